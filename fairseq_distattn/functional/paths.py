"""Which execution path one attention call takes, decided in one place:
:func:`choose_path`.

A call (:class:`Call`: its device, head size, lengths, whether the weights are
needed, attention dropout, query offset, the caller's ``flex`` setting and, in
the attention module, the recompute length) may take one of the
:class:`Path` s that the caller can take: in :func:`attention.attend`, the
paths the op's arguments allow (an additive bias alone may run fused, a table
read by ``j - i`` in flex_attention); in the attention module, the paths the
mechanism declares in its registration (``paths=``, a :class:`Capability` per
path: the mechanism option it depends on, if any, and what backward keeps on
it). Both ask :func:`choose_path`, so the path a layer plans for (whether to
recompute in row blocks, :func:`recomputes_in_row_blocks`) is the path its op
takes. The setting is always an argument (each op's ``flex``, the attention
module's ``--attention-flex``): nothing here holds a mode of its own.
"""

import enum
from dataclasses import dataclass
from typing import AbstractSet, Any, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .flex import _flex_module, check_flex


class Path(enum.Enum):
    """How one call computes ``softmax(scores) v``."""

    # the weights formed and kept (attention.attention_weights), then multiplied into the values
    EAGER = "eager"
    # F.scaled_dot_product_attention with the mechanism's additive bias and the masks as its attn_mask
    # (attention.fused_attention)
    FUSED = "fused"
    # F.scaled_dot_product_attention with is_causal and no mask: a call with no bias whose only mask is
    # exactly SDPA's causal one; a mechanism that declares FUSED may take it
    SDPA_CAUSAL = "sdpa-causal"
    # flex_attention on a table read by j - i (functional.flex), or MW's two flex calls
    FLEX = "flex"

    # Enum's own __hash__ is a Python function hashing the name; every attention call tests
    # paths in sets (choose_path), so members hash by identity, as they compare
    __hash__ = object.__hash__


# the paths that are one F.scaled_dot_product_attention call: what a declared FUSED covers
SDPA_PATHS = frozenset({Path.FUSED, Path.SDPA_CAUSAL})
# the paths a mechanism's registration declares (MechanismInfo.paths): the eager path it always
# has, and SDPA's causal kernel is part of FUSED
DECLARED_PATHS = (Path.FUSED, Path.FLEX)


def declared_as(path: Path) -> Path:
    """The path a mechanism declares to take ``path``: FUSED for SDPA's causal kernel."""
    return Path.FUSED if path in SDPA_PATHS else path


class Keeps(enum.Enum):
    """What a path keeps for backward of the ``[Tq, Tk]`` size: whether recomputing
    the layer in blocks of query rows saves memory there."""

    # [B, H, Tq, Tk] tensors (the weights, a bias or a window with a batch dimension)
    PER_BATCH = "per batch"
    # only a bias without a batch dimension ([H or 1, Tq, Tk])
    BIAS = "bias"
    # nothing of that size (a table read inside flex; vanilla's own SDPA call, with no bias)
    NOTHING = "nothing"


@dataclass(frozen=True)
class Capability:
    """When a mechanism's op takes one path, as its registration declares it
    (``register_attention(paths={Path.FUSED: Capability(...), ...})``): for the
    calls that the path serves (:func:`choose_path`: FUSED and FLEX never with
    the weights), with every value of its options, or only where its option
    ``option`` (an attribute of its options dataclass) has one of ``values``.
    ``note`` says how it runs there (the docs' mechanism table shows it);
    ``keeps``, what backward keeps on it."""

    option: str = ""
    values: Tuple[Any, ...] = ()
    note: str = ""
    keeps: Keeps = Keeps.PER_BATCH

    def __post_init__(self):
        if bool(self.option) != bool(self.values):
            raise ValueError(f"a Capability names an option and its values together, got {self!r}")

    def holds(self, options) -> bool:
        """Whether a layer with ``options`` (its options dataclass) takes the path."""
        return not self.option or getattr(options, self.option) in self.values


# what the eager path is to every mechanism: always there, keeping the weights
EAGER_CAPABILITY = Capability()


class CallOptions(NamedTuple):
    """What one attention call asks for besides its tensors: every attention op's keyword
    arguments after them (``functional``'s conventions), built once per call by the
    attention module and handed down whole (``op(q, k, v, ..., **options._asdict())``);
    the defaults are the ops'."""

    key_padding_mask: Optional[Tensor] = None
    causal: bool = False
    query_offset: int = 0
    dropout_p: float = 0.0
    need_weights: bool = True
    flex: str = "auto"


class Call(NamedTuple):
    """What one attention call is, as far as its path depends on it (a tuple: one is
    made per attention call, and a tuple is cheaper to build than a frozen dataclass)."""

    on_cuda: bool
    head_size: int
    tgt_len: int
    src_len: int
    need_weights: bool = True
    dropout_p: float = 0.0
    query_offset: int = 0
    flex: str = "auto"  # the op's flex argument (FLEX_MODES)
    grad_enabled: bool = False  # torch.is_grad_enabled()
    causal: bool = False
    key_padding: bool = False  # a key padding mask is given
    # the attention module's calls: the queries require grad, and its --attention-recompute-length (0: never)
    query_requires_grad: bool = False
    recompute_length: int = 0

    @classmethod
    def of(
        cls,
        q: Tensor,
        k: Tensor,
        *,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        query_offset: int = 0,
        dropout_p: float = 0.0,
        need_weights: bool = True,
        flex: str = "auto",
        recompute_length: int = 0,
    ) -> "Call":
        """The call of an op on ``q`` ``[B, H, Tq, D]`` and ``k`` ``[B, H, Tk, D]``."""
        return cls(
            on_cuda=q.is_cuda,
            head_size=q.size(-1),
            tgt_len=q.size(2),
            src_len=k.size(2),
            need_weights=need_weights,
            dropout_p=dropout_p,
            query_offset=query_offset,
            flex=flex,
            grad_enabled=torch.is_grad_enabled(),
            causal=causal,
            key_padding=key_padding_mask is not None,
            query_requires_grad=q.requires_grad,
            recompute_length=recompute_length,
        )

    @property
    def keys_reach_recompute_length(self) -> bool:
        return keys_reach_recompute_length(self.src_len, self.recompute_length)


def keys_reach_recompute_length(key_length: int, recompute_length: int) -> bool:
    """--attention-recompute-length's test (0: never), which also bounds ``--attention-flex auto``."""
    return 0 < recompute_length <= key_length


def _flex_serves(call: Call) -> bool:
    """Whether flex_attention can run this call: full sequences (``query_offset`` 0:
    training, scoring, the encoder; a one-token decoding step gains nothing and would
    recompile per step), at least one query and one key, without the weights and
    without attention dropout (flex has neither), on CUDA with a head size its
    kernels tile (powers of two from 16). On CPU only when forced (``"always"``) and
    without gradients: flex has no CPU backward, so there it serves inference."""
    if (
        call.flex == "never"
        or _flex_module() is None
        or call.need_weights
        or call.dropout_p > 0.0
        or call.query_offset != 0
        or not call.tgt_len
        or not call.src_len
    ):
        return False
    if not call.on_cuda:
        return call.flex == "always" and not call.grad_enabled
    return call.head_size >= 16 and call.head_size & (call.head_size - 1) == 0


def _sdpa_causal_serves(call: Call) -> bool:
    """Whether the call's only mask is exactly SDPA's own causal one."""
    return call.causal and not call.key_padding and call.query_offset == 0 and call.tgt_len == call.src_len


def choose_path(call: Call, paths: AbstractSet[Path]) -> Path:
    """The path ``call`` takes among ``paths``, those its caller can take (the eager
    path always being one): flex_attention where it serves the call (it takes
    precedence: no attention matrix is kept); else, without the weights, SDPA (its
    causal kernel where the call's only mask is exactly the causal one); else eager."""
    check_flex(call.flex)
    if Path.FLEX in paths and _flex_serves(call):
        return Path.FLEX
    if not call.need_weights:
        if Path.SDPA_CAUSAL in paths and _sdpa_causal_serves(call):
            return Path.SDPA_CAUSAL
        if Path.FUSED in paths:
            return Path.FUSED
    return Path.EAGER


def op_flex(attention_flex: str, flex_when_taken: str, key_length: int, recompute_length: int) -> str:
    """The ops' ``flex`` argument for a call of the attention module on ``key_length``
    keys under ``--attention-flex`` (``attention_flex``) and
    ``--attention-recompute-length``: ``flex_when_taken`` where the flag takes the
    flex path, ``"never"`` elsewhere (:func:`choose_path` then decides whether the
    call qualifies). ``auto`` takes it for keys from the recompute length on, where the eager
    path holds or recomputes ``[B, H, Tq, Tk]`` tensors: on shorter keys the eager
    path trains faster (benchmarks/results/speed/gpu-nvidia-h100-flex); ``always``
    takes it at every length."""
    if attention_flex == "auto":
        takes = keys_reach_recompute_length(key_length, recompute_length)
    else:
        takes = attention_flex == "always"
    return flex_when_taken if takes else "never"


def recomputes_in_row_blocks(call: Call, paths: Mapping[Path, Capability], row_wise: bool) -> bool:
    """Whether the attention module runs a training call in blocks of query rows
    under activation checkpointing: keys from the recompute length on, gradients
    wanted, a mechanism whose every query row depends on that row's queries alone
    (``row_wise``), and a path that would keep ``[B, H, Tq, Tk]`` tensors for
    backward (the ``keeps`` of the path :func:`choose_path` takes among the layer's
    ``paths``). The call's own conditions are checked first: most calls (decoding,
    evaluation, short keys) need no path for this."""
    if not (call.keys_reach_recompute_length and call.grad_enabled and call.query_requires_grad and row_wise):
        return False
    return paths[declared_as(choose_path(call, paths.keys()))].keeps is Keeps.PER_BATCH


__all__ = [
    "Call",
    "CallOptions",
    "Capability",
    "Keeps",
    "Path",
    "choose_path",
]
