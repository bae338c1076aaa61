"""Stick-breaking attention (Tan, Yang, Courville, Panda, Shen 2025, *Scaling
Stick-Breaking Attention: An Efficient Implementation and In-depth Study*, ICLR 2025,
arXiv:2410.17980).

Softmax is replaced by a stick-breaking process run by every query from its nearest
earlier key backwards. With the logit ``z_ij = q_i . k_j / sqrt(D)`` and the break
point ``beta_ij = sigmoid(z_ij)``, the query at position p gives key j < p the weight

    A_ij = beta_ij * prod_{j<l<p} (1 - beta_il),

the share of what the keys between them left of the stick; the weights are not
normalised, and ``sum_j A_ij = 1 - prod_{l<p} (1 - beta_il)`` stays below 1. In log
space, as the authors compute it (``log(1 - sigmoid(z)) = -softplus(z)``),

    log A_ij = logsigmoid(z_ij) - sum_{j<l<p} softplus(z_il).

As the authors' code computes it (github.com/shawntan/stickbreaking-attention at
commit 3147a3841b025a31d271fc8f873120ff6fa0461b: the PyTorch reference
``stickbreaking(q, k, v, mask, cum_weight)`` of ``stickbreaking_attention/sb_ref.py``,
the Triton kernels ``sb_attn`` of ``stickbreaking_attention/sb_attn/__init__.py`` and
``sb_attn_varlen`` of ``stickbreaking_attention/sb_varlen/__init__.py``, and the
``ref_fwd`` of ``tests/test_attn.py`` and ``tests/test_varlen.py`` they are checked
against):

* scale: ``1/sqrt(D)`` on ``q k^T`` (the reference divides by ``sqrt(q.shape[-1])``,
  ``inv_temp`` of the kernels defaults to it). The logits and the log-space sums are
  formed in float32 for half inputs (the reference's ``logits.float()``).
* the diagonal: excluded by default, a query attends to the keys before it only (the
  reference's hidden ``mask`` is ``triu(0)``; the kernels' ``attend_current=False``);
  ``attend_current=True`` (the kernels' option, added in the repository's
  "Attend current." commit 8dd32ad) includes ``j = p``, which then breaks first.
* what is between: the sum runs over the keys the ``mask`` leaves visible (the
  reference zeroes ``log(1 - beta)`` of hidden keys before summing it with a strictly
  triangular ``cum_weight``), so a hidden key neither gets weight nor uses any stick.
* the remaining stick: ``rem_i = 1 - sum_j A_ij = prod_l (1 - beta_il)`` over the
  visible keys. The ops return it beside ``A v`` (``o, rem``), and the full forward
  their tests check (``ref_fwd``) and their model use ``o + rem * v_i``: the remainder
  goes to the query's own value, the value at its position p. The first author's
  model layer (github.com/shawntan/dolomite-engine,
  ``dolomite_engine/hf_models/models/stickbreaking/attention.py``, ``SBAttention``
  at commit 4952760cb9129075996dfb6f42a0dcc3ab88d41c) adds it when ``sb_remainder``
  is set, which ``dolomite_engine/hf_models/models/stickbreaking/config.py`` (commit
  4a79dd3708cdd2b8c91a93ad83df1be927c523d0) makes the default, in training and in
  its one-token decoding step (``rem * v[..., -1:, :]``, the newest value). No
  attention dropout is applied there, no bias is added, and no position embedding
  is used.
* padding: the authors' kernels have no key padding mask; packed sequences
  (``cu_seqlens``) each attend within their own tokens, as if the others were not
  there. Here a padded key is hidden, so it gets no weight and uses no stick (the
  reference's arithmetic with the padding in its ``mask``), and a query whose own
  position is padding gets no remainder term, so a padded query that sees no key
  gives 0.

The paper's abstract has each query break the stick "until the stick is fully
allocated" over the tokens before it; the code leaves the remainder ``rem`` and, by
default, gives it to the query's own value, which is what is followed here
(``remainder=True``; ``remainder=False`` drops it, the ``o`` of the authors' ops).
Paper equation numbers are not cited: the paper's text was not at hand to check
them.

Here: :func:`stick_breaking_weights` computes ``A`` and ``rem`` from logits and a
visibility mask with one reverse cumulative sum per row (O(Tq Tk), where the
reference multiplies by a ``[Tk, Tk]`` triangle), and :func:`stick_breaking_attention`
is the op. Causal only: the nearest-earlier-key-first order is that of a causal
query, and the authors define no bidirectional form, so ``causal=False`` is refused.
There is no fused or flex_attention path (``flex`` is checked, then ignored): the
weights are always formed.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_queries_among_keys, position_tensor, relative_distance
from .terms import Terms


@position_tensor
def _stick_visibility(tgt_len: int, src_len: int, query_offset: int, attend_current: bool, device) -> Tensor:
    """``[Tq, Tk]`` bool: key ``j`` before the query's position ``p`` (``j <= p`` with
    ``attend_current``). Cached: shared, never modify it."""
    distance = relative_distance(tgt_len, src_len, query_offset, device)
    return distance <= 0 if attend_current else distance < 0


def stick_breaking_weights(logits: Tensor, visible: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``(A, rem)`` of the stick-breaking process over the last dimension of ``logits``
    ``[..., Tk]`` (the raw, scaled logits ``z``, keys in position order), whose nearest
    key to the query is the last visible one: ``A_j = sigmoid(z_j) * prod_{l>j, visible}
    (1 - sigmoid(z_l))`` on the visible keys and 0 elsewhere, and ``rem = prod_{l
    visible} (1 - sigmoid(z_l)) = 1 - sum_j A_j`` ``[...]``, the stick left over.

    ``visible`` is a bool tensor broadcastable to ``logits`` (True = the key may be
    attended to and breaks the stick), or None for every key: keys after the query
    must be hidden by it too. In log space, ``log A_j = logsigmoid(z_j) - sum_{l>j}
    softplus(z_l)``, in :func:`attention.logit_dtype` of ``logits`` (float32 for half).
    A row with no visible key gives ``A = 0`` and ``rem = 1``."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError(f"logits must be a floating point tensor [..., Tk], got {_described(logits)}")
    if visible is not None:
        if not isinstance(visible, Tensor) or visible.dtype != torch.bool:
            raise ValueError(f"visible must be a bool tensor (True = visible), got {_described(visible)}")
        try:
            torch.broadcast_shapes(visible.shape, logits.shape)
        except RuntimeError:
            raise ValueError(f"visible {tuple(visible.shape)} must broadcast to logits {tuple(logits.shape)}") from None
    logits = logits.to(logit_dtype(logits.dtype))
    # log(1 - beta) = -softplus(z): what each key takes from the stick of the keys before it
    log_unbroken = -F.softplus(logits)
    log_beta = F.logsigmoid(logits)
    if visible is not None:
        log_unbroken = torch.where(visible, log_unbroken, 0.0)
    # sum over the (visible) keys after j, j excluded: the reverse inclusive cumsum shifted by
    # one key (no "inclusive - own term" subtraction, whose rounding grows with the row's total)
    after = log_unbroken.flip(-1).cumsum(-1).flip(-1)
    after = torch.cat([after[..., 1:], torch.zeros_like(after[..., :1])], dim=-1)
    log_weights = log_beta + after
    if visible is not None:
        log_weights = torch.where(visible, log_weights, float("-inf"))
    return log_weights.exp(), log_unbroken.sum(-1).exp()


def _described(value) -> str:
    if isinstance(value, Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return repr(value)


def _check_options(attend_current, remainder, tgt_len: int, src_len: int, query_offset: int) -> None:
    for name, value in (("attend_current", attend_current), ("remainder", remainder)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    if remainder:
        why = "the remaining stick goes to the value at the query's own position, given with the keys"
        check_queries_among_keys(tgt_len, query_offset, src_len, " with remainder=True", why)


def stick_breaking_terms(
    q: Tensor,
    k: Tensor,
    attend_current: bool = False,
    remainder: bool = True,
    *,
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """The keys a query breaks its stick over (before its position, or up to it with
    ``attend_current``) and the stick-breaking process in place of the softmax
    (:func:`stick_breaking_weights`), whose remaining stick goes to the query's own value
    with ``remainder`` (not where that position is padding)."""
    if not causal:
        raise ValueError(
            "causal must be True: stick-breaking breaks each query's stick from its nearest earlier key "
            "backwards, an order only causal attention has (the authors define no bidirectional form)"
        )
    tgt_len, src_len = q.size(2), k.size(2)
    _check_options(attend_current, remainder, tgt_len, src_len, query_offset)
    own_padding = None
    if remainder and key_padding_mask is not None:
        own_padding = key_padding_mask[:, None, query_offset : query_offset + tgt_len]

    def stick_breaking(logits: Tensor, mask: Optional[Tensor], hidden: Optional[Tensor]):
        visible = None if mask is None else torch.isfinite(mask)
        if hidden is not None:  # a row with no visible key: the mask leaves it finite, hidden says so
            visible = ~hidden if visible is None else visible & ~hidden
        weights, rem = stick_breaking_weights(logits, visible)
        if not remainder:
            return weights, None
        return weights, rem if own_padding is None else rem.masked_fill(own_padding, 0.0)

    allowed = _stick_visibility(tgt_len, src_len, query_offset, attend_current, q.device)
    return Terms(allowed=allowed, normaliser=stick_breaking)


stick_breaking_attention = attention_op(
    stick_breaking_terms,
    "stick_breaking_attention",
    """Stick-breaking attention: ``out_i = sum_j A_ij v_j + rem_i v_p`` with the
    weights ``A`` and the remaining stick ``rem`` of :func:`stick_breaking_weights` on
    ``z = q k^T / sqrt(D)`` over the keys before the query's position ``p =
    query_offset + i`` (``j <= p`` with ``attend_current``) that are not padding.

    ``remainder`` (default True, the authors' model) adds ``rem_i v_p``, the stick the
    keys left, on the query's own value; it needs ``query_offset + Tq <= Tk`` and is
    left out where position p is padding. ``remainder=False`` drops it (the ``o`` the
    authors' ops return). Causal only: pass ``causal=True`` (the shared default,
    False, is refused). ``flex`` is checked and has no effect: there is no fused path.

    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``: ``probs`` are the weights ``A``
    (undropped; rows sum to ``1 - rem <= 1``, the remainder not included), None with
    ``need_weights=False``. Attention dropout applies to ``A`` where it multiplies
    ``v``; the remainder term is not dropped. Half inputs: logits and log-space sums
    in float32, ``out`` and ``probs`` in the input dtype.""",
)


__all__ = ["stick_breaking_attention", "stick_breaking_weights"]
