"""Log-distance bias: ``softmax(q k^T / sqrt(D) - s_h log(1 + |i - j|)) v``, a
per-head learned slope ``s_h`` on the log of the distance (a toy: it shows
what adding a mechanism takes)."""

import torch
from torch import Tensor

from fairseq_distattn.functional import Terms, attention_op, relative_distance


def log_distance_bias(slopes: Tensor, tgt_len: int, src_len: int, query_offset: int = 0) -> Tensor:
    """``-s_h log(1 + |i - j|)`` as ``[H, Tq, Tk]``."""
    distance = relative_distance(tgt_len, src_len, query_offset, slopes.device).abs().to(slopes.dtype)
    return -slopes[:, None, None] * torch.log1p(distance)


def log_distance_terms(q: Tensor, k: Tensor, slopes: Tensor, *, query_offset: int) -> Terms:
    """The bias, ``slopes`` ``[H]``."""
    return Terms(bias=log_distance_bias(slopes.to(q.dtype), q.size(2), k.size(2), query_offset))


log_distance_attention = attention_op(
    log_distance_terms,
    "log_distance_attention",
    """Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None)``; ``slopes`` is ``[H]``.""",
)
