"""Masks and positions shared by every mechanism, and the argument checks
every op makes.

Conventions (the public API of :mod:`fairseq_distattn.functional`):
query row ``i`` sits at position ``query_offset + i``, key column ``j`` at
position ``j``, so a single code path serves full-sequence and incremental
(one token at a time) decoding. ``key_padding_mask`` is ``[B, Tk]`` bool with
True marking padding; ``causal`` hides keys after the query.

Here: positions (:func:`sequence_positions`, :func:`relative_distance`) and
their cache (:func:`position_tensor`); the masks, composed only here
(:func:`causal_visibility`, :func:`as_logit_mask`, :func:`logit_mask`) and
applied by :func:`masked_softmax`; and the checks of the arguments the ops
share (:func:`check_attention_arguments`, :func:`check_tensor_argument`,
:func:`autocast_enabled`). The core that applies the masks for every
mechanism is :func:`attention.attend`; the tables of a term by ``j - i`` and the
checks of lengths and offsets are in :mod:`.position_tables`.
"""

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from .position_tables import check_position_argument, check_position_arguments

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


def in_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, without the dispatch when ``x`` already has it: a decoding step's
    tensors are small enough that the no-op conversions of its path cost as much as
    an op of its arithmetic."""
    return x if x.dtype == dtype else x.to(dtype)


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
    :func:`masked_softmax` and :func:`attend.fused_attention` zero them instead."""
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
    probs = in_dtype(torch.softmax(masked_logits, dim=-1, dtype=softmax_dtype), masked_logits.dtype)
    return probs if hidden is None else probs.masked_fill(hidden, 0.0)


def check_queries_among_keys(tgt_len: int, query_offset: int, src_len: int, condition: str, why: str) -> None:
    """ValueError unless ``query_offset + Tq <= Tk``: the ops whose query at position p reads
    something given with the keys up to p (a gate, a Householder vector, its own value)."""
    if query_offset + tgt_len > src_len:
        raise ValueError(
            f"query_offset + Tq must be <= Tk{condition}: {why}, got query_offset {query_offset}, Tq {tgt_len} "
            f"and Tk {src_len} (the keys' src_len)"
        )


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


__all__ = [
    "logit_mask",
    "masked_softmax",
    "relative_distance",
    "sequence_positions",
]
