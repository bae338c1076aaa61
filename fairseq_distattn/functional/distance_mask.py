"""Distance-based self-attention (Im & Cho 2017), after DiSAN's masks.

Masked(Q, K, V) = softmax( Q K^T / sqrt(d_k) + M_dir + alpha * M_dis ) V
with M_dis_ij = -|i - j| and an optional directional mask M_dir.

Directional masks: ``direction="forward"`` lets query i see keys j <= i,
``"backward"`` keys j >= i (0 where allowed, -inf elsewhere). DiSAN also
hides the diagonal; we keep it visible so the first (forward) or last
(backward) token always has a key and a plain softmax stays defined.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import position_tensor, relative_distance
from .position_tables import OffsetTable, offsets
from .terms import Terms

# the directional masks M_dir (None: no mask)
DIRECTIONS = (None, "forward", "backward")


@position_tensor
def distance_mask_table(tgt_len: int, src_len: int, alpha: float, query_offset: int, device, dtype) -> OffsetTable:
    """``alpha * M_dis`` = ``-alpha |i - j|`` per key offset (:class:`OffsetTable`,
    one row shared by the heads), floored at a finite value: with a huge alpha,
    ``alpha |i - j|`` overflows to inf, and a query whose own position is
    padding would then see only -inf keys (NaN). ``alpha`` multiplies in
    float64, so 0 x alpha on the diagonal is 0."""
    distance = offsets(tgt_len, src_len, query_offset, device, torch.float64).abs_()
    floor = torch.finfo(dtype).max / 2
    return OffsetTable((distance * (-alpha)).clamp_(min=-floor).to(dtype)[None], tgt_len)


@position_tensor
def directional_visibility(tgt_len: int, src_len: int, direction: str, query_offset: int, device) -> Tensor:
    """Bool ``[Tq, Tk]`` of M_dir, True where the direction allows a key."""
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    return distance <= 0 if direction == "forward" else distance >= 0


def distance_mask_terms(
    q: Tensor, k: Tensor, alpha: float, *, direction: Optional[str] = None, query_offset: int
) -> Terms:
    """The whole mechanism is one small ``[Tq, Tk]`` table ``-alpha |i - j|`` and, with
    a ``direction``, M_dir, a visibility the core masks with."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    tgt_len, src_len = q.size(2), k.size(2)
    allowed = None if direction is None else directional_visibility(tgt_len, src_len, direction, query_offset, q.device)
    table = distance_mask_table(tgt_len, src_len, float(alpha), query_offset, q.device, logit_dtype(q.dtype))
    return Terms(offset_table=table, allowed=allowed)


distance_mask_attention = attention_op(
    distance_mask_terms,
    "distance_mask_attention",
    """Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; with
    ``need_weights=False`` it runs fused and returns ``(out, None)``.""",
)


__all__ = ["distance_mask_attention"]
