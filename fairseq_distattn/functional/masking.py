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
import functools
from typing import Optional, Tuple

import torch
from torch import Tensor


# Position tensors depend only on sizes, offsets, device and dtype; generation
# asks for the same ones in every layer at every step. Small ones are kept.
MAX_CACHED_ELEMENTS = 2 ** 14
POSITION_CACHE_ENTRIES = 256


def position_tensor(builder):
    """Memoise ``builder(tgt_len, src_len, *hashable)`` for small sizes. The
    result is shared: callers never modify it in place. It is built outside
    inference mode so a tensor first built while generating can still take
    part in a later training step."""

    def build(*args):
        with torch.inference_mode(False):
            return builder(*args)

    cached = functools.lru_cache(maxsize=POSITION_CACHE_ENTRIES)(build)

    @functools.wraps(builder)
    def lookup(tgt_len: int, src_len: int, *args):
        if tgt_len * src_len > MAX_CACHED_ELEMENTS:
            return build(tgt_len, src_len, *args)
        return cached(tgt_len, src_len, *args)

    return lookup


@position_tensor
def relative_distance(tgt_len: int, src_len: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` long tensor of ``j - (query_offset + i)``."""
    query_positions = torch.arange(query_offset, query_offset + tgt_len, device=device)
    key_positions = torch.arange(src_len, device=device)
    return key_positions[None, :] - query_positions[:, None]


@position_tensor
def absolute_distance(tgt_len: int, src_len: int, query_offset: int, device, dtype) -> Tensor:
    """``|i - j|`` (query and key positions) as a ``[Tq, Tk]`` floating tensor."""
    return relative_distance(tgt_len, src_len, query_offset, device).abs().to(dtype)


@position_tensor
def causal_visibility(tgt_len: int, src_len: int, query_offset: int, device) -> Optional[Tensor]:
    """``[Tq, Tk]`` bool, True where key ``j`` is not after its query; None when
    no key is (one-token incremental steps)."""
    if src_len <= query_offset + 1:
        return None
    return relative_distance(tgt_len, src_len, query_offset, device) <= 0


@position_tensor
def _causal_logit_mask(tgt_len: int, src_len: int, query_offset: int, device, dtype) -> Optional[Tensor]:
    return as_logit_mask(causal_visibility(tgt_len, src_len, query_offset, device), dtype)[0]


def as_logit_mask(visible: Optional[Tensor], dtype) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Bool visibility (True = may attend) as ``(mask, hidden)``: an additive
    mask, 0 where visible and -inf elsewhere, and the bool ``[.., Tq, 1]``
    rows it would hide completely (a padded query that may only see padded
    keys), or None when there are none. Hidden rows are left at 0 in
    ``mask``: an all -inf row would make softmax (and its gradient) NaN;
    :func:`masked_softmax` and :func:`fused_attention` zero them instead."""
    if visible is None:
        return None, None
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    hidden = ~visible.any(dim=-1, keepdim=True)
    if not bool(hidden.any()):
        return mask, None
    return mask.masked_fill_(hidden, 0.0), hidden


def logit_mask(
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
    tgt_len: int,
    src_len: int,
    device,
    dtype,
    allowed: Optional[Tensor] = None,
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``(mask, hidden)`` as in :func:`as_logit_mask` for key padding, the
    causal mask and an optional further bool ``[Tq, Tk]`` restriction
    ``allowed``: ``mask`` broadcasts to ``[B, H, Tq, Tk]`` and is at most
    ``[B, 1, Tq, Tk]``; both are None when every key is visible. Adding it
    to the logits (in place, or inside SDPA) replaces a masked_fill over
    every head."""
    if key_padding_mask is None and allowed is None and query_offset >= 0:
        # every query sees at least key 0: the (cached) causal mask hides no row
        causal_mask = _causal_logit_mask(tgt_len, src_len, query_offset, device, dtype) if causal else None
        return (None if causal_mask is None else causal_mask[None, None]), None
    visible = causal_visibility(tgt_len, src_len, query_offset, device) if causal else None
    if allowed is not None:
        visible = allowed if visible is None else visible & allowed
    if key_padding_mask is not None:
        not_padding = ~key_padding_mask.to(torch.bool)[:, None, None, :]
        visible = not_padding if visible is None else visible & not_padding
    return as_logit_mask(visible, dtype)


def masked_softmax(masked_logits: Tensor, hidden: Optional[Tensor]) -> Tensor:
    """Softmax over the last dim of logits that already include the additive
    mask of :func:`logit_mask`: hidden keys get exactly 0 from exp(-inf), and
    ``hidden`` rows (no visible key) give zeros instead of NaN, so padding
    can never poison a batch through ``0 * NaN`` in a later matmul. -inf (not
    a large negative constant) keeps this exact in half precision.
    """
    # half-precision logits are normalised in float32, as fairseq does
    softmax_dtype = torch.float32 if masked_logits.dtype in (torch.float16, torch.bfloat16) else masked_logits.dtype
    probs = torch.softmax(masked_logits, dim=-1, dtype=softmax_dtype).to(masked_logits.dtype)
    return probs if hidden is None else probs.masked_fill(hidden, 0.0)


HALF_DTYPES = (torch.float16, torch.bfloat16)


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which logits and the terms a mechanism adds to them are
    formed: float32 for half inputs (as fairseq's softmax already is), since
    products such as DA's ReLU(QK^T) x f or a -alpha |i-j| bias leave the
    float16 range (65504) where QK^T alone does not."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def scaled(q: Tensor) -> Tensor:
    """``q / sqrt(D)``: scaling the queries costs [Tq, D], scaling the scores [Tq, Tk]."""
    return q * (q.size(-1) ** -0.5)


def masked_scores(scaled_q: Tensor, k: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``scaled_q k^T + mask`` for ``scaled_q`` ``[B,H,Tq,D]`` (see :func:`scaled`),
    ``k`` ``[B,H,Tk,D]`` and an additive mask broadcastable to ``[B,H,Tq,Tk]``
    or None: QK^T in the inputs' dtype, as vanilla attention computes it,
    returned in :func:`logit_dtype` (``mask`` must be in that dtype). A fresh
    tensor, so callers may add further terms in place; probabilities made
    from it go back to the inputs' dtype with ``.to(q.dtype)``."""
    scores = torch.matmul(scaled_q, k.transpose(-2, -1))
    scores = scores.to(logit_dtype(scores.dtype))
    return scores if mask is None else scores.add_(mask)


def dropout_probs(probs: Tensor, dropout_p: float) -> Tensor:
    """Attention dropout on the probabilities that multiply the values; the
    returned ``probs`` of every op stay undropped, as in fairseq."""
    if dropout_p > 0.0:
        return torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return probs


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
    tgt_len, src_len = q.size(2), k.size(2)
    if not need_weights and causal and key_padding_mask is None and query_offset == 0 and tgt_len == src_len:
        # exactly SDPA's own causal mask: let it pick its causal kernel
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
    if not need_weights:
        mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, q.dtype)
        return fused_attention(q, k, v, None, mask, hidden, dropout_p), None
    mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, logit_dtype(q.dtype))
    probs = masked_softmax(masked_scores(scaled(q), k, mask), hidden).to(q.dtype)
    return torch.matmul(dropout_probs(probs, dropout_p), v), probs


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], hidden: Optional[Tensor],
    dropout_p: float = 0.0,
) -> Tensor:
    """``softmax(q k^T / sqrt(D) + bias + mask) v`` through
    ``F.scaled_dot_product_attention``; ``mask, hidden`` from :func:`logit_mask`.

    The fast path for mechanisms whose math is an additive bias on the
    logits, used when the caller does not need the probabilities. Same
    semantics as :func:`masked_softmax`: a hidden row gives 0.
    """
    if bias is not None:
        if bias.dtype != q.dtype:
            # a float32 bias (see logit_dtype) joins half queries in their dtype;
            # clamped so it cannot overflow to inf there (-inf stays in `mask`)
            limit = torch.finfo(q.dtype).max / 2
            bias = bias.clamp(-limit, limit).to(q.dtype)
        mask = bias if mask is None else bias + mask
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return out if hidden is None else out.masked_fill(hidden, 0.0)
