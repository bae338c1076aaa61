"""Every benchmark harness refuses a bad command line with one argparse error that names
the flag, before any work (before these, several ended in a traceback, or ran nothing and
said nothing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.diagnostics import parameter_movement
from benchmarks.harness import training
from benchmarks.quality import lm as lm_quality
from benchmarks.quality import lm_extrapolation, lm_finetune, lm_longrope, methods, mt_grid
from benchmarks.quality import mt as quality
from benchmarks.quality import mt_extrapolation as extrapolation

CASES = [
    (quality.parse_args, ["--seeds", "1,x"], "argument --seeds: '1,x' is not a comma-separated list of integers"),
    (quality.parse_args, ["--seeds", ","], "argument --seeds: give at least one value"),
    (quality.parse_args, ["--seeds", "-1"], "argument --seeds: invalid value '-1': each must be an integer >= 0"),
    (quality.parse_args, ["--configs", "vanilla,nosuch"], "argument --configs (grid default): unknown nosuch; "),
    (quality.parse_args, ["--jobs", "0"], "argument --jobs: invalid value '0': must be an integer >= 1"),
    (quality.parse_args, ["--threads", "0"], "argument --threads: invalid value '0': must be an integer >= 1"),
    (quality.parse_args, ["--updates", "0"], "argument --updates: invalid value '0': must be an integer >= 1"),
    (quality.parse_args, ["--undecided"], "argument --undecided: only with --grid ablations"),
    (lm_quality.parse_args, ["--configs", "nosuch"], "argument --configs: unknown nosuch; choose from transformer_lm"),
    (lm_quality.parse_args, ["--seeds", ""], "argument --seeds: give at least one value"),
    (lm_quality.parse_args, ["--threads", "two"], "argument --threads: invalid value 'two': must be an integer >= 1"),
    (extrapolation.parse_args, ["--threads", "0"], "argument --threads: invalid value '0': must be an integer >= 1"),
    (extrapolation.parse_args, ["--factors", "0,2"], "argument --factors: invalid value '0,2': each must be"),
    (extrapolation.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of "),
    (
        extrapolation.parse_args,
        ["--quality-work", "{work}", "--configs", "da,nosuch"],
        "argument --configs: unknown nosuch; choose from vanilla, ",
    ),
    (lm_extrapolation.parse_args, ["--lengths", "64,0"], "argument --lengths: invalid value '64,0': each must be"),
    (lm_extrapolation.parse_args, ["--lengths", "65"], "argument --lengths: each length must be an even number"),
    (lm_extrapolation.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of"),
    (
        lm_extrapolation.parse_args,
        ["--quality-work", "{work}", "--configs", "nosuch"],
        "argument --configs: unknown nosuch; choose from transformer_lm",
    ),
    (lm_finetune.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of"),
    (lm_longrope.parse_args, ["--factors", "4,1"], "argument --factors: invalid value '4,1': each must be"),
    (lm_longrope.parse_args, ["--evo-scale", "0.03"], "argument --evo-scale: evo_scale 0.03 leaves the search"),
    (lm_longrope.parse_args, ["--samples", "0"], "argument --samples: invalid value '0': must be an integer >= 1"),
    (lm_longrope.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of"),
    (
        lm_longrope.parse_args,
        ["--quality-work", "{work}", "--configs", "distattn_lm_alibi_gbw"],
        "argument --configs: unknown distattn_lm_alibi_gbw; choose from distattn_lm_rope_gbw",
    ),
    (parameter_movement.main, ["{missing}"], "argument checkpoint: no such file: {missing}"),
    (parameter_movement.main, ["{afile}", "--data", "{missing}"], "argument --data: no such directory: {missing}"),
    (methods.main, ["--out", "{afile}"], "argument --out: {afile} names a file, and --out is the folder methods.md"),
    (methods.main, ["--out", "{missing}.md"], "argument --out: {missing}.md names a file, and --out is the folder"),
]


@pytest.mark.parametrize("parse, argv, message", CASES, ids=[f"{c[0].__module__}{c[1]}" for c in CASES])
def test_a_bad_flag_is_one_error_line_naming_it(parse, argv, message, tmp_path, capsys):
    (tmp_path / "work" / "small").mkdir(parents=True)
    (tmp_path / "afile").write_text("x\n")
    names = {"missing": tmp_path / "missing", "work": tmp_path / "work", "afile": tmp_path / "afile"}
    with pytest.raises(SystemExit) as exit_info:
        parse([item.format(**names) for item in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].split(": error: ", 1)[1].startswith(message.format(**names))


def test_methods_out_readme_is_one_error_line_and_leaves_the_page_alone(tmp_path, monkeypatch, capsys):
    """``--report --out README.md``: --out is the folder methods.md goes to (it was a
    FileExistsError); the default --out is what rewrites the README's copy of the table."""
    readme = tmp_path / "README.md"
    shutil.copyfile(Path(methods.REPO_ROOT) / "README.md", readme)
    before = readme.read_bytes()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        methods.main(["--report", "--out", "README.md"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "python -m benchmarks.quality.methods: error: argument --out: README.md names a file, and --out is the "
        "folder methods.md is written to; the default, benchmarks/results/methods, also rewrites the table where "
        "README.md and docs/ copy it"
    )
    assert readme.read_bytes() == before and [path.name for path in tmp_path.iterdir()] == ["README.md"]


def test_an_unreadable_checkpoint_or_data_directory_is_one_error_line(tmp_path, capsys):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint\n")
    with pytest.raises(SystemExit) as exit_info:
        parameter_movement.main([str(broken)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"python -m benchmarks.diagnostics.parameter_movement: error: cannot read {broken}: ")


def write_run(out, name, **fields):
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "runs" / f"{name}.json").write_text(json.dumps({"config": name, **fields}), encoding="utf-8")


@pytest.mark.parametrize(
    "parse, argv, record, message",
    [
        (
            quality.parse_args,
            ["--updates", "4000"],
            {"scale": "small", "updates": 2000},
            "is a run with updates 2000, not updates 4000: one --out holds one budget",
        ),
        (
            quality.parse_args,
            ["--scale", "base"],
            {"scale": "small", "updates": 2000},
            "is a run with scale small, updates 2000, not scale base, updates 20000",
        ),
        (
            lm_quality.parse_args,
            ["--tokens-per-sample", "128"],
            {"scale": "small", "updates": 600, "tokens_per_sample": 64},
            "is a run with tokens_per_sample 64, not tokens_per_sample 128",
        ),
        (
            extrapolation.parse_args,
            ["--quality-work", "{work}", "--scale", "tiny"],
            {"scale": "small"},
            "is a run with scale small, not scale tiny",
        ),
        (
            quality.parse_args,
            [],
            {"scale": "small", "updates": 2000, "precision": "amp"},
            "is a run with precision amp, not precision fp32",
        ),
    ],
)
def test_one_out_holds_one_budget(parse, argv, record, message, tmp_path, capsys):
    """A result file is skipped as done and averaged with its configuration's other seeds:
    a file of another budget in --out would be both, silently."""
    (tmp_path / "work" / "tiny").mkdir(parents=True)
    out = tmp_path / "out"
    write_run(out, "vanilla-seed1", **record)
    argv = [item.format(work=tmp_path / "work") for item in argv]
    with pytest.raises(SystemExit) as exit_info:
        parse([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and f"argument --out: {out / 'runs' / 'vanilla-seed1.json'} {message}" in err
    parse([*argv, "--out", str(out), "--report"])  # reading the files is not running


@pytest.mark.parametrize("harness", [quality, lm_quality, extrapolation, lm_extrapolation])
def test_each_scale_has_its_own_default_results_folder(harness, tmp_path):
    """--scale base (a GPU grid) must not find the CPU runs' files and skip them as done."""
    small = harness.parse_args(["--report"]).out
    base = harness.parse_args(["--report", "--scale", "base"]).out
    assert small == harness.DEFAULT_OUT and base == small.with_name(small.name + "-base")


@pytest.mark.parametrize("precision", ["tf32", "amp"])
def test_a_gpu_precision_without_cuda_is_one_error_line(precision, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        quality.parse_args(["--precision", precision])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2
    assert err.endswith(f"argument --precision: {precision} trains on a GPU, and CUDA is not available here")


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    "precision, flags, env",
    [("fp32", [], {}), ("tf32", [], {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}), ("amp", ["--amp"], {})],
)
def test_the_training_precision_reaches_fairseq_train_and_only_it(precision, flags, env, monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, log_path, run_env, stdout_path=None):
        calls.append(([str(c) for c in cmd], run_env))
        raise _Stop

    monkeypatch.setattr(quality, "run", fake_run)
    monkeypatch.setattr(training, "run", fake_run)  # fairseq-train runs through training.train_once
    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    base_env = {"OMP_NUM_THREADS": "1"}
    with pytest.raises(_Stop):
        quality.train_run(
            mt_grid.default_configs()["da"],
            1,
            mt_grid.SCALES["tiny"],
            tmp_path,
            tmp_path,
            tmp_path,
            base_env,
            precision,
        )
    ((cmd, run_env),) = calls
    assert "fairseq-train" in cmd[0]
    assert [flag for flag in cmd if flag in ("--amp", "--fp16", "--bf16")] == flags
    assert {k: v for k, v in run_env.items() if k.startswith("TORCH_")} == env
    assert base_env == {"OMP_NUM_THREADS": "1"}  # the caller's environment (evaluation's too) is left as it was


def test_extrapolation_evaluates_the_default_grid_and_an_ablation_only_when_named(tmp_path, capsys):
    """Ablation runs share the quality harness's --work: evaluating every model found there
    would spend an hour of CPU per ablation run nobody asked to extrapolate."""
    work = tmp_path / "work"
    for run_name in ("da-seed1", "da-map-clip-seed1"):
        (work / "small" / run_name).mkdir(parents=True)
        (work / "small" / run_name / "averaged.pt").write_bytes(b"")
        (work / "small" / run_name / "train.log").write_text("$ fairseq-train work/data-7/data-bin\n")
    argv = ["--quality-work", str(work), "--out", str(tmp_path / "out"), "--factors", "1"]
    # neither has prepared data: the error names the first model the harness would evaluate
    # (da-map-clip-seed1 sorts first)
    with pytest.raises(SystemExit, match="da-seed1/averaged.pt"):
        extrapolation.main(argv)
    with pytest.raises(SystemExit, match="da-map-clip-seed1/averaged.pt"):
        extrapolation.main([*argv, "--configs", "da,da-map-clip"])
    (work / "small" / "da-seed1" / "averaged.pt").unlink()  # leaves the ablation alone
    assert extrapolation.main(argv) == 0
    assert "0 trained models of the configurations asked for" in capsys.readouterr().err
