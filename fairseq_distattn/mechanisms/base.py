"""What every mechanism module shares: its config, the base class, and the
per-stack store of parameters shared across layers. No fairseq imports.

Every mechanism sees per-head tensors ``[B, H, T, D]``: ``queries`` holds
``"query"`` plus any extra query-side projections it declares, ``keys`` holds
``"key"``, ``"value"`` and its extra key-side projections (these are cached
by :class:`~fairseq_distattn.modules.multihead_attention.MechanismMultiheadAttention`
exactly like fairseq caches ``prev_key``).
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import Tensor, nn

from ..functional.attention import attend
from ..functional.paths import Call, CallOptions
from ..functional.terms import Terms, recomputes_in_row_blocks
from ..registry import REGISTRY, MechanismInfo


class Stack:
    """One stack of layers of one attention kind (the encoder's self-attention,
    the decoder's self-attention, its cross-attention): parameters that a
    mechanism shares across the layers of a stack (T5's relative attention
    bias) are made by the first layer that asks and handed to the others.
    ``max_positions``: the longest sequence the stack attends over (None: unknown)."""

    def __init__(self, description: str = "", max_positions: Optional[int] = None):
        self.description = description
        self.max_positions = max_positions
        self._shared: Dict[str, Any] = {}

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


@dataclass(frozen=True)
class MechanismConfig:
    name: str
    num_heads: int
    head_dim: int
    options: Any  # its own options dataclass (MechanismInfo.options), or None
    # the layer's stack (None: a lone attention module, which shares nothing)
    stack: Optional[Stack] = field(default=None, compare=False, hash=False, repr=False)
    # whether the layer is causal (decoder self-attention); None: either (a lone module, an example call)
    causal: Optional[bool] = None


@dataclass(frozen=True)
class LearnedValues:
    """One series of values a trained mechanism learned, one line of the checkpoint
    summary and one panel of ``python -m fairseq_distattn.inspect``'s plot of it."""

    name: str  # "w per head", "key table row norms"
    values: Tensor  # 1-D, detached, on the CPU
    positions: Optional[Tuple[int, ...]] = None  # each value's position on the x axis (None: one per head)
    axis: str = "head"  # what the positions are
    symbol: str = "d"  # the positions' symbol in the summary line
    shown: Optional[Tuple[int, ...]] = None  # the positions the summary line shows (None: every value)
    note: str = ""  # what the values mean (the plot panel's title)

    def summary_line(self) -> str:
        if self.positions is None:
            return f"{self.name}: " + " ".join(f"{value:+.4f}" for value in self.values.tolist())
        shown = self.positions if self.shown is None else self.shown
        index = [self.positions.index(position) for position in shown]
        at = ", ".join("0" if position == 0 else f"{position:+d}" for position in shown)
        return f"{self.name} at {self.symbol} = {at}: " + " ".join(
            f"{value:.4f}" for value in self.values[index].tolist()
        )


@dataclass(frozen=True)
class PositionTerm:
    """What a mechanism puts on (or multiplies into) the attention as a function of
    the positions alone, per head: ``values`` ``[H or 1, Tq, Tk]`` float64 on the CPU;
    ``name`` is the file-name form, ``title`` the plots'."""

    name: str
    title: str
    values: Tensor


@dataclass(frozen=True)
class SoftWindow:
    """A mechanism's soft window over the keys, ``[B, H, Tq, Tk]`` each: the left and
    right boundary distributions and the mask they make; ``equation`` names it."""

    left_pointer: Tensor
    right_pointer: Tensor
    mask: Tensor
    equation: str


def parameter_values(module: nn.Module, num_heads: int) -> List[LearnedValues]:
    """Every parameter of ``module`` as learned values: one of ``num_heads`` values
    as they are, any other by the norms of its rows (its first dimension)."""
    found = []
    for name, parameter in module.named_parameters():
        values = parameter.detach().double().cpu()
        values = values.reshape(1) if values.dim() == 0 else values
        if values.dim() == 1 and values.numel() == num_heads:
            found.append(LearnedValues(f"{name} per head", values))
            continue
        norms = values.reshape(values.size(0), -1).norm(dim=-1) if values.dim() > 1 else values.abs()
        rows = tuple(range(norms.numel()))
        shown = rows if len(rows) <= 8 else (rows[0], rows[len(rows) // 2], rows[-1])
        found.append(
            LearnedValues(
                f"{name} {list(values.shape)} row norms",
                norms,
                positions=rows,
                axis=f"row of {name}",
                symbol="row",
                shown=shown,
            )
        )
    return found


class Mechanism(nn.Module):
    """Base: the declarations of the registered name, and the call into its functional op."""

    extra_queries: Tuple[str, ...] = ()
    extra_keys: Tuple[str, ...] = ()
    # why a subclass overrides terms instead of declaring op_arguments alone (a test holds them to it)
    overrides_terms_because: str = ""
    # a sequence length whose crossing makes the keys cached before it stale (LongRoPE's switch of
    # factors): the decoder then recomputes its whole decoding cache once, in one pass (None: never)
    cache_recompute_length: Optional[int] = None
    # what --randomized-positions randomizes in this mechanism's training calls (Ruoss et al. 2023):
    # "positions" (sorted positions of [0, N), given to encode_positions: RoPE's rotation), "distances"
    # (sorted distances of [1, N) for the offsets j - i its terms read: ALiBi's table), or None: its terms
    # read no positions; the call's CallOptions.position_map holds the draw
    random_positions: Optional[str] = None

    def __init__(self, config: MechanismConfig):
        super().__init__()
        self.config = config
        self.extra_queries = self.info.extra_queries
        self.extra_keys = self.info.extra_keys

    @property
    def info(self) -> MechanismInfo:
        return REGISTRY[self.config.name]

    @classmethod
    def check_options(cls, options, kind=None, layers=()) -> None:
        """The mechanism's one validation hook beyond its fields' converters (which check
        single values): raise SpecError where ``options`` (its own options dataclass)
        cannot work. Called with ``kind`` None once the flags are read, for every
        registered mechanism, to check its options together (``--t5-bias-max-distance``
        against ``--t5-bias-buckets``); then for each attention ``kind`` (a
        :class:`fairseq_distattn.registry.AttentionKind`) whose ``layers`` use it, to
        check them against that stack (its causality, longest sequence, head size)."""

    def recomputes_in_row_blocks(
        self, call: Call, queries: Dict[str, Tensor], keys: Dict[str, Tensor], options
    ) -> bool:
        """Whether the attention module recomputes ``call`` (a training call from the
        recompute length on) in blocks of query rows (:func:`terms.recomputes_in_row_blocks`):
        only for mechanisms whose every query row depends on that row's queries alone
        (declared ``row_wise``), where the path the call takes keeps [B, H, Tq, Tk]
        tensors for backward. The path is read from the terms of an empty block of
        queries: the same kinds of terms as the call's, without their [Tq, Tk] cost."""

        def empty_block_terms() -> Terms:
            no_rows = {name: tensor[:, :, :0] for name, tensor in queries.items()}
            return self.terms(no_rows, keys, options)

        return recomputes_in_row_blocks(call, empty_block_terms, self.info.row_wise)

    def inputs_from_layer(self, x: Tensor) -> Dict[str, Tensor]:
        """The per-position inputs the mechanism makes from the layer's key-side input ``x``
        ``[T, B, E]`` (its registration's ``layer_inputs``, each ``[B, H, T, W]``), which the
        attention module caches with the keys: by default none."""
        return {}

    def encode_positions(
        self,
        queries: Dict[str, Tensor],
        keys: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        query_offset: int,
        *,
        position_map: Optional[Tensor] = None,
    ) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
        """Position information put into the projections themselves (RoPE's
        rotation), by default none. ``position_map``: the call's randomized positions
        (given only to a mechanism whose ``random_positions`` is ``"positions"``). The
        attention module calls it on each call's new queries and keys before it caches
        the keys, so a decoding step encodes only its own token: its rows sit at index ``query_offset`` on of the
        self-attended sequence, whose whole padding (cached steps included)
        ``key_padding_mask`` marks."""
        return queries, keys

    def learned_values(self, causal: bool) -> List[LearnedValues]:
        """What this layer learned, for the checkpoint summary and the plots of
        ``python -m fairseq_distattn.inspect`` (``causal``: decoder self-attention,
        where no key is after its query). By default every parameter
        (:func:`parameter_values`); a mechanism names what its values mean."""
        return parameter_values(self, self.config.num_heads)

    def op_arguments(
        self, queries: Dict[str, Tensor], keys: Dict[str, Tensor], options: CallOptions
    ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """What this layer hands its registered op after ``q, k, v`` for a call with
        ``options`` (:class:`~fairseq_distattn.functional.paths.CallOptions`, which come
        with the call): the positional arguments (its parameters, its extra projections
        out of ``queries`` and ``keys``, what it makes of them for the call) and its own
        keyword arguments (its options). Tests and benchmarks call the op with it, as the
        model does. By default none: the op needs nothing but the tensors."""
        return (), {}

    def terms(
        self,
        queries: Dict[str, Tensor],
        keys: Dict[str, Tensor],
        options: CallOptions,
        cache: Optional[Dict[str, Optional[Tensor]]] = None,
    ) -> Terms:
        """What this layer adds to the attention for one call
        (:class:`~fairseq_distattn.functional.terms.Terms`): its registered op's terms on the
        call's tensors and :meth:`op_arguments`. ``cache`` is the layer's incremental state
        (batch-first tensors), or None. A mechanism overrides this only where it must, and
        says why in ``overrides_terms_because``."""
        positional, own = self.op_arguments(queries, keys, options)
        return self.info.op.terms(queries["query"], keys["key"], keys["value"], positional, own, options)

    def forward(
        self,
        queries: Dict[str, Tensor],
        keys: Dict[str, Tensor],
        options: CallOptions,
        cache: Optional[Dict[str, Optional[Tensor]]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None when not need_weights)``: the one
        :func:`~fairseq_distattn.functional.attention.attend` on :meth:`terms`."""
        terms = self.terms(queries, keys, options, cache)
        return attend(queries["query"], keys["key"], keys["value"], terms, options)
