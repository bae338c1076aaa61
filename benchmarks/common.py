"""Timing, statistics, machine description and command-line checks shared by the harnesses.

Every comparison in the harness is *paired*: a candidate's measurement is
taken right between two measurements of its baseline (``B C1 B C2 B ...``,
the candidates' order rotating from round to round), and its ratio is
``candidate / geometric mean of the two neighbouring baseline measurements``.
Slow drift of the machine (other processes, thermal state) then cancels
within each pair; the reported ratio is the median of the per-round ratios
with their min and max.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- command line


def at_least(least: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``least`` (argparse names the flag in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be an integer >= {least}")
        return value

    return parse


def scale_results(default: Path, scale: str) -> Path:
    """A harness's default ``--out`` for ``--scale``: ``default`` for "small" (the CPU
    budget of the README's tables), ``<default>-<scale>`` otherwise, so that a GPU grid at
    ``--scale base`` neither skips the CPU runs' files as done nor mixes with them."""
    return default if scale == "small" else default.with_name(f"{default.name}-{scale}")


def add_out_argument(parser, default: Path) -> None:
    """``--out``, whose default depends on ``--scale`` (:func:`scale_results`): after
    parsing, ``args.out = args.out or scale_results(default, args.scale)``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"result files (default: {default} for --scale small, {default}-SCALE for the others)",
    )


def check_same_budget(parser, out: Path, expected: Dict[str, object]) -> None:
    """The harnesses skip a run whose result file exists, and average the files of a
    configuration: both are right only if every file under ``out/runs`` has the budget
    asked for now (``expected``: record fields such as scale and updates)."""
    for path in sorted((out / "runs").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        differs = [key for key, value in expected.items() if key in record and record[key] != value]
        if differs:
            found = ", ".join(f"{key} {record[key]}" for key in differs)
            wanted = ", ".join(f"{key} {expected[key]}" for key in differs)
            parser.error(
                f"argument --out: {path} is a run with {found}, not {wanted}: one --out holds one budget "
                "(give another --out)"
            )


def comma_separated_ints(parser, flag: str, text: str, least: int) -> List[int]:
    """``--seeds 1,2``-style values, each an integer >= ``least``; at least one (an empty
    list would run nothing and say nothing). Errors go through ``parser.error``."""
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        parser.error(f"argument {flag}: {text!r} is not a comma-separated list of integers")
    if not values:
        parser.error(f"argument {flag}: give at least one value")
    if any(value < least for value in values):
        parser.error(f"argument {flag}: invalid value {text!r}: each must be an integer >= {least}")
    return values


def comma_separated_names(parser, flag: str, text: str, known: Iterable[str]) -> List[str]:
    """``--configs a,b``: names from ``known`` (all of them when ``text`` is empty)."""
    known = list(known)
    names = [item.strip() for item in text.split(",") if item.strip()] or known
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"argument {flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


# --------------------------------------------------------------------------- device


def without_machine_paths(text: str) -> str:
    """``text`` with this checkout's directories written relative to the repository
    (``work/...``, ``.venv/bin/...``; ``../shared/...`` beside it): committed results
    must read the same on every machine. Only whole paths are rewritten: a
    directory of the same name deeper in a path (``/x/repo/work/`` with the
    checkout in ``/x``) stays as it is."""
    for directory, written in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        text = re.sub(r"(?<![\w./-])" + re.escape(f"{directory}/"), written, text)
    return text


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


# --------------------------------------------------------------------------- machine


def device_model() -> str:
    """What a harness's fairseq tools train on: the GPU's name where CUDA is
    available (they take it unasked), else the CPU's."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (GPU), {os.cpu_count()} CPU cores"
    return cpu_model()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def physical_cores() -> Optional[int]:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo, or None."""
    try:
        cores = set()
        physical = core = None
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((physical, core))
                    physical = core = None
        if core is not None:
            cores.add((physical, core))
        return len(cores) or None
    except OSError:
        return None


def load_average() -> Optional[Tuple[float, float, float]]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover
        return None


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        rev = out.stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_description(device) -> Dict[str, object]:
    import numpy
    import torch

    try:
        import fairseq

        fairseq_version = fairseq.__version__
    except Exception:  # pragma: no cover
        fairseq_version = "unknown"
    info: Dict[str, object] = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fairseq": fairseq_version,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "git": git_revision(),
        "load_average_start": load_average(),
    }
    device = torch.device(device)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    return info
