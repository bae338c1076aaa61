"""Position tables: a term of the logits that is a function of the key's
offset from the query, ``j - (query_offset + i)``, stored once per diagonal of
the ``[Tq, Tk]`` matrix; and the checks of the lengths and offsets that every
position helper takes.

Every mechanism that is a function of ``j - i`` builds one, on every path:
:func:`offsets` lays out the ``Tq + Tk - 1`` offsets, an :class:`OffsetTable`
holds a value per head and offset (``combine``: a bias, or DA's
``ReLU(score) * value``), and :func:`attention.attend` takes it (a
:class:`ScoreTable`) as ``offset_table``: its ``dense()`` matrix on the eager
and SDPA paths, its ``score_mod()`` inside flex_attention (:mod:`.flex`). An
:class:`LseValueTerm` is a value term that can also be rebuilt from flex's
log-sum-exp; :func:`index_scalar` gives the 0-d tensors a ``score_mod`` reads
its shifts from. :func:`check_position_argument`,
:func:`check_position_arguments` and :func:`check_bias_table_arguments` raise
the ValueError that names a bad length, offset or dtype.
"""

import functools
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Protocol, Sequence, Tuple

import torch
from torch import Tensor

from .randomized_positions import map_offsets

COMBINES = ("add", "relu-multiply")  # a bias on the scaled score; ReLU(score) * value (DA's eq. 6)


def check_position_argument(name: str, value) -> None:
    """ValueError unless ``value``, a length or a position, is an integer >= 0
    (a Python check: the position helpers would otherwise fail inside
    ``torch.arange``, or silently build a tensor for a fractional length)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def check_position_arguments(tgt_len: int, src_len: int, query_offset: int) -> None:
    """:func:`check_position_argument` for the lengths and ``query_offset`` every position helper takes."""
    check_position_argument("tgt_len", tgt_len)
    check_position_argument("src_len", src_len)
    check_position_argument("query_offset", query_offset)


def check_bias_table_arguments(tgt_len: int, src_len: int, query_offset: int, dtype) -> None:
    """The arguments every public ``*_bias(tgt_len, src_len, ..., query_offset,
    device, dtype)`` helper shares: a ValueError naming the one that is wrong."""
    check_position_arguments(tgt_len, src_len, query_offset)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point torch.dtype, got {dtype!r}")


def offsets(
    tgt_len: int, src_len: int, query_offset: int, device, dtype=torch.long, position_map: Optional[Tensor] = None
) -> Tensor:
    """The key's position relative to the query's, ``j - (query_offset + i)``,
    once per diagonal of a ``[Tq, Tk]`` matrix: entry ``j - i + Tq - 1``.
    With a ``position_map`` ``phi`` (randomized positions, :mod:`.randomized_positions`)
    each offset ``d`` is its randomized distance ``sign(d) phi[|d|]`` instead: still
    one value per diagonal, so every table read by ``j - i`` keeps its layout.

    ``Tq + Tk - 1`` entries. Without queries (``Tq = 0``: nothing reads the
    table) the ``Tk`` offsets of the keys from ``query_offset``, as for one
    query, so that the width gives ``Tk`` whatever the lengths, 0 included
    (:attr:`OffsetTable.src_len`)."""
    first, last = offset_range(tgt_len, src_len, query_offset)
    if position_map is None:
        return torch.arange(first, last + 1, device=device, dtype=dtype)
    relative = torch.arange(first, last + 1, device=device)
    return map_offsets(relative, position_map).to(dtype)


def offset_range(tgt_len: int, src_len: int, query_offset: int) -> Tuple[int, int]:
    """The first and last of the :func:`offsets` of a call (checked: a ValueError names a bad length)."""
    check_position_arguments(tgt_len, src_len, query_offset)
    return -(max(tgt_len, 1) - 1) - query_offset, src_len - query_offset - 1


# id of the owning parameter -> (a weak reference to it, its key, reach N, values at the offsets
# -(N-1)..N-1); an entry goes with its owner (values_by_distance). Not a WeakKeyDictionary: that
# compares keys with ==, which a tensor answers elementwise
_BY_DISTANCE: Dict[int, tuple] = {}
_FIRST_REACH = 64


def forget_tables_by_distance() -> None:
    """Makes every table :func:`values_by_distance` keeps stale: the next call without
    gradients evaluates its table again. A table is keyed on its parameters' version
    counters, which an in-place update bumps, but fairseq's optimizers (its Adam, the fp16
    wrappers' copies) write parameters through ``p.data``, which bumps none: the attention
    module calls this whenever its model changes mode, as fairseq's trainer does around
    every validation step, so that a validation never reads a table of the parameters
    before the last training steps (docs/fairseq-traps.md)."""
    for owner_id, (owner, _, reach, values) in list(_BY_DISTANCE.items()):
        # the entry stays (its owner's finalizer removes it), with a key no call has
        _BY_DISTANCE[owner_id] = (owner, None, reach, values)


def values_by_distance(
    values_of: Callable[[Tensor], Tensor],
    parameters: Sequence[Optional[Tensor]],
    settings: tuple,
    tgt_len: int,
    src_len: int,
    query_offset: int,
    dtype: torch.dtype,
) -> Tensor:
    """``values_of(|d|)`` for the :func:`offsets` ``d`` of a call (``[H or 1, Tq + Tk - 1]``),
    for a table that is a function of the size of the offset and of ``parameters``
    (the first one, a tensor, owns the memo) and ``settings`` alone: ``values_of`` takes the
    distances as a ``dtype`` tensor ``[W]`` on the first parameter's device and returns
    ``[H or 1, W]``. While no gradient is recorded (decoding, scoring) the values are read
    from a table over ``-(N-1)..N-1`` kept per owner while none of ``parameters`` changes
    (its identity, storage and version counter, which every in-place update bumps) and
    :func:`forget_tables_by_distance` is not called (an update through ``p.data`` bumps no
    version counter), grown as the offsets reach further: a decoding step then slices a
    view instead of evaluating the table again in every layer and step. With gradients it is evaluated for the call."""
    owner = parameters[0]
    if torch.is_grad_enabled() or owner.is_inference():
        return values_of(offsets(tgt_len, src_len, query_offset, owner.device, dtype).abs_())
    first, last = offset_range(tgt_len, src_len, query_offset)
    key = (tuple(None if p is None else (id(p), p.data_ptr(), p._version) for p in parameters), settings, dtype)
    reach = max(-first, last) + 1
    entry = _BY_DISTANCE.get(id(owner))
    same = entry is not None and entry[0]() is owner and entry[1] == key
    if not same or entry[2] < reach:
        grown = max(reach, _FIRST_REACH, 2 * entry[2] if same else 0)
        with torch.inference_mode(False):  # read later outside inference mode too
            distance = torch.arange(1 - grown, grown, device=owner.device, dtype=dtype).abs_()
            values = values_of(distance)
        if entry is None or entry[0]() is not owner:
            weakref.finalize(owner, _BY_DISTANCE.pop, id(owner), None)
        entry = (weakref.ref(owner), key, grown, values)
        _BY_DISTANCE[id(owner)] = entry
    centre = entry[2] - 1
    return entry[3][:, centre + first : centre + last + 1]


@functools.lru_cache(maxsize=256)
def _index_scalar(value: int, device: torch.device) -> Tensor:
    """A cached 0-d long tensor: a score_mod reads its shifts from tensors (a
    Python int would recompile the kernel for every length), and building one
    per call would be a blocking host-to-device copy on CUDA in every layer."""
    with torch.inference_mode(False):
        return torch.tensor(value, device=device)


def index_scalar(value: int, device) -> Tensor:
    return _index_scalar(int(value), torch.device(device))


class ScoreTable(Protocol):
    """What :func:`attention.attend` takes as ``offset_table``: a bias (``combine``
    "add") or DA's ``ReLU(score) * value`` ("relu-multiply") given as a table
    read inside flex_attention's ``score_mod``, or as its ``dense()`` matrix.
    ``per_batch``: whether that matrix has a batch dimension (what SDPA then keeps
    for backward, :func:`terms.kept_for_backward`)."""

    combine: str
    per_batch: bool

    def dense(self) -> Tensor: ...

    def score_mod(self) -> Callable: ...


@dataclass
class OffsetTable:
    """Per-head values of a function of ``j - i``: ``values`` ``[H or 1, Tq + Tk - 1]``,
    entry ``j - i + Tq - 1`` (see :func:`offsets`; ``[H or 1, Tk]`` when ``Tq``
    is 0). ``combine``: ``"add"`` for a bias on the scaled score,
    ``"relu-multiply"`` for ``ReLU(score) * value``. Either length may be 0
    (an empty matrix)."""

    values: Tensor
    tgt_len: int
    combine: str = "add"
    per_batch = False  # a class attribute: one row per head, for every sentence

    def __post_init__(self):
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {self.combine!r}")
        if self.values.dim() != 2 or self.src_len < 0:
            raise ValueError(
                f"values must be [H or 1, Tq + Tk - 1] with Tq = {self.tgt_len}, got {tuple(self.values.shape)}"
            )

    @property
    def src_len(self) -> int:
        """``Tk``, from the table's width (:func:`offsets`: laid out as for one query when ``Tq`` is 0)."""
        return self.values.size(-1) - max(self.tgt_len, 1) + 1

    def dense(self) -> Tensor:
        """The ``[H or 1, Tq, Tk]`` matrix the table stands for (the eager path's).

        Reversed, the table's Tk-wide windows are the matrix's rows with their
        keys reversed (a Hankel matrix): unfold and flip, whose backward is about
        twice as fast as an index gather's scatter-add on CPU."""
        if self.tgt_len == 1:  # a decoding step: the table is its one row
            return self.values[:, None]
        rows = self.values.flip(-1).unfold(-1, self.src_len, 1).flip(-1)
        # without queries the table is laid out for one: its one row is not the matrix's
        return rows if self.tgt_len else rows[:, :0]

    def score_mod(self) -> Callable:
        values = self.values
        shared = values.size(0) == 1
        shift = index_scalar(self.tgt_len - 1, values.device)

        def lookup(h, q_idx, kv_idx):
            column = kv_idx - q_idx + shift
            return values[0, column] if shared else values[h, column]

        if self.combine == "add":
            return lambda score, b, h, q_idx, kv_idx: score + lookup(h, q_idx, kv_idx)
        return lambda score, b, h, q_idx, kv_idx: torch.relu(score) * lookup(h, q_idx, kv_idx)


class LseValueTerm(Protocol):
    """A term added to the attention output that depends on the probabilities
    (``value_term`` of :func:`attention.attend`), which can also be rebuilt from
    flex's log-sum-exp so that the mechanism stays on the flex path."""

    def __call__(self, attended: Tensor) -> Tensor:
        """The term from the (dropped) ``[B, H, Tq, Tk]`` probabilities: the eager path."""
        ...

    def from_log_normaliser(
        self, lse: Tensor, lse_beyond: Callable[[int], Tensor], key_padding_mask: Optional[Tensor]
    ) -> Tensor:
        """The term from ``lse`` ``[B, H, Tq]`` (float32, -inf on rows with no
        visible key) and ``lse_beyond(d)``, the log-sum-exp over the visible
        keys with ``j - i >= d`` only."""
        ...


__all__ = [
    "LseValueTerm",
    "OffsetTable",
    "ScoreTable",
    "index_scalar",
    "offsets",
]
