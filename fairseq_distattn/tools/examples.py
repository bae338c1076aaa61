"""Example calls of every registered mechanism, for the tests and benchmarks that
run them all (op contracts, fused paths, half precision, op cost): each is the
mechanism's module, built as the model builds it, with its parameters drawn
(:class:`.inspectable.HasExampleDistribution`),
called as the attention module calls it on drawn projections, so that its op
gets what :meth:`~fairseq_distattn.mechanisms.base.Mechanism.op_arguments`
hands it in the model. :class:`ExampleDraw` makes the random tensors."""

from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ..functional.paths import CallOptions
from ..mechanisms.base import Mechanism, MechanismConfig
from ..registry import MechanismInfo
from .inspectable import example_distribution, example_options


class ExampleDraw:
    """Random tensors for an example call: per-head queries ``[B, H, Tq, D]`` and
    keys ``[B, H, Tk, D]``, and tensors of any shape (a mechanism's parameters).

    Values are drawn in float64 from one generator seeded with ``seed``, so two
    draws with the same sizes and seed give the same values whatever ``dtype``;
    they are rounded to ``rounded_to`` if given (a float64 reference of a
    half-precision call sees the half call's inputs), then returned in ``dtype``
    on ``device``. Queries (and every query-side tensor) are scaled by
    ``query_scale``. With ``requires_grad`` each tensor is a leaf that requires
    grad; every tensor drawn is in :attr:`leaves` (a module's parameter as the
    parameter, :meth:`parameter`)."""

    def __init__(
        self,
        batch: int = 2,
        heads: int = 2,
        tgt_len: int = 6,
        src_len: Optional[int] = None,
        head_dim: int = 4,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        device: Union[str, torch.device] = "cpu",
        rounded_to: Optional[torch.dtype] = None,
        requires_grad: bool = False,
        query_scale: float = 1.0,
    ):
        self.batch, self.heads, self.head_dim = batch, heads, head_dim
        self.tgt_len, self.src_len = tgt_len, tgt_len if src_len is None else src_len
        self.dtype, self.device, self.rounded_to = dtype, device, rounded_to
        self.requires_grad, self.query_scale = requires_grad, query_scale
        self.generator = torch.Generator().manual_seed(seed)
        self.leaves: List[Tensor] = []

    def __call__(self, *shape: int, std: float = 1.0, mean: Union[float, Tensor] = 0.0) -> Tensor:
        """``mean + std * N(0, 1)`` of this shape (``mean`` may be a tensor that broadcasts)."""
        values = torch.randn(shape, generator=self.generator, dtype=torch.float64) * std
        values = values + (mean.double() if isinstance(mean, Tensor) else mean)
        if self.rounded_to is not None:
            values = values.to(self.rounded_to)
        tensor = values.to(device=self.device, dtype=self.dtype)
        if self.requires_grad:
            tensor.requires_grad_()
        self.leaves.append(tensor)
        return tensor

    def query(self) -> Tensor:
        """A per-head query-side tensor ``[B, H, Tq, D]`` (scaled by ``query_scale``)."""
        return self(self.batch, self.heads, self.tgt_len, self.head_dim, std=self.query_scale)

    def key(self) -> Tensor:
        """A per-head key-side tensor ``[B, H, Tk, D]``."""
        return self(self.batch, self.heads, self.src_len, self.head_dim)

    def parameter(self, values: Tensor) -> nn.Parameter:
        """``values`` (drawn here) as a module's parameter, in their place among the leaves."""
        parameter = nn.Parameter(values.detach(), requires_grad=self.requires_grad)
        self.leaves = [parameter if leaf is values else leaf for leaf in self.leaves]
        return parameter


class ExampleCall:
    """A mechanism's module (:attr:`mechanism`, its parameters drawn) and drawn per-head
    projections (:attr:`queries`: ``"query"`` and its extra query projections;
    :attr:`keys`: ``"key"``, ``"value"`` and its extra key projections). Calling it runs
    the module as the attention module does on a call without incremental state: its
    ``encode_positions``, then its ``forward`` (the one ``attend`` on the terms of its
    registered op on ``op_arguments``) with the shared keyword arguments, whose defaults
    are the ops'. Returns
    ``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None)``."""

    def __init__(
        self,
        mechanism: Mechanism,
        queries: Dict[str, Tensor],
        keys: Dict[str, Tensor],
        layer_input: Optional[Tensor] = None,
    ):
        self.mechanism, self.queries, self.keys, self.layer_input = mechanism, queries, keys, layer_input

    def all_keys(self) -> Dict[str, Tensor]:
        """The keys with what the mechanism makes of the layer input (its ``layer_inputs``), made anew."""
        if self.layer_input is None:
            return self.keys
        return {**self.keys, **self.mechanism.inputs_from_layer(self.layer_input)}

    def __call__(self, **options) -> Tuple[Tensor, Optional[Tensor]]:
        """The call with ``options``, the ops' keyword arguments (:data:`paths.OP_OPTIONS`); a
        mechanism defined for causal attention only (no encoder self-attention form) is
        called causal whatever ``causal`` says, as every layer of it is."""
        if self.mechanism.info.causal_only:
            options = {**options, "causal": True}
        key_padding_mask, query_offset = options.get("key_padding_mask"), options.get("query_offset", 0)
        queries, keys = self.mechanism.encode_positions(self.queries, self.all_keys(), key_padding_mask, query_offset)
        return self.mechanism(queries, keys, CallOptions(**options))


def example_call(info: MechanismInfo, draw: ExampleDraw, options=None) -> ExampleCall:
    """Mechanism ``info``'s module, built with ``options`` (its options dataclass; None:
    the defaults) made runnable on ``draw``'s lengths (:class:`.inspectable.HasExampleOptions`),
    ``draw.heads`` heads of ``draw.head_dim``, and q, k, v, its extra projections, its
    parameters and (for a mechanism with ``layer_inputs``) a layer input ``[Tk, B, H * D]``
    drawn by ``draw``, in that order."""
    options = info.default_options() if options is None else options
    options = example_options(info.module, options, draw.src_len, draw.head_dim)
    # building initialises parameters from the global generator, which the draws never touch
    with torch.random.fork_rng(devices=[]):
        mechanism = info.module(MechanismConfig(info.name, draw.heads, draw.head_dim, options))
    queries = {"query": draw.query()}
    keys = {"key": draw.key(), "value": draw.key()}
    queries.update((name, draw.query()) for name in mechanism.extra_queries)
    keys.update((name, draw.key()) for name in mechanism.extra_keys)
    for name, parameter in list(mechanism.named_parameters()):
        values = draw(*parameter.shape, **example_distribution(mechanism, name))
        owner, _, attribute = name.rpartition(".")
        setattr(mechanism.get_submodule(owner), attribute, draw.parameter(values))
    layer_input = draw(draw.src_len, draw.batch, draw.heads * draw.head_dim) if info.layer_inputs else None
    return ExampleCall(mechanism, queries, keys, layer_input)
