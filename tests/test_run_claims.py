"""Two harnesses started on one work directory (two shells, two sessions, a lane that
outlives its session) never train the same run at once: each run directory is claimed
with an flock while it trains, and a run another process claimed or finished meanwhile
is skipped. Before the claims, both trained it into the same checkpoints directory."""

from __future__ import annotations

import json
import os
import platform
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.common import REPO_ROOT
from benchmarks.harness.claims import claimed
from benchmarks.quality import lm as lm_quality
from benchmarks.quality import mt as quality

HOLDER = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    from benchmarks.harness.claims import claimed

    with claimed(Path(sys.argv[1])) as holder:
        print(holder, flush=True)
        sys.stdin.readline()  # holds the claim until the test writes a line
        time.sleep(float(sys.argv[2]))
        print("releasing", flush=True)
    """
)


class Holder:
    """Another process that holds the claim on ``directory`` until released or killed."""

    def __init__(self, directory: Path, linger_s: float = 0.0):
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory), str(linger_s)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "None"  # it got the claim

    @property
    def name(self) -> str:
        return f"pid {self.process.pid} on {platform.node()}"

    def release(self) -> None:
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def holders():
    started: list = []
    yield lambda *args: started.append(Holder(*args)) or started[-1]
    for holder in started:
        holder.stop()


def test_a_claimed_directory_names_its_holder_and_is_free_once_the_holder_is_killed(tmp_path, holders):
    holder = holders(tmp_path / "run")
    with claimed(tmp_path / "run") as other:
        assert other == holder.name
    with claimed(tmp_path / "other-run") as other:
        assert other is None  # claims are per directory
    holder.stop()  # killed, not released: the kernel drops its lock, no stale claim is left
    with claimed(tmp_path / "run") as other:
        assert other is None
        with claimed(tmp_path / "run") as nested:  # a second claim, even from this process, is refused
            assert nested == f"pid {os.getpid()} on {platform.node()}"


def test_a_waiting_claim_gets_the_directory_once_its_holder_releases_it(tmp_path, holders):
    holder = holders(tmp_path / "data", 1.0)  # keeps the claim 1 s after being told to release it
    holder.release()
    with claimed(tmp_path / "data", wait=True) as other:
        assert other is None
        # the holder had printed its last line and left its block before this one was entered
        assert select.select([holder.process.stdout], [], [], 0)[0]
        assert holder.process.stdout.readline().strip() == "releasing"


def fake_quality_record(name: str, seed: int) -> dict:
    return {"config": name, "seed": seed, "tokenized_bleu_compound_split": 30.0, "sacrebleu": 30.0, "wall_s": 1.0}


@pytest.mark.parametrize("harness", ["mt", "lm"])
def test_a_harness_skips_a_run_another_process_trains_or_finished(harness, tmp_path, holders, monkeypatch, capsys):
    module = quality if harness == "mt" else lm_quality
    names = ["da", "alibi", "rope"] if harness == "mt" else [f"distattn_lm_{m}_gbw" for m in ("da", "alibi", "rope")]
    out, work = tmp_path / "out", tmp_path / "work"
    trained = []

    def fake_train_run(config, seed, *args):
        trained.append(config.name)
        if config.name == names[0]:  # meanwhile, another process finishes the third run
            (out / "runs").mkdir(parents=True, exist_ok=True)
            (out / "runs" / f"{names[2]}-seed1.json").write_text("{}\n", encoding="utf-8")
        return {**fake_quality_record(config.name, seed), "test_ppl": 100.0}

    if harness == "mt":
        monkeypatch.setattr(module, "prepare", lambda data, directory, merges, env: (directory / "p", directory / "b"))
    else:
        monkeypatch.setattr(module, "prepare", lambda data, directory, env: (directory / "b", {}))
    monkeypatch.setattr(module, "train_run", fake_train_run)
    monkeypatch.setattr(module, "report", lambda out_dir: "")
    holder = holders(work / "tiny" / f"{names[1]}-seed1")  # another process trains the second run

    argv = ["--scale", "tiny", "--configs", ",".join(names), "--seeds", "1", "--out", str(out), "--work", str(work)]
    assert module.main([*argv, "--jobs", "1"] if harness == "mt" else argv) == 0

    assert trained == [names[0]]
    err = capsys.readouterr().err
    assert f"skip {names[1]} seed 1: {holder.name} is training it in {work / 'tiny' / names[1]}-seed1" in err
    assert f"skip {names[2]} seed 1: another process finished it" in err
    assert json.loads((out / "runs" / f"{names[0]}-seed1.json").read_text())["config"] == names[0]
    assert not (out / "runs" / f"{names[1]}-seed1.json").exists()
    assert (out / "runs" / f"{names[2]}-seed1.json").read_text() == "{}\n"  # the other process's file, kept
