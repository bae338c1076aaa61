"""``sandwich``: the inner product of sinusoidal position embeddings as a bias (Chi et al. 2023)."""

from dataclasses import dataclass

import torch

from ..functional.sandwich import sandwich_attention, sandwich_bias
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
from .base import Mechanism, MechanismConfig, PositionTerm

# NVIDIA NeMo's port takes each head's size; 64 in every preset here (256 / 4, 512 / 8, 1024 / 16)
SANDWICH_DIM = 64


def _sinusoid_dim(value, context):
    if not is_integer(value) or value < 2 or value % 2:
        raise SpecError(
            "--sandwich-dim",
            value,
            "must be an even integer >= 2 (the sinusoids come in sin/cos pairs)",
            "2, 4, 6, ...",
        )
    return value


@dataclass(frozen=True)
class SandwichOptions:
    sandwich_dim: int = option(
        SANDWICH_DIM,
        "--sandwich-dim",
        "sandwich: the dimension d of the sinusoidal embeddings whose inner product is the bias, "
        "the sum over k = 1..d/2 of cos(|i-j| / 10000^(2k/d)), minus d/2, divided by n*8/H for head n "
        "(default: {default}, the head size of every preset here, which NVIDIA NeMo's port uses)",
        convert=_sinusoid_dim,
        role=EVALUATION,
        type=int,
        metavar="D",
    )


@register_attention(
    "sandwich",
    SandwichOptions,
    op=sandwich_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # the fused path keeps only the [H, Tq, Tk] bias, the flex path only its table
    description="fixed bias from the inner product of sinusoidal position embeddings, `sum_k cos(abs(i-j) / "
    "10000^(2k/d)) - d/2`, divided by `n*8/H` for head n (`--sandwich-dim`); no parameters",
    paper="Chi, Fan, Rudnicky and Ramadge 2023, *Dissecting Transformer Length Extrapolation via the Lens of "
    "Receptive Field Analysis*",
)
class Sandwich(Mechanism):
    """Chi et al. 2023: no parameters, nothing in checkpoints; the LM preset
    ``distattn_lm_sandwich_gbw`` drops the position embeddings, as the paper
    does (the bias is what is left of them)."""

    random_positions = "distances"  # --randomized-positions: its table read at sign(d) r_|d|

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.dim = config.options.sandwich_dim

    def extra_repr(self) -> str:
        return f"heads={self.config.num_heads}, sinusoid dim={self.dim}"

    def position_term(self, tgt_len, src_len, causal):
        bias = sandwich_bias(tgt_len, src_len, self.config.num_heads, self.dim, 0, "cpu", torch.float64)
        return PositionTerm("sandwich-bias", "Sandwich bias (p_i . p_j - d/2) / (n 8/H)", bias)

    def op_arguments(self, queries, keys, options):
        return (self.dim,), {}
