"""ALiBi: attention with linear biases (Press, Smith, Lewis 2022, *Train Short,
Test Long*).

Sec. 3:   softmax( q_i K^T + m * [-(i-1), ..., -2, -1, 0] )
a static, non-learned bias on the query-key scores (here the scaled scores
q_i k_j / sqrt(d), as the paper's implementation adds it), with one slope m
per head; no position embeddings are added to the word embeddings.

Slopes (sec. 3): for n heads the geometric sequence that starts at
2^(-8/n) and has that ratio, m_h = 2^(-8h/n), h = 1..n (1/2, 1/4, ..., 1/256
for 8 heads). For n not a power of 2 (the paper's footnote and code): the
2^floor(log2 n) slopes of the closest smaller power of 2, followed by the
first n - 2^floor(log2 n) of every other slope of twice that power.

The paper's causal form gives key j <= i the bias -m (i - j); keys after the
query are hidden by the causal mask, so it is -m |i - j| on every visible key.
The encoder (bidirectional) form is the symmetric -m |i - j|.
"""

import math
from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_tensor_argument, position_tensor
from .position_tables import OffsetTable, check_bias_table_arguments, offsets
from .terms import Terms


@lru_cache(maxsize=64)
def alibi_slopes(num_heads: int) -> Tuple[float, ...]:
    """The paper's slopes m_1..m_n for ``num_heads`` heads (exact in float64)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")

    def power_of_2(n: int) -> Tuple[float, ...]:
        start = 2.0 ** (-8.0 / n)
        return tuple(start**h for h in range(1, n + 1))

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    if closest == num_heads:
        return power_of_2(num_heads)
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


@position_tensor
def _paper_slope_values(tgt_len: int, src_len: int, num_heads: int, query_offset: int, device, dtype) -> Tensor:
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64, device=device)
    distance = offsets(tgt_len, src_len, query_offset, device, torch.float64).abs_()
    return (slopes[:, None] * distance).neg_().to(dtype)


def alibi_table(
    tgt_len: int,
    src_len: int,
    num_heads: int,
    query_offset: int,
    device,
    dtype,
    slopes: Optional[Tensor] = None,
    position_map: Optional[Tensor] = None,
) -> OffsetTable:
    """``-m_h |i - j|`` per head and key offset (:class:`OffsetTable`): with the
    paper's slopes formed in float64, else with ``slopes`` ``[H]`` in ``dtype``.
    With a ``position_map`` (randomized distances ``r``), ``-m_h r_|i - j|``."""
    if position_map is not None:
        distance = offsets(tgt_len, src_len, query_offset, device, torch.float64, position_map).abs_()
        if slopes is None:
            paper = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64, device=device)
            return OffsetTable((paper[:, None] * distance).neg_().to(dtype), tgt_len)
        return OffsetTable(-(slopes.to(dtype)[:, None] * distance.to(dtype)), tgt_len)
    if slopes is None:
        return OffsetTable(_paper_slope_values(tgt_len, src_len, num_heads, query_offset, device, dtype), tgt_len)
    distance = offsets(tgt_len, src_len, query_offset, device, dtype).abs_()
    return OffsetTable(-(slopes.to(dtype)[:, None] * distance), tgt_len)


def alibi_bias(tgt_len: int, src_len: int, num_heads: int, query_offset: int, device, dtype) -> Tensor:
    """``-m_h |i - j|`` as ``[H, Tq, Tk]`` in the floating ``dtype`` (formed in
    float64) with the paper's slopes; the lengths and ``query_offset`` are
    integers >= 0 (else a ValueError naming the argument)."""
    check_bias_table_arguments(tgt_len, src_len, query_offset, dtype)
    alibi_slopes(num_heads)  # its ValueError names num_heads
    return alibi_table(tgt_len, src_len, num_heads, query_offset, device, dtype).dense()


def alibi_terms(
    q: Tensor, k: Tensor, slopes: Optional[Tensor] = None, *, query_offset: int, position_map: Optional[Tensor]
) -> Terms:
    """ALiBi's table ``-m_h |i - j|`` (:func:`alibi_table`) for ``q`` and ``k``,
    ``slopes`` ``[H]`` defaulting to the paper's (:func:`alibi_slopes`). With a
    ``position_map`` (randomized distances ``r_0 = 0 < r_1 < ...``, Ruoss et al. 2023's
    ``NOISY_ALIBI``), ``-m_h r_|i - j|``; the authors' non-causal form also adds
    ``+0.5 m_h`` below the diagonal, in their deterministic ALiBi as well, which this
    ALiBi (the paper's symmetric encoder form) does not have, randomized or not."""
    heads = q.size(1)
    if slopes is not None:
        check_tensor_argument("slopes", slopes, "q", q, dtypes=None)  # any floating dtype: converted
        if tuple(slopes.shape) != (heads,):
            raise ValueError(f"slopes must be [H] = ({heads},), one per head, got {tuple(slopes.shape)}")
    table = alibi_table(q.size(2), k.size(2), heads, query_offset, q.device, logit_dtype(q.dtype), slopes, position_map)
    return Terms(offset_table=table)


alibi_attention = attention_op(
    alibi_terms,
    "alibi_attention",
    """``softmax(q k^T / sqrt(D) - m_h |i - j|) v`` (sec. 3): the causal form with
    ``causal=True``, the symmetric one without. ``slopes`` ``[H]`` default to the
    paper's (:func:`alibi_slopes`). Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``;
    the bias runs fused with ``need_weights=False`` (``probs`` None).""",
)


__all__ = ["alibi_attention", "alibi_bias", "alibi_slopes"]
