"""Results over seeds: the mean and sample std of a configuration's runs, how the
tables show them, and how a difference of two means is read against seed noise."""

from __future__ import annotations

import math
import statistics
from typing import Dict, Optional, Sequence, Tuple


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std_text(values: Sequence[float], digits: int = 2) -> str:
    """``mean +- sample std``; one value alone, since one seed has no spread to show
    ("+- 0.00" would claim one)."""
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} +- {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def mean_difference(values: Sequence[float], baseline: Sequence[float]) -> Optional[float]:
    """The mean of ``values`` minus the mean of ``baseline``; None when either has none."""
    if not values or not baseline:
        return None
    return statistics.fmean(values) - statistics.fmean(baseline)


def difference_text(values: Sequence[float], baseline: Sequence[float]) -> str:
    """:func:`mean_difference` as the tables show it, e.g. ``+0.42``; ``-`` when there is none."""
    difference = mean_difference(values, baseline)
    return "-" if difference is None else f"{difference:+.2f}"


def seeds_cell(records: Sequence[Dict]) -> str:
    """How many runs and their seeds, e.g. ``2 (1,2)``."""
    return f"{len(records)} ({','.join(str(r['seed']) for r in sorted(records, key=lambda r: r['seed']))})"


# ------------------------------------------------ differences read against seed noise
#
# Every table that reads a difference of two configurations' means against seed noise
# (the translation harness's ablations and the papers' tables, the methods table) decides
# "beyond noise" with :func:`beyond_noise` on :func:`difference_noise`: one standard error of
# the difference of two means whose seeds vary with one std, the baseline's over its seeds.

WITHIN_NOISE = "within noise"
BETTER = "better, beyond noise"
WORSE = "worse, beyond noise"
NOISE_RULE = (
    "beyond noise: |difference| > one standard error of the difference of the two means, the baseline's "
    "seed std times sqrt(1/n1 + 1/n2) for n1 and n2 seeds"
)


def seed_std(values: Sequence[float]) -> Optional[float]:
    """The sample std of a configuration's values over its seeds; None with fewer than two
    (no spread to read a difference against)."""
    return statistics.stdev(values) if len(values) > 1 else None


def difference_noise(std: float, n1: int, n2: int) -> float:
    """One standard error of the difference of a mean over ``n1`` seeds and one over ``n2``,
    when each seed varies with sample std ``std``: ``std * sqrt(1/n1 + 1/n2)``."""
    return std * math.sqrt(1 / n1 + 1 / n2)


def beyond_noise(difference: float, noise: float) -> bool:
    """Whether a difference of means is beyond ``noise`` (:func:`difference_noise`): strictly
    larger in size than one standard error; at or under it seed noise alone could make it."""
    return abs(difference) > noise


def noise_reading(difference: float, noise: float, higher_is_better: bool) -> str:
    """``difference`` (this minus the baseline) as :data:`BETTER`, :data:`WORSE` or
    :data:`WITHIN_NOISE`; ``higher_is_better`` for BLEU, not for perplexity."""
    if not beyond_noise(difference, noise):
        return WITHIN_NOISE
    return BETTER if (difference > 0) == higher_is_better else WORSE


def compare_means(
    values: Sequence[float], baseline: Sequence[float], std: Optional[float], higher_is_better: bool
) -> Tuple[Optional[float], Optional[float], str]:
    """``(difference, noise, reading)``: the mean of ``values`` minus the mean of ``baseline``
    (:func:`mean_difference`), one standard error of it (:func:`difference_noise` of ``std``,
    the baseline's seed std, and both seed counts) and :func:`noise_reading` of the two; the
    noise is None and the reading "-" without values or without a std (the baseline has
    fewer than two seeds)."""
    difference = mean_difference(values, baseline)
    if difference is None or std is None:
        return difference, None, "-"
    noise = difference_noise(std, len(values), len(baseline))
    return difference, noise, noise_reading(difference, noise, higher_is_better)


def read_means(values: Sequence[float], baseline: Sequence[float], std: Optional[float], higher_is_better: bool) -> str:
    """The reading of :func:`compare_means`: "-" without values or without a std."""
    return compare_means(values, baseline, std, higher_is_better)[2]
