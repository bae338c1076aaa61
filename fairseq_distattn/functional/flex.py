"""The flex_attention backend: ``torch.nn.attention.flex_attention`` as the
fused path for mechanisms that are a function of the score and of the key's
offset from the query. Here: its setting (:data:`FLEX_MODES`,
:func:`check_flex`), its compilation (one compiled
function per kind of call), its block masks and :func:`flex_attend`. The
position tables it reads (:class:`position_tables.OffsetTable`,
:class:`position_tables.LseValueTerm`) are shared with the eager and SDPA
paths and live in :mod:`.position_tables`; :func:`paths.choose_path` picks
this path, for :func:`attention.attend` and MW's op.

A bias that depends only on the head and on ``j - i`` (alibi's -m_h |i-j|,
distance-mask's -alpha |i-j|, T5's bucketed b_h, DA's coefficients f(w_h |i-j|))
is ``Tq + Tk - 1`` values per head, not ``Tq x Tk``: an ``OffsetTable``
holds them and its ``score_mod`` reads entry ``j - i + Tq - 1`` inside the
kernel, so neither the bias nor the attention matrix is ever materialised, and
a score modification such as DA's eq. 6 ``ReLU(s) * f`` runs fused too (SDPA
only takes an additive mask). Causal, key-padding and direction masks become
one block mask, so fully hidden blocks are skipped; the last few block masks
are kept, keyed on the mask tensors' identity and version counter, so the
layers that share one padding tensor (and MW's and rpr's extra calls) build it
once.

Shaw et al.'s value term (eq. 3) needs each query's probability mass per
clipped distance, which flex does not return: it is rebuilt from flex's
log-sum-exp (an ``LseValueTerm``): the 2k - 1 unclipped distances are one
diagonal of keys each, whose scores are recomputed (``O(Tq k D)``) and
normalised by ``exp(s - lse)``; the keys clipped to +k are one more flex call
restricted to ``j - i >= k`` (``exp(lse_beyond - lse)``), and those clipped
to -k are what is left of 1. MW's ``(softmax(s) * M) v`` (Nguyen et al.
eq. 13) is ``softmax(s + log M) v`` times each row's window mass
``sum_j softmax(s)_j M_j = exp(lse(s + log M) - lse(s))``: two flex calls, with
M read inside the first one's ``score_mod``.

When it runs (:func:`paths.choose_path`, with every other path): full-sequence
calls (``query_offset`` 0: training, scoring, the encoder; one-token decoding
steps gain nothing and would recompile per step) without attention weights and
without attention dropout (FlexAttention has none), on CUDA with a head size
flex compiles for. Elsewhere
the mechanisms take the eager path of :func:`attention.attend`, to which this one
is equal to float32 rounding. Every op's ``flex`` argument forces it on or off. On CPU,
"always" runs flex's eager (uncompiled) form without gradients (flex has no
CPU backward), which checks the score and mask functions but is not fast; the
compiled CPU kernel is never used, because it is wrong for lengths that are
not a multiple of its block size in the torch this plugin pins.
"""

import collections
import functools
import importlib.util
import types
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from .position_tables import ScoreTable, index_scalar

FLEX_MODES = ("auto", "always", "never")


@functools.lru_cache(maxsize=None)
def _flex_module():
    """torch's flex_attention module, imported on first use (importing this package
    stays cheap and side-effect free), or None before torch 2.5."""
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return None
    return importlib.import_module("torch.nn.attention.flex_attention")


def check_flex(flex) -> None:
    """ValueError unless ``flex`` is one of :data:`FLEX_MODES`: ``"auto"`` (CUDA only, the
    default), ``"always"`` (wherever the call qualifies, CPU included) or ``"never"``."""
    if flex not in FLEX_MODES:
        raise ValueError(f"flex must be one of {', '.join(FLEX_MODES)}, got {flex!r}")


COMPILE_BACKEND = "inductor"  # torch.compile's backend for the kernel (tests count compilations with their own)


@functools.lru_cache(maxsize=None)
def _compiled_flex(variant: tuple, backend) -> Callable:
    """flex_attention compiled for one ``variant`` of the call (see :func:`flex_attend`).

    torch.compile keeps a limited number of compiled entries per code object
    (``torch._dynamo.config.recompile_limit``), and past that runs flex
    uncompiled, which on CUDA materialises every score (slower and larger than
    the eager path). Every mask combination (causal, padding, ``allowed``,
    ``min_offset``), score_mod and lse request fails the others' guards, and a
    static compile adds entries as lengths vary: compiled as one function, a
    model with rpr in both stacks ran out of entries within its first batches.
    A code object per variant gives each its own entries without touching
    torch's global configuration, and compiling with dynamic shapes from the
    start keeps varying lengths from adding more (counted in
    docs/functional-api.md; ``tests/test_flex.py`` counts the compilations)."""
    module = _flex_module()

    def flex_attention(*args, **kwargs):
        return module.flex_attention(*args, **kwargs)

    code = flex_attention.__code__.replace(co_name=f"flex_attention_variant_{_compiled_flex.cache_info().currsize}")
    own = types.FunctionType(code, flex_attention.__globals__, code.co_name, None, flex_attention.__closure__)
    return torch.compile(own, backend=backend, dynamic=True)


def _compiled_kernel(variant: tuple, q: Tensor, *args, **kwargs):
    """The compiled kernel; a failure to compile it (no Triton, a GPU it does not
    support) becomes an error that names the way off this path, instead of an
    inductor traceback in the middle of a training step."""
    try:
        return _compiled_flex(variant, COMPILE_BACKEND)(q, *args, **kwargs)
    except Exception as error:
        import torch._dynamo.exc as dynamo_errors

        if not isinstance(error, dynamo_errors.TorchDynamoException):
            raise
        raise RuntimeError(
            f"flex_attention could not be compiled for {q.device} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no message'}); take the eager path: train with "
            "--attention-flex never, generate from a trained model with --model-overrides "
            "\"{'attention_flex': 'never'}\" (fairseq-generate has no model flags), or in the functional API "
            "pass flex='never' to the op"
        ) from error


def _flex(q: Tensor, variant: tuple) -> Callable:
    """Compiled flex_attention on CUDA (once per process and variant); its eager form elsewhere."""
    return functools.partial(_compiled_kernel, variant) if q.is_cuda else _flex_module().flex_attention


# Block masks recently built, newest last: every layer that shares one key-padding
# tensor, MW's two calls and rpr's main call all need the same block mask, and
# create_block_mask evaluates the mask over every (batch, query, key) each time.
_BLOCK_MASKS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
BLOCK_MASK_CACHE_ENTRIES = 8  # a decoder layer alternates self and cross masks; rpr adds its j - i >= k mask


def _tensor_identity(tensor: Optional[Tensor]):
    """What identifies a mask tensor's contents without reading them: the object
    (kept alive by the cache entry, so its id is not reused) and its version
    counter, which every in-place change bumps. None for an inference tensor,
    which has no version counter and so is never cached."""
    if tensor is None:
        return ()
    if tensor.is_inference():
        return None
    return (id(tensor), tensor._version)


def _block_mask(q: Tensor, k: Tensor, allowed, key_padding_mask, causal: bool, min_offset: Optional[int]):
    batch, _, tgt_len, _ = q.shape
    src_len = k.size(2)
    padding_identity, allowed_identity = _tensor_identity(key_padding_mask), _tensor_identity(allowed)
    key = None
    if padding_identity is not None and allowed_identity is not None:
        key = (padding_identity, allowed_identity, causal, min_offset, batch, tgt_len, src_len, q.device)
        cached = _BLOCK_MASKS.get(key)
        if cached is not None and cached[0] is key_padding_mask and cached[1] is allowed:
            _BLOCK_MASKS.move_to_end(key)
            return cached[2]
    nearest = None if min_offset is None else index_scalar(min_offset, q.device)

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx >= 0
        if causal:
            keep = keep & (kv_idx <= q_idx)
        if key_padding_mask is not None:
            keep = keep & ~key_padding_mask[b, kv_idx]
        if allowed is not None:
            keep = keep & allowed[q_idx, kv_idx]
        if nearest is not None:
            keep = keep & (kv_idx - q_idx >= nearest)
        return keep

    block_mask = _flex_module().create_block_mask(
        mask_mod,
        batch if key_padding_mask is not None else None,
        None,
        tgt_len,
        src_len,
        device=q.device,
    )
    if key is not None:
        _BLOCK_MASKS[key] = (key_padding_mask, allowed, block_mask)
        while len(_BLOCK_MASKS) > BLOCK_MASK_CACHE_ENTRIES:
            _BLOCK_MASKS.popitem(last=False)
    return block_mask


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Optional[ScoreTable],
    *,
    allowed: Optional[Tensor] = None,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    min_offset: Optional[int] = None,
    return_lse: bool = False,
):
    """``softmax(table applied to q k^T / sqrt(D)) v`` (``table`` None: the plain
    scores) over the keys that ``causal``, ``key_padding_mask``, the bool
    ``[Tq, Tk]`` ``allowed`` and ``j - i >= min_offset`` leave visible
    (``query_offset`` 0). A row with no visible key gives 0, as on the eager
    path. ``return_lse``: ``(out, lse)`` with the float32 ``[B, H, Tq]``
    log-sum-exp of each row's logits (-inf on a row with no visible key)."""
    block_mask = None
    if causal or key_padding_mask is not None or allowed is not None or min_offset is not None:
        block_mask = _block_mask(q, k, allowed, key_padding_mask, causal, min_offset)
    score_mod = None if table is None else table.score_mod()
    # what the compiled kernel's guards tell apart, other than shapes (see _compiled_flex)
    variant = (
        causal,
        key_padding_mask is not None,
        allowed is not None,
        min_offset is not None,
        None if score_mod is None else score_mod.__code__,
        return_lse,
    )
    kernel = _flex(q, variant)
    if not return_lse:
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask)
    module = _flex_module()
    if hasattr(module, "AuxRequest"):
        out, aux = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=module.AuxRequest(lse=True))
        return out, aux.lse
    return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)


class _FlooredLog(torch.autograd.Function):
    """``log(max(M, eps))`` whose gradient is ``grad / max(M, eps)`` below the
    floor too. ``eps = sqrt(smallest normal)`` of the logits' dtype (1e-19 in
    float32, which half M is widened to, as flex scores half inputs in float32:
    float16's own would be 0.0078 and lift every window tail below it): a
    weight ``softmax(s) * M`` moves by at most ``eps``, and a key whose M
    underflows to 0 keeps the gradient eq. 13 gives it (``softmax(s) * dL/dout
    . v``, the pull that widens a window), where a plain clamp would give 0 and
    an unfloored log ``0 / 0``."""

    @staticmethod
    def forward(ctx, mask):
        ctx.save_for_backward(mask)  # the floor is redone in backward: no second [B, H, Tq, Tk] copy kept
        return _floored(mask).log()

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return (grad / _floored(mask)).to(mask.dtype)


def _floored(mask: Tensor) -> Tensor:
    # the logits' dtype (attention.logit_dtype): float32 for half M
    dtype = torch.float32 if mask.dtype in (torch.float16, torch.bfloat16) else mask.dtype
    return mask.to(dtype).clamp_min(torch.finfo(dtype).tiny ** 0.5)


@dataclass
class LogWindow:
    """``score + log M`` inside flex's ``score_mod``, M the ``[B, H, Tq, Tk]`` soft
    window (floored: :class:`_FlooredLog`)."""

    mask: Tensor
    combine: str = "add"

    def score_mod(self):
        log_mask = _FlooredLog.apply(self.mask)

        def add_log_window(score, b, h, q_idx, kv_idx):
            return score + log_mask[b, h, q_idx, kv_idx]

        return add_log_window


def flex_windowed_attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, allowed=None, key_padding_mask=None, causal: bool = False
) -> Tensor:
    """MW's ``(softmax(s) * M) v`` (eq. 13) through flex_attention, ``query_offset``
    0: ``softmax(s + log M) v`` scaled per row by the window's mass under the
    weights, ``sum_j softmax(s)_j M_j = exp(lse(s + log M) - lse(s))``. Neither
    the weights nor their product with M is formed (M itself is)."""
    masks = dict(allowed=allowed, key_padding_mask=key_padding_mask, causal=causal)
    windowed, windowed_lse = flex_attend(q, k, v, LogWindow(mask), return_lse=True, **masks)
    _, plain_lse = flex_attend(q, k, v, None, return_lse=True, **masks)
    visible_row = torch.isfinite(plain_lse)
    # a row with no visible key gives 0, as on the eager path (both lse are -inf there)
    mass = torch.where(visible_row, torch.exp(windowed_lse - plain_lse.masked_fill(~visible_row, 0.0)), 0.0)
    return windowed * mass[..., None].to(windowed.dtype)


__all__ = [
    "flex_attend",
    "flex_windowed_attend",
    "check_flex",
]
