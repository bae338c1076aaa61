"""Position bookkeeping and masked softmax shared by every mechanism.

Conventions (the public API of :mod:`fairseq_distattn.functional`):
query row ``i`` sits at position ``query_offset + i``, key column ``j`` at
position ``j``, so a single code path serves full-sequence and incremental
(one token at a time) decoding. ``key_padding_mask`` is ``[B, Tk]`` bool with
True marking padding; ``causal`` hides keys after the query.

Every attention op takes the same keyword-only arguments after its tensors:
``key_padding_mask``, ``causal``, ``query_offset``, ``dropout_p`` (attention
dropout on the probabilities that multiply the values; returned probabilities
are undropped) and ``need_weights`` (False: the op returns ``(out, None)``,
and a mechanism that is an additive bias on the logits runs fused
``F.scaled_dot_product_attention``).

The one core path is :func:`attend`: a mechanism hands it an additive
``bias`` on the logits, a ``score_mod`` of the raw scores, a ``weight_mod`` of
the normalised weights or a ``value_term``, and the masking (key padding,
causal, a mechanism's own visibility such as a direction) is composed here
only, by :func:`logit_mask` and :func:`masked_softmax`.
"""

import functools
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .flex import ScoreTable, check_position_argument, check_position_arguments, flex_applies, flex_attend

# Position tensors depend only on sizes, offsets, device and dtype; generation
# asks for the same ones in every layer at every step. Small ones are kept.
MAX_CACHED_ELEMENTS = 2**14
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


def sequence_positions(key_padding_mask: Optional[Tensor], length: int, offset: int, device) -> Tensor:
    """Positions of the ``length`` tokens from index ``offset`` on, counted from
    each sequence's first real key: ``[B, length]`` (``[1, length]`` without
    padding), int64. A sequence's leading padding (fairseq left-pads sources)
    shifts its positions; padding after it is masked wherever it is a key."""
    positions = torch.arange(offset, offset + length, device=device)[None]
    if key_padding_mask is None or key_padding_mask.size(-1) == 0:  # no keys: no padding before them
        return positions
    real = ~key_padding_mask.to(torch.bool)
    leading = torch.where(real.any(dim=-1), real.to(torch.int8).argmax(dim=-1), 0)
    return (positions - leading[:, None]).clamp_min(0)


@position_tensor
def _relative_distance(tgt_len: int, src_len: int, query_offset: int, device) -> Tensor:
    """:func:`relative_distance` unchecked; ``query_offset`` may be negative
    (QVI's eq. 7 attends from values over queries that can start after them)."""
    query_positions = torch.arange(query_offset, query_offset + tgt_len, device=device)
    key_positions = torch.arange(src_len, device=device)
    return key_positions[None, :] - query_positions[:, None]


def relative_distance(tgt_len: int, src_len: int, query_offset: int, device) -> Tensor:
    """``[Tq, Tk]`` long tensor of ``j - (query_offset + i)``; the lengths and
    ``query_offset`` are integers >= 0 (else a ValueError naming the argument).
    Cached (:func:`position_tensor`): the result is shared, never modify it."""
    check_position_arguments(tgt_len, src_len, query_offset)
    return _relative_distance(tgt_len, src_len, query_offset, device)


@position_tensor
def causal_visibility(tgt_len: int, src_len: int, query_offset: int, device) -> Optional[Tensor]:
    """``[Tq, Tk]`` bool, True where key ``j`` is not after its query; None when
    no key is (one-token incremental steps)."""
    if src_len <= query_offset + 1:
        return None
    return _relative_distance(tgt_len, src_len, query_offset, device) <= 0


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
    every head. The lengths are integers >= 0; ``query_offset`` is an integer
    that may be negative here (QVI's eq. 7 puts values before their queries)."""
    check_position_argument("tgt_len", tgt_len)
    check_position_argument("src_len", src_len)
    if isinstance(query_offset, bool) or not isinstance(query_offset, int):
        raise ValueError(f"query_offset must be an integer, got {query_offset!r}")
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


def check_attention_arguments(
    q: Tensor,
    k: Tensor,
    v: Optional[Tensor],
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
    dropout_p: float = 0.0,
    *,
    names: Tuple[str, str, Optional[str], str] = ("q", "k", "v", "key_padding_mask"),
) -> None:
    """The checks every public op makes of the arguments they share: each
    mistake is a ValueError naming the argument (``names``: what the op calls
    ``q``, ``k``, ``v`` and ``key_padding_mask``). ``q``, ``k`` and ``v`` are
    floating point tensors of one dtype on one device, and not on the meta
    device; ``key_padding_mask`` is bool on that device. Shapes, dtypes,
    devices and Python scalars only (attribute comparisons): no check reads a
    value, so none waits for the device."""
    q_name, k_name, v_name, padding_name = names
    for name, tensor in ((q_name, q), (k_name, k), (v_name, v)):
        if tensor is not None and (not isinstance(tensor, Tensor) or tensor.dim() != 4):
            raise ValueError(f"{name} must be a [B, H, T, D] tensor, got {_describe(tensor)}")
    # check_tensor_argument, inlined (this runs on every call of every op): a tensor
    # with q's dtype and device is floating point and has values once q does
    if not q.is_floating_point() or q.is_meta:
        check_tensor_argument(q_name, q)
    dtype, device = q.dtype, q.device
    for name, tensor in ((k_name, k), (v_name, v)):
        if tensor is not None and (tensor.dtype is not dtype or tensor.device != device):
            check_tensor_argument(name, tensor, q_name, q)
    if q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"{q_name} {tuple(q.shape)} and {k_name} {tuple(k.shape)} must share B, H and D")
    if v is not None and (v.shape[:3] != k.shape[:3]):
        raise ValueError(f"{v_name} {tuple(v.shape)} must have {k_name}'s B, H and length {tuple(k.shape[:3])}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            # a float "1 = keep" mask would otherwise be read as padding, inverted
            raise ValueError(
                f"{padding_name} must be a bool tensor with True = padding, got "
                f"{_describe(key_padding_mask)} (for a 1 = keep mask pass mask == 0)"
            )
        if key_padding_mask.device != device:
            raise ValueError(f"{padding_name} is on {key_padding_mask.device} but {q_name} is on {q.device}")
        if tuple(key_padding_mask.shape) != (k.size(0), k.size(2)):
            raise ValueError(
                f"{padding_name} must be [B, Tk] = {(k.size(0), k.size(2))}, got {tuple(key_padding_mask.shape)}"
            )
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if isinstance(query_offset, bool) or not isinstance(query_offset, int) or query_offset < 0:
        raise ValueError(
            f"query_offset must be an integer >= 0 (the position of the first query), got {query_offset!r}"
        )
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")


def check_tensor_argument(
    name: str,
    tensor,
    like_name: Optional[str] = None,
    like: Optional[Tensor] = None,
    dtypes: Optional[Tuple[torch.dtype, ...]] = (),
) -> None:
    """ValueError naming ``name`` unless ``tensor`` is a floating point tensor
    with values (not on the meta device, where a tensor has a shape and no
    data) and, given ``like``, on ``like``'s device with ``like``'s dtype or
    one of ``dtypes`` (``dtypes=None``: any floating dtype, for a tensor the op
    converts itself). Attribute comparisons only: no value is read."""
    if not isinstance(tensor, Tensor) or not tensor.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating point tensor, got {_describe(tensor)}")
    if tensor.is_meta:
        raise ValueError(f"{name} is on the meta device: a meta tensor has a shape but no values to attend with")
    if like is None:
        return
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device} but {like_name} is on {like.device}")
    if dtypes is not None and tensor.dtype is not like.dtype and tensor.dtype not in dtypes:
        others = "".join(f" or {dtype}" for dtype in dtypes if dtype != like.dtype)
        allowed = f" ({name} may have {like.dtype}{others})" if others else ""
        raise ValueError(f"{name} has dtype {tensor.dtype} but {like_name} has {like.dtype}{allowed}")


def autocast_enabled(device: torch.device) -> bool:
    """Whether autocast (fairseq's --amp) is on for ``device``'s type: then
    float32 parameters meet half activations, and autocast's ops cast them."""
    try:
        return torch.is_autocast_enabled(device.type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled() if device.type == "cuda" else torch.is_autocast_cpu_enabled()


def _describe(value) -> str:
    if isinstance(value, Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {tuple(value.shape)}"
    return repr(value)


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
):
    """Plain ``softmax(q k^T / sqrt(D)) v`` under the same conventions; returns
    ``(out, probs)`` (``probs`` is None when ``need_weights=False``).

    NaN: a query row whose visible logits are all NaN (a NaN query, or NaN in
    every key it may see) gives NaN probabilities and a NaN output row. The
    fused path (``need_weights=False``) gives NaN too, except where SDPA gets no
    mask (no ``key_padding_mask``; ``causal`` as SDPA's own causal mask or a
    one-token step that sees every key) on CPU and the row has fewer keys than
    one SIMD vector holds (torch 2.13, AVX2: Tk < 8 in float32 and bfloat16,
    Tk < 4 in float64): there the row is 0. torch's CPU flash kernel takes the
    maximum of such a short row in a scalar loop that skips NaN, so the row
    keeps -inf and is taken for a fully masked one (probabilities 0). Every
    other NaN propagates on both paths. Not corrected: passing SDPA a mask to
    force NaN costs 3 to 28% of such a call (measured), and summing ``q`` into
    the output costs more and misses NaN keys (``tests/test_functional_errors.py``
    pins the behaviour of both paths)."""
    check_attention_arguments(q, k, v, key_padding_mask, causal, query_offset, dropout_p)
    return attend(
        q,
        k,
        v,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
        dropout_p=dropout_p,
        need_weights=need_weights,
    )


# score_mod(raw scores q k^T / sqrt(D) in logit_dtype, the additive mask that will be added
# after it or None) -> logits: the mask is passed so a mod that reads which keys are visible
# (CoPE's gates) does not build it a second time
ScoreMod = Callable[[Tensor, Optional[Tensor]], Tensor]
# weight_mod(softmax weights, additive mask, hidden rows) -> the weights that multiply the values
WeightMod = Callable[[Tensor, Optional[Tensor], Optional[Tensor]], Tensor]
# value_term(the (dropped) weights) -> a [B, H, Tq, D] term added to the output
ValueTerm = Callable[[Tensor], Tensor]


def attention_weights(
    q: Tensor,
    k: Tensor,
    *,
    bias: Optional[Tensor] = None,
    score_mod: Optional[ScoreMod] = None,
    allowed: Optional[Tensor] = None,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(probs, mask, hidden)``: ``softmax(score_mod(q k^T / sqrt(D)) + bias)``
    over the keys each query may see (key padding, ``causal`` and the bool
    ``[Tq, Tk]`` restriction ``allowed``), in :func:`logit_dtype`; ``mask,
    hidden`` from :func:`logit_mask`. ``bias`` broadcasts to ``[B, H, Tq, Tk]``
    and is in the logit dtype."""
    tgt_len, src_len = q.size(2), k.size(2)
    mask, hidden = logit_mask(
        key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, logit_dtype(q.dtype), allowed
    )
    if score_mod is None:
        logits = masked_scores(scaled(q), k, mask)
        if bias is not None:
            logits = logits.add_(bias)
    else:
        logits = score_mod(torch.matmul(scaled(q), k.transpose(-2, -1)).to(logit_dtype(q.dtype)), mask)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = logits + mask
    return masked_softmax(logits, hidden), mask, hidden


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Optional[Tensor] = None,
    score_mod: Optional[ScoreMod] = None,
    offset_table: Optional[ScoreTable] = None,
    weight_mod: Optional[WeightMod] = None,
    value_term: Optional[ValueTerm] = None,
    allowed: Optional[Tensor] = None,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    need_weights: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The core path of every mechanism: ``(out, probs)`` with
    ``probs = weight_mod(softmax(score_mod(q k^T / sqrt(D)) + bias))`` over the
    visible keys (see :func:`attention_weights`) and ``out = dropout(probs) v
    + value_term(dropout(probs))``; ``probs`` is None unless ``need_weights``.

    ``offset_table`` is a bias or a score modification read from a table by
    ``j - i`` (:class:`flex.OffsetTable`: per head; rpr's
    ``RelativeKeyScores``: per query and clipped distance), given instead of
    ``bias`` or ``score_mod``: where :func:`flex.flex_applies` it runs in
    flex_attention (its ``score_mod``), with a ``value_term`` only if that can
    be rebuilt from flex's log-sum-exp (:class:`flex.LseValueTerm`);
    elsewhere its ``dense()`` becomes that ``bias`` or ``score_mod``. A mechanism that is
    only an additive bias (and ``allowed``) otherwise runs fused
    (:func:`fused_attention`) when the weights are not needed. Unchecked: the
    public ops check their arguments first.

    Empty sequences, as ``F.scaled_dot_product_attention`` treats them: no
    queries (``Tq = 0``) give an empty ``[B, H, 0, D]`` output and ``[B, H, 0,
    Tk]`` weights; no keys (``Tk = 0``) leave every query row without a visible
    key, which gives 0 (as a row hidden by the masks does) and ``[B, H, Tq, 0]``
    weights."""
    tgt_len, src_len = q.size(2), k.size(2)
    if offset_table is not None:
        if (
            weight_mod is None
            and (value_term is None or hasattr(value_term, "from_log_normaliser"))
            and tgt_len
            and src_len  # an empty matrix has nothing to fuse: its dense bias is empty too
            and flex_applies(q, need_weights=need_weights, dropout_p=dropout_p, query_offset=query_offset)
        ):
            return _flex_attend(q, k, v, offset_table, value_term, allowed, key_padding_mask, causal), None
        dense = offset_table.dense()
        if offset_table.combine == "add":
            bias = dense
        else:
            score_mod = functools.partial(_relu_multiply, coefficients=dense)
    if not need_weights and score_mod is None and weight_mod is None and value_term is None:
        if (
            bias is None
            and allowed is None
            and causal
            and key_padding_mask is None
            and query_offset == 0
            and tgt_len == src_len
        ):
            # exactly SDPA's own causal mask: let it pick its causal kernel
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, q.dtype, allowed)
        return fused_attention(q, k, v, bias, mask, hidden, dropout_p), None
    probs, mask, hidden = attention_weights(
        q,
        k,
        bias=bias,
        score_mod=score_mod,
        allowed=allowed,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
    )
    if weight_mod is not None:
        probs = weight_mod(probs, mask, hidden)
    probs = probs.to(q.dtype)
    attended = dropout_probs(probs, dropout_p)
    out = torch.matmul(attended, v)
    if value_term is not None:
        out = out + value_term(attended)
    return out, probs if need_weights else None


def _flex_attend(q, k, v, offset_table, value_term, allowed, key_padding_mask, causal) -> Tensor:
    """:func:`flex.flex_attend`, plus the value term rebuilt from its log-sum-exp."""
    masks = dict(allowed=allowed, key_padding_mask=key_padding_mask, causal=causal)
    if value_term is None:
        return flex_attend(q, k, v, offset_table, **masks)
    out, lse = flex_attend(q, k, v, offset_table, return_lse=True, **masks)

    def lse_beyond(min_offset: int) -> Tensor:
        return flex_attend(q, k, v, offset_table, min_offset=min_offset, return_lse=True, **masks)[1]

    return out + value_term.from_log_normaliser(lse, lse_beyond, key_padding_mask).to(out.dtype)


def _relu_multiply(scores: Tensor, mask: Optional[Tensor], coefficients: Tensor) -> Tensor:
    return torch.relu(scores) * coefficients


def half_range_bias(bias: Tensor, mask: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``bias`` as an SDPA ``attn_mask`` for half queries of ``dtype``: a row whose
    largest entry over the keys ``mask`` leaves visible is beyond +-max/64 of
    ``dtype`` is shifted by that entry; then it is clamped to +-max/2.

    Why: SDPA takes no float32 mask with half queries on CUDA (its
    memory-efficient kernel refuses a bias whose dtype is not the query's), and
    its math kernels add the bias to QK^T in the half dtype, where the sum can
    pass 65504 although each term fits, and a row of -inf gives NaN; a plain
    clamp would tie distinct large biases (AW's 40000 and 50000). Softmax is
    invariant to a per-row constant, so the shift changes nothing exact (and
    needs no gradient); after it the key with the largest bias has a logit
    within max/64 of QK^T's own, so a row overflows only where QK^T nearly does
    alone. Rows of ordinary biases are not shifted: rounding ``bias - max``
    instead of ``bias`` would cost precision on the small entries. Keeping the
    rounded bias (rather than routing half inputs to float32 logits) keeps the
    fused kernels, and their memory saving, for half precision."""
    bias = bias.to(torch.float32)
    limit = torch.finfo(dtype).max / 2
    visible_max = (bias if mask is None else bias + mask).amax(dim=-1, keepdim=True).detach()
    shift = torch.where(visible_max.abs() > limit / 32, visible_max, 0.0)
    # entries above 0 after the shift lie under the mask's -inf, which must not meet +inf
    return (bias - shift).clamp_(-limit, limit).to(dtype)


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Optional[Tensor],
    mask: Optional[Tensor],
    hidden: Optional[Tensor],
    dropout_p: float = 0.0,
) -> Tensor:
    """``softmax(q k^T / sqrt(D) + bias + mask) v`` through
    ``F.scaled_dot_product_attention``; ``mask, hidden`` from :func:`logit_mask`.

    The fast path for mechanisms whose math is an additive bias on the
    logits, used when the caller does not need the probabilities. Same
    semantics as :func:`masked_softmax`: a hidden row gives 0. Also 0, on CPU,
    a short row whose logits are all NaN when SDPA gets no mask (the weights
    path gives NaN: see :func:`softmax_attention`).
    """
    if bias is not None:
        if q.dtype in HALF_DTYPES:
            bias = half_range_bias(bias, mask, q.dtype)
        mask = bias if mask is None else bias + mask
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return out if hidden is None else out.masked_fill(hidden, 0.0)


__all__ = [
    "attend",
    "attention_weights",
    "logit_mask",
    "masked_softmax",
    "relative_distance",
    "sequence_positions",
    "softmax_attention",
]
