"""Sandwich (Chi, Fan, Rudnicky, Ramadge 2023, *Dissecting Transformer Length
Extrapolation via the Lens of Receptive Field Analysis*, sec. 5).

Sandwich keeps, of the logit of sinusoidal embeddings added to the inputs, only
the inner product of the two position embeddings, which depends on the distance
alone: ``p_m . p_n = sum_{k=1}^{d/2} cos((m - n) / 10000^(2k/d))``, and adds it
to the scaled scores as a parameter-free bias, per head compressed like ALiBi's
slopes (the paper's Fig. 1: ``h = n 8 / H`` for head n = 1..H):

    b_n(m, n') = (sum_{k=1}^{d/2} cos(|m - n'| / 10000^(2k/d)) - d/2) / (n 8 / H)

The authors' code was not public when this was written; this follows NVIDIA
NeMo's port (``nemo/collections/nlp/modules/common/megatron/position_embedding/
sandwich_relative_position_embedding.py``, from the extrapolatable position
embeddings of NeMo PR #6666): k from 1 to d/2, d the per-head dimension by
default, the constant d/2 subtracted so the bias is 0 at distance 0 and below
it elsewhere (down to -d), then divided by ``n 8 / H`` (head 1 the steepest);
the bias is added after the 1/sqrt(d) scaling. The decay is about logarithmic
in the distance, with ripples. Causal in the decoder; the encoder gets the
same function of ``|m - n'|`` both ways (NeMo's ``bidirectional``).
"""

from typing import Optional

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import position_tensor
from .position_tables import OffsetTable, check_bias_table_arguments, offsets
from .terms import Terms

SANDWICH_BASE = 10000.0


def check_sandwich_dim(dim) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be an even integer >= 2 (the sinusoids come in sin/cos pairs), got {dim!r}")


def _sandwich_of(distance: Tensor, num_heads: int, dim: int, device, dtype) -> Tensor:
    frequencies = SANDWICH_BASE ** (-2.0 * torch.arange(1, dim // 2 + 1, device=device, dtype=torch.float64) / dim)
    inner_product = torch.cos(distance[:, None] * frequencies).sum(-1) - dim / 2
    compression = torch.arange(1, num_heads + 1, device=device, dtype=torch.float64) * (8.0 / num_heads)
    return (inner_product / compression[:, None]).to(dtype)


@position_tensor
def _sandwich_values(tgt_len: int, src_len: int, num_heads: int, dim: int, query_offset: int, device, dtype) -> Tensor:
    distance = offsets(tgt_len, src_len, query_offset, device, torch.float64).abs_()
    return _sandwich_of(distance, num_heads, dim, device, dtype)


def sandwich_table(
    tgt_len: int,
    src_len: int,
    num_heads: int,
    dim: int,
    query_offset: int,
    device,
    dtype,
    position_map: Optional[Tensor] = None,
) -> OffsetTable:
    """The bias per head and key offset (:class:`OffsetTable`), formed in float64 (unchecked);
    with a ``position_map`` (randomized distances ``r``), at the distance ``r_|i - j|``."""
    if position_map is not None:
        distance = offsets(tgt_len, src_len, query_offset, device, torch.float64, position_map).abs_()
        return OffsetTable(_sandwich_of(distance, num_heads, dim, device, dtype), tgt_len)
    return OffsetTable(_sandwich_values(tgt_len, src_len, num_heads, dim, query_offset, device, dtype), tgt_len)


def sandwich_bias(tgt_len: int, src_len: int, num_heads: int, dim: int, query_offset: int, device, dtype) -> Tensor:
    """The bias ``[H, Tq, Tk]`` in the floating ``dtype`` (formed in float64);
    each mistake is a ValueError naming the argument."""
    check_bias_table_arguments(tgt_len, src_len, query_offset, dtype)
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
    check_sandwich_dim(dim)
    return sandwich_table(tgt_len, src_len, num_heads, dim, query_offset, device, dtype).dense()


def sandwich_terms(
    q: Tensor, k: Tensor, dim: Optional[int] = None, *, query_offset: int, position_map: Optional[Tensor]
) -> Terms:
    """Sandwich's table ``b_h(|i - j|)`` of ``dim``-dimensional sinusoids (None: the head size);
    with a ``position_map``, of the randomized distances (:mod:`.randomized_positions`)."""
    dim = q.size(-1) if dim is None else dim
    check_sandwich_dim(dim)
    table = sandwich_table(
        q.size(2), k.size(2), q.size(1), dim, query_offset, q.device, logit_dtype(q.dtype), position_map
    )
    return Terms(offset_table=table)


sandwich_attention = attention_op(
    sandwich_terms,
    "sandwich_attention",
    """``softmax(q k^T / sqrt(D) + b_h(|i - j|)) v`` with Sandwich's bias of
    ``dim``-dimensional sinusoids (None: the head size ``D``). Returns
    ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; fused with ``need_weights=False``.""",
)


__all__ = ["sandwich_attention", "sandwich_bias"]
