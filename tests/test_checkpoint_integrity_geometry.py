"""A checkpoint is evaluated as the model it was trained as, on every token asked for.

Three ways a command used to run without a word and compute something else (issue 47,
section 4), each now one error line (exit status 2, no traceback) or the right result:

- ``fairseq-eval-lm`` past the training length without ``'max_target_positions'`` in
  ``--model-overrides``: fairseq skipped every block longer than the checkpoint's
  positions and printed the perplexity of the last, shorter block;
- the attention's geometry: resuming with another ``--decoder-attention-heads``, or
  overriding it, loaded the same weight shapes into another model (rope's rotation and
  ALiBi's slopes depend on the head count; kerple's per-head parameters ended in a
  traceback);
- ``--model-overrides`` keys the plugin does not know but close to one it does
  (``'rope_bse'``), and options of a mechanism no layer of the checkpoint uses
  (``'rope_scaling'`` on kerple): fairseq ignored both.

The end-to-end tests train two tiny language models (rope and kerple, 2 heads, samples
of 64 tokens) for one update each.
"""

from __future__ import annotations

import re
from argparse import Namespace

import pytest

from fairseq_distattn.registry import SpecError
from fairseq_distattn.trained_settings import (
    architecture_defaults,
    check_overrides,
    differences,
    settings_of,
    trained_settings,
)

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import run_cli
    from .model_helpers import TINY, TINY_LM, parse
except ImportError:  # rootdir-relative import mode without the package
    from conftest import run_cli
    from model_helpers import TINY, TINY_LM, parse

USER_DIR = ["--user-dir", "fairseq_distattn"]
LM_TASK = ["--task", "language_modeling", "--tokens-per-sample", "64"]
# TINY_LM without --max-relative-position (no rpr layer here: an unused option would only warn)
LM_FLAGS = [a for i, a in enumerate(TINY_LM) if "--max-relative-position" not in (a, TINY_LM[i - 1])]
TRAIN = [
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--max-tokens",
    "1024",
    "--disable-validation",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--seed",
    "1",
]
# docs/architectures.md's evaluation past the training length (64 tokens here)
YARN = {"rope_scaling": "yarn", "rope_scaling_factor": 2, "rope_original_length": 64}


def train_lm(data_bin, save_dir, mechanism, max_update=1, extra=()):
    return run_cli(
        [
            "fairseq-train",
            data_bin,
            *USER_DIR,
            *LM_TASK,
            "--arch",
            "distattn_lm",
            "--decoder-self-attention",
            mechanism,
            "--no-token-positional-embeddings",
            *LM_FLAGS,
            *extra,
            *TRAIN,
            "--max-update",
            max_update,
            "--save-dir",
            save_dir,
        ],
        check=False,
    )


def eval_lm(data_bin, checkpoint, tokens_per_sample, overrides=None):
    return run_cli(
        [
            "fairseq-eval-lm",
            data_bin,
            *USER_DIR,
            "--path",
            checkpoint,
            "--gen-subset",
            "test",
            "--tokens-per-sample",
            tokens_per_sample,
            "--max-tokens",
            "4096",
            "--num-workers",
            "0",
            *(["--model-overrides", repr(overrides)] if overrides else []),
        ],
        check=False,
    )


def one_error_line(proc, prog):
    """Exit status 2 and the error as the last line of stderr, without a traceback."""
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), proc.stderr[-3000:]
    return last


def scored_tokens(proc) -> int:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    found = re.search(r"Evaluated ([0-9,]+) tokens", proc.stdout + proc.stderr)
    assert found, (proc.stdout + proc.stderr)[-3000:]
    return int(found.group(1).replace(",", ""))


@pytest.fixture(scope="module")
def checkpoints(lm_data, tmp_path_factory):
    """mechanism -> checkpoint of a 2-head LM trained for one update on blocks of 64 tokens."""
    root = tmp_path_factory.mktemp("geometry")
    found = {}
    for mechanism in ("rope", "kerple"):
        proc = train_lm(lm_data["bin"], root / mechanism, mechanism)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[mechanism] = root / mechanism / "checkpoint_last.pt"
    return found


# --------------------------------------------------------------------------- 4.1: eval-lm past the training length


def test_eval_lm_past_the_training_length_without_max_target_positions_is_refused(lm_data, checkpoints):
    """fairseq skips every block longer than the checkpoint's 64 positions: it scored only the
    last, shorter block (22 of 932 tokens here) and printed a perplexity."""
    proc = eval_lm(lm_data["bin"], checkpoints["rope"], 130, YARN)
    line = one_error_line(proc, "fairseq-eval-lm")
    assert "argument --tokens-per-sample: invalid value '130'" in line
    assert "longer than the checkpoint's max_target_positions 64" in line
    assert "--model-overrides \"{'max_target_positions': 130}\"" in line


def test_eval_lm_past_the_training_length_with_max_target_positions_scores_every_token(lm_data, checkpoints):
    every_token = scored_tokens(eval_lm(lm_data["bin"], checkpoints["rope"], 64))
    longer = eval_lm(lm_data["bin"], checkpoints["rope"], 130, {**YARN, "max_target_positions": 130})
    assert scored_tokens(longer) == every_token
    assert "skipped" not in longer.stdout + longer.stderr


# --------------------------------------------------------------------------- 4.3: the attention's geometry


def test_the_head_counts_and_widths_of_each_attention_kind_are_compared():
    base = trained_settings(parse("translation", "distattn_transformer", TINY), "distattn_transformer")
    assert {name: base[name] for name in base if name.endswith(("-heads", "-embed-dim"))} == {
        "--encoder-attention-heads": 2,
        "--encoder-embed-dim": 16,
        "--decoder-attention-heads": 2,
        "--decoder-embed-dim": 16,
    }
    for flag in ("--encoder-attention-heads", "--decoder-attention-heads"):
        other = trained_settings(
            parse("translation", "distattn_transformer", [*TINY, flag, "4"]), "distattn_transformer"
        )
        assert differences(base, other) == [(flag, 2, 4)]
        with pytest.raises(SpecError, match=re.escape(f"{flag} 2 -> 4")):
            check_overrides(base, other, {flag[2:].replace("-", "_"): 4})

    lm = trained_settings(parse("language_modeling", "distattn_lm", TINY_LM), "distattn_lm")
    assert [name for name in lm if name.endswith(("-heads", "-embed-dim"))] == [
        "--decoder-attention-heads",
        "--decoder-embed-dim",
    ]


def test_fairseqs_own_models_are_compared_as_before():
    plugin_flags = {"--max-relative-position", "--window-segment-size"}
    fairseq_tiny = [a for i, a in enumerate(TINY) if a not in plugin_flags and TINY[i - 1] not in plugin_flags]
    fairseqs = trained_settings(parse("translation", "transformer", fairseq_tiny), "transformer")
    assert not [name for name in fairseqs if name.endswith(("-heads", "-embed-dim"))]


@pytest.mark.parametrize(
    "arch,expected",
    [
        ("distattn_lm", {"--decoder-attention-heads": 8, "--decoder-embed-dim": 512}),
        ("distattn_lm_rope_gbw", {"--decoder-attention-heads": 16, "--decoder-embed-dim": 512}),
        ("distattn_transformer_iwslt_de_en", {"--encoder-attention-heads": 4, "--decoder-attention-heads": 4}),
    ],
)
def test_a_configuration_without_the_geometry_reads_as_its_architectures_default(arch, expected):
    settings = settings_of(Namespace(arch=arch))
    assert {name: settings[name] for name in expected} == expected
    # fairseq's architecture fills the decoder's width from the encoder's, and so does the fallback
    assert (
        architecture_defaults(Namespace(arch="distattn_transformer", encoder_embed_dim=16))["decoder_embed_dim"] == 16
    )


def test_resuming_with_another_head_count_stops_with_one_line(lm_data, checkpoints, workdir):
    save_dir = workdir / "resume"
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(checkpoints["rope"].read_bytes())
    proc = train_lm(lm_data["bin"], save_dir, "rope", 2, ["--decoder-attention-heads", "4"])
    line = one_error_line(proc, "fairseq-train")
    assert (
        "was trained as another model than this command builds: --decoder-attention-heads 2 (this command: 4)" in line
    )


@pytest.mark.parametrize("mechanism", ["rope", "kerple"])
def test_overriding_the_head_count_is_refused(lm_data, checkpoints, mechanism):
    """rope loaded and computed another model; kerple's per-head parameters were a traceback."""
    proc = eval_lm(lm_data["bin"], checkpoints[mechanism], 64, {"decoder_attention_heads": 4})
    line = one_error_line(proc, "fairseq-eval-lm")
    assert "argument --model-overrides" in line and "(--decoder-attention-heads 2 -> 4)" in line


# --------------------------------------------------------------------------- 4.4: override keys


@pytest.mark.parametrize(
    "overrides,typo,meant",
    [
        ({"rope_bse": 20000}, "rope_bse", "rope_base"),
        ({"rope_scaling": "linear", "rope_scaling_fator": 4}, "rope_scaling_fator", "rope_scaling_factor"),
    ],
    ids=["rope_bse", "rope_scaling_fator"],
)
def test_a_misspelt_override_is_refused_naming_the_option(lm_data, checkpoints, overrides, typo, meant):
    line = one_error_line(eval_lm(lm_data["bin"], checkpoints["rope"], 64, overrides), "fairseq-eval-lm")
    assert f"unknown override {typo!r}; did you mean {meant!r}?" in line


def test_an_override_of_a_mechanism_the_checkpoint_does_not_use_is_refused(lm_data, checkpoints):
    proc = eval_lm(lm_data["bin"], checkpoints["kerple"], 64, {"rope_scaling": "linear", "rope_scaling_factor": 4})
    line = one_error_line(proc, "fairseq-eval-lm")
    assert "'rope_scaling': 'linear' changes nothing in this checkpoint: it configures rope, xpos" in line
    assert "(--decoder-self-attention kerple)" in line


def test_fairseqs_own_keys_and_the_checkpoints_options_still_pass(lm_data, checkpoints):
    overrides = {
        "rope_scaling": "linear",
        "rope_scaling_factor": 2,
        "attention_flex": "never",  # the attention module's own option: every layer has it
        "data": str(lm_data["bin"]),  # fairseq's task options
        "sample_break_mode": "none",
        "beam": 2,  # fairseq's generation options
        "an_unrelated_key": 1,  # close to no option: fairseq lets it through, and so does the plugin
    }
    proc = eval_lm(lm_data["bin"], checkpoints["rope"], 64, overrides)
    assert scored_tokens(proc) > 0
    assert "linear scaling x2" in proc.stdout + proc.stderr
