"""Differentiable Window for dynamic local attention (Nguyen, Nguyen, Joty, Li 2020).

Trainable soft masking (sec. 3.2):
  eqs. (7)-(8)  phi_l = S(q W_L^Q (K W_L^K)^T / sqrt d),  phi_r likewise with W_R
  eq.  (9)      m = (phi_l^T L) * (phi_r^T L^T) + (phi_r^T L) * (phi_l^T L^T)
where phi^T L is the cumulative sum of phi over keys ("rightward", f) and
phi^T L^T the reverse cumulative sum ("leftward", g): m = f_l g_r + f_r g_l.
We compute both sums directly in O(Tq Tk); no triangular matrix is built.
Eq. 9 is implemented as written: where the two pointers agree on one key
(l = r) both terms count it, so a one-hot window of width 1 gives 2 there:
f_l g_r + f_r g_l = E[1{l <= j <= r}] + E[1{r <= j <= l}]
                  = E[1{min(l, r) <= j <= max(l, r)}] + p_l(j) p_r(j).
``expected=True`` (``--window-expected-mask``, off by default) departs from
the letter of eq. 9 for the value the paper states, m_hat = E(m) in [0, 1]:
M = eq. 9 - p_l(j) p_r(j) = E[1{min(l, r) <= j <= max(l, r)}] with l ~ p_l and
r ~ p_r independent.

Segment-based soft masking (sec. 3.3, eqs. 10-11): L is replaced by J with
J_ij = 1 iff i <= b * ceil(j / b), so every key of a segment of b keys gets
the cumulative sum up to the end of its segment (f) or from the start of its
segment (g). Segments are counted from each sequence's first real token, so
left padding does not shift a sentence's segment boundaries. Eq. 11 is the
token formula on the pointers' per-segment masses P(s) = sum_{seg(i) = s} p(i),
so ``expected=True`` there subtracts P_l(seg(j)) P_r(seg(j)), which gives
E[1{seg(min(l, r)) <= seg(j) <= seg(max(l, r))}].

Window attention (sec. 4):
  eqs. (12)-(13) MW:  (S(Q K^T / sqrt d) * M) V
  eqs. (14)-(17) AW:  S((Q_g K_g^T + (Q_l K_l^T) * M) / sqrt d) V
(eq. 14-15 of the extraction show Q in place of K on the right; we read the
key sequence, as the prose and eq. 1 do.)

The pointer softmaxes run over the keys the query may see (non-padding, and
not in the future when causal), so padding never receives window mass.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attend, attention_op, logit_dtype, masked_scores
from .masking import check_attention_arguments, check_tensor_argument, logit_mask, masked_softmax
from .paths import CallOptions
from .terms import Terms


def _cumulative_sums(pointer: Tensor) -> Tuple[Tensor, Tensor]:
    """(f, g): inclusive cumulative and reverse cumulative sums over keys."""
    rightward = torch.cumsum(pointer, dim=-1)
    return rightward, _leftward(pointer, rightward)


def _leftward(pointer: Tensor, rightward: Tensor) -> Tensor:
    """g = sum(p) - f + p, the reverse cumulative sum, from f; a fresh tensor."""
    return (pointer.sum(dim=-1, keepdim=True) - rightward).add_(pointer)


class _TokenWindowMask(torch.autograd.Function):
    """Eq. 9, ``m = f_l g_r + f_r g_l`` with ``f = cumsum(p)`` and
    ``g = sum(p) - f + p`` (minus ``p_l p_r`` when ``expected``), with its
    gradient in closed form.

    Autograd's own backward of this expression flips every cumsum twice and
    runs a dozen more passes over ``[B, H, Tq, Tk]``. Here, with ``dM`` the
    incoming gradient, ``F = dM g_r`` and ``G = dM f_r`` for the left pointer:
    ``dp_l = F + sum_j F - cumsum(F - G)`` (and the same with l and r swapped).
    Only the two cumsums ``f`` are kept; ``g`` is rebuilt in backward. With
    ``expected``, the ``- p_l p_r`` term adds ``-dM p_r`` to ``dp_l`` and
    ``-dM p_l`` to ``dp_r`` at the same key.
    """

    @staticmethod
    def forward(ctx, left_pointer: Tensor, right_pointer: Tensor, expected: bool = False) -> Tensor:
        mask, left_f, right_f = _token_window_mask(left_pointer, right_pointer, expected)
        ctx.expected = expected
        ctx.save_for_backward(left_pointer, right_pointer, left_f, right_f)
        return mask

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mask: Tensor):
        left_pointer, right_pointer, left_f, right_f = ctx.saved_tensors
        left_grad = _pointer_gradient(grad_mask, right_pointer, right_f)
        right_grad = _pointer_gradient(grad_mask, left_pointer, left_f)
        if ctx.expected:
            left_grad.addcmul_(grad_mask, right_pointer, value=-1)
            right_grad.addcmul_(grad_mask, left_pointer, value=-1)
        return left_grad, right_grad, None


def _window_from_sums(left_sums: Tuple[Tensor, Tensor], right_sums: Tuple[Tensor, Tensor]) -> Tensor:
    """``m = f_l g_r + f_r g_l`` (eqs. 9 and 11) from each pointer's ``(f, g)``."""
    (left_f, left_g), (right_f, right_g) = left_sums, right_sums
    return torch.addcmul(left_f * right_g, right_f, left_g)


def _token_window_mask(
    left_pointer: Tensor, right_pointer: Tensor, expected: bool = False
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(m, f_l, f_r)``: eq. 9 (minus ``p_l p_r`` when ``expected``) and the two
    cumulative sums its gradient needs."""
    left_sums, right_sums = _cumulative_sums(left_pointer), _cumulative_sums(right_pointer)
    mask = _window_from_sums(left_sums, right_sums)
    if expected:
        mask.addcmul_(left_pointer, right_pointer, value=-1)  # a fresh tensor: E[1{min(l,r) <= j <= max(l,r)}]
    return mask, left_sums[0], right_sums[0]


def _pointer_gradient(grad_mask: Tensor, other_pointer: Tensor, other_f: Tensor) -> Tensor:
    """Gradient for one pointer of :class:`_TokenWindowMask`, given the other's ``p`` and ``f``."""
    other_g = _leftward(other_pointer, other_f)
    through_f = grad_mask * other_g
    through_f_minus_g = other_g.sub_(other_f).mul_(grad_mask)
    return through_f.add_(through_f.sum(dim=-1, keepdim=True)).sub_(torch.cumsum(through_f_minus_g, dim=-1))


def key_segments(key_padding_mask: Optional[Tensor], src_len: int, segment_size: int, device) -> Tensor:
    """Segment index of every key, ``[B|1, 1, 1, Tk]``, counted from the first real token."""
    if key_padding_mask is None:
        rank = torch.arange(src_len, device=device)[None, :]
    else:
        rank = torch.cumsum((~key_padding_mask.to(torch.bool)).long(), dim=-1) - 1
    return (rank.clamp(min=0) // segment_size)[:, None, None, :]


def _segment_cumulative_sums(
    pointer: Tensor, segments: Tensor, num_segments: int
) -> Tuple[Tuple[Tensor, Tensor], Tensor]:
    """((f, g), P) of eq. 11: cumulative sums over whole segments, and the
    pointer's total mass P in each key's own segment, read back per key."""
    index = segments.expand_as(pointer)
    per_segment = pointer.new_zeros(pointer.shape[:-1] + (num_segments,))
    per_segment.scatter_add_(-1, index, pointer)
    rightward, leftward = _cumulative_sums(per_segment)
    return (rightward.gather(-1, index), leftward.gather(-1, index)), per_segment.gather(-1, index)


def window_mask(
    q_left: Tensor,
    k_left: Tensor,
    q_right: Tensor,
    k_right: Tensor,
    segment_size: int = 0,
    *,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    expected: bool = False,
) -> Tensor:
    """Soft window mask M ``[B, H, Tq, Tk]`` of eq. 9 (``segment_size=0``) or eq. 11
    (``segment_size=b>0``); float32 for half inputs. Not an attention op (no
    values): it takes the positional conventions but no dropout or weights.

    ``expected=True`` departs from eq. 9/11 as written (which count a key twice
    where both pointers fall on it, so M reaches 2): it returns the paper's
    stated m_hat = E[1{min(l, r) <= j <= max(l, r)}] in [0, 1], i.e. eq. 9 minus
    ``p_l(j) p_r(j)``, or with segments eq. 11 minus ``P_l(seg(j)) P_r(seg(j))``
    (each pointer's mass in key j's segment), = E[1{seg(min) <= seg(j) <= seg(max)}]."""
    left, right = ("q_left", "k_left", None, "key_padding_mask"), ("q_right", "k_right", None, "key_padding_mask")
    check_attention_arguments(q_left, k_left, None, key_padding_mask, causal, query_offset, names=left)
    check_tensor_argument("q_right", q_right, "q_left", q_left)
    check_attention_arguments(q_right, k_right, None, key_padding_mask, causal, query_offset, names=right)
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 0:
        raise ValueError(f"segment_size must be an integer >= 0 (0: token-level eq. 9), got {segment_size!r}")
    if not isinstance(expected, bool):
        raise ValueError(f"expected must be a bool, got {expected!r}")
    tgt_len, src_len = q_left.size(2), k_left.size(2)
    # pointers, their cumulative sums and eq. 9's products stay in float32 for
    # half inputs: a float16 cumsum over Tk keys loses ~Tk ulps
    compute = logit_dtype(q_left.dtype)
    mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q_left.device, compute)
    left_pointer = masked_softmax(masked_scores(q_left, k_left, mask), hidden)
    right_pointer = masked_softmax(masked_scores(q_right, k_right, mask), hidden)
    if segment_size > 0:
        segments = key_segments(key_padding_mask, src_len, segment_size, q_left.device)
        num_segments = (src_len + segment_size - 1) // segment_size
        left_sums, left_mass = _segment_cumulative_sums(left_pointer, segments, num_segments)
        right_sums, right_mass = _segment_cumulative_sums(right_pointer, segments, num_segments)
        mask = _window_from_sums(left_sums, right_sums)
        return torch.addcmul(mask, left_mass, right_mass, value=-1) if expected else mask
    if torch.is_grad_enabled() and (left_pointer.requires_grad or right_pointer.requires_grad):
        return _TokenWindowMask.apply(left_pointer, right_pointer, expected)
    # generation calls this once per windowed layer and step: skip autograd's bookkeeping
    return _token_window_mask(left_pointer, right_pointer, expected)[0]


def _check_window(mask: Tensor, q: Tensor, k: Tensor, q_name: str = "q") -> None:
    expected = (q.size(0), q.size(1), q.size(2), k.size(2))
    if not isinstance(mask, Tensor) or tuple(mask.shape) != expected:
        raise ValueError(
            f"mask must be the [B, H, Tq, Tk] = {expected} window of window_mask, got "
            f"{tuple(mask.shape) if isinstance(mask, Tensor) else repr(mask)}"
        )
    # window_mask's dtype: q's, or float32 for half q
    check_tensor_argument("mask", mask, q_name, q, (logit_dtype(q.dtype),))


def multiplicative_window_terms(q: Tensor, k: Tensor, mask: Tensor) -> Terms:
    """MW's window M, which multiplies the weights (eq. 13)."""
    _check_window(mask, q, k)
    return Terms(window=mask)


multiplicative_window_attention = attention_op(
    multiplicative_window_terms,
    "multiplicative_window_attention",
    """MW, eqs. 12-13. Returns ``(out, weights)``; weights = softmax * M (rows need
    not sum to 1). Where :func:`paths.choose_path` takes flex (CUDA, no weights,
    no dropout, full sequences) it runs as :func:`flex.flex_windowed_attend`.""",
)


def additive_window_terms(
    q_global: Tensor,
    k_global: Tensor,
    q_local: Tensor,
    k_local: Tensor,
    mask: Tensor,
    *,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """AW's masked local scores (eqs. 14-16), an additive bias on the global ones."""
    check_tensor_argument("q_local", q_local, "q_global", q_global)
    local_names = ("q_local", "k_local", None, "key_padding_mask")
    check_attention_arguments(q_local, k_local, None, key_padding_mask, causal, query_offset, names=local_names)
    _check_window(mask, q_global, k_global, "q_global")
    # the local scores times M are formed in float32 for half inputs (M is, see window_mask)
    return Terms(bias=masked_scores(q_local, k_local, None) * mask)


def additive_window_attention(
    q_global: Tensor,
    k_global: Tensor,
    q_local: Tensor,
    k_local: Tensor,
    v: Tensor,
    mask: Tensor,
    *,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
    flex: str = "auto",
    position_map: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """AW, eqs. 14-17. Returns ``(out, probs)``; the masked local scores are an
    additive bias, so ``need_weights=False`` runs fused and returns ``(out, None)``.
    (Its own signature, not :func:`attention.attention_op`'s: the local projections
    come before the values.)"""
    global_names = ("q_global", "k_global", "v", "key_padding_mask")
    check_attention_arguments(
        q_global, k_global, v, key_padding_mask, causal, query_offset, dropout_p, names=global_names
    )
    if position_map is not None:
        raise ValueError("additive_window_attention reads no positions: position_map must be None")
    options = CallOptions(key_padding_mask, causal, query_offset, dropout_p, need_weights, flex)
    local = dict(key_padding_mask=key_padding_mask, causal=causal, query_offset=query_offset)
    return attend(
        q_global, k_global, v, additive_window_terms(q_global, k_global, q_local, k_local, mask, **local), options
    )


def differentiable_window_terms(
    q: Tensor,
    k: Tensor,
    q_left: Tensor,
    k_left: Tensor,
    q_right: Tensor,
    k_right: Tensor,
    q_local: Optional[Tensor] = None,
    k_local: Optional[Tensor] = None,
    *,
    segment_size: int = 0,
    expected: bool = False,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """The soft mask of eq. 9 (or eq. 11 with ``segment_size`` > 0; ``expected`` as in
    :func:`window_mask`) from the boundary projections, as MW's window (eqs. 12-13),
    or as AW's bias (eqs. 14-17) when the local projections are given."""
    if (q_local is None) != (k_local is None):
        raise ValueError("q_local and k_local are given together (AW) or not at all (MW)")
    mask = window_mask(
        q_left,
        k_left,
        q_right,
        k_right,
        segment_size,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
        expected=expected,
    )
    if q_local is None:
        return multiplicative_window_terms(q, k, mask)
    local = dict(key_padding_mask=key_padding_mask, causal=causal, query_offset=query_offset)
    return additive_window_terms(q, k, q_local, k_local, mask, **local)


differentiable_window_attention = attention_op(
    differentiable_window_terms,
    "differentiable_window_attention",
    """The whole mechanism in one call: the soft mask of eq. 9 (or eq. 11 with
    ``segment_size`` > 0; ``expected`` as in :func:`window_mask`) from the
    boundary projections, then MW (eqs. 12-13), or AW (eqs. 14-17) when the
    local projections ``q_local``, ``k_local`` are given. Returns ``(out, probs)``
    as :func:`multiplicative_window_attention` and :func:`additive_window_attention` do.""",
)


__all__ = [
    "additive_window_attention",
    "differentiable_window_attention",
    "multiplicative_window_attention",
    "window_mask",
]
