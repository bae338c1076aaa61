"""CoPE: contextual position encoding (Golovneva, Wang, Weston, Sukhbaatar
2024, *Contextual Position Encoding: Learning to Count What's Important*, sec. 3).

Positions are counted by the context instead of by tokens. Each key gets a
gate from its query, and a key's position is the sum of the gates from it up
to the query (eq. 3-4):

    g_ij = sigmoid(q_i . k_j),        p_ij = sum_{t=j}^{i} g_it,

fractional, so its embedding is interpolated between the learned embeddings
of the integer positions around it (eq. 5), ``e[p] = (p - floor p) e[ceil p]
+ (1 - p + floor p) e[floor p]``, and the attention is (eq. 6)

    a_ij = softmax_j( q_i . (k_j + e[p_ij]) ).

As the authors' code computes it (facebookresearch/RAM,
``projects/cope/src/cope/context_position.py``, its default path): the gates
are ``sigmoid(q_i . k_j / sqrt(d))`` on the scaled scores, zero on the keys the
query may not see (after it, padding); the positions are clamped to
``npos - 1``; the table ``e`` is ``[d, npos]``, one per layer shared by its
heads, initialised to zeros (so a fresh model has no position information),
and interpolation is done on the logits ``q_i . e[p]`` of the integer
positions (``q @ e``, the same by linearity); the logits are
``(q_i . k_j + q_i . e[p_ij]) / sqrt(d)``. (The paper's listing adds the
position term unscaled, the authors' ``--cope-nodiv``; the default scales it.)

The sum runs from the key to the query, a causal count (the paper's models
are decoders); the whole logit row is needed for it, so there is no fused
path.
"""

from typing import Optional

import torch
from torch import Tensor

from ..registry import OptionContext, SpecError, positive_integer
from .attention import attention_op, logit_dtype, logit_product, scores
from .masking import check_attention_arguments, check_tensor_argument, logit_mask
from .terms import Terms

# the rule of the command line's --cope-max-positions (mechanisms/cope.py), for the functional npos
_check_npos = positive_integer("--cope-max-positions")


def check_npos(npos) -> None:
    """ValueError naming ``npos`` unless it is a number of positions that
    ``--cope-max-positions`` accepts (the same converter: an integer >= 1)."""
    try:
        _check_npos(npos, OptionContext())
    except SpecError as error:
        raise ValueError(f"npos {error.problem} (as --cope-max-positions: {error.allowed}), got {npos!r}") from None


def check_position_table(table, q: Optional[Tensor] = None) -> None:
    if not isinstance(table, Tensor) or table.dim() != 2 or table.size(1) < 1:
        shape = tuple(table.shape) if isinstance(table, Tensor) else repr(table)
        raise ValueError(f"position_embeddings must be [D, npos] with npos >= 1, got {shape}")
    if q is None:
        check_tensor_argument("position_embeddings", table)
        return
    check_tensor_argument("position_embeddings", table, "q", q, dtypes=None)  # any floating dtype: converted
    if table.size(0) != q.size(-1):
        raise ValueError(f"position_embeddings must be [D, npos] with D = {q.size(-1)}, got {tuple(table.shape)}")


def contextual_positions(scaled_scores: Tensor, mask: Optional[Tensor], max_position: int) -> Tensor:
    """``p_ij = sum_{t=j}^{i} sigmoid(s_it)`` over the visible keys (``mask``: 0 or
    -inf, broadcastable), clamped to ``max_position``: ``[B, H, Tq, Tk]``."""
    gates = torch.sigmoid(scaled_scores if mask is None else scaled_scores + mask)
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=max_position)


def interpolated_position_logits(q: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    """``q_i . e[p_ij]`` with ``e`` interpolated at the fractional positions (eq. 5),
    from the logits of the integer positions ``q @ table``; in the positions' dtype
    (:func:`attention.logit_product`: from float32 copies of half ``q``)."""
    integer_logits = logit_product(q, table).to(positions.dtype)  # [B, H, Tq, npos]
    # A NaN position (NaN scores: a NaN query or key, a diverging model) reads entry 0 and stays NaN
    # through the weight, so its logit is NaN, as any other mechanism's would be, rather than an index
    # out of range (NaN as long is -2^63: an IndexError on CPU, a device-side assert on CUDA) that
    # would pre-empt fairseq's own NaN detection.
    readable = positions.nan_to_num(nan=0.0)
    floor = readable.floor()
    weight = positions - floor  # differentiable: the gates learn through it
    below = integer_logits.gather(-1, floor.long())
    above = integer_logits.gather(-1, readable.ceil().long())
    return above * weight + below * (1 - weight)


def cope_positions(
    q: Tensor,
    k: Tensor,
    npos: int,
    *,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = True,
    query_offset: int = 0,
) -> Tensor:
    """The contextual positions ``p_ij`` ``[B, H, Tq, Tk]`` (clamped to ``npos - 1``)
    that :func:`cope_attention` uses, for inspection; 0 on hidden keys. ``npos``,
    the number of learned positions, is an integer >= 1, as the command line's
    ``--cope-max-positions`` (else a ValueError naming it)."""
    check_attention_arguments(q, k, None, key_padding_mask, causal, query_offset)
    check_npos(npos)
    mask, _ = logit_mask(key_padding_mask, causal, query_offset, q.size(2), k.size(2), q.device, logit_dtype(q.dtype))
    return contextual_positions(scores(q, k), mask, npos - 1)


def cope_terms(q: Tensor, k: Tensor, position_embeddings: Tensor) -> Terms:
    """CoPE's score modification: ``q_i . e[p_ij] / sqrt(D)`` added to each score, at the
    contextual positions ``p_ij`` its gates count over the visible keys."""
    check_position_table(position_embeddings, q)
    scale = q.size(-1) ** -0.5
    max_position = position_embeddings.size(1) - 1

    def with_positions(scaled_scores: Tensor, mask: Optional[Tensor]) -> Tensor:
        positions = contextual_positions(scaled_scores, mask, max_position)
        return scaled_scores + interpolated_position_logits(q, position_embeddings, positions) * scale

    return Terms(score_mod=with_positions)


cope_attention = attention_op(
    cope_terms,
    "cope_attention",
    """``softmax((q_i . k_j + q_i . e[p_ij]) / sqrt(D)) v`` with the learned
    ``position_embeddings`` ``e`` ``[D, npos]`` shared by the heads. Returns
    ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])`` (``probs`` None unless ``need_weights``);
    no fused path: the positions need the whole row of gates.""",
)


__all__ = ["cope_attention", "cope_positions"]
