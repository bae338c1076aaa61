"""benchmarks/gpu/quality_grid.sh, the GPU quality grid in calls of the device tool: each
call must bring back what has finished (an earlier GPU session lost a whole grid that
was still running when its machine was taken back), and a call with no flags goes on
with the first call's. Run here with stand-ins for python3, nvidia-smi and the setup."""

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# a stand-in for python3: logs its arguments; "training" writes a run file and the reports
# write a table, where the harnesses would
FAKE_PYTHON = textwrap.dedent(
    """\
    #!/bin/sh
    echo "$*" >> "$CALLS"
    case "$*" in
      *"benchmarks.quality.mt --scale base --report"*)
        echo table > benchmarks/results/quality-base/quality.md ;;
      *"benchmarks.quality.mt_extrapolation --scale base --report"*)
        echo table > benchmarks/results/extrapolation-base/extrapolation.md ;;
      *"benchmarks.quality.mt --scale base --work"*)
        sleep "$TRAIN_SECONDS"
        mkdir -p work/quality/base/vanilla-seed1
        echo "num_updates=2000" > work/quality/base/vanilla-seed1/train.log
        echo "{}" > benchmarks/results/quality-base/runs/vanilla-seed1.json ;;
      *"benchmarks.quality.mt_extrapolation --scale base --quality-work"*)
        echo "{}" > benchmarks/results/extrapolation-base/runs/vanilla-seed1-x8.json ;;
    esac
    """
)


@pytest.fixture
def grid(tmp_path):
    """A repository copy holding the script, a no-op setup and empty results folders."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results" / "quality-base" / "runs").mkdir(parents=True)
    (repo / "benchmarks" / "results" / "extrapolation-base" / "runs").mkdir(parents=True)
    (repo / "benchmarks" / "gpu").mkdir()
    shutil.copy(REPO / "benchmarks" / "gpu" / "quality_grid.sh", repo / "benchmarks" / "gpu")
    (repo / "benchmarks" / "gpu" / "device_setup.sh").write_text(":\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/bin/sh\necho 'Fake GPU, 100 %, 1 MiB'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return repo, bin_dir, tmp_path / "calls.log"


def call(grid, out, seconds, *flags, train_seconds=0):
    repo, bin_dir, calls = grid
    out.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(out), CALLS=str(calls))
    env["TRAIN_SECONDS"] = str(train_seconds)
    result = subprocess.run(
        ["bash", "benchmarks/gpu/quality_grid.sh", str(seconds), *flags],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_call_runs_the_grid_then_extrapolation_and_brings_back_runs_and_tables(grid, tmp_path):
    stdout = call(grid, tmp_path / "out1", 60, "--precision", "amp", "--jobs", "8")
    out = tmp_path / "out1"
    assert (out / "quality-base" / "runs" / "vanilla-seed1.json").exists()
    assert (out / "quality-base" / "quality.md").read_text() == "table\n"
    assert (out / "extrapolation-base" / "runs" / "vanilla-seed1-x8.json").exists()
    assert (out / "extrapolation-base" / "extrapolation.md").read_text() == "table\n"
    assert "vanilla-seed1: num_updates=2000" in stdout and "Fake GPU" in stdout
    calls = grid[2].read_text().splitlines()
    assert calls[0] == "-m benchmarks.quality.mt --scale base --work work/quality --precision amp --jobs 8"
    assert calls[1] == "-m benchmarks.quality.mt_extrapolation --scale base --quality-work work/quality"


def test_a_call_ends_within_its_budget_and_the_next_one_goes_on_with_the_same_flags(grid, tmp_path):
    # training outlasts the first call (budget 45 s, of which 40 are kept for the copy)
    call(grid, tmp_path / "out1", 45, "--updates", "2000", train_seconds=25)
    assert not (tmp_path / "out1" / "quality-base" / "runs" / "vanilla-seed1.json").exists()
    assert (tmp_path / "out1" / "quality-base" / "quality.md").exists()  # the table of what has finished
    call(grid, tmp_path / "out2", 90)  # finds the grid running: waits for it, starts nothing
    assert (tmp_path / "out2" / "quality-base" / "runs" / "vanilla-seed1.json").exists()
    trainings = [line for line in grid[2].read_text().splitlines() if "--scale base --work" in line]
    assert trainings == ["-m benchmarks.quality.mt --scale base --work work/quality --updates 2000"]
    call(grid, tmp_path / "out3", 60)  # the grid is done: a call with no flags reruns it with the first's
    trainings = [line for line in grid[2].read_text().splitlines() if "--scale base --work" in line]
    assert trainings[-1] == "-m benchmarks.quality.mt --scale base --work work/quality --updates 2000"
