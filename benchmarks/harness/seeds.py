"""Results over seeds: the mean and sample std of a configuration's runs, and how the
tables show them."""

from __future__ import annotations

import statistics
from typing import Dict, Sequence, Tuple


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std_text(values: Sequence[float], digits: int = 2) -> str:
    """``mean +- sample std``; one value alone, since one seed has no spread to show
    ("+- 0.00" would claim one)."""
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} +- {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def seeds_cell(records: Sequence[Dict]) -> str:
    """How many runs and their seeds, e.g. ``2 (1,2)``."""
    return f"{len(records)} ({','.join(str(r['seed']) for r in sorted(records, key=lambda r: r['seed']))})"
