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

from .masking import dropout_probs, fused_attention, masked_softmax, relative_distance, scaled_scores, visible_keys

DIRECTIONS = (None, "forward", "backward")


def distance_mask_bias(tgt_len: int, src_len: int, alpha: float, query_offset: int, device, dtype) -> Tensor:
    """``alpha * M_dis`` = ``-alpha |i - j|`` as ``[Tq, Tk]``."""
    distance = relative_distance(tgt_len, src_len, query_offset, device).abs().to(dtype)
    return distance * (-alpha)


def directional_visibility(direction: Optional[str], tgt_len: int, src_len: int, query_offset: int, device) -> Optional[Tensor]:
    """Bool ``[1, 1, Tq, Tk]`` (True = allowed) for M_dir, or None."""
    if direction is None:
        return None
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    allowed = distance <= 0 if direction == "forward" else distance >= 0
    return allowed[None, None]


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
    bias = distance_mask_bias(tgt_len, src_len, alpha, query_offset, q.device, q.dtype)
    visible = visible_keys(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device)
    directional = directional_visibility(direction, tgt_len, src_len, query_offset, q.device)
    if directional is not None:
        visible = directional if visible is None else visible & directional
    if not need_weights:
        return fused_attention(q, k, v, bias, visible, dropout_p), None
    probs = masked_softmax(scaled_scores(q, k) + bias, visible)
    return torch.matmul(dropout_probs(probs, dropout_p), v), probs
