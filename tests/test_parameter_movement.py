"""``benchmarks.diagnostics.parameter_movement`` rebuilds fairseq-train's initial model
exactly: with a zero learning rate nothing moves, with a real one every
mechanism parameter group moves."""

from __future__ import annotations

import pytest

from benchmarks.common import size_flags

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import run_cli

from benchmarks.diagnostics import parameter_movement

ARCH = [
    "--arch",
    "distattn_transformer",
    "--encoder-self-attention",
    "rpr@0,window-aw@1",
    "--decoder-self-attention",
    "da@0,qvi@1",
    "--cross-attention",
    "window-mw-seg@1",
    "--max-relative-position",
    "5",
]
TINY = [
    "--task",
    "translation",
    "--source-lang",
    "en",
    "--target-lang",
    "de",
    *size_flags(dim=32, ffn=32, heads=2, layers=2),
    "--optimizer",
    "adam",
    "--lr-scheduler",
    "fixed",
    "--max-tokens",
    "1024",
    "--max-update",
    "3",
    "--disable-validation",
    "--num-workers",
    "0",
    "--no-save-optimizer-state",
    "--seed",
    "7",
]
GROUPS = {
    "encoder self mechanism.relative_keys",
    "encoder self mechanism.relative_values",
    "encoder self extra_query_proj.local_query.weight",
    "encoder self extra_key_proj.left_key.weight",
    "decoder self mechanism.distance_weight",
    "decoder self mechanism.sharpness",
    "decoder self mechanism.value_projection",
    "decoder self mechanism.gate_weight",
    "cross extra_query_proj.right_query.weight",
    "cross extra_key_proj.left_key.weight",
}


def _movement_after_training(data_bin, arguments, lr, tmp_path):
    """``parameter_movement.movement`` of a model fairseq-train trained with ``lr``."""
    save_dir = tmp_path / "checkpoints"
    run_cli(
        ["fairseq-train", data_bin, "--user-dir", "fairseq_distattn", *arguments, "--lr", lr, "--save-dir", save_dir]
    )
    return parameter_movement.movement(save_dir / "checkpoint_last.pt")


def _assert_moved_exactly_when_trained(result, lr):
    """lr 0: every group where it started, exactly; otherwise every group moved."""
    changes = {key: entry["relative_change"] for key, entry in result.items()}
    if lr == "0":
        assert changes == {key: 0.0 for key in changes}
    else:
        assert {key: change for key, change in changes.items() if change <= 1e-4} == {}


@pytest.mark.parametrize("lr", ["0", "1e-2"])
def test_initial_model_is_rebuilt_exactly_and_training_moves_every_mechanism_parameter(mt_data, tmp_path, lr):
    result = _movement_after_training(mt_data["bin"], [*ARCH, *TINY], lr, tmp_path)
    assert GROUPS <= set(result)
    assert not any(
        "q_proj" in key or "fc1" in key or key.endswith(("left_key.bias", "right_key.bias")) for key in result
    )
    assert result["decoder self mechanism.distance_weight"]["measure"] == "absolute"  # w starts at 0
    assert result["encoder self mechanism.relative_keys"]["measure"] == "relative"
    _assert_moved_exactly_when_trained(result, lr)
    if lr != "0":
        assert result["decoder self mechanism.sharpness"]["value_max"] != 0
    assert "decoder self mechanism.sharpness" in parameter_movement.summary(result)


LM_ARCH = [
    "--task",
    "language_modeling",
    "--arch",
    "distattn_lm",
    "--decoder-self-attention",
    "rpr@0,window-mw@1",
    "--max-relative-position",
    "4",
    "--tokens-per-sample",
    "32",
    "--sample-break-mode",
    "none",
    "--decoder-layers",
    "2",
    "--decoder-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--decoder-attention-heads",
    "2",
]


@pytest.mark.parametrize("lr", ["0", "1e-2"])
def test_a_language_models_initial_model_is_rebuilt_exactly(lm_data, tmp_path, lr):
    """The same for ``--task language_modeling`` (benchmarks.quality.lm records it
    for every LM run): the LM task builds its model from its dictionary alone."""
    result = _movement_after_training(lm_data["bin"], [*LM_ARCH, *TINY[TINY.index("--optimizer") :]], lr, tmp_path)
    assert {
        "decoder self mechanism.relative_keys",
        "decoder self mechanism.relative_values",
        "decoder self extra_query_proj.left_query.weight",
        "decoder self extra_key_proj.right_key.weight",
    } <= set(result)
    _assert_moved_exactly_when_trained(result, lr)
