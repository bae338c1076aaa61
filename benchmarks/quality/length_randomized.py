"""The length-generalization report's reading of Ruoss et al. 2023, *Randomized Positional
Encodings Boost Length Generalization of Transformers* (github
google-deepmind/randomized_positional_encodings): trained on lengths up to 40 and tested on
41 to 500, the randomized version of an encoding scores 12.0 points of accuracy above the
encoding on average (Table 1: the mean over their encodings and 15 tasks).

Here each randomized row (``X+randomized``, ``length_grid.LM_VARIANT_ROWS``) is read against
the row it randomizes, in the decoder-only form: per seed, the mean over the tasks both have
runs of and one of them fits in distribution of the exact match beyond the training lengths
(the mean over the buckets from x2 on; theirs averages every test length beyond 40).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence

from ..harness.report import mean_std_cell, table_row
from ..harness.seeds import BETTER, WITHIN_NOISE, WORSE, compare_means, seed_std
from .length_grid import BASELINE, DECODER_ONLY, FITTED_IN_DISTRIBUTION, IN_DISTRIBUTION, bucket_multiplier
from .length_papers import TaskSeeds, fitted, seed_means

PAPER = "Ruoss et al. 2023"
THEIR_GAIN = 12.0  # points of accuracy, Table 1's mean over encodings and tasks
SUFFIX = "+randomized"


def beyond_training(accuracy: Dict[str, Optional[float]]) -> Optional[float]:
    """The mean exact match of a run's buckets from x2 on (None without one)."""
    values = [v for b, v in accuracy.items() if v is not None and (bucket_multiplier(b) or 0) >= 2]
    return statistics.fmean(values) if values else None


def task_seed_values(records: Sequence[Dict], methods: Sequence[str], score) -> TaskSeeds:
    """``score(run's accuracy)`` of every decoder-only run of ``methods``, by method, task and seed."""
    found: TaskSeeds = {}
    for r in records:
        value = score(r["accuracy"])
        if r["form"] == DECODER_ONLY and r["method"] in methods and value is not None:
            found.setdefault(r["method"], {}).setdefault(r["task"], {})[r["seed"]] = value
    return found


def pair_tasks(found: TaskSeeds, fits: TaskSeeds, pair: Sequence[str]) -> List[str]:
    """The tasks both rows of ``pair`` have runs of, one of them fitted in distribution."""
    both = set.intersection(*(set(found.get(method, {})) for method in pair))
    pair_fits = {method: fits.get(method, {}) for method in pair}
    return sorted(task for task in both if fitted(pair_fits, task))


def pairs(records: Sequence[Dict]) -> List[tuple]:
    """``(plain row, randomized row)`` of every randomized row with runs."""
    randomized = sorted({r["method"] for r in records if r["method"].endswith(SUFFIX)})
    return [(name[: -len(SUFFIX)], name) for name in randomized]


def section(records: Sequence[Dict]) -> List[str]:
    """Each encoding against its randomized version, then the mean gain against theirs."""
    found_pairs = pairs(records)
    lines = ["", f"## Against {PAPER}", "", intro_text(), ""]
    if not found_pairs:
        return lines + ["No randomized row has runs yet."]
    methods = [m for pair in found_pairs for m in pair]
    found = task_seed_values(records, methods, beyond_training)
    fits = task_seed_values(records, methods, lambda accuracy: accuracy.get(IN_DISTRIBUTION))
    headings = ["encoding", "tasks", "beyond training", "randomized", "difference (points)", "reading"]
    lines += [table_row(headings), "|" + "---|" * len(headings)]
    gains, readings = [], []
    for plain, randomized in found_pairs:
        tasks = pair_tasks(found, fits, (plain, randomized))
        base, values = seed_means(found, plain, tasks), seed_means(found, randomized, tasks)
        difference, _, reading = compare_means(values, base, seed_std(base), higher_is_better=True)
        if difference is not None:
            gains.append(difference)
            readings.append(reading)
        name = f"`{plain}`" if plain != BASELINE else "baseline (sinusoidal)"
        cells = [name, ", ".join(tasks) or "-", mean_std_cell(base, digits=1), mean_std_cell(values, digits=1)]
        lines.append(table_row([*cells, "-" if difference is None else f"{difference:+.1f}", reading]))
    return lines + ["", summary_text(gains, readings)]


def intro_text() -> str:
    return (
        f"{PAPER} (Table 1; trained on lengths up to 40, tested on 41 to 500) find that randomizing an "
        f"encoding's positions raises its accuracy by {THEIR_GAIN:.1f} points on average. Here: each encoding "
        "against its randomized version (`--randomized-positions N`, N the task's positions, drawn in evaluation "
        "too as the authors' code does, `--randomized-positions-at-evaluation`), decoder-only; per "
        "seed, the mean over the tasks both have runs of and one of them fits in distribution (at least "
        f"{FITTED_IN_DISTRIBUTION:.0f}%) of the exact match beyond the training lengths (the mean of the buckets "
        "from x2 on); the difference read against the plain encoding's seed noise with the rule above."
    )


def summary_text(gains: Sequence[float], readings: Sequence[str]) -> str:
    if not gains:
        return f"No encoding has runs of both rows on a common fitted task yet: no comparison with {PAPER}."
    counts = ", ".join(f"{readings.count(r)} {r}" for r in (BETTER, WITHIN_NOISE, WORSE) if readings.count(r))
    return (
        f"Mean gain of randomized positions over the {len(gains)} encoding(s): {statistics.fmean(gains):+.1f} "
        f"points ({PAPER}: +{THEIR_GAIN:.1f}); readings: {counts or 'none yet (fewer than two seeds)'}."
    )
