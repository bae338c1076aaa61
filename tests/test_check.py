"""``python -m fairseq_distattn.check CHECKPOINT`` tells a user who forgot
``--user-dir`` what the checkpoint needs (fairseq itself only shows torch's
UnpicklingError, which advises the unsafe ``weights_only=False``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.common import size_flags

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import REPO_ROOT, cli_env, run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import REPO_ROOT, cli_env, run_cli

MT_TASK = ["--task", "translation", "--source-lang", "en", "--target-lang", "de"]
TINY = [
    *size_flags(dim=32, ffn=32, heads=2, layers=2),
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--max-tokens",
    "1024",
    "--max-update",
    "1",
    "--disable-validation",
    "--num-workers",
    "0",
    "--no-save-optimizer-state",
]


def check(path, cwd=None):
    """Run the tool the way the README documents it, from another directory."""
    return subprocess.run(
        [sys.executable, "-m", "fairseq_distattn.check", str(path)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(cwd or REPO_ROOT.parent),
        timeout=300,
    )


def train(data_bin, save_dir, arch_args, user_dir=True):
    run_cli(
        [
            "fairseq-train",
            data_bin,
            *(["--user-dir", "fairseq_distattn"] if user_dir else []),
            *MT_TASK,
            *arch_args,
            *TINY,
            "--save-dir",
            save_dir,
        ]
    )
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def plugin_checkpoint(mt_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("check") / "checkpoints"
    return train(
        mt_data["bin"],
        save_dir,
        [
            "--arch",
            "distattn_transformer",
            "--encoder-self-attention",
            "rpr@0,window-aw@1",
            "--decoder-self-attention",
            "da",
            "--cross-attention",
            "window-aw-seg@1",
            "--max-relative-position",
            "5",
        ],
    )


def test_without_user_dir_fairseq_fails_and_the_tool_names_the_user_dir(plugin_checkpoint, mt_data):
    generate = [
        "fairseq-generate",
        mt_data["bin"],
        *MT_TASK,
        "--path",
        plugin_checkpoint,
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--max-len-b",
        "5",
        "--required-batch-size-multiple",
        "1",
        "--num-workers",
        "0",
    ]
    failed = run_cli(generate, check=False)
    assert failed.returncode != 0 and "UnpicklingError" in failed.stderr  # the symptom the README describes

    proc = check(plugin_checkpoint)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "fairseq model distattn_transformer (--arch distattn_transformer), 1 updates" in lines[0]
    plugin_dir = REPO_ROOT / "fairseq_distattn"
    assert lines[1].startswith(f"needs the plugin: pass --user-dir {plugin_dir} to fairseq-generate")
    assert "  encoder self-attention: 0=rpr, 1=window-aw" in lines
    assert "  decoder self-attention: 0=da, 1=da" in lines
    assert "  encoder-decoder cross-attention: 0=vanilla, 1=window-aw-seg" in lines
    assert "--max-relative-position 5" in proc.stdout

    # the directory it names is what fairseq needs
    fixed = run_cli([*generate[:2], "--user-dir", plugin_dir, *generate[2:]])
    assert sum(line.startswith("H-") for line in fixed.stdout.splitlines()) == mt_data["n_test"]


def test_a_stock_fairseq_checkpoint_is_named_as_such(mt_data, workdir):
    checkpoint = train(mt_data["bin"], workdir / "checkpoints", ["--arch", "transformer"], user_dir=False)
    proc = check(checkpoint)
    assert proc.returncode == 0, proc.stderr
    assert "fairseq model transformer (--arch transformer)" in proc.stdout
    assert "not a fairseq_distattn model" in proc.stdout and "needs the plugin" not in proc.stdout


@pytest.mark.parametrize("content", [b"not a checkpoint\n", b""], ids=["text", "empty"])
def test_an_unreadable_file_gives_one_error_line_and_status_1(content, workdir):
    path = workdir / "broken.pt"
    path.write_bytes(content)
    proc = check(path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"python -m fairseq_distattn.check: error: cannot read {path}")
    assert "weights_only" not in message, "torch's advice to load it unsafely is not repeated"
    if content:
        assert "not a PyTorch checkpoint, or it is damaged (torch's unpickler: Unsupported operand" in message
    else:
        assert message.endswith("empty or cut short (EOFError)")


def test_a_checkpoint_with_code_in_it_is_refused_not_run(workdir):
    import torch

    path = workdir / "unsafe.pt"
    torch.save({"model": {}, "hook": print}, path)
    proc = check(path)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert "outside the allow-list" in message and "Unsupported global: GLOBAL print" in message
    assert "add_safe_globals" not in message


def test_a_checkpoint_that_calls_a_blocked_module_is_refused_naming_what_it_calls(workdir):
    """torch's message for a global of a blocked module (``os.system``) has no
    ``WeightsUnpickler error:`` marker; the tool still names torch's finding, and never
    repeats its advice to load the file with weights_only=False."""
    import os

    import torch

    class RunsACommand:
        def __reduce__(self):
            return (os.system, ("echo this must not run",))

    path = workdir / "runs-code.pt"
    torch.save({"model": {}, "payload": RunsACommand()}, path)
    for tool in ("check", "inspect"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                f"fairseq_distattn.{tool}",
                str(path),
                *(["--out", str(workdir)] if tool == "inspect" else []),
            ],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=str(REPO_ROOT.parent),
            timeout=300,
        )
        assert proc.returncode != 0 and "this must not run" not in proc.stdout
        message = proc.stderr.strip().splitlines()[-1]
        assert f"GLOBAL {os.system.__module__}.system" in message and "is blocked" in message, message
        assert "outside the allow-list" in message and "refused" in message
        assert "weights_only" not in message and "trust" not in message and "add_safe_globals" not in message


def test_a_missing_file_is_a_usage_error(workdir):
    proc = check(workdir / "missing.pt")
    assert proc.returncode == 2 and "no such file" in proc.stderr


# --------------------------------------------------------------------------- one validation with loading

OLD_CHECKPOINTS = REPO_ROOT / "tests" / "data" / "old_checkpoints"


def check_with(path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "fairseq_distattn.check", str(path), *extra],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(REPO_ROOT),
        timeout=300,
    )


def test_a_checkpoint_loading_refuses_is_refused_and_the_override_it_names_is_accepted():
    """The rope checkpoint from 5a4b114 records no arithmetic revision; fairseq-eval-lm
    refuses it until --model-overrides names one, and so does the tool (status 1, one line)."""
    path = OLD_CHECKPOINTS / "rope-rotate-half.checkpoint"
    refused = check_with(path)
    assert refused.returncode == 1, refused.stderr
    assert refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert "'distattn_revisions': 'rope:N'" in refused.stderr
    named = check_with(path, "--model-overrides", "{'distattn_revisions': 'rope:1'}")
    assert named.returncode == 0, named.stderr
    assert "decoder self-attention: 0=rope, 1=rope" in named.stdout


def test_a_recorded_value_that_building_refuses_is_refused_by_the_tool_too(tmp_path):
    """A checkpoint whose recorded heads do not divide its width (edited here; a checkpoint
    from a plugin that checked less would hold the like): loading it exits with the
    builder's error, and the tool says the same instead of describing it."""
    import shutil

    import torch

    state = torch.load(OLD_CHECKPOINTS / "kerple-per-layer.checkpoint", map_location="cpu", weights_only=False)
    state["cfg"]["model"].decoder_attention_heads = 3
    torch.save(state, tmp_path / "bad.checkpoint")
    shutil.copy(OLD_CHECKPOINTS / "dict.txt", tmp_path / "dict.txt")
    result = check_with(tmp_path / "bad.checkpoint")
    assert result.returncode == 1, result.stdout
    assert "--decoder-attention-heads" in result.stderr and "divides --decoder-embed-dim 16" in result.stderr
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, 'tests/data/old_checkpoints'); from pathlib import Path; "
            f"from make_fixture import log_probabilities; log_probabilities(Path({str(tmp_path)!r}), 'bad')",
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(REPO_ROOT),
        timeout=300,
    )
    assert loaded.returncode == 2 and "--decoder-attention-heads" in loaded.stderr, loaded.stderr[-2000:]
