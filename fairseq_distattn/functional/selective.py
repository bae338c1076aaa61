"""Selective attention (Leviathan, Kalman, Matias 2024, *Selective Attention
Improves Transformer*, arXiv:2410.02703, sec. 3).

A token may decide that an earlier token is no longer needed by the tokens that
follow it. Nothing is learned for this: the attention logits of one head (head 0)
are reused as the selection. With ``l^h_ij = q^h_i . k^h_j / sqrt(d)`` the scaled
logits of head h, query i and key j,

    S_ij = ReLU(l^0_ij)          for 0 < j < i, and S_ij = 0 otherwise,
    F_ij = sum_{i' < i} S_i'j,
    a^h_i = softmax_j(l^h_ij - F_ij)   over the keys j <= i, for every head h
                                       (head 0 included).

``S_ij`` is how much token i masks token j for the tokens after i; ``F`` accumulates
it, shifted by one query so that a token's own selection only acts on later
queries. The constraints on S are the paper's: no selection of a key after the
query (the causal mask is applied before the ReLU, so a hidden logit gives 0), of
the token itself (``S_ii = 0``, "do not mask self") or of the first token
(``S_i0 = 0``, "do not mask <BOS>").

The paper's code listing (its sketch implementation, Figure 2) does exactly this on
the scaled, causally masked logits ``[b, h, n, n]``: ``S = attn_logits[:, 0]``
(head 0), ``relu``, ``S[..., 0] = 0`` (<BOS>), ``S = (1 - eye(n)) * S`` (self),
``roll(S, 1, -2)`` and ``S[..., 0, :] = 0`` (strictly the future), ``F = cumsum(S,
axis=-2)``, ``attn_logits -= F[:, None]``, then the softmax. It has no padding and
computes the whole ``n x n`` block at once (no incremental decoding).

x-transformers (github.com/lucidrains/x-transformers at commit
9252ed7838021ee61e6c5be0930b3a9a88efdf06, ``x_transformers/attend.py``,
``selective_attn`` and ``Attend(selective=True)``, which requires ``causal``) agrees
on the square block with no padding: head 0 (``sim[:, 0]``), the logits scaled by
``dim_head ** -0.5`` and masked (padding, causal: filled with ``-finfo.max``) before
the ReLU, the first key and the diagonal zeroed, the shift as a one-row pad, the
cumsum, subtracted from every head. It departs from the listing where the block is
not square or holds padding; this op follows the listing (the authors' code) there:

* More keys than queries (``j > i``: its one-token decoding step on a key cache,
  or memory key/values): it takes the ``j - i`` first keys for a prefix that is
  never selected (its eye matrix is padded with ones there) and protects key
  ``j - i`` instead of key 0; the earlier queries' selections are not at hand. A
  one-token decoding step there gets no penalty at all (every entry of its gate is
  zeroed), so its decoding does not reproduce its full forward. Here the keys are
  the positions 0..Tk-1, the earlier rows' selections are carried
  (``selection_state`` below) and decoding equals the full forward exactly.
* The logits it selects with are those after its other additions (an
  ``attn_bias`` such as ALiBi, soft clamping, CoPE); the listing's are the plain
  scaled ``q k^T``, which is what ``score_mod`` receives here.
* It protects column 0 whatever the padding; with left padding that is a pad, and
  the sequence's first token may be selected. Here the first token is the first
  real key (below).

Padding (``key_padding_mask``; neither reference defines it beyond x-transformers'
masking): a padded key is never selected (``S`` is 0 in its column, as
x-transformers' masked logit gives: no attention weight depends on it, the column
being hidden, but ``F`` and the state stay free of pads); a padded query selects
nothing (``S`` is 0 in its row: the query at position p is the token of key p,
x-transformers lets it select); and the protected first token is each sequence's
first real key (key 0 without padding, as :func:`masking.sequence_positions` counts
positions). So a padded sequence, left- or right-padded or with holes, gets on its
real tokens exactly what the listing gives the sequence without its pads.

Incremental decoding: ``F`` of a query at position p needs the selections of every
earlier query. A call whose first query is at ``query_offset > 0`` takes them as
``selection_state`` ``[B, 1, W]`` (``query_offset <= W <= Tk``): per key j < W, the
sum of ``S_i'j`` over the query positions ``i' < query_offset`` (keys from W on count
as not selected yet). :func:`selection_penalty` returns the state after its rows,
``[B, 1, Tk]``, to pass to the call that starts at the next query. The same holds
for a caller that splits the query rows into blocks: each block needs the state of
the rows before it (a row depends on the earlier rows' queries).

Causal only (the paper's models are decoders; x-transformers asserts it too): the
selection masks a token for the tokens after it.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype, scores
from .masking import check_attention_arguments, check_queries_among_keys, check_tensor_argument, relative_distance
from .terms import Terms

SELF_ATTENTION_ONLY = "selective attention is self-attention, the token of each query's position is among the keys"


def _check_selection_state(selection_state: Optional[Tensor], q: Tensor, k: Tensor, query_offset: int) -> None:
    """Type, shape and device of ``selection_state``: a ValueError naming it. Attribute
    comparisons only."""
    if selection_state is None:
        if query_offset > 0:
            raise ValueError(
                f"selection_state is required with query_offset {query_offset} > 0: the penalty of a query "
                f"depends on the selections of every earlier query (pass the state selection_penalty returned "
                f"for the earlier rows)"
            )
        return
    check_tensor_argument("selection_state", selection_state, "q", q, dtypes=None)  # any floating dtype: converted
    batch, src_len = q.size(0), k.size(2)
    shape = tuple(selection_state.shape)
    if len(shape) != 3 or shape[:2] != (batch, 1) or not query_offset <= shape[2] <= src_len:
        raise ValueError(
            f"selection_state must be [B, 1, W] with B = {batch} and query_offset <= W <= Tk "
            f"({query_offset} <= W <= {src_len}): the earlier queries' summed selection of each key, got {shape}"
        )


def _selectable(key_padding_mask: Optional[Tensor], tgt_len: int, src_len: int, query_offset: int, device) -> Tensor:
    """Bool ``[B or 1, Tq, Tk]``, True where ``S`` may be nonzero: key before the query
    (neither after it nor itself), not the sequence's first real key, and neither the
    key nor the query (the token of key ``query_offset + i``) a pad."""
    earlier = relative_distance(tgt_len, src_len, query_offset, device) < 0  # j < p
    keys = torch.arange(src_len, device=device)
    if key_padding_mask is None:
        return (earlier & (keys != 0))[None]
    real = ~key_padding_mask
    if src_len == 0:
        return earlier[None] & real[:, None, :]  # [B, Tq, 0]
    first = torch.where(real.any(dim=-1), real.to(torch.int8).argmax(dim=-1), 0)  # [B]
    selectable_keys = real & (keys[None, :] != first[:, None])  # [B, Tk]
    real_queries = real[:, query_offset : query_offset + tgt_len]  # [B, Tq]
    return earlier[None] & selectable_keys[:, None, :] & real_queries[:, :, None]


def _penalty(selector_scores: Tensor, selectable: Tensor, selection_state: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(F [B, 1, Tq, Tk], state after these rows [B, 1, Tk])`` from the selecting
    head's scaled scores ``[B, Tq, Tk]``, in their dtype; unchecked."""
    batch, tgt_len, src_len = selector_scores.shape
    selection = torch.where(selectable, torch.relu(selector_scores), 0.0)
    accumulated = torch.cumsum(selection, dim=-2)  # row i: sum over rows <= i
    # shifted by one row: row i gets the rows before it (the listing's roll, row 0 zeroed, cumsum)
    penalty = torch.zeros_like(accumulated)
    penalty[:, 1:] = accumulated[:, :-1]
    state = accumulated[:, -1:] if tgt_len > 0 else selection.new_zeros(batch, 1, src_len)
    if selection_state is not None:
        earlier = selection_state.to(selection.dtype)
        earlier = torch.nn.functional.pad(earlier, (0, src_len - earlier.size(-1)))
        penalty = penalty + earlier
        state = state + earlier
    return penalty[:, None], state


def selection_penalty(
    q: Tensor,
    k: Tensor,
    selection_state: Optional[Tensor] = None,
    *,
    key_padding_mask: Optional[Tensor] = None,
    query_offset: int = 0,
) -> Tuple[Tensor, Tensor]:
    """``(F, state)``: the penalty ``F`` ``[B, 1, Tq, Tk]`` that :func:`selective_attention`
    subtracts from every head's logits, ``F_ij = sum_{i' < p} S_i'j`` for the query
    at position ``p = query_offset + i``, with ``S`` from head 0's scaled scores
    ``q[:, 0] k[:, 0]^T / sqrt(D)`` (the module docstring: causal, not self, not the
    first real key, no pads); and ``state`` ``[B, 1, Tk]``, the summed selections of
    the query positions up to the last of these rows, which is the
    ``selection_state`` of the call whose first query follows them.

    ``selection_state`` ``[B, 1, W]`` (``query_offset <= W <= Tk``, any floating dtype,
    on q's device) is that of the rows before ``query_offset``: required when
    ``query_offset > 0``. ``query_offset + Tq <= Tk``. Both are in
    :func:`attention.logit_dtype` (float32 for half inputs); a wrong argument is a
    ValueError naming it."""
    check_attention_arguments(q, k, None, key_padding_mask, True, query_offset)
    check_queries_among_keys(q.size(2), query_offset, k.size(2), "", SELF_ATTENTION_ONLY)
    _check_selection_state(selection_state, q, k, query_offset)
    selectable = _selectable(key_padding_mask, q.size(2), k.size(2), query_offset, q.device)
    return _penalty(scores(q[:, :1], k[:, :1])[:, 0], selectable, selection_state)


def selective_terms(
    q: Tensor,
    k: Tensor,
    selection_state: Optional[Tensor] = None,
    *,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """The selection penalty ``F`` (:func:`selection_penalty`), subtracted from the scores."""
    if not causal:
        raise ValueError(
            "causal must be True: selective attention lets a token mask earlier tokens for the tokens after it, "
            "which is defined for causal attention only"
        )
    check_queries_among_keys(q.size(2), query_offset, k.size(2), "", SELF_ATTENTION_ONLY)
    _check_selection_state(selection_state, q, k, query_offset)
    selectable = _selectable(key_padding_mask, q.size(2), k.size(2), query_offset, q.device)
    state = None if selection_state is None else selection_state.to(logit_dtype(q.dtype))

    def select(scaled_scores: Tensor, mask: Optional[Tensor]) -> Tensor:
        penalty, _ = _penalty(scaled_scores[:, 0], selectable, state)
        return scaled_scores - penalty

    return Terms(score_mod=select)


selective_attention = attention_op(
    selective_terms,
    "selective_attention",
    """Selective attention: ``softmax(q k^T / sqrt(D) - F) v`` over the keys up to
    each query, with the penalty ``F`` ``[B, 1, Tq, Tk]`` of :func:`selection_penalty`
    (head 0's selections, shared by every head). Causal only: pass ``causal=True``
    (the shared default, False, is refused). ``query_offset + Tq <= Tk``; a call
    with ``query_offset > 0`` (incremental decoding) takes the earlier queries'
    ``selection_state`` from :func:`selection_penalty` and then equals the
    corresponding rows of the full call. Returns ``(out [B,H,Tq,D], probs
    [B,H,Tq,Tk])`` (``probs`` None unless ``need_weights``); no fused path: the
    penalty is a function of the whole block of scores.""",
)


__all__ = ["selection_penalty", "selective_attention"]
