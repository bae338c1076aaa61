"""T5's relative attention bias (Raffel et al. 2020, *Exploring the Limits of
Transfer Learning with a Unified Text-to-Text Transformer*, sec. 2.1).

"Each embedding is a scalar that is added to the corresponding logit used for
computing the attention weights": logits_ij = q_i k_j / sqrt(d) + b_h(bucket(j - i)),
a learned [buckets, heads] table b. T5 uses 32 buckets "whose sizes increase
logarithmically up to an offset of 128 beyond which we assign all relative
positions to the same embedding"; the table is shared across the layers of a
stack (each layer's heads read the same b), and the encoder's and decoder's
stacks have their own.

Buckets (T5's ``_relative_position_bucket``), with n = i - j the distance back
from the query to the key:
- bidirectional (encoder): half the buckets for n >= 0, half (offset by
  buckets/2) for keys after the query (n < 0), each side over |n|;
- unidirectional (decoder): every bucket for n >= 0 (n < 0 is bucket 0 and
  hidden by the causal mask);
- of a side's N buckets the first N/2 hold one distance each (n < N/2), the
  rest are log-spaced: N/2 + floor(log(n / (N/2)) / log(max_distance / (N/2))
  * (N - N/2)), capped at N - 1.
T5 evaluates the logarithm in float32; here the floor is found with integers
(exact), which gives T5's buckets for every distance at 32/128 (tested).
"""

from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_tensor_argument
from .position_tables import OffsetTable, check_position_arguments, offsets
from .terms import Terms

NUM_BUCKETS = 32
MAX_DISTANCE = 128


def _one_side(n: int, num_buckets: int, max_distance: int) -> int:
    """Bucket of a distance ``n >= 0`` among ``num_buckets`` of one side."""
    max_exact = num_buckets // 2
    if n < max_exact:
        return n
    # floor(k log(n / e) / log(m / e)) >= b  <=>  (n / e)^k >= (m / e)^b  <=>  n^k e^b >= m^b e^k
    log_buckets = num_buckets - max_exact
    bucket = 0
    while bucket + 1 < log_buckets and n**log_buckets * max_exact ** (bucket + 1) >= (
        max_distance ** (bucket + 1) * max_exact**log_buckets
    ):
        bucket += 1
    return max_exact + bucket


def relative_position_bucket_table(num_buckets: int, max_distance: int, bidirectional: bool) -> Tuple[int, ...]:
    """Bucket of every relative position ``j - i`` in ``-max_distance..max_distance``
    (entry ``j - i + max_distance``); beyond them the buckets do not change.
    Arguments as :func:`check_bucket_arguments` takes them (else a ValueError
    naming the argument); cached."""
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be a bool, got {bidirectional!r}")
    check_bucket_arguments(num_buckets, max_distance, bidirectional)
    return _bucket_table(num_buckets, max_distance, bidirectional)


@lru_cache(maxsize=64)
def _bucket_table(num_buckets: int, max_distance: int, bidirectional: bool) -> Tuple[int, ...]:
    table = []
    for relative in range(-max_distance, max_distance + 1):
        n = -relative
        if bidirectional:
            half = num_buckets // 2
            table.append((half if n < 0 else 0) + _one_side(abs(n), half, max_distance))
        else:
            table.append(_one_side(max(n, 0), num_buckets, max_distance))
    return tuple(table)


@lru_cache(maxsize=64)
def _bucket_lookup(num_buckets: int, max_distance: int, bidirectional: bool, device: torch.device) -> Tensor:
    """:func:`relative_position_bucket_table` as a long tensor on ``device``, built
    once: every layer asks for it in every step, and on CUDA each build would be a
    blocking host-to-device copy."""
    with torch.inference_mode(False):
        return torch.tensor(_bucket_table(num_buckets, max_distance, bidirectional), device=device)


def check_bucket_arguments(num_buckets, max_distance, bidirectional: bool) -> None:
    smallest = 4 if bidirectional else 2
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < smallest:
        direction = "bidirectional" if bidirectional else "unidirectional"
        raise ValueError(f"num_buckets must be an integer >= {smallest} ({direction}), got {num_buckets!r}")
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance <= num_buckets // 2:
        raise ValueError(
            f"max_distance must be an integer > num_buckets // 2 = {num_buckets // 2} (where the "
            f"log-spaced buckets end), got {max_distance!r}"
        )


def check_bidirectional_rows(num_buckets: int, bidirectional: bool) -> None:
    """ValueError naming ``table`` for an odd number of rows where ``bidirectional``:
    T5 halves the buckets per direction (``num_buckets //= 2``), so the last row of
    an odd table is never read, as ``--t5-bias-buckets`` says for the encoder. Not in
    :func:`check_bucket_arguments`: the bucket helpers may show that unread row."""
    if bidirectional and num_buckets % 2:
        raise ValueError(
            f"table must have an even number of rows (buckets) where bidirectional, got {num_buckets}: T5 "
            f"halves them per direction ({num_buckets} // 2 = {num_buckets // 2} each), so row {num_buckets - 1} "
            f"would never be read; allowed: an even number ({num_buckets - 1} or {num_buckets + 1}), or "
            "bidirectional=False"
        )


def t5_relative_table(
    table: Tensor,
    tgt_len: int,
    src_len: int,
    max_distance: int,
    bidirectional: bool,
    query_offset: int = 0,
    dtype: Optional[torch.dtype] = None,
    position_map: Optional[Tensor] = None,
) -> OffsetTable:
    """``b_h(bucket(j - i))`` per head and key offset (:class:`OffsetTable`) from
    the ``[buckets, H]`` ``table`` (unchecked); with a ``position_map`` (randomized
    distances ``r``), the bucket of ``sign(j - i) r_|j - i|``."""
    lookup = _bucket_lookup(table.size(0), max_distance, bidirectional, table.device)
    relative = offsets(tgt_len, src_len, query_offset, table.device, position_map=position_map)
    buckets = lookup[relative.clamp(-max_distance, max_distance) + max_distance]
    return OffsetTable(table.to(dtype or table.dtype).t()[:, buckets], tgt_len)


def t5_relative_bias(
    table: Tensor,
    tgt_len: int,
    src_len: int,
    max_distance: int,
    bidirectional: bool,
    query_offset: int = 0,
    dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """``b_h(bucket(j - i))`` as ``[H, Tq, Tk]`` from the floating ``[buckets, H]``
    ``table``, in ``dtype`` (None: the table's); each mistake is a ValueError
    naming the argument."""
    if not isinstance(table, Tensor) or table.dim() != 2:
        raise ValueError(
            f"table must be [buckets, H], got {tuple(table.shape) if isinstance(table, Tensor) else repr(table)}"
        )
    check_tensor_argument("table", table)
    check_position_arguments(tgt_len, src_len, query_offset)
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be a bool, got {bidirectional!r}")
    check_bucket_arguments(table.size(0), max_distance, bidirectional)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"dtype must be None or a floating point torch.dtype, got {dtype!r}")
    return t5_relative_table(table, tgt_len, src_len, max_distance, bidirectional, query_offset, dtype).dense()


def t5_bias_terms(
    q: Tensor,
    k: Tensor,
    table: Tensor,
    *,
    max_distance: int = MAX_DISTANCE,
    bidirectional: Optional[bool] = None,
    causal: bool,
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """T5's bucketed table ``b_h(bucket(j - i))`` of the learned ``[buckets, H]`` ``table``;
    with a ``position_map``, of the randomized distances (:mod:`.randomized_positions`)."""
    bidirectional = not causal if bidirectional is None else bidirectional
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be a bool or None, got {bidirectional!r}")
    if not isinstance(table, Tensor) or table.dim() != 2 or table.size(1) != q.size(1):
        raise ValueError(
            f"table must be [buckets, H] with H = {q.size(1)}, got "
            f"{tuple(table.shape) if isinstance(table, Tensor) else repr(table)}"
        )
    check_tensor_argument("table", table, "q", q, dtypes=None)  # any floating dtype: converted
    check_bucket_arguments(table.size(0), max_distance, bidirectional)
    check_bidirectional_rows(table.size(0), bidirectional)
    relative_bias = t5_relative_table(
        table, q.size(2), k.size(2), max_distance, bidirectional, query_offset, logit_dtype(q.dtype), position_map
    )
    return Terms(offset_table=relative_bias)


t5_bias_attention = attention_op(
    t5_bias_terms,
    "t5_bias_attention",
    """``softmax(q k^T / sqrt(D) + b_h(bucket(j - i))) v`` with the learned
    ``[buckets, H]`` ``table``; ``bidirectional`` defaults to ``not causal``
    (T5: the encoder's buckets are bidirectional, the decoder's not); bidirectional
    buckets take a table of an even number of rows (else a ValueError naming
    ``table``: T5 would never read the last row of an odd one). Returns
    ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; fused with ``need_weights=False``.""",
)


__all__ = ["relative_position_bucket_table", "t5_bias_attention", "t5_relative_bias"]
