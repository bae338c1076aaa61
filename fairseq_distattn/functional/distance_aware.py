"""DA-Transformer: distance-aware attention (Wu, Wu, Huang 2021).

Sec. 3.1:  R^(h) = w_h * R,  R_ij = |i - j|  (one learnable w per head)
Eq. (5):   f(R^(h); v_h) = (1 + exp(v_h)) / (1 + exp(v_h - R^(h)))
Eq. (6):   O^(h) = softmax( ReLU(Q K^T) * f(R^(h)) / sqrt(d) ) V

f is evaluated as exp(softplus(v) - softplus(v - R)), which is the same
quantity but never overflows for long sequences or large |w|.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .masking import (
    absolute_distance, check_attention_arguments, dropout_probs, logit_dtype, logit_mask, masked_softmax, scaled,
)


def distance_coefficients(distance_weight: Tensor, sharpness: Tensor, tgt_len: int, src_len: int, query_offset: int) -> Tensor:
    """Re-scaled coefficients f(w_h |i-j|; v_h) of eq. (5) as ``[H, Tq, Tk]``."""
    distance = absolute_distance(tgt_len, src_len, query_offset, distance_weight.device, distance_weight.dtype)
    weighted = distance_weight[:, None, None] * distance
    sharpness = sharpness[:, None, None]
    return torch.exp(F.softplus(sharpness) - F.softplus(sharpness - weighted))


def distance_aware_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    distance_weight: Tensor,
    sharpness: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
) -> Tuple[Tensor, Tensor]:
    """DA eqs. (5)-(6); ``distance_weight`` (w) and ``sharpness`` (v) are ``[H]``.
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``."""
    check_attention_arguments(q, k, v, key_padding_mask, causal, query_offset, dropout_p)
    for name, parameter in (("distance_weight", distance_weight), ("sharpness", sharpness)):
        if tuple(parameter.shape) != (q.size(1),):
            raise ValueError(f"{name} must be [H] = ({q.size(1)},), one per head, got {tuple(parameter.shape)}")
    tgt_len, src_len = q.size(2), k.size(2)
    # ReLU(QK^T) x f reaches (1 + e^v) times the largest logit: formed in float32 for half inputs
    compute = logit_dtype(q.dtype)
    coefficients = distance_coefficients(distance_weight.to(compute), sharpness.to(compute), tgt_len, src_len,
                                         query_offset)
    # ReLU commutes with the positive 1/sqrt(d)
    scores = torch.relu(torch.matmul(scaled(q), k.transpose(-2, -1))).to(compute)
    mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, compute)
    logits = scores * coefficients if mask is None else torch.addcmul(mask, scores, coefficients)
    probs = masked_softmax(logits, hidden).to(q.dtype)
    return torch.matmul(dropout_probs(probs, dropout_p), v), probs
