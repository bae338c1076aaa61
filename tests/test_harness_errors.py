"""A harness that meets a run it cannot use says so in one line naming the run, before any
training: ``benchmarks.quality.lm_finetune`` on a run without its training log, on a checkpoint
the fine-tuning recipe cannot load, and on a result fine-tuned from another model than the run's
checkpoint now (before these: tracebacks, and that result skipped as done without a word). Fake
run folders only: nothing is trained here."""

from __future__ import annotations

import hashlib
import json
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks.quality import lm_finetune
from benchmarks.quality.lm_grid import SCALES

CONFIG = "distattn_lm_rope_gbw"
MODEL = b"the run's checkpoint now\n"


class _Trained(Exception):
    """fairseq-train was started: the harness got past every check."""


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    def run(cmd, log_path, env, stdout_path=None):
        raise _Trained(" ".join(str(c) for c in cmd))

    monkeypatch.setattr(lm_finetune, "run", run)
    lm_finetune._fingerprint.cache_clear()


def fake_run(work: Path, checkpoint: bytes = MODEL, log: str = "", scale: str = "small") -> Path:
    """A run folder of benchmarks.quality.lm: its checkpoint and, unless ``log`` is None, its
    train.log (default: a training command at 64 tokens per sample)."""
    run_dir = work / scale / f"{CONFIG}-seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint_best.pt").write_bytes(checkpoint)
    if log is not None:
        default = f"$ fairseq-train {work}/data-1/data-bin --arch {CONFIG} --tokens-per-sample 64\n"
        (run_dir / "train.log").write_text(log or default, encoding="utf-8")
    return run_dir


def fairseq_checkpoint(path: Path, scale: str = "small", **sizes) -> bytes:
    """The bytes of a checkpoint whose model configuration is the ``scale`` recipe's but for ``sizes``."""
    import torch

    recipe = SCALES[scale]
    config = dict(
        arch=CONFIG,
        decoder_layers=recipe["layers"],
        decoder_embed_dim=recipe["dim"],
        decoder_input_dim=recipe["dim"],
        decoder_output_dim=recipe["dim"],
        decoder_ffn_embed_dim=recipe["ffn"],
        decoder_attention_heads=recipe["heads"],
    )
    torch.save({"cfg": {"model": Namespace(**{**config, **sizes})}, "model": {}}, path)
    return path.read_bytes()


def result_file(out: Path, scaling: str, finetuned_from: bytes) -> Path:
    """A result of lm_finetune (factor 4 of 64 tokens) recording the sha256 of ``finetuned_from``."""
    path = out / "runs" / f"{CONFIG}+{scaling}-ft-seed1-L256.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": f"{CONFIG}+{scaling}-ft", "finetuned_from_sha256": hashlib.sha256(finetuned_from).hexdigest()}
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path


def finetune(tmp_path: Path, *flags: str) -> None:
    lm_finetune.main(["--quality-work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *flags])


def one_error_line(exit_info) -> str:
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message and "Traceback" not in message
    return message


def test_a_result_fine_tuned_from_another_model_is_refused_with_both_hashes(tmp_path):
    """The run was trained again, or --quality-work holds other runs: the result is not the
    fine-tune of this checkpoint, and skipping it as done would keep it in the table silently."""
    fake_run(tmp_path / "work")
    result = result_file(tmp_path / "out", "linear", b"the model before\n")
    before = result.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        finetune(tmp_path, "--scalings", "linear")
    message = one_error_line(exit_info)
    recorded, current = hashlib.sha256(b"the model before\n").hexdigest(), hashlib.sha256(MODEL).hexdigest()
    assert message.startswith(f"{result} was fine-tuned from another model than ")
    assert f"sha256 {recorded}, not {current}" in message
    assert "delete that result file" in message and "--quality-work" in message
    assert result.read_bytes() == before  # refused, not replaced


def test_a_result_of_the_runs_checkpoint_is_skipped_hashing_it_once(tmp_path, monkeypatch):
    from benchmarks.harness.fingerprints import checkpoint_fingerprint

    hashed = []

    def counted(path):
        hashed.append(path)
        return checkpoint_fingerprint(path)

    monkeypatch.setattr(lm_finetune, "checkpoint_fingerprint", counted)
    fake_run(tmp_path / "work")
    results = [result_file(tmp_path / "out", scaling, MODEL) for scaling in lm_finetune.SCALINGS]
    before = [path.read_bytes() for path in results]
    finetune(tmp_path)  # no _Trained: both skipped as done
    assert [path.read_bytes() for path in results] == before
    assert len(hashed) == 1  # compared for every scaling, hashed once


@pytest.mark.parametrize(
    "log, missing",
    [
        (None, "no train.log in "),
        ("nothing was run\n", "no fairseq-train command in "),
        ("$ fairseq-train data-bin --arch x\n", "has no data-bin or no --tokens-per-sample N"),
    ],
    ids=["no train.log", "no command", "no length"],
)
def test_a_run_without_its_training_command_is_one_error_line_naming_it(log, missing, tmp_path):
    run_dir = fake_run(tmp_path / "work", log=log)
    with pytest.raises(SystemExit) as exit_info:
        finetune(tmp_path)
    message = one_error_line(exit_info)
    assert message.startswith(f"{run_dir.name}: ") and missing in message


def test_a_checkpoint_of_other_sizes_than_the_recipe_is_one_error_line_naming_them(tmp_path):
    """A run of another scale's sizes under this scale: fairseq-train would start, then fail
    to load it with a traceback and its log's tail."""
    checkpoint = fairseq_checkpoint(tmp_path / "tiny.pt", "tiny")
    run_dir = fake_run(tmp_path / "work", checkpoint)
    with pytest.raises(SystemExit) as exit_info:
        finetune(tmp_path, "--scalings", "yarn")
    message = one_error_line(exit_info)
    assert message.startswith(f"{run_dir.name}: {run_dir / 'checkpoint_best.pt'} does not fit the small-scale recipe")
    assert "--decoder-layers 2 (the recipe: 3)" in message and "--decoder-embed-dim 16 (the recipe: 256)" in message
    assert "--arch" not in message  # what matches is not listed
    assert not (run_dir / "finetune-yarn-x4").exists()


def test_an_unreadable_checkpoint_is_one_error_line(tmp_path):
    run_dir = fake_run(tmp_path / "work", b"not a checkpoint\n")
    with pytest.raises(SystemExit) as exit_info:
        finetune(tmp_path)
    assert one_error_line(exit_info).startswith(f"cannot read {run_dir / 'checkpoint_best.pt'}: ")


def test_a_checkpoint_of_the_recipe_goes_on_to_fine_tuning(tmp_path):
    fake_run(tmp_path / "work", fairseq_checkpoint(tmp_path / "small.pt"))
    with pytest.raises(_Trained, match="--finetune-from-model"):
        finetune(tmp_path, "--scalings", "linear")


def test_only_the_lm_grids_rope_presets_are_fine_tuned(tmp_path):
    """rotary_configs lists the translation preset too, which the LM recipe cannot build."""
    fake_run(tmp_path / "work")
    args = lm_finetune.parse_args(["--quality-work", str(tmp_path / "work")])
    assert args.configs == [CONFIG]


def test_a_fine_tune_another_process_holds_is_skipped_until_it_lets_go(tmp_path):
    """Two processes fine-tuning one run with one scaling would train into one checkpoints folder and
    read their numbers from its shared eval.log: the second leaves it to the one holding it."""
    from benchmarks.harness.claims import claimed

    run_dir = fake_run(tmp_path / "work", fairseq_checkpoint(tmp_path / "small.pt"))
    with claimed(lm_finetune.finetune_work(run_dir, "linear", 4)) as holder:
        assert holder is None
        finetune(tmp_path, "--scalings", "linear")  # no _Trained: skipped
    with pytest.raises(_Trained, match="--finetune-from-model"):
        finetune(tmp_path, "--scalings", "linear")


def test_a_fine_tune_another_process_finished_before_the_claim_is_not_redone(tmp_path, monkeypatch):
    """The result was missing when checked, and written by the process that held the claim before this
    one took it: this one checks it as done instead of training again."""
    import contextlib

    checkpoint = fairseq_checkpoint(tmp_path / "small.pt")
    fake_run(tmp_path / "work", checkpoint)

    @contextlib.contextmanager
    def finished_meanwhile(directory):
        result_file(tmp_path / "out", "linear", checkpoint)
        yield None

    monkeypatch.setattr(lm_finetune, "claimed", finished_meanwhile)
    finetune(tmp_path, "--scalings", "linear")  # no _Trained
    result = tmp_path / "out" / "runs" / f"{CONFIG}+linear-ft-seed1-L256.json"
    assert json.loads(result.read_text())["finetuned_from_sha256"] == hashlib.sha256(checkpoint).hexdigest()
