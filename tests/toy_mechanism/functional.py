"""Log-distance bias: ``softmax(q k^T / sqrt(D) - s_h log(1 + |i - j|)) v``, a
per-head learned slope ``s_h`` on the log of the distance (a toy: it shows
what adding a mechanism takes)."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from fairseq_distattn.functional import attend, relative_distance


def log_distance_bias(slopes: Tensor, tgt_len: int, src_len: int, query_offset: int = 0) -> Tensor:
    """``-s_h log(1 + |i - j|)`` as ``[H, Tq, Tk]``."""
    distance = relative_distance(tgt_len, src_len, query_offset, slopes.device).abs().to(slopes.dtype)
    return -slopes[:, None, None] * torch.log1p(distance)


def log_distance_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    *,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
    flex: str = "auto",
) -> Tuple[Tensor, Optional[Tensor]]:
    """Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None)``; ``slopes`` is ``[H]``."""
    bias = log_distance_bias(slopes.to(q.dtype), q.size(2), k.size(2), query_offset)
    return attend(
        q,
        k,
        v,
        bias=bias,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
        dropout_p=dropout_p,
        need_weights=need_weights,
        flex=flex,
    )
