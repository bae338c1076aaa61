"""The runs of a grid that are still to do, and training them, each under its claim
(:mod:`.claims`): what the translation and LM harnesses do between parsing their
command line and writing their report."""

from __future__ import annotations

import functools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..common import without_machine_paths
from .claims import file_version, train_unless_taken


@dataclass(frozen=True)
class PlannedRun:
    """One run to train: a configuration (anything with a ``name``) and a seed, the
    directory it trains in, the run file its result goes to, and that file's
    version when the grid was listed (a file that changes meanwhile was written by
    another process)."""

    config: Any
    seed: int
    run_dir: Path
    run_file: Path
    listed: Optional[int]

    @property
    def label(self) -> str:
        return f"{self.config.name} seed {self.seed}"


def plan_runs(jobs: Iterable[Tuple[Any, int]], work: Path, out: Path, retrain: bool) -> List[PlannedRun]:
    """The ``(config, seed)`` jobs whose run file ``<out>/runs/<config>-seed<seed>.json``
    does not exist yet (all of them with ``retrain``), each to train in
    ``<work>/<config>-seed<seed>``, with its file's version as listed now."""
    planned = []
    for config, seed in jobs:
        name = f"{config.name}-seed{seed}"
        path = out / "runs" / f"{name}.json"
        if retrain or not path.is_file():
            planned.append(PlannedRun(config, seed, work / name, path, file_version(path)))
    return planned


def write_run_file(
    planned: PlannedRun, record: Dict[str, Any], metric: str, shown_as: str, log: Callable[[str], None], details=""
) -> None:
    """Write ``planned``'s run file (without this machine's paths) and log the run's
    ``record[metric]`` as ``shown_as`` with ``details`` after it (and, where the file held an
    earlier run, that run's value, which this one replaces)."""
    path = planned.run_file
    if path.is_file():
        recorded = json.loads(path.read_text(encoding="utf-8")).get(metric)
        log(f"retrained {planned.label}: {shown_as} {record[metric]}, recorded {recorded}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(without_machine_paths(json.dumps(record, indent=1)) + "\n", encoding="utf-8")
    log(f"done {planned.label}: {shown_as} {record[metric]}{details}, {record['wall_s']:.0f}s")


def train_planned(
    runs: Iterable[PlannedRun], train: Callable[[PlannedRun], None], log: Callable[[str], None], jobs: int = 1
) -> None:
    """``train`` each run, ``jobs`` at a time, unless another process holds its claim or
    finished it. A failure stops the grid: the runs not started yet are skipped, and the
    first failure is raised once those running have ended (their run files are kept;
    the next invocation does the rest)."""
    failed = threading.Event()

    def one(run: PlannedRun) -> None:
        if failed.is_set():
            log(f"skip {run.label}: an earlier run failed")
            return
        try:
            train_unless_taken(run.label, run.run_dir, run.run_file, run.listed, functools.partial(train, run), log)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, run) for run in runs]
    for future in futures:
        future.result()
