"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge,
Rudnicky 2022, *KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation*).

Sec. 4.2 derives the bias from conditionally positive definite kernels of the
distance, shifted to be a bias on the logits (eq. 6, the two kernels of sec. 4.3):

    logarithmic  b_h(i, j) = -r1_h log(1 + r2_h |i - j|),    r1, r2 > 0
    power        b_h(i, j) = -r1_h |i - j|^r2_h,              r1 > 0, 0 < r2 <= 2

added to the scaled scores ``q_i k_j / sqrt(d)`` (the authors' gpt-neox code
adds it to ``matmul_result`` after the ``1 / norm_factor`` scaling), with r1 and
r2 learned per head (the authors' code shares them across layers: see the
mechanism). The power kernel with r2 = 1 is ALiBi with learned slopes; the
logarithmic one is what the paper's tables favour.

The constraints: the authors' code (chijames/KERPLE,
``megatron/mpu/layers.py``, ``ParallelKerpleLog`` and ``ParallelKerplePower``)
clamps the parameters' data to ``>= 1e-2`` (and the power's r2 to ``<= 2``) at
every forward, a projection after each optimiser step. The op here applies
the same clamp to the values it is given, so the kernel is always the one the
constraints allow (also for parameters that a last optimiser step moved out
of bounds); the mechanism projects its parameters' data as the authors do.

The causal form (the paper's; its code zeroes the distances above the
diagonal, which the causal mask hides) is ``|i - j|`` on every visible key;
the encoder gets the same kernel of ``|i - j|`` in both directions (the
kernels are functions of the distance, which is symmetric).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_tensor_argument
from .position_tables import OffsetTable, check_position_arguments, offsets
from .terms import Terms

KERPLE_KERNELS = ("log", "power")
# the authors' projection: both parameters >= 1e-2, the power kernel's exponent <= 2
KERPLE_MIN = 1e-2
KERPLE_POWER_MAX = 2.0


def constrained(r1: Tensor, r2: Tensor, kernel: str) -> Tuple[Tensor, Tensor]:
    """``(r1, r2)`` clamped to the kernel's constraints, as the authors' code does."""
    r2_max = KERPLE_POWER_MAX if kernel == "power" else None
    return r1.clamp(min=KERPLE_MIN), r2.clamp(min=KERPLE_MIN, max=r2_max)


def check_kernel_arguments(kernel: str, r1, r2, num_heads: Optional[int] = None) -> None:
    if kernel not in KERPLE_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERPLE_KERNELS)}, got {kernel!r}")
    for name, parameter in (("r1", r1), ("r2", r2)):
        if not isinstance(parameter, Tensor) or parameter.dim() != 1:
            shape = tuple(parameter.shape) if isinstance(parameter, Tensor) else repr(parameter)
            raise ValueError(f"{name} must be [H], one per head, got {shape}")
        if num_heads is not None and parameter.size(0) != num_heads:
            raise ValueError(f"{name} must be [H] = ({num_heads},), one per head, got {tuple(parameter.shape)}")
    if r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must have one value per head each, got {tuple(r1.shape)} and {tuple(r2.shape)}")


def kerple_table(
    r1: Tensor,
    r2: Tensor,
    kernel: str,
    tgt_len: int,
    src_len: int,
    query_offset: int,
    dtype: torch.dtype,
    position_map: Optional[Tensor] = None,
) -> OffsetTable:
    """The kernel's bias per head and key offset (:class:`OffsetTable`), in ``dtype`` (unchecked);
    with a ``position_map`` (randomized distances ``r``), at the distance ``r_|i - j|``."""
    r1, r2 = constrained(r1.to(dtype), r2.to(dtype), kernel)
    distance = offsets(tgt_len, src_len, query_offset, r1.device, dtype, position_map).abs_()
    if kernel == "log":
        values = torch.log1p(r2[:, None] * distance)
    else:
        # 0 ** r2 is 0, and torch's pow gives it a zero gradient in r2 (not 0 * log 0)
        values = distance.pow(r2[:, None])
    return OffsetTable(-r1[:, None] * values, tgt_len)


def kerple_bias(r1: Tensor, r2: Tensor, kernel: str, tgt_len: int, src_len: int, query_offset: int = 0) -> Tensor:
    """The kernel's bias ``[H, Tq, Tk]`` in the parameters' dtype; each mistake is
    a ValueError naming the argument."""
    check_kernel_arguments(kernel, r1, r2)
    check_tensor_argument("r1", r1)
    check_tensor_argument("r2", r2, "r1", r1)
    check_position_arguments(tgt_len, src_len, query_offset)
    return kerple_table(r1, r2, kernel, tgt_len, src_len, query_offset, r1.dtype).dense()


def kerple_terms(
    q: Tensor,
    k: Tensor,
    r1: Tensor,
    r2: Tensor,
    *,
    kernel: str = "log",
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """KERPLE's table ``b_h(i, j)`` of ``kernel`` (:func:`kerple_table`); with a
    ``position_map``, of the randomized distances (:mod:`.randomized_positions`)."""
    check_kernel_arguments(kernel, r1, r2, q.size(1))
    check_tensor_argument("r1", r1, "q", q, dtypes=None)  # any floating dtype: converted
    check_tensor_argument("r2", r2, "q", q, dtypes=None)
    table = kerple_table(r1, r2, kernel, q.size(2), k.size(2), query_offset, logit_dtype(q.dtype), position_map)
    return Terms(offset_table=table)


kerple_attention = attention_op(
    kerple_terms,
    "kerple_attention",
    """``softmax(q k^T / sqrt(D) + b_h(i, j)) v`` with KERPLE's ``kernel``
    (``"log"`` or ``"power"``) of per-head ``r1``, ``r2`` ``[H]`` (clamped to the
    constraints, see the module docstring). Returns ``(out [B,H,Tq,D], probs
    [B,H,Tq,Tk])``; fused with ``need_weights=False``, flex_attention on CUDA
    with gradients to r1 and r2.""",
)


__all__ = ["KERPLE_KERNELS", "kerple_attention", "kerple_bias"]
