"""The runs of a grid that are still to do, and training them, each under its claim
(:mod:`.claims`): what the translation and LM harnesses do between parsing their
command line and writing their report."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Tuple

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
