"""The self-attention decoding cache's buffers, without a copy of the cache per step.

fairseq's ``MultiheadAttention`` appends each step's keys and values to its cache with
``torch.cat``, and beam search reorders the cache with ``index_select`` before every
step: two copies of the whole cache per layer and step. Here the reorder writes its
copy into a buffer one step longer (:func:`reordered_with_room`) and the next step
writes its keys into that room (:func:`appended`): one copy per step, the reorder's.
The cached tensor stays a ``[B, H, T, W]`` view of its buffer, which carries how many
positions of room follow it (an attribute of that view alone: any other tensor, a
slice of a longer one included, has none).

A cache whose room is written in place must not be shared: a copy of the incremental
state dict that goes on decoding beside the original (a fork, which fairseq's own
generators never make) would write the same room. Copy its tensors to fork it.
"""

import torch
from torch import Tensor

ROOM = "_decoding_cache_room"  # the attribute of a cached view that holds its buffer's free positions


def reordered_with_room(cached: Tensor, order: Tensor) -> Tensor:
    """``cached.index_select(0, order)`` for ``cached`` ``[B, H, T, W]``, written into a
    buffer of ``T + 1`` positions: the next step's :func:`appended` fills the last one.
    A plain ``index_select`` where autograd records ``cached`` (``out=`` has no gradient)."""
    if torch.is_grad_enabled() and cached.requires_grad:
        return cached.index_select(0, order)
    heads, length, width = cached.shape[1:]
    buffer = cached.new_empty(order.numel(), heads, length + 1, width)
    reordered = buffer.as_strided((order.numel(), heads, length, width), buffer.stride())
    torch.index_select(cached, 0, order, out=reordered)
    setattr(reordered, ROOM, 1)
    return reordered


def appended(cached: Tensor, new: Tensor) -> Tensor:
    """``torch.cat([cached, new], dim=2)`` for ``[B, H, T, W]`` and ``[B, H, n, W]``:
    ``new`` written into the room after ``cached`` where it has room for it and autograd
    records neither, a copy of both otherwise."""
    length, count = cached.size(2), new.size(2)
    recorded = torch.is_grad_enabled() and (cached.requires_grad or new.requires_grad)
    if recorded or getattr(cached, ROOM, 0) < count:
        return torch.cat([cached, new], dim=2)
    batch, heads, _, width = cached.shape
    stride = cached.stride()
    cached.as_strided(new.shape, stride, cached.storage_offset() + length * stride[2]).copy_(new)
    return cached.as_strided((batch, heads, length + count, width), stride)
