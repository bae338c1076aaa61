"""Clocks, paired measurements, statistics and profiling of the speed harness.

Every comparison is *paired*: a candidate's measurement is taken right between
two measurements of its baseline (``B C1 B C2 B ...``, the candidates' order
rotating from round to round), and its ratio is ``candidate / geometric mean of
the two neighbouring baseline measurements``. Slow drift of the machine (other
processes, thermal state) then cancels within each pair; the reported ratio is
the median of the per-round ratios with their min and max.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------- clock


def synchronize(device) -> None:
    """Wait for queued kernels so wall time measures the work (no-op on CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":  # pragma: no cover - not on our machines
        torch.mps.synchronize()


_clock: Callable[[], float] = time.perf_counter


def set_clock(name: str) -> None:
    """``wall``: time.perf_counter. ``cpu``: time.process_time, the CPU time of
    this process, which does not count the time other processes hold the core
    (with one torch thread it equals wall time on a quiet machine)."""
    global _clock
    if name not in ("wall", "cpu"):
        raise ValueError(f"clock must be wall or cpu, not {name!r}")
    _clock = time.process_time if name == "cpu" else time.perf_counter


def now() -> float:
    return _clock()


def timed(fn: Callable[[], float], device) -> Tuple[float, float]:
    """Run ``fn`` (which returns its amount of work) and return ``(work, seconds)``
    on the clock chosen with :func:`set_clock`."""
    synchronize(device)
    start = _clock()
    work = fn()
    synchronize(device)
    return float(work), _clock() - start


# --------------------------------------------------------------------------- statistics


@dataclass
class Summary:
    """Median with min and max of a list of samples."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Summary":
        values = [float(v) for v in values]
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> Dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def fit_exponent(lengths: Sequence[float], costs: Sequence[float]) -> float:
    """Least-squares slope of log(cost) against log(length): cost ~ length^slope."""
    xs = [math.log(x) for x in lengths]
    ys = [math.log(y) for y in costs]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return float("nan")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx


# --------------------------------------------------------------------------- paired runs


@dataclass
class PairedResult:
    """Throughput samples of one configuration and its per-round ratios to the baseline."""

    name: str
    throughputs: List[float] = field(default_factory=list)
    ratios: List[float] = field(default_factory=list)

    @property
    def throughput(self) -> Summary:
        return Summary.of(self.throughputs)

    @property
    def ratio(self) -> Summary:
        return Summary.of(self.ratios)

    def record(self) -> dict:
        """Raw samples and per-round ratios with their summary, for results.json."""
        return {
            "samples": self.throughputs,
            "ratio": self.ratio.as_dict() if self.ratios else None,
            "ratios": self.ratios,
        }


def run_paired(
    baseline: str,
    candidates: Sequence[str],
    measure: Callable[[str], float],
    repeats: int,
    warmup: int = 1,
    log: Optional[Callable[[str], None]] = None,
) -> Dict[str, PairedResult]:
    """Interleave ``measure(name)`` (returns a throughput, higher is better).

    Warm-up: every configuration is measured ``warmup`` times first and those
    samples are discarded. Then ``repeats`` rounds of
    ``B C_a B C_b ... B C_z B`` (the candidates' order rotates each round);
    each candidate sample is divided by the geometric mean of the baseline
    samples just before and just after it. Returns results keyed by name
    (the baseline's has no ratios).
    """
    results = {name: PairedResult(name) for name in [baseline, *candidates]}
    for _ in range(warmup):
        for name in [baseline, *candidates]:
            measure(name)
    for round_index in range(repeats):
        shift = round_index % max(1, len(candidates))
        order = list(candidates[shift:]) + list(candidates[:shift])
        previous = measure(baseline)
        results[baseline].throughputs.append(previous)
        for name in order:
            value = measure(name)
            following = measure(baseline)
            results[baseline].throughputs.append(following)
            results[name].throughputs.append(value)
            results[name].ratios.append(value / math.sqrt(previous * following))
            previous = following
        if log is not None:
            log(f"  round {round_index + 1}/{repeats} done")
    return results


# --------------------------------------------------------------------------- profiling


def profile_min(fn: Callable[[], object], device, runs: int = 2, row_limit: int = 15) -> Dict[str, object]:
    """Run ``fn`` ``runs`` times under torch.profiler; per operator keep the
    minimum self CPU time over the runs (drops most of the time other processes
    took). Returns ``ops`` {name: {"self_cpu_ms", "calls"}}, ``total_self_cpu_ms``
    and the profiler's own ``table`` of the last run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    best: Dict[str, Dict[str, float]] = {}
    table = ""
    for _ in range(runs):
        with profile(activities=activities) as prof:
            fn()
            synchronize(device)
        averages = prof.key_averages()
        for e in averages:
            ms = e.self_cpu_time_total / 1000.0
            if e.key not in best or ms < best[e.key]["self_cpu_ms"]:
                best[e.key] = {"self_cpu_ms": ms, "calls": e.count}
        table = averages.table(sort_by="self_cpu_time_total", row_limit=row_limit)
    return {"ops": best, "total_self_cpu_ms": sum(v["self_cpu_ms"] for v in best.values()), "table": table}
