"""fairseq commands run with ``--user-dir fairseq_distattn`` keep stderr free of
fairseq 0.12's known start-up warnings (hydra deprecations, pin_memory, amp), and
``--tensorboard-logdir`` writes event files (tensorboardX is a dependency)."""

import re

from benchmarks.common import size_flags
from fairseq_distattn.patches.quiet_warnings import KNOWN_WARNINGS

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import run_cli

TINY_MODEL = size_flags(dim=32, ffn=64, heads=2, layers=1)


def train(data_bin, save_dir, *args):
    return run_cli(
        [
            "fairseq-train",
            data_bin,
            "--task",
            "translation",
            *TINY_MODEL,
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--max-tokens",
            "1000",
            "--max-update",
            "2",
            "--num-workers",
            "0",
            "--save-dir",
            save_dir,
            *args,
        ]
    )


def test_train_with_the_plugin_prints_no_warnings_and_writes_tensorboard_events(mt_data, workdir):
    # The same training without the plugin shows every warning the plugin filters,
    # so the filters match what this fairseq and torch print (the test is not vacuous).
    plain = train(mt_data["bin"], workdir / "plain", "--arch", "transformer")
    for _, message, _ in KNOWN_WARNINGS:
        assert re.search(message, plain.stderr, flags=re.I), f"fairseq no longer prints {message!r}"

    tensorboard = workdir / "tensorboard"
    quiet = train(
        mt_data["bin"],
        workdir / "plugin",
        "--user-dir",
        "fairseq_distattn",
        "--arch",
        "distattn_transformer",
        "--encoder-self-attention",
        "rpr",
        "--tensorboard-logdir",
        tensorboard,
    )
    print(
        f"stderr lines: {len(plain.stderr.splitlines())} without the plugin, {len(quiet.stderr.splitlines())} with it"
    )
    assert "Warning" not in quiet.stderr, quiet.stderr
    assert "tensorboard not found" not in quiet.stdout
    for split in ("train", "valid"):
        assert list((tensorboard / split).glob("events.out.tfevents.*")), f"no {split} events in {tensorboard}"


def test_the_same_message_from_other_code_still_shows():
    # Filters are scoped by module: the pin_memory text raised by anything but
    # torch's data loader (here __main__) is not hidden.
    proc = run_cli(
        [
            "python",
            "-c",
            "import warnings, fairseq_distattn\n"
            "warnings.warn(\"'pin_memory' argument is set as true but no accelerator is found\")\n"
            "warnings.warn('hydra.experimental.compose() is no longer experimental')",
        ]
    )
    assert proc.stderr.count("UserWarning") == 2, proc.stderr


def test_a_flag_no_layer_uses_is_named_in_one_warning_line(mt_data, workdir):
    """fairseq-train says when a mechanism option changes nothing (the run goes on)."""
    proc = train(
        mt_data["bin"],
        workdir / "unused",
        "--user-dir",
        "fairseq_distattn",
        "--arch",
        "distattn_transformer",
        "--decoder-self-attention",
        "da",
        "--max-relative-position",
        "8",
        "--da-mapping",
        "sigmoid",
        "--da-clip-threshold",
        "4",
    )
    # fairseq-train logs to stdout
    warnings = [line for line in proc.stdout.splitlines() if "has no effect" in line]
    assert len(warnings) == 2, proc.stdout[-3000:]
    assert warnings[0].endswith(
        "--max-relative-position 8 has no effect: it configures rpr, which no layer uses (--decoder-self-attention da)"
    )
    assert warnings[1].endswith(
        "--da-clip-threshold 4.0 has no effect: it is used only with --da-mapping clip, not --da-mapping sigmoid"
    )
    assert "done training" in proc.stdout + proc.stderr
