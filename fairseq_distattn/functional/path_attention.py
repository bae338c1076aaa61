"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim 2025, *PaTH Attention:
Position Encoding via Accumulating Householder Transformations*, arXiv:2505.16381).

Every position t carries a data-dependent Householder-like matrix

    H_t = I - beta_t w_t w_t^T,   ||w_t|| = 1,   beta_t in (0, 2),

and a query at position i scores key j <= i through the product of the matrices of
the positions after the key, up to and including the query's:

    logit_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D)
             = (H_{j+1} ... H_i q_i)^T k_j / sqrt(D)        (each H_t is symmetric),

then a causal softmax over j and the weighted sum of the values. The diagonal has no
factor (``logit_ii = q_i^T k_i / sqrt(D)``), position 0's matrix never enters, and with
beta = 0 everywhere it is plain causal softmax attention. No other position encoding
is used. (The paper writes the product as ``k_j^T (prod_{s=j+1}^{i} H_s) q_i``, the
transpose of the same number; its equation text was not at hand to check its numbering,
so this module follows the code below, which fixes every detail.)

PaTH-FoX, as flash-linear-attention names it: an optional forget gate, the log gates
``log_forget`` = log f_t <= 0 of every position (fla's layer: ``logsigmoid`` of a
projection), adds ``c_i - c_j`` with ``c`` their inclusive cumulative sum, i.e.
``sum_{t=j+1}^{i} log f_t``, to the logits *before* the 1/sqrt(D) scaling:

    logit_ij = (q_i^T H_i ... H_{j+1} k_j + sum_{t=j+1}^{i} log f_t) / sqrt(D).

That scaling of the gate is fla's and differs from FoX itself
(:func:`forgetting.forgetting_attention` adds the gate bias unscaled):
``path_attention(..., beta=0, log_forget=g)`` equals ``forgetting_attention(...,
log_forget=g / sqrt(D))``.

As flash-linear-attention computes it (github.com/fla-org/flash-linear-attention at
commit bc3b101dcb713ddc5bd8924b66754eb68b5ccf89):

* ``fla/ops/path_attn/naive.py``, ``naive_path_attn(q, k, v, w, beta, g, scale)``: the
  product of each chunk's matrices in the compact (UT transform) form
  ``I - W^T (I + strictly_lower(diag(beta) W W^T))^{-1} diag(beta) W``; within a chunk,
  ``q_i^T k_j - sum_{t<=i} (q_i.w_t) [T strictly_lower(diag(beta) W K^T)]_tj`` (no factor
  on the diagonal); across chunks, each query is carried back over the chunks between
  it and the key's. The gate: ``A + g_cumsum[i] - g_cumsum[j]`` and then ``(A * scale)``,
  scale = 1/sqrt(D) in its test; a ``tril`` causal mask, softmax in float32, times ``v``.
  The parallel kernels (``parallel_path_fwd.py``: ``(q.k + g_q - g_k) * scale``) and
  the one-step decoding (``attn_decoding_one_step(..., do_gate_scale=True)``) scale the
  gate the same way.
* ``fla/layers/path_attn.py``, ``PaTHAttention``: ``w`` is a (low-rank) projection,
  optionally through a short causal convolution, split per head and L2-normalised in
  float32 (``l2_norm``: ``x / sqrt(sum x^2 + 1e-6)``) before the op; ``beta =
  2 * sigmoid(linear(x))`` in float32, one per key head and position, range (0, 2)
  ("allowing negative eigenvalues": H_t has eigenvalue 1 - beta_t on w_t);
  ``g = logsigmoid(linear(x))`` one per head with ``use_forget_gate``. Padding: the
  layer removes the padded tokens (``unpad_input``) before the op, so a padded token
  neither is attended to nor transforms any other pair.
* Decoding (the same layer): the cache holds the *transformed* keys, ``k_j^{(t)} =
  H_t ... H_{j+1} k_j``; each new token updates every cached key with its own matrix
  (``rank_one_update``: ``k - beta (k.w) w``), appends its own key untransformed, and
  the new query's logits are then plain ``q . k_cache`` (fla's softmax decoding kernel).

Here: the same arithmetic, formed directly. ``w`` is normalised inside the op
(``w / max(||w||, 1e-12)``, in the logit dtype), as fla's layer does before its op: an
already unit-norm ``w`` is unchanged, and fla's eps (1e-6 inside the square root) is
not added, so the result differs from fla's layer by a relative ~5e-7 for unit-norm
projections, more only for ``||w||`` near 1e-3 or below (a zero ``w`` gives H = I
here). ``beta`` is taken as given (not checked: reading its values would wait for the
device); ``beta`` in [0, 2] keeps every H_t a contraction.

The op computes fla's chunked form (the UT transform, chunks of :data:`CHUNK`
positions: :func:`_path_logits_by_chunk`); beside it,
:func:`_path_logits_by_position` is the plain definition the tests hold it to, each
query carried back one position at a time (a loop over key positions, one rank-one
update of every query row per step). Both are O(Tq Tk D) work with no D x D matrices,
and neither divides a prefix product out (H_t is singular where beta_t = 1); the
chunked form runs Tk / CHUNK Python steps instead of Tk, which is what makes long
evaluations feasible. Logits are formed in :func:`attention.logit_dtype` (float32 for
half inputs); the output and the weights are in the input dtype.

Padding: a padded position's ``beta`` and ``w`` are set to 0 (H_t = I) and its log
gate to 0, so it changes no other pair's transform and decays nothing, which is what
fla's removal of the padded tokens gives; the padded keys themselves are hidden by
the mask. Incremental decoding (``query_offset > 0``): the op is given the raw keys,
``w``, ``beta`` (and ``log_forget``) of all Tk positions and recomputes every logit
from them, which is exact: the rows equal the corresponding rows of the full call. A
mechanism would therefore cache the raw ``k``, ``v``, ``w``, ``beta`` (and the log
gates) of every position, an append-only cache, at O(Tk D) work per new token; fla's
cache of transformed keys costs the same per token but rewrites every cached key on
each step.

Causal only: the product runs over the positions between a key and the query after
it, and neither the paper nor fla defines a bidirectional form, so ``causal=False`` is
refused. There is no fused or flex_attention path (``flex`` is checked, then
ignored): the weights are always formed.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_op, full_precision, logit_dtype
from .masking import (
    check_queries_among_keys,
    check_tensor_argument,
)
from .terms import Terms

NORM_EPS = 1e-12  # the floor on ||w|| when normalising (F.normalize's default)
CHUNK = 64  # positions per chunk of the UT form (fla's naive reference and kernels use 64)


def _check_per_position(name: str, tensor: Optional[Tensor], shape: Tuple[int, ...], wanted: str, q: Tensor) -> None:
    """Type, device and shape of a per-position argument: a ValueError naming it. Any
    floating dtype (converted to the logit dtype); attribute comparisons only."""
    if tensor is None:
        return
    check_tensor_argument(name, tensor, "q", q, dtypes=None)
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must be {wanted} = {shape}, one per key position, got {tuple(tensor.shape)}")


def _path_logits_by_position(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, query_offset: int) -> Tensor:
    """``[B, H, Tq, Tk]``: entry (i, j) is ``q_i^T H_p ... H_{j+1} k_j`` for ``j <= p =
    query_offset + i`` (``q_i^T k_i`` on ``j = p``), with ``H_t = I - beta_t w_t w_t^T``;
    entries with ``j > p`` are left unspecified (the causal mask hides them). All in one floating dtype;
    ``query_offset + Tq <= Tk``; unchecked.

    Carries every query back from its own position: after the step for key j, row i
    holds ``u_i = H_{j+1} ... H_p q_i`` (rows whose position is <= j hold ``q_i``), and
    column j is ``u_i . k_j``."""
    batch, heads, tgt_len, src_len = q.size(0), q.size(1), q.size(2), k.size(2)
    last = query_offset + tgt_len if tgt_len else 0  # columns after the last query are all hidden
    positions = torch.arange(query_offset, query_offset + tgt_len, device=q.device)
    carried = q
    columns = [None] * last
    for j in range(last - 1, -1, -1):
        if j + 1 < last:
            w_t = w[:, :, j + 1, None, :]  # [B, H, 1, D]
            projection = (carried * w_t).sum(-1, keepdim=True)
            updated = carried - beta[:, :, j + 1, None, None] * projection * w_t
            # H_{j+1} applies to the queries at positions >= j + 1 only
            carried = torch.where((positions > j)[:, None], updated, carried)
        columns[j] = (carried * k[:, :, j, None, :]).sum(-1)
    if not columns:
        return q.new_zeros(batch, heads, tgt_len, src_len)
    logits = torch.stack(columns, dim=-1)
    return F.pad(logits, (0, src_len - last)) if src_len > last else logits


def _carry_operators(w: Tensor, beta: Tensor) -> Tuple[Tensor, Tensor]:
    """Per chunk (``w`` ``[B, H, N, C, D]``, ``beta`` ``[B, H, N, C]``): the chunk's
    lower and upper unit-triangular matrices ``I + strictly_lower(G diag(beta))`` and
    ``I + strictly_upper(G diag(beta))``, ``G = W W^T``. Solving against the lower one
    gives the coefficients a row vector collects while it is carried back over the
    chunk's positions (last position first); the upper one, a key carried forward."""
    eye = torch.eye(w.size(-2), dtype=w.dtype, device=w.device)
    scaled = (w @ w.transpose(-1, -2)) * beta[..., None, :]  # column t scaled by beta_t
    return eye + scaled.tril(-1), eye + scaled.triu(1)


def _path_logits_by_chunk(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, query_offset: int, chunk: int) -> Tensor:
    """:func:`_path_logits_by_position` in flash-linear-attention's chunked form (the UT transform of
    ``fla/ops/path_attn/naive.py``): the positions in chunks of ``chunk``, the product of
    a chunk's matrices ``I - W^T diag(beta) L^{-1} W`` (``L`` its lower matrix), so the
    carry back runs over chunks, not positions. Same contract and result to rounding.

    Within a chunk, a query at position p collects ``a_pt = beta_t (u . w_t)`` from every
    position t <= p of its chunk as it is carried back; ``a_pt`` does not depend on where
    the carry stops, so ``logit_pj = q_p . k_j - sum_{t=j+1}^{p} a_pt (w_t . k_j)``. Across
    chunks, the query carried to its chunk's first position crosses every chunk in between
    whole and meets the key carried forward to its own chunk's last position."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.size(2)
    last = query_offset + tgt_len
    if tgt_len == 0:
        return q.new_zeros(batch, heads, 0, src_len)
    chunk = min(chunk, last)
    count = -(-last // chunk)
    extra = count * chunk - last  # padded positions: w = beta = 0, H = I, hidden keys

    def by_chunk(x: Tensor) -> Tensor:
        x = x[:, :, :last]
        x = F.pad(x, (0, extra) if x.dim() == 3 else (0, 0, 0, extra))
        return x.reshape(batch, heads, count, chunk, *x.shape[3:])

    keys, directions, strengths = by_chunk(k), by_chunk(w), by_chunk(beta)
    lower, upper = _carry_operators(directions, strengths)
    key_rows = (keys @ directions.transpose(-1, -2)).triu(1) * strengths[..., None, :]
    key_coeffs = torch.linalg.solve_triangular(upper, key_rows, upper=True, left=False, unitriangular=True)
    keys_at_end = keys - key_coeffs @ directions
    crossing = strengths[..., None] * torch.linalg.solve_triangular(lower, directions, upper=False, unitriangular=True)

    first = query_offset // chunk  # the chunks holding queries: first .. count - 1
    queries = F.pad(q, (0, 0, query_offset - first * chunk, extra)).reshape(batch, heads, count - first, chunk, dim)
    held = directions[:, :, first:]
    query_rows = (queries @ held.transpose(-1, -2)).tril() * strengths[:, :, first:, None, :]
    collected = torch.linalg.solve_triangular(
        lower[:, :, first:], query_rows, upper=False, left=False, unitriangular=True
    )
    local = (
        queries @ keys[:, :, first:].transpose(-1, -2)
        - collected @ (held @ keys[:, :, first:].transpose(-1, -2)).tril(-1)
    ).tril()
    at_start = queries - collected @ held

    zeros = q.new_zeros(batch, heads, 1, chunk, chunk)
    columns = [None] * count
    moving = at_start[:, :, :0]  # the query chunks after the column's, carried back to it
    for c in range(count - 1, -1, -1):
        blocks = [zeros.expand(-1, -1, max(c - first, 0), -1, -1)]
        if c >= first:
            blocks.append(local[:, :, c - first, None])
        if moving.size(2):
            blocks.append(moving @ keys_at_end[:, :, c, None].transpose(-1, -2))
            moving = moving - (moving @ directions[:, :, c, None].transpose(-1, -2)) @ crossing[:, :, c, None]
        if c >= first:
            moving = torch.cat([at_start[:, :, c - first, None], moving], dim=2)
        columns[c] = torch.cat(blocks, dim=2)
    logits = torch.stack(columns, dim=-2).reshape(batch, heads, (count - first) * chunk, count * chunk)
    start = query_offset - first * chunk
    logits = logits[:, :, start : start + tgt_len, :last]
    return F.pad(logits, (0, src_len - last)) if src_len > last else logits


def path_terms(
    q: Tensor,
    k: Tensor,
    w: Tensor,
    beta: Tensor,
    log_forget: Optional[Tensor] = None,
    *,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """PaTH's logits ``q_i^T H_p ... H_{j+1} k_j / sqrt(D)`` (with PaTH-FoX's gates), in
    place of ``q k^T / sqrt(D)``."""
    if not causal:
        raise ValueError(
            "causal must be True: PaTH multiplies the Householder matrices of the positions between a key "
            "and the later query, an order only causal attention has (fla defines no bidirectional form)"
        )
    batch, heads, tgt_len, src_len = q.size(0), q.size(1), q.size(2), k.size(2)
    _check_per_position("w", w, tuple(k.shape), "[B, H, Tk, D]", q)
    _check_per_position("beta", beta, (batch, heads, src_len), "[B, H, Tk]", q)
    _check_per_position("log_forget", log_forget, (batch, heads, src_len), "[B, H, Tk]", q)
    why = "a query at position p needs the w and beta of the positions up to p, given with the keys"
    check_queries_among_keys(tgt_len, query_offset, src_len, "", why)
    compute = logit_dtype(q.dtype)
    scale = 1.0 / math.sqrt(q.size(-1))
    with full_precision(q):
        directions = F.normalize(w.to(compute), dim=-1, eps=NORM_EPS)
        strengths = beta.to(compute)
        gates = None if log_forget is None else log_forget.to(compute)
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :]
            directions = directions.masked_fill(padded[..., None], 0.0)
            strengths = strengths.masked_fill(padded, 0.0)
            gates = None if gates is None else gates.masked_fill(padded, 0.0)
        logits = _path_logits_by_chunk(q.to(compute) * scale, k.to(compute), directions, strengths, query_offset, CHUNK)
        if gates is not None:
            cumulative = torch.cumsum(gates, dim=-1)
            rows = cumulative[..., query_offset : query_offset + tgt_len]
            logits = logits + (rows[..., :, None] - cumulative[..., None, :]) * scale
    return Terms(logits=logits)


path_attention = attention_op(
    path_terms,
    "path_attention",
    """PaTH attention: ``softmax_j(q_i^T H_p ... H_{j+1} k_j / sqrt(D)) v`` over the keys
    ``j <= p = query_offset + i``, with ``H_t = I - beta_t w_t w_t^T``.

    ``w`` ``[B, H, Tk, D]``: the Householder direction of every key position, normalised
    here to unit length per head (as fla's layer does before its op; any nonzero length
    may be given). ``beta`` ``[B, H, Tk]``: its strength, in (0, 2) as fla's ``2 *
    sigmoid`` gives it (not checked; 0 gives H_t = I). ``log_forget`` ``[B, H, Tk]`` or
    None: PaTH-FoX's log forget gates (<= 0, not checked), added as ``sum_{t=j+1}^{p}
    log f_t`` before the 1/sqrt(D) scaling, as fla does. All three may have any floating
    dtype (converted to the logit dtype) and are on q's device. The w, beta (and gates)
    of positions up to the last query's are needed: ``query_offset + Tq <= Tk``.

    Padding: a padded position's H_t is the identity (its beta and w set to 0) and its
    gate is 1, so it transforms and decays nothing; padded keys are hidden. Causal only:
    pass ``causal=True`` (the shared default, False, is refused). ``flex`` is checked and
    has no effect. Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])`` (``probs`` undropped,
    None with ``need_weights=False``); half inputs: logits in float32, ``out`` and
    ``probs`` in the input dtype. Every mistake is a ValueError naming the argument.""",
)


__all__ = ["path_attention"]
