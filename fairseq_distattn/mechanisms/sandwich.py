"""``sandwich``: the inner product of sinusoidal position embeddings as a bias (Chi et al. 2023)."""

from dataclasses import dataclass

import torch

from .. import functional as DF
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    EVALUATION,
    SELF_ATTENTION,
    SpecError,
    is_integer,
    option,
    register_attention,
)
from .base import Mechanism, MechanismConfig, PositionTerm, shared_arguments


def _sinusoid_dim(value, context):
    if not is_integer(value) or value < 0 or value == 1 or value % 2:
        raise SpecError(
            "--sandwich-dim",
            value,
            "must be 0 (the head size) or an even integer >= 2 (the sinusoids come in sin/cos pairs)",
            "0 or an even integer >= 2",
        )
    return value


@dataclass(frozen=True)
class SandwichOptions:
    sandwich_dim: int = option(
        0,
        "--sandwich-dim",
        "sandwich: the dimension d of the sinusoidal embeddings whose inner product is the bias, "
        "the sum over k = 1..d/2 of cos(|i-j| / 10000^(2k/d)), minus d/2, divided by n*8/H for head n; "
        "0: each head's size, as NVIDIA NeMo's port does (default: {default})",
        convert=_sinusoid_dim,
        role=EVALUATION,
        type=int,
        metavar="D",
    )


@register_attention(
    "sandwich",
    SandwichOptions,
    op=DF.sandwich_attention,
    example=lambda draw, options: ((options.sandwich_dim or 4,), {}),  # the examples' heads may be odd
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    fused="without weights",
    flex="without weights",
    small_fused_bias=True,  # the fused path keeps only the [H, Tq, Tk] bias
    description="fixed bias from the inner product of sinusoidal position embeddings, `sum_k cos(abs(i-j) / "
    "10000^(2k/d)) - d/2`, divided by `n*8/H` for head n (`--sandwich-dim`); no parameters",
    paper="Chi, Fan, Rudnicky and Ramadge 2023, *Dissecting Transformer Length Extrapolation via the Lens of "
    "Receptive Field Analysis*",
)
class Sandwich(Mechanism):
    """Chi et al. 2023: no parameters, nothing in checkpoints; the LM preset
    ``distattn_lm_sandwich_gbw`` drops the position embeddings, as the paper
    does (the bias is what is left of them)."""

    @classmethod
    def check_options(cls, options, kind, layers):
        if not options.sandwich_dim and kind.head_dim and kind.head_dim % 2:
            raise SpecError(
                "--sandwich-dim",
                options.sandwich_dim,
                f"0 takes the head size, and {kind.flag}'s heads are {kind.head_dim} wide, an odd number (the "
                "sinusoids come in sin/cos pairs)",
                "an even integer >= 2",
            )

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.dim = config.options.sandwich_dim or config.head_dim
        if self.dim % 2:
            raise SpecError(
                "--sandwich-dim", 0, f"0 takes the head size, {self.dim}, an odd number", "an even integer >= 2"
            )

    def extra_repr(self) -> str:
        return f"heads={self.config.num_heads}, sinusoid dim={self.dim}"

    def position_term(self, tgt_len, src_len, causal):
        bias = DF.sandwich_bias(tgt_len, src_len, self.config.num_heads, self.dim, 0, "cpu", torch.float64)
        return PositionTerm("sandwich-bias", "Sandwich bias (p_i . p_j - d/2) / (n 8/H)", bias)

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        return DF.sandwich_attention(
            queries["query"],
            keys["key"],
            keys["value"],
            self.dim,
            **shared_arguments(key_padding_mask, causal, query_offset, dropout_p, need_weights),
        )
