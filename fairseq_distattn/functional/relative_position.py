"""Relative position representations (Shaw, Uszkoreit, Vaswani 2018).

Eq. (4):  e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)
Eq. (3):  z_i  = sum_j alpha_ij (v_j + a^V_ij),  alpha = softmax_j(e_ij)
with a^K_ij = w^K_{clip(j - i, -k, k)} and a^V_ij = w^V_{clip(j - i, -k, k)},
tables shared across heads (sec. 3.1-3.2).

Efficient form (sec. 3.3): the relative term of eq. (4) is computed as
q @ (w^K)^T over the 2k+1 buckets, then gathered per (i, j); the relative term
of eq. (3) sums alpha per bucket and multiplies by w^V. Nothing of size
[Tq, Tk, D] is ever built.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .masking import (
    dropout_probs, fused_attention, logit_mask, masked_scores, masked_softmax, position_tensor, relative_distance,
    scaled, softmax_attention,
)


@position_tensor
def relative_position_buckets(tgt_len: int, src_len: int, max_distance: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` indices ``clip(j - i, -k, k) + k`` into the ``[2k+1, D]`` tables."""
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    return distance.clamp(-max_distance, max_distance) + max_distance


def relative_position_bias(q: Tensor, rel_keys: Tensor, buckets: Tensor) -> Tensor:
    """``q_i . a^K_ij`` as ``[B, H, Tq, Tk]`` (the second term of eq. 4, with
    whatever scale ``q`` carries)."""
    per_bucket = torch.matmul(q, rel_keys.transpose(0, 1))  # [B, H, Tq, 2k+1]
    index = buckets.expand(q.size(0), q.size(1), -1, -1)
    return per_bucket.gather(-1, index)


def relative_position_values(probs: Tensor, rel_values: Tensor, buckets: Tensor) -> Tensor:
    """``sum_j alpha_ij a^V_ij`` as ``[B, H, Tq, D]`` (the second term of eq. 3)."""
    bsz, heads, tgt_len, _ = probs.shape
    per_bucket = probs.new_zeros(bsz, heads, tgt_len, rel_values.size(0))
    per_bucket.scatter_add_(-1, buckets.expand(bsz, heads, -1, -1), probs)
    return torch.matmul(per_bucket, rel_values)


def relative_position_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_keys: Tensor,
    rel_values: Optional[Tensor],
    max_distance: int,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Shaw et al. eqs. (3)-(4). ``rel_keys``/``rel_values`` are ``[2k+1, D]``
    (``rel_values=None``: keys only). Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``;
    keys-only with ``need_weights=False`` runs fused and returns ``(out, None)``."""
    tgt_len, src_len = q.size(2), k.size(2)
    buckets = relative_position_buckets(tgt_len, src_len, max_distance, query_offset, q.device)
    if tgt_len == 1:
        # One query (an incremental decoding step): eqs. 3-4 as written, k_j + a^K_j
        # and v_j + a^V_j, cost as much as the bucket form and take half the ops.
        keys = k + rel_keys[buckets[0]]
        values = v if rel_values is None else v + rel_values[buckets[0]]
        return softmax_attention(q, keys, values, key_padding_mask, causal, query_offset, dropout_p, need_weights)
    mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, q.dtype)
    scaled_q = scaled(q)  # both terms of eq. 4
    bias = relative_position_bias(scaled_q, rel_keys, buckets)
    if rel_values is None and not need_weights:
        return fused_attention(q, k, v, bias, mask, hidden, dropout_p), None
    probs = masked_softmax(masked_scores(scaled_q, k, mask).add_(bias), hidden)
    attended = dropout_probs(probs, dropout_p)
    out = torch.matmul(attended, v)
    if rel_values is not None:
        out = out + relative_position_values(attended, rel_values, buckets)
    return out, probs
