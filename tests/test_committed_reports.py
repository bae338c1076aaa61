"""Every committed results table is what its harness's ``--report`` makes of the committed
run files: a run file that lands without its report regenerated (or a report edited by
hand) fails here. Each report is rebuilt into a temporary copy of its results folder, so
the committed files and the pages that show them are left alone."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

RESULTS = REPO_ROOT / "benchmarks" / "results"

# harness module -> its results folder (whose copy is --out) and the tables it writes there
REPORTS = {
    "benchmarks.quality.mt": ("quality", ("quality.md",)),
    "benchmarks.quality.mt_extrapolation": ("extrapolation", ("extrapolation.md",)),
    "benchmarks.quality.lm": ("lm_quality", ("lm_quality.md",)),
    "benchmarks.quality.lm_extrapolation": ("lm_extrapolation", ("lm_extrapolation.md", "summary.md")),
    "benchmarks.quality.methods": ("methods", ("methods.md",)),
    "benchmarks.quality.length_generalization": ("length_generalization", ("length_generalization.md",)),
    "benchmarks.diagnostics.window": ("window_diagnostics", ("window_diagnostics.md",)),
}


def copied_runs(folder: str, tmp_path: Path) -> Path:
    """A copy of a results folder without its tables and plots: what ``--report`` reads."""
    out = tmp_path / folder
    shutil.copytree(RESULTS / folder, out, ignore=shutil.ignore_patterns("*.png", "*.md"))
    return out


def report(module: str, out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", module, "--report", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("module", sorted(REPORTS))
def test_the_committed_report_is_its_harness_report_of_the_committed_runs(module, tmp_path):
    folder, tables = REPORTS[module]
    out = report(module, copied_runs(folder, tmp_path))
    for table in tables:
        committed = (RESULTS / folder / table).read_text(encoding="utf-8")
        rebuilt = (out / table).read_text(encoding="utf-8")
        assert rebuilt == committed, (
            f"benchmarks/results/{folder}/{table} is not what `python -m {module} --report` makes of the "
            "committed run files: run it and commit the result"
        )


SPEED_RESULTS = sorted((RESULTS / "speed").rglob("results.json"))


@pytest.mark.parametrize("results", SPEED_RESULTS, ids=lambda path: str(path.parent.relative_to(RESULTS)))
def test_each_committed_speed_summary_is_the_report_of_its_results(results, tmp_path):
    """A speed summary (the README's and docs' benchmark tables) is rebuilt from its
    ``results.json`` by the current targets: one left from older report code fails here."""
    from benchmarks.speed.report import write_summary

    rebuilt = write_summary(results, out_dir=tmp_path)
    assert rebuilt == (results.parent / "summary.md").read_text(encoding="utf-8"), (
        f"{results.parent / 'summary.md'} is stale: run `python -m benchmarks.speed.report {results}` and commit it"
    )


def test_a_report_that_misses_a_landed_run_is_caught(tmp_path):
    """The check above can fail: a run file the committed table does not count changes the table."""
    out = copied_runs("quality", tmp_path)
    runs = sorted((out / "runs").glob("*-seed1.json"))
    runs[0].unlink()  # as if the committed table had been made before this run landed
    report("benchmarks.quality.mt", out)
    assert (out / "quality.md").read_text(encoding="utf-8") != (RESULTS / "quality" / "quality.md").read_text(
        encoding="utf-8"
    )
