"""``rope`` and ``xpos``: rotary position embeddings (Su et al. 2021) and their
length-extrapolatable form (Sun et al. 2023), with RoPE's context-length
scaling at evaluation time."""

import math
from dataclasses import dataclass

import torch

from .. import functional as DF
from ..functional.rotary import ROPE_BASE, SCALING_MODES, XPOS_SCALE_BASE, YARN_MODES
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    ENCODER_SELF_KIND,
    EVALUATION,
    SELF_ATTENTION,
    SpecError,
    finite_number,
    is_integer,
    one_of,
    option,
    register_attention,
)
from .base import Mechanism, MechanismConfig, PositionTerm, shared_arguments


def _fraction(value, context):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise SpecError("--rope-fraction", value, "must be a share of the head's dimensions", "a number 0 < f <= 1")
    return float(value)


def _scaling_factor(value, context):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise SpecError(
            "--rope-scaling-factor",
            value,
            "must be a finite number >= 1 (the evaluation length over the training length)",
            "a number s >= 1",
        )
    return float(value)


def _length(value, context):
    if not is_integer(value) or value < 0:
        raise SpecError("--rope-original-length", value, "must be a length in tokens", "an integer >= 0 (0: unset)")
    return value


@dataclass(frozen=True)
class RotaryOptions:
    rope_base: float = option(
        ROPE_BASE,
        "--rope-base",
        "rope, xpos: the rotation frequencies' base, theta_i = base^(-2i/d) (default: {default:g}, RoFormer's)",
        convert=finite_number("--rope-base", "base", positive=True),
        type=float,
        metavar="B",
        role=EVALUATION,
    )
    rope_fraction: float = option(
        1.0,
        "--rope-fraction",
        "rope, xpos: share of each head's dimensions that is rotated, the first 2*floor(f*d/2) of them (GPT-NeoX's "
        "partial rotary, e.g. 0.25); the rest pass through (default: {default:g}). Pairs are the paper's neighbouring "
        "dimensions (2i, 2i+1); GPT-NeoX's rotate-half layout (i with i + d/2) is the same rotation on permuted "
        "projection rows",
        convert=_fraction,
        type=float,
        metavar="F",
        role=EVALUATION,
    )
    rope_scaling: str = option(
        "none",
        "--rope-scaling",
        "rope, xpos: context-length scaling of the frequencies, for evaluation beyond the training length "
        "(a trained model takes it as --model-overrides): linear (position interpolation, Chen et al. 2023), ntk "
        "(base * s^(d/(d-2))), yarn (Peng et al. 2023 as the authors' code and Hugging Face's rope_type='yarn' "
        "compute it: interpolation ramped over the pair index between the correction dimensions of 32 and 1 "
        "rotations over --rope-original-length, and the rotated dimensions' share of each logit times "
        "(0.1 ln s + 1)^2), yarn-paper (the paper's formulas: the ramp continuous in the wavelength, the whole "
        "logit times (0.1 ln s + 1)^2) (default: {default})",
        convert=one_of("--rope-scaling", SCALING_MODES),
        choices=SCALING_MODES,
        role=EVALUATION,
    )
    rope_scaling_factor: float = option(
        1.0,
        "--rope-scaling-factor",
        "rope, xpos: the scaling factor s of --rope-scaling, the evaluation length over the training length "
        "(default: {default:g})",
        convert=_scaling_factor,
        type=float,
        metavar="S",
        role=EVALUATION,
    )
    rope_original_length: int = option(
        0,
        "--rope-original-length",
        "rope, xpos: the training length L in tokens, which --rope-scaling yarn and yarn-paper ramp their "
        "interpolation by, and which nothing else reads (default: {default}, unset)",
        convert=_length,
        type=int,
        metavar="L",
        role=EVALUATION,
    )
    xpos_scale_base: float = option(
        XPOS_SCALE_BASE,
        "--xpos-scale-base",
        "xpos: the scale base of zeta_i^(n/scale_base) (default: {default:g}, the paper's)",
        convert=finite_number("--xpos-scale-base", "scale_base", positive=True),
        applies_to=lambda name: name == "xpos",
        type=float,
        metavar="B",
        role=EVALUATION,
    )

    @staticmethod
    def check_together(options) -> None:
        if options.rope_scaling == "none" and options.rope_scaling_factor != 1.0:
            raise SpecError(
                "--rope-scaling-factor",
                options.rope_scaling_factor,
                "scales nothing with --rope-scaling none",
                "1 (the default), or name a --rope-scaling mode",
            )
        yarn = options.rope_scaling in YARN_MODES
        if yarn and options.rope_original_length < 1:
            raise SpecError(
                "--rope-original-length",
                options.rope_original_length,
                f"--rope-scaling {options.rope_scaling} ramps its interpolation by the training length, which "
                "must be given",
                "the length in tokens the model was trained on (--tokens-per-sample of its training)",
            )
        if not yarn and options.rope_original_length:
            raise SpecError(
                "--rope-original-length",
                options.rope_original_length,
                f"has no effect with --rope-scaling {options.rope_scaling}: only yarn and yarn-paper read it",
                "0 (the default), or --rope-scaling yarn or yarn-paper",
            )


def _example(xpos: bool):
    def example(draw, options):
        arguments = _op_arguments(options, xpos)
        if arguments["scaling"] != "none":
            # a scaling that scales: by 2 where the options leave it at 1, from half the drawn length where unset
            arguments["scaling_factor"] = max(arguments["scaling_factor"], 2.0)
            arguments["original_length"] = arguments["original_length"] or max(1, draw.src_len // 2)
        return (), arguments

    return example


def _op_arguments(options, xpos: bool):
    return dict(
        base=options.rope_base,
        fraction=options.rope_fraction,
        scaling=options.rope_scaling,
        scaling_factor=options.rope_scaling_factor,
        original_length=options.rope_original_length,
        xpos_scale_base=options.xpos_scale_base if xpos else None,
    )


def check_rotated_pairs(fraction: float, head_dim: int) -> None:
    if DF.rotary_dims(head_dim, fraction) < 2:
        raise SpecError(
            "--rope-fraction",
            fraction,
            f"rotates no pair of the {head_dim} dimensions of each head",
            f"a number >= {2 / head_dim:g}",
        )


# why xPos is for causal attention only
XPOS_CAUSAL_ONLY = (
    "its scale zeta^((n-m)/scale_base) decays with the distance only to keys before the query; a bidirectional "
    "encoder would weight keys after it exponentially up (the paper uses it in causal language models)"
)


@register_attention(
    "xpos",
    RotaryOptions,
    op=DF.rotary_attention,
    example=_example(xpos=True),
    kinds=SELF_ATTENTION - {ENCODER_SELF_KIND},
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES, ENCODER_SELF_KIND: XPOS_CAUSAL_ONLY},
    fused="without weights",
    fused_without_bias=True,  # rotated q and k, then vanilla's own SDPA call
    description="RoPE with a per-pair exponential decay: queries times `zeta_i^(n/scale_base)`, keys times its "
    "inverse, `zeta_i = (2i/d + 0.4)/1.4` (`--xpos-scale-base`); decoder only",
    paper="Sun et al. 2023, *A Length-Extrapolatable Transformer*",
)
@register_attention(
    "rope",
    RotaryOptions,
    op=DF.rotary_attention,
    example=_example(xpos=False),
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    fused="without weights",
    fused_without_bias=True,  # rotated q and k, then vanilla's own SDPA call
    description="queries and keys rotated pairwise by position times `base^(-2i/d)` (`--rope-base`, "
    "`--rope-fraction` of each head), then the plain fused attention; context-length scaling at evaluation "
    "(`--rope-scaling linear|ntk|yarn`); positions count from each sentence's first real token",
    paper="Su et al. 2021, *RoFormer: Enhanced Transformer with Rotary Position Embedding*",
)
class Rotary(Mechanism):
    """RoPE (and xPos): nothing learned, nothing saved in checkpoints. The
    rotation is applied where the attention module hands over a layer's new
    projections (:meth:`encode_positions`), so each key is cached already
    rotated at its own position and a decoding step rotates only its own
    query and key; the attention itself is the plain one."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options = config.options
        self.xpos = config.name == "xpos"
        check_rotated_pairs(options.rope_fraction, config.head_dim)
        self.arguments = _op_arguments(options, self.xpos)

    @classmethod
    def check_options(cls, options, kind, layers):
        if kind.head_dim:
            check_rotated_pairs(options.rope_fraction, kind.head_dim)

    def extra_repr(self) -> str:
        rotated = DF.rotary_dims(self.config.head_dim, self.arguments["fraction"])
        text = f"base={self.arguments['base']:g}, rotated {rotated} of {self.config.head_dim} dims per head"
        if self.arguments["scaling"] != "none":
            text += f", {self.arguments['scaling']} scaling x{self.arguments['scaling_factor']:g}"
        if self.xpos:
            text += f", xpos scale_base={self.arguments['xpos_scale_base']:g}"
        return text

    def encode_positions(self, queries, keys, key_padding_mask, query_offset):
        query, key = DF.rotary_query_key(
            queries["query"],
            keys["key"],
            key_padding_mask=key_padding_mask,
            query_offset=query_offset,
            key_offset=query_offset,
            **self.arguments,
        )
        return {**queries, "query": query}, {**keys, "key": key}

    def position_term(self, tgt_len, src_len, causal):
        # The logit a query and key that are the same all-ones vector get at each offset (over sqrt(d)):
        # RoPE's sum_i cos((n-m) theta_i), the content-free part of its relative term, per layer (the heads agree).
        ones = torch.ones(1, 1, max(tgt_len, src_len), self.config.head_dim, dtype=torch.float64)
        query, key = DF.rotary_query_key(ones[:, :, :tgt_len], ones[:, :, :src_len], **self.arguments)
        logits = query @ key.transpose(-1, -2) / math.sqrt(self.config.head_dim)
        return PositionTerm(f"{self.config.name}-logit", f"{self.config.name} logit of equal all-ones q, k", logits[0])

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        # queries and keys arrive rotated (encode_positions)
        return DF.attend(
            queries["query"],
            keys["key"],
            keys["value"],
            **shared_arguments(key_padding_mask, causal, query_offset, dropout_p, need_weights),
        )
