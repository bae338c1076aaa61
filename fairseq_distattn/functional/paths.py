"""Which execution path one attention call takes, decided in one place:
:func:`choose_path`.

A call (:class:`Call`: its device, head size, lengths, whether the weights are
needed, attention dropout, query offset, its ``flex`` setting and, in the
attention module, the recompute length) takes one of the :class:`Path` s that
what the mechanism adds to the attention allows (:class:`terms.Terms`,
:func:`terms.candidate_paths`: an additive bias alone may run fused, a table
read by ``j - i`` or a soft window in flex_attention). The attention module's
plan (whether to recompute in row blocks) and :func:`attention.attend` ask the
same function on the same terms, so the path a layer plans for is the path it
takes. The setting is always an argument (:class:`CallOptions`' ``flex`` and
``flex_from``): nothing here holds a mode of its own.
"""

import enum
from typing import AbstractSet, Dict, NamedTuple, Optional, Tuple

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
    # exactly SDPA's causal one
    SDPA_CAUSAL = "sdpa-causal"
    # flex_attention on a table read by j - i (functional.flex), or a soft window's two flex calls (MW)
    FLEX = "flex"

    # Enum's own __hash__ is a Python function hashing the name; every attention call tests
    # paths in sets (choose_path), so members hash by identity, as they compare
    __hash__ = object.__hash__


class Keeps(enum.Enum):
    """What a path keeps for backward of the ``[Tq, Tk]`` size: whether recomputing
    the layer in blocks of query rows saves memory there."""

    # [B, H, Tq, Tk] tensors (the weights, a bias or a window with a batch dimension)
    PER_BATCH = "per batch"
    # only a bias without a batch dimension ([H or 1, Tq, Tk])
    BIAS = "bias"
    # nothing of that size (a table read inside flex; vanilla's own SDPA call, with no bias)
    NOTHING = "nothing"


class CallOptions(NamedTuple):
    """What one attention call asks for besides its tensors: every attention op's keyword
    arguments after them (``functional``'s conventions), built once per call by the
    attention module and handed down whole; the defaults are the ops'. ``flex_from``
    is the key length from which ``flex`` may take flex_attention (the attention
    module's ``--attention-recompute-length`` under ``--attention-flex auto``); the
    ops take every length. ``position_map``: randomized positions
    (``--randomized-positions``, :mod:`.randomized_positions`), a strictly increasing
    long tensor ``phi`` that the ops whose terms read positions apply (an absolute
    position ``t`` read as ``phi[t]``, an offset ``d`` as ``sign(d) phi[|d|]``); None:
    the ordinary positions."""

    key_padding_mask: Optional[Tensor] = None
    causal: bool = False
    query_offset: int = 0
    dropout_p: float = 0.0
    need_weights: bool = True
    flex: str = "auto"
    position_map: Optional[Tensor] = None
    flex_from: int = 0

    def op_keywords(self) -> Dict[str, object]:
        """The ops' keyword arguments of this call (:data:`OP_OPTIONS`)."""
        return {option: getattr(self, option) for option in OP_OPTIONS}


# the options an op's caller gives (CallOptions less what only the attention module sets)
OP_OPTIONS = CallOptions._fields[:-1]


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
    flex: str = "auto"  # FLEX_MODES
    flex_from: int = 0
    grad_enabled: bool = False  # torch.is_grad_enabled()
    causal: bool = False
    key_padding: bool = False  # a key padding mask is given
    # the attention module's calls: the queries require grad, and its --attention-recompute-length (0: never)
    query_requires_grad: bool = False
    recompute_length: int = 0
    batch: int = 0  # sentences in the call (0: not known)

    @classmethod
    def of(cls, q: Tensor, k: Tensor, options: CallOptions, recompute_length: int = 0) -> "Call":
        """The call of ``options`` on ``q`` ``[B, H, Tq, D]`` and ``k`` ``[B, H, Tk, D]``."""
        # positional, in the fields' order: every attention call builds one
        return cls(
            q.is_cuda,
            q.size(-1),
            q.size(2),
            k.size(2),
            options.need_weights,
            options.dropout_p,
            options.query_offset,
            options.flex,
            options.flex_from,
            torch.is_grad_enabled(),
            options.causal,
            options.key_padding_mask is not None,
            q.requires_grad,
            recompute_length,
            q.size(0),
        )

    @property
    def keys_reach_recompute_length(self) -> bool:
        return keys_reach_recompute_length(self.src_len, self.recompute_length)


def keys_reach_recompute_length(key_length: int, recompute_length: int) -> bool:
    """--attention-recompute-length's test (0: never), which also bounds ``--attention-flex auto``."""
    return 0 < recompute_length <= key_length


def module_flex(attention_flex: str, recompute_length: int, on_cpu: bool = False) -> Tuple[str, int]:
    """The calls' ``(flex, flex_from)`` under the attention module's ``--attention-flex``
    and ``--attention-recompute-length``: ``auto`` takes flex_attention for keys from
    the recompute length on, where the eager path holds or recomputes ``[B, H, Tq, Tk]``
    tensors (on shorter keys the eager path trains faster:
    benchmarks/results/speed/gpu-nvidia-h100-flex), never when recomputation is off;
    ``always`` at every length. On CUDA only, unless ``on_cpu`` (tests: flex's eager
    form, without gradients)."""
    check_flex(attention_flex)
    if attention_flex == "never" or (attention_flex == "auto" and recompute_length == 0):
        return "never", 0
    return ("always" if on_cpu else "auto"), (recompute_length if attention_flex == "auto" else 0)


def _flex_serves(call: Call) -> bool:
    """Whether flex_attention can run this call: full sequences (``query_offset`` 0:
    training, scoring, the encoder; a one-token decoding step gains nothing and would
    recompile per step) of at least ``flex_from`` keys, at least one query and one
    key, without the weights and without attention dropout (flex has neither), on
    CUDA with a head size its kernels tile (powers of two from 16). On CPU only when
    forced (``"always"``) and without gradients: flex has no CPU backward, so there it
    serves inference."""
    if (
        call.flex == "never"
        or _flex_module() is None
        or call.need_weights
        or call.dropout_p > 0.0
        or call.query_offset != 0
        or not call.tgt_len
        or call.src_len < max(call.flex_from, 1)
    ):
        return False
    if not call.on_cuda:
        return call.flex == "always" and not call.grad_enabled
    return call.head_size >= 16 and call.head_size & (call.head_size - 1) == 0


def _sdpa_causal_serves(call: Call) -> bool:
    """Whether the call's only mask is exactly SDPA's own causal one."""
    return call.causal and not call.key_padding and call.query_offset == 0 and call.tgt_len == call.src_len


def _eager_beats_masked_sdpa(call: Call, paths: AbstractSet[Path]) -> bool:
    """Whether a call that SDPA would run with an ``attn_mask`` (a bias, a restriction or
    key padding) runs faster eager: a decoding step on the CPU (queries after cached
    keys, no gradient), where SDPA's CPU kernel with a mask costs more than the eager
    path's few small products (the beam-search rows of ``python -m benchmarks.run``).
    Full sequences keep SDPA: it holds no ``[B, H, Tq, Tk]`` weights for backward."""
    masked = Path.SDPA_CAUSAL not in paths or call.key_padding
    return masked and not call.on_cuda and call.query_offset > 0 and not call.grad_enabled


def choose_path(call: Call, paths: AbstractSet[Path]) -> Path:
    """The path ``call`` takes among ``paths``, those its terms allow (the eager
    path always being one): flex_attention where it serves the call (it takes
    precedence: no attention matrix is kept); else, without the weights, SDPA (its
    causal kernel where the call's only mask is exactly the causal one), unless the
    eager path is the faster one (:func:`_eager_beats_masked_sdpa`); else eager."""
    check_flex(call.flex)
    if Path.FLEX in paths and _flex_serves(call):
        return Path.FLEX
    if not call.need_weights:
        if Path.SDPA_CAUSAL in paths and _sdpa_causal_serves(call):
            return Path.SDPA_CAUSAL
        if Path.FUSED in paths and not _eager_beats_masked_sdpa(call, paths):
            return Path.FUSED
    return Path.EAGER


__all__ = [
    "Call",
    "CallOptions",
    "Keeps",
    "Path",
    "choose_path",
]
