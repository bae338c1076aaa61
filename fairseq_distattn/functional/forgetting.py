"""FoX: Forgetting Attention (Lin, Nikishin, He, Courville 2025, *Forgetting
Transformer: Softmax Attention with a Forget Gate*, ICLR 2025, arXiv:2503.02130).

The paper's Forgetting Attention: every head has a scalar forget gate per position,

    f_t = sigmoid(w_f^T x_t + b_f),

and a query i weighs key j <= i by the product of the gates after j,

    o_i = sum_{j<=i} F_ij exp(q_i^T k_j) v_j / sum_{j<=i} F_ij exp(q_i^T k_j),
    F_ij = prod_{l=j+1}^{i} f_l,

which in matrix form is softmax attention with an additive, data-dependent bias,

    O = softmax(Q K^T + D) V,   D_ij = log F_ij = sum_{l=j+1}^{i} log f_l  (j <= i),
    D_ij = -inf  (j > i),

computed as D = c 1^T - 1 c^T with c_i = sum_{l<=i} log f_l. The sum runs over
j+1..i: D_ii = 0 (a query never decays its own key) and the first position's gate
never enters any entry (it cancels). No position embedding is needed. With the
usual scale the logits are ``q k^T / sqrt(D) + D``: both codes below scale ``q k^T``
alone and add ``D`` unscaled.

As the authors' code computes it (``src/forgetting_transformer/ops/forgetting_attention.py``
of github.com/zhixuan-lin/forgetting-transformer at commit
883f260c636e87971339749b0d8310004794a5cc: ``ForgettingAttention.forward`` and
``_fwd_kernel``): ``log_fgate`` ``[B, H, Tk]`` is ``logsigmoid`` of the gate logits
(float32, their model casts the logits first); ``log_lambda`` is its inclusive
``cumsum`` over positions; a query row at position p gets
``q . k_j * sm_scale + (log_lambda[p] - log_lambda[j])``: the scale
``sm_scale = 1/sqrt(D)`` multiplies ``q k^T`` only, the bias is added unscaled.
Causal only (``assert causal``); the queries are the last ``Tq`` of the ``Tk``
positions (``P_SEQ = Tk - Tq``: incremental decoding, here ``query_offset``).
Padding: left padding only, as ``seq_start`` (the first real position of each
sequence): keys before it are hidden, query rows before it give 0, and
``log_fgate`` is set to 0 before it ahead of the cumsum (their comment: so that
padded values cannot reach the result through the cumsum's rounding), which
changes no visible entry: c_i - c_j for j >= seq_start sums gates after j only.

Here: the same arithmetic in :func:`forget_gate_bias` (``c`` in the logit dtype:
float32 for half inputs, as the authors keep ``log_fgate`` and their accumulators
in float32) and :func:`forgetting_attention`, which adds it to ``q k^T / sqrt(D)``
through :func:`attention.attend` (fused SDPA with ``need_weights=False``). For
padding it zeroes ``log_forget`` at every padded key before the cumsum: for left
padding exactly the authors' step; for padding elsewhere (which the authors'
kernel does not take) a padded token neither is attended to nor decays the keys
before it, as if it were not in the sequence.

flash-linear-attention's reference (``fla/ops/forgetting_attn/naive.py``,
``naive_forgetting_attn``, github.com/fla-org/flash-linear-attention at commit
bc3b101dcb713ddc5bd8924b66754eb68b5ccf89) forms the same bias: the inclusive
``g.float().cumsum`` over time, ``gc_i - gc_j`` added unscaled to
``(q * scale) k^T`` (its kernel ``fla/ops/attn/parallel.py`` likewise folds only
log2(e) into the cumsum, never ``scale``), a causal ``tril`` mask, softmax. It
differs in form only: ``[B, T, H, D]`` layout with ``g`` ``[B, T, HQ]``, grouped
keys (GQA), an optional sliding window, float32 computation, Tq = Tk and no
padding. Its layer (``fla/layers/forgetting_attn.py``) handles padding by removing
the padded tokens (``unpad_input``, then a per-sequence cumsum over
``cu_seqlens``), which is what zeroing the padded gates gives here for any
padding; fla's one-step decoding kernel (``fla/ops/attn/decoding.py``) has a
``do_gate_scale`` option that would multiply the gates by ``scale`` too, off by
default and left off by the FoX layer.

The bidirectional form is not FoX's (the gate is a product over the positions
between query and key in one direction). x-transformers' ``DataDependentAlibi``
(github.com/lucidrains/x-transformers at commit 9252ed7,
``x_transformers/x_transformers.py``) defines one for its encoder: a second set
of gates ``g`` per head, whose inclusive cumsum ``r`` gives the keys after the
query ``r_j - r_p = sum_{l=p+1}^{j} log g_l`` (``forget_gates_reversed``, its
``triu``), the keys before it FoX's ``c_p - c_j`` (its ``tril``), 0 on the
diagonal from both. :func:`forgetting_attention` takes it as
``log_forget_backward`` with ``causal=False``, and refuses ``causal=False``
without it.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_queries_among_keys, check_tensor_argument, relative_distance
from .position_tables import check_position_argument
from .terms import Terms

FORGET_GATES_WITH_KEYS = (
    "the forget gate bias of a query at position p needs the gates of positions up to p, given with the keys"
)


def _check_log_forget(
    log_forget: Tensor, shape: Optional[Tuple[int, int, int]], like: Optional[Tensor], name: str = "log_forget"
) -> None:
    """Type, shape and device of ``log_forget`` (``shape`` ``(B, H, Tk)`` when known):
    a ValueError naming it. Attribute comparisons only."""
    check_tensor_argument(name, log_forget, "q", like, dtypes=None)  # any floating dtype: converted
    if log_forget.dim() != 3 or (shape is not None and tuple(log_forget.shape) != shape):
        wanted = "[B, H, Tk]" if shape is None else f"[B, H, Tk] = {shape}"
        raise ValueError(f"{name} must be {wanted}, one log gate per key position, got {tuple(log_forget.shape)}")


def _bias(log_forget: Tensor, tgt_len: int, query_offset: int) -> Tensor:
    """``c[query_offset + i] - c[j]`` with ``c`` the inclusive cumsum of ``log_forget``
    over positions, in ``log_forget``'s dtype; unchecked."""
    cumulative = torch.cumsum(log_forget, dim=-1)
    rows = cumulative[..., query_offset : query_offset + tgt_len]
    return rows[..., :, None] - cumulative[..., None, :]


def forget_gate_bias(log_forget: Tensor, tgt_len: int, query_offset: int = 0) -> Tensor:
    """FoX's bias ``D`` as ``[B, H, Tq, Tk]`` from ``log_forget`` ``[B, H, Tk]``
    (log f of every key position 0..Tk-1, <= 0 and finite: the caller's, as every op's
    checks read attributes only, never values; NaN or -inf gives NaN): entry (i, j) is
    ``c[p] - c[j]`` with ``p = query_offset + i`` and ``c`` the inclusive cumulative
    sum of ``log_forget`` over positions, i.e. ``sum_{l=j+1}^{p} log f_l`` for
    ``j <= p`` (0 on ``j = p``). Entries with ``j > p`` keep the same formula
    (``-sum_{l=p+1}^{j} log f_l >= 0``, finite): the causal mask hides them, and
    the bias is only FoX's under it.

    Formed in :func:`attention.logit_dtype` of ``log_forget``'s dtype (float32 for
    half). ``query_offset + tgt_len`` must not exceed Tk (the gates up to the last
    query's position are needed); a wrong argument is a ValueError naming it.
    Padded positions are the caller's: :func:`forgetting_attention` zeroes their
    gates first."""
    _check_log_forget(log_forget, None, None)
    check_position_argument("tgt_len", tgt_len)
    check_position_argument("query_offset", query_offset)
    check_queries_among_keys(tgt_len, query_offset, log_forget.size(-1), "", FORGET_GATES_WITH_KEYS)
    return _bias(log_forget.to(logit_dtype(log_forget.dtype)), tgt_len, query_offset)


def forgetting_terms(
    q: Tensor,
    k: Tensor,
    log_forget: Tensor,
    log_forget_backward: Optional[Tensor] = None,
    *,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """FoX's bias ``D_ij = sum_{l=j+1}^{p} log f_l`` (:func:`forget_gate_bias`), ``[B, H, Tq, Tk]``;
    with ``log_forget_backward`` (``causal=False``), x-transformers' bidirectional form."""
    if causal == (log_forget_backward is not None):
        raise ValueError(
            "causal must be True: FoX's forget gate is defined for causal attention (the bidirectional form, "
            "x-transformers' DataDependentAlibi, takes log_forget_backward with causal=False)"
            if not causal
            else "log_forget_backward is the bidirectional form's (causal=False); a causal call takes log_forget only"
        )
    batch, heads, tgt_len, src_len = q.size(0), q.size(1), q.size(2), k.size(2)
    _check_log_forget(log_forget, (batch, heads, src_len), q)
    check_queries_among_keys(tgt_len, query_offset, src_len, "", FORGET_GATES_WITH_KEYS)
    gates = [log_forget] if causal else [log_forget, log_forget_backward]
    if not causal:
        _check_log_forget(log_forget_backward, (batch, heads, src_len), q, "log_forget_backward")
    gates = [gate.to(logit_dtype(q.dtype)) for gate in gates]
    if key_padding_mask is not None:
        gates = [gate.masked_fill(key_padding_mask[:, None, :], 0.0) for gate in gates]
    earlier = _bias(gates[0], tgt_len, query_offset)
    if causal:
        return Terms(bias=earlier)
    later = _bias(gates[1], tgt_len, query_offset).neg_()  # r_j - r_p
    before = relative_distance(tgt_len, src_len, query_offset, q.device) <= 0
    return Terms(bias=torch.where(before, earlier, later))


forgetting_attention = attention_op(
    forgetting_terms,
    "forgetting_attention",
    """Forgetting Attention: ``softmax(q k^T / sqrt(D) + D) v`` with FoX's bias
    ``D_ij = sum_{l=j+1}^{p} log f_l`` (:func:`forget_gate_bias`) over the keys
    ``j <= p = query_offset + i``. ``log_forget`` ``[B, H, Tk]`` is log f of every key
    position (``logsigmoid`` of the gate logits), of any floating dtype, on q's
    device; every entry <= 0 and finite (unchecked, as no op reads values: a -inf gate
    gives NaN, -inf - -inf), and
    ``query_offset + Tq <= Tk``. Causal: pass ``causal=True`` (the shared default,
    False, is refused without ``log_forget_backward``). With ``log_forget_backward``
    ``[B, H, Tk]`` and ``causal=False``, x-transformers' bidirectional form: keys after
    the query get ``sum_{l=p+1}^{j} log g_l`` from those gates. The gates of padded keys are set to 0 before the
    cumulative sum, so a padded token does not decay the keys before it (the
    authors' treatment of left padding). Returns ``(out [B,H,Tq,D], probs
    [B,H,Tq,Tk])``; the bias runs fused with ``need_weights=False`` (``probs``
    None).""",
)


__all__ = ["forget_gate_bias", "forgetting_attention"]
