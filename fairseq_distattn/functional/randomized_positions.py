"""Randomized positions (Ruoss et al. 2023, *Randomized Positional Encodings Boost
Length Generalization of Transformers*): the samplers, and the map every
mechanism that reads positions applies to them.

Restated from the authors' code (google-deepmind/randomized_positional_encodings
at e8c64749, ``models/positional_encodings.py``):

- absolute positions (``NOISY_SIN_COS``, ``NOISY_LEARNT``, ``NOISY_ROTARY``,
  PE:196-226): ``jrandom.choice(arange(L), shape=(T,), replace=False)``, sorted:
  positions ``p_0 < ... < p_{T-1}`` drawn without replacement from ``[0, L)``
  (position 0 itself is drawn, not forced) -- :func:`sample_positions`;
- relative distances (``NOISY_RELATIVE`` PE:471-506, ``NOISY_ALIBI`` PE:620-630):
  ``r_1 < ... < r_{T-1}`` drawn without replacement from ``[1, L)``, sorted, and an
  offset ``d = j - i`` read as ``phi(d) = sign(d) r_|d|`` with ``r_0 = 0``
  (the symmetric default, ``randomize_both_sides=False``) -- :func:`sample_distances`
  and :func:`map_offsets`. These are random *distances*, one per diagonal of the
  ``[Tq, Tk]`` matrix, not differences ``p_j - p_i`` of sampled positions: every
  term stays a table read by ``j - i`` (:class:`position_tables.OffsetTable`).

Both come as one strictly increasing long tensor ``phi`` (a *position map*, the
ops' ``position_map`` keyword): an absolute mechanism reads position ``t`` as
``phi[t]``, a relative one offset ``d`` as ``sign(d) phi[|d|]`` (``phi[0] = 0``).
One draw serves the whole batch, as in the authors' code (their batches have one
length; a shorter, padded sequence here reads the first entries of the draw).
The authors' released ``NOISY_RELATIVE`` indexes a table of ``L`` rows with indexes
up to ``2L - 1``, which JAX clamps (their issue #2): here the intended map is used,
not that bug.
"""

from typing import Optional

import torch
from torch import Tensor


def _check_draw(length: int, max_position: int, low: int) -> None:
    for name, value in (("length", length), ("max_position", max_position)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if length - low > max_position - low or (length > 0 and max_position < 1):
        raise ValueError(
            f"cannot draw {length - low} distinct sorted values from [{low}, {max_position}): "
            f"max_position must be at least {max(length, 1)}"
        )


def _sorted_sample(count: int, low: int, high: int, device, generator: Optional[torch.Generator]) -> Tensor:
    """``count`` distinct values of ``[low, high)``, ascending (``torch.randperm`` on
    the CPU generator, as ``jrandom.choice(..., replace=False)`` draws: every ordered
    subset equally likely), as a long tensor on ``device``."""
    drawn = torch.randperm(high - low, generator=generator)[:count] + low
    return drawn.sort().values.to(device)


def sample_positions(
    length: int, max_position: int, device=None, generator: Optional[torch.Generator] = None
) -> Tensor:
    """``[length]`` positions ``p_0 < ... < p_{length-1}`` drawn without replacement
    from ``[0, max_position)`` (the authors' ``noisy_fixed_positional_encodings``),
    long. ``generator``: a CPU ``torch.Generator`` (None: torch's global one)."""
    _check_draw(length, max_position, 0)
    return _sorted_sample(length, 0, max_position, device, generator)


def sample_distances(
    length: int, max_position: int, device=None, generator: Optional[torch.Generator] = None
) -> Tensor:
    """``[length]`` distances ``r_0 = 0 < r_1 < ... < r_{length-1}``, the last
    ``length - 1`` drawn without replacement from ``[1, max_position)`` (the authors'
    ``NOISY_RELATIVE``/``NOISY_ALIBI`` ``right_indexes``), long: the map of every
    offset ``|j - i| < length``."""
    _check_draw(length, max_position, 1 if length else 0)
    if length == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    rest = _sorted_sample(length - 1, 1, max_position, device, generator)
    return torch.cat([torch.zeros(1, dtype=torch.long, device=rest.device), rest])


def check_position_map(position_map: Tensor, needed: int, what: str = "positions") -> None:
    """ValueError unless ``position_map`` is a 1-D integer tensor of at least ``needed`` entries."""
    if not isinstance(position_map, Tensor) or position_map.dim() != 1:
        raise ValueError(f"position_map must be a 1-D tensor, got {type(position_map).__name__}")
    if position_map.dtype.is_floating_point or position_map.dtype.is_complex or position_map.dtype == torch.bool:
        raise ValueError(f"position_map must be an integer tensor, got {position_map.dtype}")
    if position_map.numel() < needed:
        raise ValueError(
            f"position_map has {position_map.numel()} entries, fewer than the {needed} {what} of this call"
        )


def map_offsets(relative: Tensor, position_map: Tensor) -> Tensor:
    """``sign(d) phi[|d|]`` of every offset ``d`` of ``relative`` (an integer tensor),
    in ``relative``'s dtype: the randomized distance of each offset (``phi[0]`` must
    be 0, as :func:`sample_distances` draws it)."""
    longest = int(relative.abs().max()) + 1 if relative.numel() else 0
    check_position_map(position_map, longest, "distances")
    magnitude = position_map.to(relative.device)[relative.abs().long()]
    return (torch.sign(relative).long() * magnitude).to(relative.dtype)


def map_positions(positions: Tensor, position_map: Tensor) -> Tensor:
    """``phi[t]`` of every position ``t`` of ``positions`` (an integer tensor >= 0), long."""
    longest = int(positions.max()) + 1 if positions.numel() else 0
    check_position_map(position_map, longest)
    return position_map.to(positions.device)[positions.long()]


__all__ = ["map_offsets", "map_positions", "sample_distances", "sample_positions"]
