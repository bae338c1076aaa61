"""The core attention path of every mechanism: :func:`attend`, and the ops and
helpers of its three execution paths.

A mechanism hands :func:`attend` what it changes: an additive ``bias`` on the
logits, a ``score_mod`` of the raw scores, an ``offset_table`` read by ``j - i``
(:mod:`.position_tables`), a ``weight_mod`` of the normalised weights or a
``value_term``. :func:`attend` composes the masks of :mod:`.masking` (key
padding, causal, a mechanism's own visibility such as a direction) with it and
takes the path that :func:`paths.choose_path` picks among those its arguments
allow: eager (:func:`attention_weights`, on the scoring helpers
:func:`logit_dtype`, :func:`scaled`, :func:`scores` and :func:`masked_scores`,
then :func:`dropout_probs`), fused ``F.scaled_dot_product_attention`` when the
weights are not needed (:func:`fused_attention`, :func:`half_range_bias`), or
flex_attention for a table (:func:`_flex_attend` on the backend in
:mod:`.flex`). :func:`softmax_attention` is the plain op on it.

Every attention op takes the same keyword-only arguments after its tensors:
``key_padding_mask``, ``causal``, ``query_offset``, ``dropout_p`` (attention
dropout on the probabilities that multiply the values; returned probabilities
are undropped), ``need_weights`` (False: the op returns ``(out, None)``,
and a mechanism that is an additive bias on the logits runs fused) and ``flex``
(``"auto"``, ``"always"`` or ``"never"``: whether a table read by ``j - i`` may
run in flex_attention, :func:`paths.choose_path`) and ``position_map`` (randomized
positions, :mod:`.randomized_positions`: only the ops whose terms read positions take
one; None, the default, is the ordinary positions).
"""

import contextlib
import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .flex import check_flex, flex_attend, flex_windowed_attend
from .masking import autocast_enabled, check_attention_arguments, in_dtype, logit_mask, masked_softmax
from .paths import OP_OPTIONS, Call, CallOptions, Path, choose_path
from .terms import EAGER_ONLY, PLAIN, Normaliser, ScoreMod, Terms, candidate_paths

HALF_DTYPES = (torch.float16, torch.bfloat16)


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which logits and the terms a mechanism adds to them are
    formed: float32 for half inputs (as fairseq's softmax already is), since
    products such as QK^T, DA's ReLU(QK^T) x f or a -alpha |i-j| bias leave the
    float16 range (65504) where float32 holds them."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def scaled(q: Tensor) -> Tensor:
    """``q / sqrt(D)``: scaling the queries costs [Tq, D], scaling the scores [Tq, Tk]. The
    factor is a cached 0-d tensor in ``q``'s dtype, the same number a Python float becomes:
    torch wraps a Python scalar into a tensor and converts it on every call, which costs
    more than the product itself at a decoding step's sizes."""
    return q * _inverse_square_root(q.size(-1), q.dtype, q.device)


@functools.lru_cache(maxsize=64)
def _inverse_square_root(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # built outside inference mode: usable in training later
        return torch.tensor(size**-0.5, dtype=dtype, device=device)


def full_precision(x: Tensor):
    """A region where autocast (fairseq's ``--amp``) is off on ``x``'s device when ``x`` is
    half, for the float32 products formed from it: autocast would run them in half again.
    A null context otherwise (float32 inputs keep what autocast does to them) and where
    autocast is off already."""
    if x.dtype in HALF_DTYPES and autocast_enabled(x.device):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def logit_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``, a term of the logits, in :func:`logit_dtype` of ``a``: for half ``a``
    from float32 copies of both operands. Rounding a half product to float32 after
    the fact is too late: entries of a few hundred already make a dot product pass
    65504, and the inf becomes NaN in the softmax (inf - inf). Other dtypes are
    multiplied as they are, ``b`` converted to ``a``'s dtype (no copy when it is in it)."""
    compute = logit_dtype(a.dtype)
    if compute == a.dtype:
        # autocast may run it in half: widened back, a no-op without autocast
        return in_dtype(product(a, in_dtype(b, compute)), compute)
    with full_precision(a):
        return product(a.to(compute), b.to(compute))


def product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``: torch.matmul, but for a 2-D ``b`` (a table), which meets the rows of ``a`` in
    one ``mm``: torch.matmul multiplies a decoding step's permuted ``[B, H, 1, D]`` queries by
    a transposed table as a batch of one-row products, 2-3 times slower on the CPU.
    Everything else is torch.matmul's, whose dispatch in C++ costs less than reshaping the
    operands for a ``bmm`` in Python at a decoding step's sizes."""
    if b.dim() == 2:
        return torch.mm(a.reshape(-1, a.size(-1)), b).view(*a.shape[:-1], b.size(-1))
    return torch.matmul(a, b)


def scores(q: Tensor, k: Tensor, key_rows: Optional[Tensor] = None) -> Tensor:
    """``q k^T / sqrt(D)`` (Vaswani et al. 2017 eq. 1's logits) for ``q`` ``[B,H,Tq,D]``
    and ``k`` ``[B,H,Tk,D]`` in :func:`logit_dtype`, a fresh tensor. Half ``q`` and ``k``
    are multiplied as float32 copies (:func:`logit_product`), the scaling done on the
    copy so that ``q / sqrt(D)`` is not rounded to half first; other dtypes as vanilla
    attention computes them, with no copy.

    ``key_rows``: one ``[Tk, D]`` row ``r_j`` per key, shared by the batch and heads, for
    ``q (k_j + r_j)^T / sqrt(D)``: ``q r_j^T`` is accumulated into the scores (``addmm_``)
    with the queries scaled once, and ``k + r``, a copy of every key, is never formed.
    RPR's decoding step (eq. 4) takes it: at one query two ops fewer than the scores plus
    a bias, and each small op costs about as much as its arithmetic there."""
    compute = logit_dtype(q.dtype)
    if compute == q.dtype:
        queries = scaled(q)
        # autocast may run it in half: widened back, a no-op without autocast
        logits = in_dtype(product(queries, k.transpose(-2, -1)), compute)
        return logits if key_rows is None else _add_key_rows(logits, queries, key_rows)
    with full_precision(q):
        queries = scaled(q.to(compute))
        logits = product(queries, k.to(compute).transpose(-2, -1))
        return logits if key_rows is None else _add_key_rows(logits, queries, key_rows)


def _add_key_rows(logits: Tensor, queries: Tensor, key_rows: Tensor) -> Tensor:
    """``logits + queries key_rows^T``, in place on the fresh ``logits``."""
    flat_queries = queries.reshape(-1, queries.size(-1))
    logits.view(-1, logits.size(-1)).addmm_(flat_queries, in_dtype(key_rows, logits.dtype).t())
    return logits


def masked_scores(q: Tensor, k: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``q k^T / sqrt(D) + mask`` (:func:`scores`) for ``q`` ``[B,H,Tq,D]``, ``k``
    ``[B,H,Tk,D]`` and an additive mask broadcastable to ``[B,H,Tq,Tk]`` or None,
    in :func:`logit_dtype` (``mask`` must be in that dtype). A fresh tensor, so
    callers may add further terms in place; probabilities made from it go back
    to the inputs' dtype with ``.to(q.dtype)``."""
    logits = scores(q, k)
    return logits if mask is None else logits.add_(mask)


def dropout_probs(probs: Tensor, dropout_p: float) -> Tensor:
    """Attention dropout on the probabilities that multiply the values; the
    returned ``probs`` of every op stay undropped, as in fairseq."""
    if dropout_p > 0.0:
        return torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return probs


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
    logits: Optional[Tensor] = None,
    normaliser: Optional[Normaliser] = None,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(probs, mask, hidden, own_share)``: ``softmax(score_mod(q k^T / sqrt(D)) + bias)``
    over the keys each query may see (key padding, ``causal`` and the bool ``[Tq, Tk]``
    restriction ``allowed``), in :func:`logit_dtype`; ``mask, hidden`` from
    :func:`masking.logit_mask`. ``bias`` broadcasts to ``[B, H, Tq, Tk]`` and is in the
    logit dtype. ``logits`` replace ``q k^T / sqrt(D)``, and ``normaliser`` the softmax
    (``own_share``: the mass it leaves on each query's own value; None without one)."""
    tgt_len, src_len = q.size(2), k.size(2)
    mask, hidden = logit_mask(
        key_padding_mask, causal, query_offset, tgt_len, src_len, q.device, logit_dtype(q.dtype), allowed
    )
    if score_mod is None and logits is None:
        logits = masked_scores(q, k, mask)
        if bias is not None:
            logits = logits.add_(bias)
    else:
        raw = scores(q, k) if logits is None else logits
        logits = raw if score_mod is None else score_mod(raw, mask)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = logits + mask
    if normaliser is not None:
        probs, own_share = normaliser(logits, mask, hidden)
        return probs, mask, hidden, own_share
    return masked_softmax(logits, hidden), mask, hidden, None


def attend(
    q: Tensor, k: Tensor, v: Tensor, terms: Terms = PLAIN, options: CallOptions = CallOptions()
) -> Tuple[Tensor, Optional[Tensor]]:
    """The core path of every mechanism: ``(out, probs)`` of ``q``, ``k``, ``v`` (or the
    replacements ``terms`` give) with what ``terms`` add, under the call's ``options``:
    ``probs = weight_mod(softmax(score_mod(q k^T / sqrt(D)) + bias) * window)`` over the
    visible keys (see :func:`attention_weights`) and ``out = dropout(probs) v +
    value_term(dropout(probs))``; ``probs`` is None unless ``options.need_weights``.

    The path is :func:`paths.choose_path`'s among :func:`terms.candidate_paths`: in
    flex_attention an ``offset_table`` is read by ``j - i`` inside the kernel (its
    ``score_mod``), with a ``value_term`` only if that can be rebuilt from flex's
    log-sum-exp (:class:`position_tables.LseValueTerm`), and a ``window`` is two calls
    (:func:`flex.flex_windowed_attend`); elsewhere a table's ``dense()`` becomes that
    ``bias`` or ``score_mod``. Terms that are only an additive bias (and ``allowed``)
    otherwise run fused (:func:`fused_attention`) when the weights are not needed.
    Unchecked: the public ops check their arguments first.

    Empty sequences, as ``F.scaled_dot_product_attention`` treats them: no
    queries (``Tq = 0``) give an empty ``[B, H, 0, D]`` output and ``[B, H, 0,
    Tk]`` weights; no keys (``Tk = 0``) leave every query row without a visible
    key, which gives 0 (as a row hidden by the masks does) and ``[B, H, Tq, 0]``
    weights."""
    if terms is PLAIN and is_unmasked_step(q, k, options):
        # the path choice and the masks would give exactly this (tests/test_execution_paths.py): a decoding
        # step of rope's, xpos's and vanilla's layers skips describing the call
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=options.dropout_p), None
    given_dtype = q.dtype
    q = q if terms.query is None else terms.query
    k = k if terms.key is None else terms.key
    v = v if terms.value is None else terms.value
    if q.dtype == given_dtype:
        return _attend(q, k, v, terms, options)
    # replaced in float32 for half inputs: autocast would run the products in half again
    with torch.autocast(q.device.type, enabled=False) if autocast_enabled(q.device) else contextlib.nullcontext():
        out, probs = _attend(q, k, v, terms, options)
    return out.to(given_dtype), None if probs is None else probs.to(given_dtype)


def _attend(q: Tensor, k: Tensor, v: Tensor, terms: Terms, options: CallOptions) -> Tuple[Tensor, Optional[Tensor]]:
    key_padding_mask, causal, query_offset, dropout_p = (
        options.key_padding_mask,
        options.causal,
        options.query_offset,
        options.dropout_p,
    )
    path = path_taken(q, k, terms, options)
    if path is Path.FLEX:
        masks = dict(allowed=terms.allowed, key_padding_mask=key_padding_mask, causal=causal)
        if terms.window is not None:
            return flex_windowed_attend(q, k, v, terms.window, **masks), None
        return _flex_attend(q, k, v, terms.offset_table, terms.value_term, masks), None
    bias, score_mod = terms.bias, terms.score_mod
    if terms.offset_table is not None:
        dense = terms.offset_table.dense()
        if terms.offset_table.combine == "add":
            bias = dense
        else:
            score_mod = functools.partial(_relu_multiply, coefficients=dense)
    if path is Path.SDPA_CAUSAL:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
    if path is Path.FUSED:
        mask, hidden = logit_mask(
            key_padding_mask, causal, query_offset, q.size(2), k.size(2), q.device, q.dtype, terms.allowed
        )
        return fused_attention(q, k, v, bias, mask, hidden, dropout_p), None
    probs, mask, hidden, own_share = attention_weights(
        q,
        k,
        bias=bias,
        score_mod=score_mod,
        allowed=terms.allowed,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
        logits=terms.logits,
        normaliser=terms.normaliser,
    )
    if terms.window is not None:
        probs = probs * terms.window
    if terms.weight_mod is not None:
        probs = terms.weight_mod(probs, mask, hidden)
    probs = in_dtype(probs, q.dtype)
    attended = dropout_probs(probs, dropout_p)
    out = product(attended, v)
    if terms.value_term is not None:
        out = terms.value_term(attended, out)
    if own_share is not None:
        own_values = v[:, :, query_offset : query_offset + q.size(2)]
        out = out + own_share.to(q.dtype)[..., None] * own_values
    return out, probs if options.need_weights else None


def is_unmasked_step(q: Tensor, k: Tensor, options: CallOptions) -> bool:
    """Whether a call is one query that is the last of its keys, after cached ones
    (``query_offset > 0``), without key padding and without the weights: for plain terms
    :func:`path_taken` gives it the fused path and :func:`masking.logit_mask` no mask, so
    :func:`attend` runs SDPA on it at once."""
    return (
        q.size(2) == 1
        and 0 < options.query_offset == k.size(2) - 1
        and options.key_padding_mask is None
        and not options.need_weights
    )


def path_taken(q: Tensor, k: Tensor, terms: Terms, options: CallOptions) -> Path:
    """The path :func:`attend` runs ``terms`` on: :func:`paths.choose_path`'s among
    :func:`terms.candidate_paths`, or the eager path without describing the call where the
    terms allow no other (logits or a normaliser of their own: RPR's decoding step, PaTH,
    stick-breaking), as every decoding step of those layers would otherwise do."""
    paths = candidate_paths(terms)
    if paths is EAGER_ONLY:
        return Path.EAGER
    return choose_path(Call.of(q, k, options), paths)


def _flex_attend(q, k, v, offset_table, value_term, masks) -> Tensor:
    """:func:`flex.flex_attend`, plus the value term rebuilt from its log-sum-exp."""
    if value_term is None:
        return flex_attend(q, k, v, offset_table, **masks)
    out, lse = flex_attend(q, k, v, offset_table, return_lse=True, **masks)

    def lse_beyond(min_offset: int) -> Tensor:
        return flex_attend(q, k, v, offset_table, min_offset=min_offset, return_lse=True, **masks)[1]

    return out + value_term.from_log_normaliser(lse, lse_beyond, masks["key_padding_mask"]).to(out.dtype)


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
    ``F.scaled_dot_product_attention``; ``mask, hidden`` from :func:`masking.logit_mask`.

    The fast path for mechanisms whose math is an additive bias on the
    logits, used when the caller does not need the probabilities. Same
    semantics as :func:`masking.masked_softmax`: a hidden row gives 0. Also 0, on CPU,
    a short row whose logits are all NaN when SDPA gets no mask (the weights
    path gives NaN: see :func:`softmax_attention`).
    """
    if bias is not None:
        if q.dtype in HALF_DTYPES:
            bias = half_range_bias(bias, mask, q.dtype)
        mask = bias if mask is None else bias + mask
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return out if hidden is None else out.masked_fill(hidden, 0.0)


# An op's inputs: the tensors every op takes first; a terms function takes q and k, and v if it reads it
INPUTS = ("q", "k", "v")


def attention_op(terms_of: Callable[..., Terms], name: str, doc: str) -> Callable[..., Tuple[Tensor, Optional[Tensor]]]:
    """The public op ``name(q, k, v, *args, key_padding_mask=None, causal=False,
    query_offset=0, dropout_p=0.0, need_weights=True, flex="auto", position_map=None,
    **own)`` of the
    terms function ``terms_of(q, k[, v], *args, **own, **read)``: it checks the
    shared arguments, builds the call's :class:`paths.CallOptions` and runs
    :func:`attend` on the terms. ``read`` are the call options ``terms_of`` names as
    keyword-only parameters (``query_offset``, ``causal``, ``key_padding_mask``,
    ``position_map``): a terms function takes only what it uses, and an op whose terms
    function does not read ``position_map`` refuses one (a ValueError). The op's ``terms(q, k, v, args, own,
    options)`` makes the terms alone (the attention module's call); its signature
    is the terms function's with the inputs and the shared arguments."""
    parameters = inspect.signature(terms_of).parameters
    inputs = tuple(p for p in list(parameters)[:3] if p in INPUTS)
    if inputs[:2] != ("q", "k"):
        raise TypeError(f"{terms_of.__name__} must take q and k first (and v if it reads it)")
    read = tuple(option for option in OP_OPTIONS if option in parameters)
    takes_value = "v" in inputs

    def terms(q: Tensor, k: Tensor, v: Tensor, args: Sequence[Any], own: Dict[str, Any], options) -> Terms:
        given = {option: getattr(options, option) for option in read}
        if takes_value:
            return terms_of(q, k, v, *args, **own, **given)
        return terms_of(q, k, *args, **own, **given)

    def op(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *args,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        query_offset: int = 0,
        dropout_p: float = 0.0,
        need_weights: bool = True,
        flex: str = "auto",
        position_map: Optional[Tensor] = None,
        **own,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        check_attention_arguments(q, k, v, key_padding_mask, causal, query_offset, dropout_p)
        check_flex(flex)  # also where the terms leave no path to choose
        if position_map is not None and "position_map" not in read:
            raise ValueError(f"{name} reads no positions: position_map must be None")
        options = CallOptions(key_padding_mask, causal, query_offset, dropout_p, need_weights, flex, position_map)
        return attend(q, k, v, terms(q, k, v, args, own, options), options)

    op.__name__ = op.__qualname__ = name
    op.__module__ = terms_of.__module__
    op.__doc__ = doc
    op.terms = terms
    op.terms_of = terms_of
    op.__signature__ = _op_signature(parameters, inputs, read)
    return op


def _op_signature(parameters, inputs: Tuple[str, ...], read: Tuple[str, ...]) -> inspect.Signature:
    keyword = inspect.Parameter.KEYWORD_ONLY
    tensors = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Tensor) for name in INPUTS]
    own = [p for name, p in parameters.items() if name not in inputs and name not in read]
    shared = [
        inspect.Parameter(option, keyword, default=default)
        for option, default in CallOptions()._asdict().items()
        if option in OP_OPTIONS
    ]
    positional = [p for p in own if p.kind is not keyword]
    return inspect.Signature(tensors + positional + [p for p in own if p.kind is keyword] + shared)


def plain_terms(q: Tensor, k: Tensor) -> Terms:
    """Plain attention adds nothing."""
    return PLAIN


softmax_attention = attention_op(
    plain_terms,
    "softmax_attention",
    """Plain ``softmax(q k^T / sqrt(D)) v`` under the same conventions; returns
    ``(out, probs)`` (``probs`` is None when ``need_weights=False``).

    NaN in gives NaN out on both paths, except that on CPU the fused path
    (``need_weights=False``) gives 0 for a row of all-NaN logits shorter than
    one SIMD vector when SDPA gets no mask: torch's CPU kernel takes such a row
    for a fully masked one. Not corrected, as forcing NaN costs more than it is
    worth (docs/functional-api.md; ``tests/test_functional_errors.py`` pins both
    paths).""",
)


__all__ = [
    "attend",
    "attention_op",
    "attention_weights",
    "softmax_attention",
]
