"""``alibi``: attention with linear biases (Press, Smith, Lewis 2022)."""

import torch

from ..functional.alibi import alibi_attention, alibi_bias, alibi_slopes
from ..registry import CROSS_KIND, DIFFERENT_SEQUENCES, SELF_ATTENTION, register_attention
from .base import Mechanism, PositionTerm


@register_attention(
    "alibi",
    op=alibi_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # the fused path keeps only the [H, Tq, Tk] bias, the flex path only its table
    description="fixed per-head linear bias `-m_h * abs(i-j)` on the logits, geometric slopes `m_h = 2^(-8h/H)` "
    "(causal in the decoder, symmetric in the encoder); no parameters",
    paper="Press, Smith and Lewis 2022, *Train Short, Test Long: Attention with Linear Biases Enables Input Length "
    "Extrapolation*",
)
class ALiBi(Mechanism):
    """Press et al. 2022: the paper's slopes for this layer's heads (not learned,
    nothing saved in checkpoints); the LM preset ``distattn_lm_alibi_gbw`` drops
    the position embeddings, as the paper does. ``--randomized-positions`` reads its
    offsets as sampled distances (Ruoss et al. 2023's ``NOISY_ALIBI``)."""

    random_positions = "distances"

    def extra_repr(self) -> str:
        slopes = alibi_slopes(self.config.num_heads)
        return f"heads={self.config.num_heads}, slopes={slopes[0]:.4g}..{slopes[-1]:.4g}"

    def position_term(self, tgt_len, src_len, causal):
        bias = alibi_bias(tgt_len, src_len, self.config.num_heads, 0, "cpu", torch.float64)
        return PositionTerm("alibi-bias", "ALiBi bias -m_h |i-j|", bias)
