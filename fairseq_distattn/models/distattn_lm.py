"""Language model ``distattn_lm`` and its architectures."""

import dataclasses
import functools
import itertools
from argparse import Namespace
from typing import Optional

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models import transformer_lm as fairseq_lm
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from ..mechanisms.llama4_temperature import NOPE_INTERVAL
from ..modules.summary import log_attention
from ..modules.transformer import DistAttnTransformerDecoder, ModelAttentionPlans, language_model_plans
from ..patches.checkpoint_upgrade import record_arithmetic
from ..patches.lm_decoder import language_model_decoder
from ..registry import is_integer, on_register
from ..spec import SpecError
from .arguments import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    add_distattn_args,
    build_or_exit,
    check_attention_heads,
    check_blocks_fit_the_model,
    register_architecture,
    set_distattn_defaults,
)


@register_model("distattn_lm")
class DistAttnLanguageModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` with a distance-aware mechanism chosen per decoder layer."""

    @classmethod
    def add_args(cls, parser):
        # registered without a dataclass (its flags go through argparse), so
        # fairseq's LM options are added here from transformer_lm's dataclass
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_distattn_args(parser, (DECODER_SELF,))

    @classmethod
    def check_attention_args(cls, args, new_model: bool = True) -> ModelAttentionPlans:
        """Raise SpecError for any bad attention flag (what building would find), else return the
        plans; ``new_model``: False where the model is built, maybe from a checkpoint trained before
        a check was added."""
        check_attention_heads(args, ("decoder",))
        set_distattn_defaults(args)
        for kind in (ENCODER_SELF, CROSS):  # listed by --help for every model, but the LM has neither
            spec = getattr(args, kind.attr)
            if spec != "vanilla":
                raise SpecError(
                    kind.flag,
                    spec,
                    f"distattn_lm is decoder-only and has no {kind.description}",
                    "vanilla (or leave it out)",
                )
        # fairseq's LM build_model takes the positions from --tokens-per-sample when not given
        max_target_positions = getattr(args, "max_target_positions", None)
        positions_flag = "--max-target-positions"
        if not max_target_positions:
            max_target_positions, positions_flag = getattr(args, "tokens_per_sample", None), "--tokens-per-sample"
        # decoder_layers_to_keep: the plans take each kept layer's mechanism from the trained layers,
        # which args still counts (fairseq's LM build_model sets decoder_layers to the kept count after this)
        geometry = {"max_target_positions": max_target_positions}
        cfg = TransformerConfig.from_namespace(Namespace(**{**vars(args), **geometry}))
        return language_model_plans(cfg, target_flag=positions_flag, new_model=new_model)

    @classmethod
    def build_model(cls, args, task):
        def build():
            plans = cls.check_attention_args(args, new_model=False)
            check_blocks_fit_the_model(args, task)
            record_arithmetic(args, plans.mechanisms())
            # the decoder fairseq builds takes the plans just read (and checked) instead of reading them again
            decoder = functools.partial(DistAttnTransformerDecoder, layer_plans=plans.decoder)
            with language_model_decoder(decoder):
                return super(DistAttnLanguageModel, cls).build_model(args, task)

        model = build_or_exit(build, args)
        log_attention(model)
        return model


def architecture(name, fairseq_architecture, **attention):
    return register_architecture("distattn_lm", name, fairseq_architecture, **attention)


def transformer_lm_architecture(args):
    """The defaults of fairseq's ``--arch transformer_lm``: its dataclass's fields as they are
    (fairseq registers that architecture as a no-op). Not ``base_lm_architecture``, which only the
    named architectures (``transformer_lm_gbw``, ...) apply and which builds another model: pre-norm
    with a final layer norm, and input/output widths that follow ``--decoder-embed-dim`` where
    ``transformer_lm`` keeps 512 unless ``--decoder-input-dim``/``--decoder-output-dim`` say otherwise."""
    for name, default in dataclasses.asdict(TransformerLanguageModelConfig()).items():
        if isinstance(default, str) and default.startswith("${"):
            continue  # interpolated from the task's options (tokens_per_sample, ...), which args holds
        if getattr(args, name, None) is None:
            setattr(args, name, default)


transformer_lm_architecture.__name__ = "transformer_lm"
architecture("distattn_lm", transformer_lm_architecture)
architecture("distattn_lm_gbw", fairseq_lm.transformer_lm_baevski_gbw)


def preset_name(mechanism: str) -> str:
    """The LM preset of a mechanism: ``distattn_lm_<name>_gbw``."""
    return f"distattn_lm_{mechanism.replace('-', '_')}_gbw"


def register_mechanism_preset(info) -> None:
    """``distattn_lm_<name>_gbw``: fairseq's gbw LM with the mechanism in every decoder
    layer, without the position embeddings it replaces (kept where its papers keep
    them, ``keeps_position_embeddings``). Derived for every mechanism that applies to
    decoder self-attention, except one whose papers place it in named layers (their
    presets are below)."""
    if DECODER_SELF.key not in info.kinds or info.papers_place_it:
        return
    architecture(
        preset_name(info.name),
        fairseq_lm.transformer_lm_baevski_gbw,
        decoder_self=info.name,
        no_absolute_positions=not info.keeps_position_embeddings,
    )


on_register(register_mechanism_preset)
# Haviv et al. 2022: no position information at all; the causal mask alone lets an LM infer positions.
architecture("distattn_lm_nope_gbw", fairseq_lm.transformer_lm_baevski_gbw, no_absolute_positions=True)
# Nguyen et al. 2020 LM: multiplicative window in the first 3 decoder layers.
architecture("distattn_lm_window_gbw", fairseq_lm.transformer_lm_baevski_gbw, decoder_self="window-mw@0-2")


def llama4_decoder_spec(layers: int, interval: int) -> str:
    """Llama 4's layout of ``layers`` decoder layers as a SPEC: ``llama4-temperature`` (no
    rope) in the layers ``i`` with ``(i + 1) % interval == 0``, HF's ``no_rope_layers`` rule
    (``Llama4TextConfig``: ``int((i + 1) % no_rope_layer_interval != 0)``, 0 a NoPE layer),
    ``rope`` in the others (``interval`` 1: no rope at all; above ``layers``: rope only)."""
    for name, value in (("layers", layers), ("interval", interval)):
        if not is_integer(value) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    names = ["llama4-temperature" if (i + 1) % interval == 0 else "rope" for i in range(layers)]
    if len(set(names)) == 1:
        return names[0]
    items = []
    for name, run in itertools.groupby(range(layers), key=names.__getitem__):
        run = list(run)
        items.append(f"{name}@{run[0]}" if len(run) == 1 else f"{name}@{run[0]}-{run[-1]}")
    return ",".join(items)


def llama4_decoder_self(args) -> Optional[str]:
    """The default ``--decoder-self-attention`` of ``distattn_lm_llama4_gbw``:
    :func:`llama4_decoder_spec` of ``--decoder-layers`` and ``--llama4-nope-interval``; None
    where either is bad (the checks refuse it in one line).

    Llama 4 (Meta AI 2025), as HF transformers 4.57.1 builds its text model (modeling_llama4.py,
    Llama4TextAttention; configuration_llama4.py, Llama4TextConfig): no position embeddings, rope in
    every layer but every --llama4-nope-interval-th (default 4), which has no rope and scales its queries
    (llama4-temperature; --llama4-attn-scale 0 turns that off, HF's attn_temperature_tuning=False). Left
    out, as other parts of a block than the position method: the rope layers' chunked local attention
    (layer_types "chunked_attention", attention_chunk_size 8192: those layers see only the keys of the
    query's own chunk of 8192 positions, so on sequences of up to 8192 tokens they are full causal
    attention) and their qk norm (use_qk_norm: a weightless RMS norm of the rotated queries and keys,
    Llama4TextL2Norm), Llama 4's rope
    base (rope_theta 500000: give --rope-base 500000) and its pairing of dimensions (adjacent pairs, a
    fixed permutation of each head's dimensions for a model trained from scratch), grouped-query heads,
    RMSNorm, SwiGLU and mixture-of-experts feed-forward layers: fairseq's gbw LM keeps its own."""
    layers = getattr(args, "decoder_layers", None)
    interval = getattr(args, "llama4_nope_interval", NOPE_INTERVAL)
    if not (is_integer(layers) and layers >= 1 and is_integer(interval) and interval >= 1):
        return None
    return llama4_decoder_spec(layers, interval)


# Llama 4's interleaving of rope and NoPE layers: what it keeps and leaves out is llama4_decoder_self's docstring
architecture(
    "distattn_lm_llama4_gbw",
    fairseq_lm.transformer_lm_baevski_gbw,
    decoder_self=llama4_decoder_self,
    no_absolute_positions=True,
)
