"""Relative position representations (Shaw, Uszkoreit, Vaswani 2018).

Eq. (4):  e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)
Eq. (3):  z_i  = sum_j alpha_ij (v_j + a^V_ij),  alpha = softmax_j(e_ij)
with a^K_ij = w^K_{clip(j - i, -k, k)} and a^V_ij = w^V_{clip(j - i, -k, k)},
tables shared across heads (sec. 3.1-3.2).

Efficient form (sec. 3.3): the relative term of eq. (4) is computed as
q @ (w^K)^T over the 2k+1 buckets, then gathered per (i, j); the relative term
of eq. (3) sums alpha per bucket (each unclipped bucket is one diagonal of
alpha) and multiplies by w^V. Nothing of size
[Tq, Tk, D] is ever built. On the flex path (CUDA) neither is anything of size
[Tq, Tk]: the key term is read inside flex's score_mod and the per-bucket sums
of alpha are rebuilt from its log-sum-exp (:class:`RelativeValues`).
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype, logit_product, scaled, scores
from .masking import (
    autocast_enabled,
    check_tensor_argument,
    in_dtype,
    position_tensor,
    relative_distance,
)
from .position_tables import index_scalar
from .randomized_positions import map_offsets
from .terms import Terms


@position_tensor
def relative_position_buckets(tgt_len: int, src_len: int, max_distance: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` indices ``clip(j - i, -k, k) + k`` into the ``[2k+1, D]`` tables."""
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    return distance.clamp(-max_distance, max_distance) + max_distance


@functools.lru_cache(maxsize=256)
def _diagonals(tgt_len: int, src_len: int, max_distance: int, query_offset: int, first: int, last: int):
    """``(bucket, diagonal, first_row, rows)`` of every distance ``first..last``
    (within ``-k..k``) that some query has: its keys are the diagonal
    ``j = query_offset + i + d``, its bucket ``d + k``."""
    diagonals = []
    for distance in range(first, last + 1):
        diagonal = query_offset + distance
        first_row = max(0, -diagonal)
        rows = min(tgt_len, src_len - diagonal) - first_row
        if rows > 0:
            diagonals.append((distance + max_distance, diagonal, first_row, rows))
    return tuple(diagonals)


def _band_diagonals(tgt_len: int, src_len: int, max_distance: int, query_offset: int, causal: bool):
    """:func:`_diagonals` of every unclipped bucket ``|j - i| < k``; under
    ``causal`` the buckets after the query are left out."""
    last = 0 if causal else max_distance - 1
    return _diagonals(tgt_len, src_len, max_distance, query_offset, -(max_distance - 1), last)


@position_tensor
def _clipped_left(tgt_len: int, src_len: int, max_distance: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` bool, True where ``j - i <= -k`` (bucket 0)."""
    return relative_position_buckets(tgt_len, src_len, max_distance, query_offset, device) == 0


def _unclipped_view(per_bucket: Tensor, src_len: int, max_distance: int, query_offset: int) -> Optional[Tensor]:
    """``[.., Tq, Tk]`` view of a contiguous ``[.., Tq, 2k+1]`` tensor with
    ``view_ij = per_bucket[i, j - (query_offset + i) + k]``, or None when some
    distance is clipped (or rows would overlap).

    When no distance reaches k, every (i, j) has its own bucket, and bucket
    ``j - i + k`` of row i sits at flat position ``i (2k+1) + j - i + k - offset
    = 2k i + j + k - offset``: one strided view with row stride 2k (the skewing
    of Huang et al.'s Music Transformer), instead of one diagonal per bucket.
    """
    tgt_len = per_bucket.size(-2)
    longest = max(query_offset + tgt_len - 1, src_len - 1 - query_offset)
    if longest > max_distance or (tgt_len > 1 and 2 * max_distance < src_len):
        return None
    return per_bucket.as_strided(
        per_bucket.shape[:-1] + (src_len,),
        per_bucket.stride()[:-2] + (2 * max_distance, 1),
        per_bucket.storage_offset() + max_distance - query_offset,
    )


def _bucket_sums(scores: Tensor, max_distance: int, query_offset: int, causal: bool) -> Tensor:
    """``[.., Tq, Tk] -> [.., Tq, 2k+1]``: each row summed per bucket. Without
    clipping, one strided copy (:func:`_unclipped_view`). Otherwise the
    unclipped buckets are diagonals, read as strided views, and the two clipped
    ones are what is left of the row total (scatter_add is several times
    slower). ``causal``: nothing after the query is nonzero, so bucket 2k is 0."""
    tgt_len, src_len = scores.shape[-2:]
    sums = scores.new_zeros(scores.shape[:-1] + (2 * max_distance + 1,))
    skewed = _unclipped_view(sums, src_len, max_distance, query_offset)
    if skewed is not None:
        skewed.copy_(scores)
        return sums
    for bucket, diagonal, first_row, rows in _band_diagonals(tgt_len, src_len, max_distance, query_offset, causal):
        sums[..., first_row : first_row + rows, bucket] = torch.diagonal(scores, diagonal, -2, -1)
    clipped = scores.sum(dim=-1) - sums.sum(dim=-1)
    if causal or max_distance == 0:  # one clipped bucket holds the rest
        sums[..., 0] = clipped
    else:
        left = _clipped_left(tgt_len, src_len, max_distance, query_offset, scores.device)
        sums[..., 0] = torch.where(left, scores, 0).sum(dim=-1)
        sums[..., -1] = clipped - sums[..., 0]
    return sums


def _bucket_gather(per_bucket: Tensor, buckets: Tensor, max_distance: int, query_offset: int) -> Tensor:
    """``[.., Tq, 2k+1] -> [.., Tq, Tk]``: ``out_ij = per_bucket[i, bucket_ij]``."""
    skewed = _unclipped_view(per_bucket.contiguous(), buckets.size(-1), max_distance, query_offset)
    if skewed is not None:
        return skewed.contiguous()
    return per_bucket.gather(-1, buckets.expand(per_bucket.shape[:-1] + buckets.shape[-1:]))


class _BucketSums(torch.autograd.Function):
    """:func:`_bucket_sums`, whose adjoint is :func:`_bucket_gather`."""

    @staticmethod
    def forward(ctx, scores, buckets, max_distance, query_offset, causal):
        ctx.save_for_backward(buckets)
        ctx.layout = (max_distance, query_offset, causal)
        return _bucket_sums(scores, *ctx.layout)

    @staticmethod
    def backward(ctx, grad):
        (buckets,) = ctx.saved_tensors
        return _BucketGather.apply(grad, buckets, *ctx.layout), None, None, None, None


class _BucketGather(torch.autograd.Function):
    """:func:`_bucket_gather`, whose adjoint is :func:`_bucket_sums` (autograd's
    own gather backward is a scatter_add)."""

    @staticmethod
    def forward(ctx, per_bucket, buckets, max_distance, query_offset, causal):
        ctx.save_for_backward(buckets)
        ctx.layout = (max_distance, query_offset, causal)
        return _bucket_gather(per_bucket, buckets, max_distance, query_offset)

    @staticmethod
    def backward(ctx, grad):
        (buckets,) = ctx.saved_tensors
        return _BucketSums.apply(grad, buckets, *ctx.layout), None, None, None, None


def relative_position_bias(
    q: Tensor,
    rel_keys: Tensor,
    buckets: Tensor,
    max_distance: int,
    query_offset: int = 0,
    causal: bool = False,
) -> Tensor:
    """``q_i . a^K_ij`` as ``[B, H, Tq, Tk]`` (the second term of eq. 4, with
    whatever scale ``q`` carries). ``causal``: the caller hides the keys after
    each query, so no gradient flows back from there."""
    return RelativeKeyScores.of(q, rel_keys, buckets, max_distance, query_offset, causal).dense()


@dataclass
class RelativeKeyScores:
    """The second term of eq. 4 as a table for :func:`attention.attend`:
    ``q_i . a^K_b`` per query and bucket, ``per_bucket`` ``[B, H, Tq, 2k+1]``, read at
    bucket ``clip(j - i, -k, k) + k``. Eagerly it becomes the ``[B, H, Tq, Tk]``
    bias of :func:`relative_position_bias`; in flex_attention ``score_mod`` reads
    it, so that bias is never formed (keys only: eq. 3's value term needs the
    weights)."""

    per_bucket: Tensor
    buckets: Tensor
    max_distance: int
    query_offset: int
    causal: bool
    combine: str = "add"
    per_batch = True  # a class attribute: q_i . a^K per sentence

    @classmethod
    def of(
        cls, q: Tensor, rel_keys: Tensor, buckets: Tensor, max_distance: int, query_offset: int, causal: bool
    ) -> "RelativeKeyScores":
        """``q_i . a^K_b`` for every bucket (whatever scale ``q`` carries), in the
        logit dtype (:func:`attention.logit_product`: from float32 copies of half ``q``)."""
        per_bucket = logit_product(q, rel_keys.transpose(0, 1))  # [B, H, Tq, 2k+1]
        return cls(per_bucket, buckets, max_distance, query_offset, causal)

    def dense(self) -> Tensor:
        return _BucketGather.apply(self.per_bucket, self.buckets, self.max_distance, self.query_offset, self.causal)

    def score_mod(self):
        per_bucket = self.per_bucket
        offset = index_scalar(self.query_offset, per_bucket.device)
        # a tensor, not a Python int: compiled with dynamic shapes, a captured int becomes a
        # symbol that inductor could not lower inside score_mod (benchmarks/results/speed/gpu-nvidia-h200)
        max_distance = index_scalar(self.max_distance, per_bucket.device)

        def add_relative_key_score(score, b, h, q_idx, kv_idx):
            distance = torch.minimum(torch.maximum(kv_idx - q_idx - offset, -max_distance), max_distance)
            return score + per_bucket[b, h, q_idx, distance + max_distance]

        return add_relative_key_score


@position_tensor
def _band_keys(tgt_len: int, src_len: int, max_distance: int, first: int, last: int, device) -> Tuple[Tensor, Tensor]:
    """``(keys, on_band)``, both ``[Tq, 2k+1]``: the key ``j = i + b - k`` of query
    ``i`` at bucket ``b`` (clamped into the sequence), and whether that key exists
    and its distance is within ``first..last``."""
    distance = torch.arange(-max_distance, max_distance + 1, device=device)
    keys = torch.arange(tgt_len, device=device)[:, None] + distance
    on_band = (keys >= 0) & (keys < src_len) & (distance >= first) & (distance <= last)
    return keys.clamp(0, src_len - 1), on_band


def _rowwise_dot(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    return (a.to(dtype) * b.to(dtype)).sum(dim=-1)


class _BandDotProducts(torch.autograd.Function):
    """``q_i . k_{i+d}`` for the unclipped distances ``|d| < k`` as ``[B, H, Tq, 2k+1]``
    (column ``d + k``; 0 where there is no such key) in :func:`attend.logit_dtype`:
    one diagonal of ``q k^T`` per distance, ``O(Tq k D)``, and its gradient
    without autograd keeping a float32 copy of every diagonal's slices."""

    @staticmethod
    def forward(ctx, q, k, diagonals, width):
        ctx.save_for_backward(q, k)
        ctx.diagonals = diagonals
        dtype = logit_dtype(q.dtype)
        products = q.new_zeros(q.shape[:-1] + (width,), dtype=dtype)
        for column, diagonal, first_row, rows in diagonals:
            queries = q[..., first_row : first_row + rows, :]
            keys = k[..., first_row + diagonal : first_row + diagonal + rows, :]
            products[..., first_row : first_row + rows, column] = _rowwise_dot(queries, keys, dtype)
        return products

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        grad_q = torch.zeros(q.shape, dtype=grad.dtype, device=q.device)
        grad_k = torch.zeros(k.shape, dtype=grad.dtype, device=k.device)
        for column, diagonal, first_row, rows in ctx.diagonals:
            query_rows, key_rows = (
                slice(first_row, first_row + rows),
                slice(first_row + diagonal, first_row + diagonal + rows),
            )
            weight = grad[..., query_rows, column, None]
            grad_q[..., query_rows, :].addcmul_(weight, k[..., key_rows, :].to(grad.dtype))
            grad_k[..., key_rows, :].addcmul_(weight, q[..., query_rows, :].to(grad.dtype))
        return grad_q.to(q.dtype), grad_k.to(k.dtype), None, None


@dataclass
class RelativeValues:
    """The second term of eq. 3, ``sum_j alpha_ij a^V_ij``, as a ``value_term`` of
    :func:`attention.attend` (a :class:`position_tables.LseValueTerm`). Eagerly it sums the
    probabilities per bucket. On the flex path, where the probabilities are never
    formed, each unclipped bucket's one key is rescored (eq. 4 from ``q``,
    ``k`` and the key table's ``key_scores``) and normalised by flex's log-sum-exp;
    of the clipped buckets, +k is ``exp(lse_beyond(k) - lse)`` and -k what is
    left of 1."""

    key_scores: RelativeKeyScores
    scaled_q: Tensor
    k: Tensor
    rel_values: Tensor

    def __call__(self, attended: Tensor, out: Tensor) -> Tensor:
        key_scores = self.key_scores
        return out + relative_position_values(
            attended,
            self.rel_values,
            key_scores.buckets,
            key_scores.max_distance,
            key_scores.query_offset,
            key_scores.causal,
        )

    def from_log_normaliser(self, lse, lse_beyond, key_padding_mask) -> Tensor:
        causal, max_distance = self.key_scores.causal, self.key_scores.max_distance
        tgt_len, src_len = self.scaled_q.size(2), self.k.size(2)
        dtype = logit_dtype(self.scaled_q.dtype)
        # A clipped bucket holds one key per query, a diagonal like the others, when
        # no key lies beyond its distance (always the case once rows_within_reach cut
        # k to the longest distance): then it needs no log-sum-exp of its own.
        left_is_diagonal = tgt_len - 1 <= max_distance
        right_is_diagonal = causal or src_len - 1 <= max_distance
        first = -max_distance if left_is_diagonal else -(max_distance - 1)
        last = 0 if causal else (max_distance if right_is_diagonal else max_distance - 1)
        diagonals = _diagonals(tgt_len, src_len, max_distance, 0, first, last)
        products = _BandDotProducts.apply(self.scaled_q, self.k, diagonals, 2 * max_distance + 1)
        bucket_scores = products + self.key_scores.per_bucket.to(dtype)
        keys, on_band = _band_keys(tgt_len, src_len, max_distance, first, last, self.k.device)
        if key_padding_mask is not None:
            on_band = on_band & ~key_padding_mask[:, None, keys]
        lse = lse.to(dtype)
        visible_row = torch.isfinite(lse)
        # a row with no visible key has lse -inf: normalising by +inf gives it no mass
        normaliser = lse.masked_fill(~visible_row, float("inf"))
        masses = torch.where(on_band, bucket_scores - normaliser[..., None], float("-inf")).exp()
        if left_is_diagonal and right_is_diagonal:
            return torch.matmul(masses.to(self.rel_values.dtype), self.rel_values)
        rest = torch.where(visible_row, 1.0 - masses.sum(dim=-1), 0.0)
        if left_is_diagonal:
            left, right = masses[..., 0], rest
        elif right_is_diagonal:
            left, right = rest, masses[..., -1]
        else:
            right = torch.exp(lse_beyond(max_distance).to(dtype) - normaliser)
            left = rest - right
        masses = torch.cat([left[..., None], masses[..., 1:-1], right[..., None]], dim=-1)
        return torch.matmul(masses.to(self.rel_values.dtype), self.rel_values)


def relative_position_values(
    probs: Tensor,
    rel_values: Tensor,
    buckets: Tensor,
    max_distance: int,
    query_offset: int = 0,
    causal: bool = False,
) -> Tensor:
    """``sum_j alpha_ij a^V_ij`` as ``[B, H, Tq, D]`` (the second term of eq. 3).
    ``causal``: ``probs`` are 0 after each query."""
    per_bucket = _BucketSums.apply(probs, buckets, max_distance, query_offset, causal)
    return torch.matmul(per_bucket, rel_values)


def rows_within_reach(
    rel_keys: Tensor,
    rel_values: Optional[Tensor],
    max_distance: int,
    tgt_len: int,
    src_len: int,
    query_offset: int,
) -> Tuple[Tensor, Optional[Tensor], int]:
    """The table rows of the distances these positions can have, and their clipping distance.

    No |j - i| exceeds the longest distance between a query and a key here, so
    clipping at ``k' = min(k, longest)`` and using rows ``k - k' .. k + k'`` of the
    ``[2k+1, D]`` tables gives exactly eqs. 3-4 with ``k``: work then depends on
    the sequence, not on ``k`` (rows never reached get no gradient either way).
    """
    longest = max(query_offset + tgt_len - 1, src_len - 1 - query_offset, 1)
    if longest >= max_distance:
        return rel_keys, rel_values, max_distance
    rows = slice(max_distance - longest, max_distance + longest + 1)
    return rel_keys[rows], None if rel_values is None else rel_values[rows], longest


def mapped_relative_position_terms(
    q: Tensor,
    rel_keys: Tensor,
    rel_values: Optional[Tensor],
    max_distance: int,
    src_len: int,
    query_offset: int,
    position_map: Tensor,
) -> Terms:
    """Eqs. 3-4 with randomized distances (``--randomized-positions``, Ruoss et al. 2023's
    ``NOISY_RELATIVE`` distances ``r``, :mod:`.randomized_positions`): the offset ``d = j - i``
    reads the bucket ``clip(sign(d) r_|d|, -k, k) + k``. Shaw et al.'s RPR is not among the
    authors' encodings; this clips their distances as RPR clips its own. A bucket is then no
    longer one diagonal (many distances clip into one, and the unclipped ones skip rows), so
    the key term is a gather of the per-bucket scores and the value term a per-bucket sum
    of the weights (``scatter_add``): training calls only, where the map is drawn."""
    relative = relative_distance(q.size(2), src_len, query_offset, q.device)
    mapped = map_offsets(relative, position_map)
    buckets = (mapped.clamp(-max_distance, max_distance) + max_distance).expand(*q.shape[:2], *relative.shape)
    bias = logit_product(scaled(q), rel_keys.transpose(0, 1)).gather(-1, buckets)
    if rel_values is None:
        return Terms(bias=bias)

    def relative_values(attended: Tensor, out: Tensor) -> Tensor:
        per_bucket = attended.new_zeros(attended.shape[:-1] + (rel_values.size(0),))
        return out + torch.matmul(per_bucket.scatter_add(-1, buckets, attended), rel_values)

    return Terms(bias=bias, value_term=relative_values)


@position_tensor
def _key_buckets(tgt_len: int, src_len: int, max_distance: int, query_offset: int, device) -> Tensor:
    """``[Tk]``: the buckets of one query's keys (:func:`relative_position_buckets` of ``Tq = 1``)."""
    return relative_position_buckets(tgt_len, src_len, max_distance, query_offset, device)[0]


def _one_query_terms(
    q: Tensor, k: Tensor, rel_keys: Tensor, rel_values: Optional[Tensor], max_distance: int, query_offset: int
) -> Terms:
    """Eqs. 3-4 for one query (an incremental decoding step): eq. 4 is the query against
    ``k_j + a^K_ij``, a ``[Tk, D]`` row of the key table per key, and eq. 3's second term the
    weights times the ``[Tk, D]`` value rows. Reading the rows first keeps both gathers on the
    small tables (the query's scores against all 2k+1 rows, gathered per key, index its
    ``[B, H, 1, 2k+1]`` scores along their last dimension); the key rows are accumulated into
    the scores (:func:`attention.scores`' ``key_rows``). Forming ``k + a^K`` and ``v + a^V``
    instead copies the whole cache twice per layer and step."""
    row = _key_buckets(1, k.size(2), max_distance, query_offset, q.device)
    logits = scores(q, k, key_rows=rel_keys.index_select(0, row))
    if rel_values is None:
        return Terms(logits=logits)
    return Terms(logits=logits, value_term=ValueRows(rel_values.index_select(0, row)))


class ValueRows(NamedTuple):
    """Eq. 3's second term at one query, ``sum_j alpha_ij a^V_ij`` with the ``[Tk, D]``
    value rows of its keys, accumulated into the output (``addmm_``: one op, where a
    product and a sum are two)."""

    rows: Tensor

    def __call__(self, attended: Tensor, out: Tensor) -> Tensor:
        flat = out.view(-1, out.size(-1))
        flat.addmm_(in_dtype(attended, out.dtype).reshape(-1, attended.size(-1)), in_dtype(self.rows, out.dtype))
        return out


def relative_position_terms(
    q: Tensor,
    k: Tensor,
    rel_keys: Tensor,
    rel_values: Optional[Tensor],
    max_distance: int,
    *,
    causal: bool,
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """Eq. 4's second term, an additive bias on the logits read by clipped ``j - i``,
    and eq. 3's, a value term of the weights; with a ``position_map``, read by the
    randomized distances (:func:`mapped_relative_position_terms`)."""
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
        raise ValueError(f"max_distance must be an integer >= 1 (the clipping distance k), got {max_distance!r}")
    # the tables meet q in a matmul: one dtype, unless autocast (--amp) casts them there
    table_dtypes = None if autocast_enabled(q.device) else ()
    for name, table in (("rel_keys", rel_keys), ("rel_values", rel_values)):
        if table is not None:
            check_tensor_argument(name, table, "q", q, table_dtypes)
        if table is not None and tuple(table.shape) != (2 * max_distance + 1, q.size(-1)):
            raise ValueError(
                f"{name} must be [2k+1, D] = {(2 * max_distance + 1, q.size(-1))}, got {tuple(table.shape)}"
            )
    tgt_len, src_len = q.size(2), k.size(2)
    if position_map is not None:
        return mapped_relative_position_terms(
            q, rel_keys, rel_values, max_distance, src_len, query_offset, position_map
        )
    if tgt_len == 1:
        return _one_query_terms(q, k, rel_keys, rel_values, max_distance, query_offset)
    rel_keys, rel_values, max_distance = rows_within_reach(
        rel_keys, rel_values, max_distance, tgt_len, src_len, query_offset
    )
    buckets = relative_position_buckets(tgt_len, src_len, max_distance, query_offset, q.device)
    scaled_q = scaled(q)
    key_scores = RelativeKeyScores.of(scaled_q, rel_keys, buckets, max_distance, query_offset, causal)
    value_term = None if rel_values is None else RelativeValues(key_scores, scaled_q, k, rel_values)
    return Terms(offset_table=key_scores, value_term=value_term)


relative_position_attention = attention_op(
    relative_position_terms,
    "relative_position_attention",
    """Shaw et al. eqs. (3)-(4). ``rel_keys``/``rel_values`` are ``[2k+1, D]``
    (``rel_values=None``: keys only), in ``q``'s dtype unless autocast is on.
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; keys-only with
    ``need_weights=False`` runs fused (but for one query, which runs eager) and returns
    ``(out, None)``.""",
)


__all__ = ["relative_position_attention"]
