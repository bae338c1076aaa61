"""``llama4-temperature``: Llama 4's attention temperature tuning in its NoPE layers (Meta AI 2025)."""

import dataclasses
from dataclasses import dataclass

from ..functional.llama4_temperature import ATTN_SCALE, FLOOR_SCALE, llama4_temperature_attention
from ..registry import (
    CROSS_KIND,
    DECODER_SELF_KIND,
    DIFFERENT_SEQUENCES,
    ENCODER_SELF_KIND,
    EVALUATION,
    finite_number,
    option,
    positive_integer,
    register_attention,
)
from .base import Mechanism

# Llama 4's interval of its NoPE layers: HF's Llama4TextConfig (no_rope_layer_interval, default 4) makes
# no_rope_layers[i] = int((i + 1) % no_rope_layer_interval != 0), 0 a layer without rope
NOPE_INTERVAL = 4


@dataclass(frozen=True)
class Llama4TemperatureOptions:
    llama4_floor_scale: float = option(
        FLOOR_SCALE,
        "--llama4-floor-scale",
        "llama4-temperature: the positions per step of the query factor 1 + s * ln(1 + floor((p + 1) / F)), F "
        "(HF's floor_scale; default: {default:g})",
        convert=finite_number("--llama4-floor-scale", "F", positive=True),
        role=EVALUATION,
        type=float,
        metavar="F",
    )
    llama4_attn_scale: float = option(
        ATTN_SCALE,
        "--llama4-attn-scale",
        "llama4-temperature: the slope s of the query factor (HF's attn_scale; default: {default:g}); 0 makes "
        "the factor 1, HF's attn_temperature_tuning=False",
        convert=finite_number("--llama4-attn-scale", "s", positive=False),
        role=EVALUATION,
        type=float,
        metavar="S",
    )
    llama4_nope_interval: int = option(
        NOPE_INTERVAL,
        "--llama4-nope-interval",
        "llama4-temperature: the LM preset distattn_lm_llama4_gbw puts llama4-temperature without rope in the "
        "decoder layers K-1, 2K-1, ... (every K-th) and rope in the others, K (HF's no_rope_layer_interval; "
        "default: {default}, Llama 4's); read only by that preset, for its default --decoder-self-attention",
        convert=positive_integer("--llama4-nope-interval"),
        # no parameter depends on it (the layers' SPEC, which it formed, is what a checkpoint keeps)
        role=EVALUATION,
        type=int,
        metavar="K",
    )


# why the encoder has no form of it
CAUSAL_ONLY = (
    "its factor grows with the number of keys a causal query sees (its index in the kv cache), Llama 4's decoder "
    "being causal (HF defines it there only); a bidirectional encoder's queries all see every key"
)


@register_attention(
    "llama4-temperature",
    Llama4TemperatureOptions,
    op=llama4_temperature_attention,
    kinds=frozenset({DECODER_SELF_KIND}),
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES, ENCODER_SELF_KIND: CAUSAL_ONLY},
    description="each query times `1 + s * ln(1 + floor((p + 1) / F))` at its position p among the keys, no "
    "other position information (Llama 4's attention temperature tuning of its NoPE layers, HF's arithmetic; "
    "`--llama4-floor-scale` F, `--llama4-attn-scale` s); decoder only; the preset `distattn_lm_llama4_gbw` "
    "interleaves it with rope",
    paper="Meta AI 2025, *The Llama 4 herd: The beginning of a new era of natively multimodal AI innovation*",
)
class Llama4Temperature(Mechanism):
    """Llama 4's NoPE layers (HF transformers 4.57.1 ``Llama4TextAttention.forward`` with
    ``attn_temperature_tuning`` in a layer of ``no_rope_layers`` 0): the query at cache
    position ``p`` (``query_offset + i``) scaled by the factor, keys and values as they are,
    the plain causal attention. Nothing learned; the options are parameter-free, so
    ``--model-overrides`` may change them (``llama4_attn_scale`` 0 turns it off)."""

    def op_arguments(self, queries, keys, options):
        own = self.config.options
        return (), {"floor_scale": own.llama4_floor_scale, "attn_scale": own.llama4_attn_scale}

    def extra_repr(self) -> str:
        own = self.config.options
        return f"floor_scale={own.llama4_floor_scale:g}, attn_scale={own.llama4_attn_scale:g}"

    @classmethod
    def example_options(cls, options, src_len, head_dim):
        # the example calls are short: a floor scale that makes the factor differ along them
        if options.llama4_floor_scale != FLOOR_SCALE:
            return options
        return dataclasses.replace(options, llama4_floor_scale=2.0)
