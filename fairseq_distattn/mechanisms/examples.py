"""Example calls of every registered mechanism's functional op, for the tests
and benchmarks that run them all (op contracts, fused paths, half precision,
op cost): ``MechanismInfo.example(draw, options)`` names the op's arguments
beyond q, k and v, and :class:`ExampleDraw` makes the random tensors."""

from typing import Any, Callable, List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..registry import MechanismInfo


class ExampleDraw:
    """Random tensors for an example call: per-head queries ``[B, H, Tq, D]`` and
    keys ``[B, H, Tk, D]``, and tensors of any shape (a mechanism's parameters).

    Values are drawn in float64 from one generator seeded with ``seed``, so two
    draws with the same sizes and seed give the same values whatever ``dtype``;
    they are rounded to ``rounded_to`` if given (a float64 reference of a
    half-precision call sees the half call's inputs), then returned in ``dtype``
    on ``device``. Queries (and every query-side tensor) are scaled by
    ``query_scale``. With ``requires_grad`` each tensor is a leaf that requires
    grad; every tensor drawn is in :attr:`leaves`."""

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
        values = torch.randn(*shape, generator=self.generator, dtype=torch.float64) * std
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


OpCall = Callable[..., Tuple[Tensor, Optional[Tensor]]]


def example_call(info: MechanismInfo, draw: ExampleDraw, options: Any = None) -> OpCall:
    """Draws q, k, v and the example arguments of mechanism ``info`` (with
    ``options``, its options dataclass; None: the defaults) and returns
    ``call(**shared)`` that runs its op on them with the shared keyword
    arguments (``key_padding_mask``, ``causal``, ...)."""
    q, k, v = draw.query(), draw.key(), draw.key()
    args, kwargs = info.example(draw, info.default_options() if options is None else options)

    def call(**shared):
        return info.op(q, k, v, *args, **kwargs, **shared)

    return call
