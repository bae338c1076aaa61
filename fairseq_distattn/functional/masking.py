"""Position bookkeeping and masked softmax shared by every mechanism.

Conventions (the public API of :mod:`fairseq_distattn.functional`):
query row ``i`` sits at position ``query_offset + i``, key column ``j`` at
position ``j``, so a single code path serves full-sequence and incremental
(one token at a time) decoding. ``key_padding_mask`` is ``[B, Tk]`` bool with
True marking padding; ``causal`` hides keys after the query.

Attention ops also take trailing ``dropout_p`` (attention dropout on the
probabilities that multiply the values; returned probabilities are undropped)
and, where the mechanism is an additive bias on the logits, ``need_weights``:
with ``need_weights=False`` they run fused ``F.scaled_dot_product_attention``
and return ``(out, None)``.
"""
from typing import Optional

import torch
from torch import Tensor


def relative_distance(tgt_len: int, src_len: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` long tensor of ``j - (query_offset + i)``."""
    query_positions = torch.arange(query_offset, query_offset + tgt_len, device=device)
    key_positions = torch.arange(src_len, device=device)
    return key_positions[None, :] - query_positions[:, None]


def visible_keys(
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
    tgt_len: int,
    src_len: int,
    device,
) -> Optional[Tensor]:
    """Bool mask broadcastable to ``[B, H, Tq, Tk]``, True where a query may
    attend to a key; None when every key is visible."""
    visible = None
    if causal:
        visible = (relative_distance(tgt_len, src_len, query_offset, device) <= 0)[None, None]
    if key_padding_mask is not None:
        not_padding = ~key_padding_mask.to(torch.bool)[:, None, None, :]
        visible = not_padding if visible is None else visible & not_padding
    return visible


def masked_softmax(logits: Tensor, visible: Optional[Tensor]) -> Tensor:
    """Softmax over the last dim restricted to ``visible`` entries.

    A row with no visible entry (e.g. a padded query that may only see padded
    keys) yields zeros instead of NaN, so padding can never poison a batch
    through ``0 * NaN`` in a later matmul. -inf (not a large negative
    constant) keeps this exact in half precision.
    """
    # half-precision logits are normalised in float32, as fairseq does
    softmax_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    if visible is None:
        return torch.softmax(logits, dim=-1, dtype=softmax_dtype).to(logits.dtype)
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1, dtype=softmax_dtype).to(logits.dtype)
    return probs.masked_fill(~visible, 0.0)


def dropout_probs(probs: Tensor, dropout_p: float) -> Tensor:
    """Attention dropout on the probabilities that multiply the values; the
    returned ``probs`` of every op stay undropped, as in fairseq."""
    if dropout_p > 0.0:
        return torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return probs


def scaled_scores(q: Tensor, k: Tensor) -> Tensor:
    """``q k^T / sqrt(D)`` for ``q`` ``[B,H,Tq,D]`` and ``k`` ``[B,H,Tk,D]``."""
    return torch.matmul(q, k.transpose(-2, -1)) * (q.size(-1) ** -0.5)


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
):
    """Plain ``softmax(q k^T / sqrt(D)) v`` under the same conventions; returns
    ``(out, probs)`` (``probs`` is None when ``need_weights=False``)."""
    visible = visible_keys(key_padding_mask, causal, query_offset, q.size(2), k.size(2), q.device)
    if not need_weights:
        return fused_attention(q, k, v, None, visible, dropout_p), None
    probs = masked_softmax(scaled_scores(q, k), visible)
    return torch.matmul(dropout_probs(probs, dropout_p), v), probs


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Optional[Tensor],
    visible: Optional[Tensor],
    dropout_p: float = 0.0,
) -> Tensor:
    """``softmax(q k^T / sqrt(D) + bias) v`` through ``F.scaled_dot_product_attention``.

    The fast path for mechanisms whose math is an additive bias on the
    logits, used when the caller does not need the probabilities. Same
    semantics as :func:`masked_softmax`: a row with no visible key gives 0.
    """
    attn_mask = bias
    empty_rows = None
    if visible is not None:
        if attn_mask is None:
            attn_mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
        attn_mask = attn_mask.masked_fill(~visible, float("-inf"))
        empty_rows = ~visible.any(dim=-1, keepdim=True)
        # an all -inf row would make SDPA return NaN; give it any finite row and zero it below
        attn_mask = attn_mask.masked_fill(empty_rows, 0.0)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out
