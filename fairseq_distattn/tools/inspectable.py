"""What the inspection tools, the tests and the benchmarks may ask of a mechanism beyond what
the model runs: each optional hook is a protocol here, with the answer for a mechanism that
does not implement it. The model needs none of them, so :class:`~fairseq_distattn.mechanisms.base.Mechanism`
declares none; a mechanism implements a hook where it has something to show (DA's
coefficients, CoPE's contextual positions, the window's pointers) or to ask of an example
call (:mod:`.examples`: how to draw its parameters, which options complete a choice)."""

from typing import Any, Dict, Optional, Protocol, runtime_checkable

from torch import Tensor

from ..mechanisms.base import Mechanism, PositionTerm, SoftWindow

Tensors = Dict[str, Tensor]


@runtime_checkable
class HasPositionTerm(Protocol):
    def position_term(self, tgt_len: int, src_len: int, causal: bool) -> Optional[PositionTerm]:
        """What the layer adds to (or multiplies into) the attention as a function of the
        positions alone, per head; None where that depends on the content."""


@runtime_checkable
class HasSentenceTerm(Protocol):
    def sentence_term(
        self, queries: Tensors, keys: Tensors, key_padding_mask: Optional[Tensor], causal: bool, query_offset: int
    ) -> Optional[PositionTerm]:
        """What the layer computes from its forward's inputs as a function of the sentence as
        well as the positions (CoPE's contextual positions): the first sentence's ``[H, Tq, Tk]``."""


@runtime_checkable
class HasSoftWindow(Protocol):
    def soft_window(
        self, queries: Tensors, keys: Tensors, key_padding_mask: Optional[Tensor], causal: bool, query_offset: int
    ) -> Optional[SoftWindow]:
        """The soft window the layer computes from its forward's inputs."""


@runtime_checkable
class HasExampleDistribution(Protocol):
    def example_distribution(self, name: str) -> Dict[str, Any]:
        """How an example call draws the parameter ``name`` (a ``named_parameters`` name):
        ``mean`` (a number, or a tensor that broadcasts) and ``std`` of a normal distribution,
        values a trained layer may hold where the initial ones would hide a term (DA's w = 0
        makes f = 1 at every distance). Without the hook: N(0, 1)."""


@runtime_checkable
class HasExampleOptions(Protocol):
    @classmethod
    def example_options(cls, options: Any, src_len: int, head_dim: int) -> Any:
        """The options an example call over ``src_len`` keys of ``head_dim`` runs with, given ``options`` (its
        options dataclass, which the tests vary one field at a time): where a choice works only
        with others that the flags' checks would ask for, those."""


def position_term(mechanism: Mechanism, tgt_len: int, src_len: int, causal: bool) -> Optional[PositionTerm]:
    return mechanism.position_term(tgt_len, src_len, causal) if isinstance(mechanism, HasPositionTerm) else None


def sentence_term(mechanism: Mechanism, *arguments) -> Optional[PositionTerm]:
    """:meth:`HasSentenceTerm.sentence_term` on ``arguments``; None without the hook."""
    return mechanism.sentence_term(*arguments) if isinstance(mechanism, HasSentenceTerm) else None


def soft_window(mechanism: Mechanism, *arguments) -> Optional[SoftWindow]:
    """:meth:`HasSoftWindow.soft_window` on ``arguments``; None without the hook."""
    return mechanism.soft_window(*arguments) if isinstance(mechanism, HasSoftWindow) else None


def example_distribution(mechanism: Mechanism, name: str) -> Dict[str, Any]:
    return mechanism.example_distribution(name) if isinstance(mechanism, HasExampleDistribution) else {}


def example_options(module: type, options: Any, src_len: int, head_dim: int) -> Any:
    """``module``'s (a mechanism class's) example options; ``options`` as they are without the hook."""
    return module.example_options(options, src_len, head_dim) if hasattr(module, "example_options") else options
