"""benchmarks.harness.grid: which runs of a grid are still to do, and how a grid of
them is trained (each under its claim; a failure stops the grid)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.common import REPO_ROOT
from benchmarks.harness.claims import claimed
from benchmarks.harness.grid import PlannedRun, plan_runs, train_planned, write_run_file


@dataclass(frozen=True)
class Config:
    name: str


def planned(tmp_path: Path, names=("a", "b", "c"), seeds=(1,), retrain=False):
    jobs = ((Config(name), seed) for seed in seeds for name in names)
    return plan_runs(jobs, tmp_path / "work", tmp_path, retrain)


def test_a_run_whose_file_exists_is_not_planned_unless_retrained(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "b-seed2.json").write_text("{}")
    labels = [run.label for run in planned(tmp_path, ("a", "b"), (1, 2))]
    assert labels == ["a seed 1", "b seed 1", "a seed 2"]
    runs = planned(tmp_path, ("a", "b"), (1, 2), retrain=True)
    assert [run.label for run in runs] == ["a seed 1", "b seed 1", "a seed 2", "b seed 2"]
    assert runs[3].listed == (tmp_path / "runs" / "b-seed2.json").stat().st_mtime_ns
    assert runs[0].listed is None and runs[0].run_dir == tmp_path / "work" / "a-seed1"


@pytest.mark.parametrize("jobs", [1, 3])
def test_every_planned_run_is_trained_once(tmp_path, jobs):
    trained, lock = [], threading.Lock()

    def train(run: PlannedRun) -> None:
        with lock:
            trained.append((run.config.name, run.seed))

    train_planned(planned(tmp_path, seeds=(1, 2)), train, lambda line: None, jobs)
    assert sorted(trained) == [(name, seed) for name in "abc" for seed in (1, 2)]


def test_a_run_another_process_finished_or_holds_is_skipped(tmp_path):
    runs = planned(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a-seed1.json").write_text("{}")  # finished since the grid was listed
    trained, logged = [], []
    with claimed(tmp_path / "work" / "b-seed1"):  # held while the grid runs
        # flock locks belong to the open file, so a second open in this process is refused as another's would be
        train_planned(runs, lambda run: trained.append(run.label), logged.append)
    assert trained == ["c seed 1"]
    assert logged[0] == "skip a seed 1: another process finished it"
    assert logged[1].startswith("skip b seed 1: pid ")


def test_a_failure_stops_the_grid_one_at_a_time(tmp_path):
    trained, logged = [], []

    def train(run: PlannedRun) -> None:
        trained.append(run.label)
        if run.config.name == "a":
            raise RuntimeError("fairseq-train failed")

    with pytest.raises(RuntimeError, match="fairseq-train failed"):
        train_planned(planned(tmp_path), train, logged.append)
    assert trained == ["a seed 1"]
    assert logged == ["skip b seed 1: an earlier run failed", "skip c seed 1: an earlier run failed"]


def test_in_parallel_a_failure_lets_the_running_runs_end_and_starts_no_other(tmp_path):
    c_skipped, finished, logged = threading.Event(), [], []

    def train(run: PlannedRun) -> None:
        if run.config.name == "a":
            raise RuntimeError("a failed")
        if run.config.name == "b":
            # still running when a fails: a's worker, free again, takes c and must skip it
            assert c_skipped.wait(10)
        finished.append(run.label)  # c, d: must never start

    def log(line: str) -> None:
        logged.append(line)
        if line.startswith("skip c seed 1"):
            c_skipped.set()

    runs = planned(tmp_path, ("b", "a", "c", "d"))
    with pytest.raises(RuntimeError, match="a failed"):
        train_planned(runs, train, log, jobs=2)
    assert finished == ["b seed 1"]
    assert [line for line in logged if line.startswith("skip")] == [
        "skip c seed 1: an earlier run failed",
        "skip d seed 1: an earlier run failed",
    ]


def test_a_run_file_is_written_without_machine_paths_and_logs_what_it_replaces(tmp_path):
    """The run file names no directory of this machine; its headline is logged, and a
    retrained run's log line names the value of the file it replaces."""
    (run,) = planned(tmp_path, ("a",))
    record = {"test_ppl": 210.5, "wall_s": 61.2, "train_command": f"{REPO_ROOT}/.venv/bin/fairseq-train x"}
    logged = []
    write_run_file(run, record, "test_ppl", "test ppl", logged.append)
    assert json.loads(run.run_file.read_text()) == {**record, "train_command": ".venv/bin/fairseq-train x"}
    assert logged == ["done a seed 1: test ppl 210.5, 61s"]
    write_run_file(run, {**record, "test_ppl": 200.0}, "test_ppl", "test ppl", logged.append, ", 3 seeds")
    assert logged[1:] == [
        "retrained a seed 1: test ppl 200.0, recorded 210.5",
        "done a seed 1: test ppl 200.0, 3 seeds, 61s",
    ]
