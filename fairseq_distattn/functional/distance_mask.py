"""Distance-based self-attention (Im & Cho 2017), after DiSAN's masks.

Masked(Q, K, V) = softmax( Q K^T / sqrt(d_k) + M_dir + alpha * M_dis ) V
with M_dis_ij = -|i - j| and an optional directional mask M_dir.

Directional masks: ``direction="forward"`` lets query i see keys j <= i,
``"backward"`` keys j >= i (0 where allowed, -inf elsewhere). DiSAN also
hides the diagonal; we keep it visible so the first (forward) or last
(backward) token always has a key and a plain softmax stays defined.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .masking import (
    as_logit_mask, causal_visibility, dropout_probs, fused_attention, logit_mask, masked_scores, masked_softmax,
    position_tensor, relative_distance, scaled,
)

DIRECTIONS = (None, "forward", "backward")


@position_tensor
def distance_mask_bias(tgt_len: int, src_len: int, alpha: float, query_offset: int, device, dtype) -> Tensor:
    """``alpha * M_dis`` = ``-alpha |i - j|`` as ``[Tq, Tk]``."""
    distance = relative_distance(tgt_len, src_len, query_offset, device).abs().to(dtype)
    return distance * (-alpha)


@position_tensor
def directional_visibility(tgt_len: int, src_len: int, direction: str, query_offset: int, device) -> Tensor:
    """Bool ``[Tq, Tk]`` of M_dir, True where the direction allows a key."""
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    return distance <= 0 if direction == "forward" else distance >= 0


def distance_logit_mask(key_padding_mask, causal, direction, query_offset, tgt_len, src_len, device, dtype):
    """``(mask, hidden)`` as :func:`~.masking.logit_mask`, with M_dir folded in."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction is None:
        return logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, device, dtype)
    visible = directional_visibility(tgt_len, src_len, direction, query_offset, device)
    causal_visible = causal_visibility(tgt_len, src_len, query_offset, device) if causal else None
    if causal_visible is not None:
        visible = visible & causal_visible
    if key_padding_mask is not None:
        visible = visible & ~key_padding_mask.to(torch.bool)[:, None, None, :]
    return as_logit_mask(visible, dtype)


def distance_mask_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    direction: Optional[str] = None,
    dropout_p: float = 0.0,
    need_weights: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; with
    ``need_weights=False`` it runs fused and returns ``(out, None)``."""
    tgt_len, src_len = q.size(2), k.size(2)
    # the whole mechanism is one small [B|1, 1, Tq, Tk] additive mask
    mask, hidden = distance_logit_mask(key_padding_mask, causal, direction, query_offset, tgt_len, src_len, q.device, q.dtype)
    bias = distance_mask_bias(tgt_len, src_len, float(alpha), query_offset, q.device, q.dtype)
    mask = bias if mask is None else mask + bias
    if not need_weights:
        return fused_attention(q, k, v, None, mask, hidden, dropout_p), None
    probs = masked_softmax(masked_scores(scaled(q), k, mask), hidden)
    return torch.matmul(dropout_probs(probs, dropout_p), v), probs
