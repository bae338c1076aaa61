"""The plugin's flags are listed by fairseq's --help and reach the model;
flags that do not apply to the LM are refused like any bad value."""
import subprocess
import sys
from pathlib import Path

import pytest

from .model_helpers import TINY_LM, language_model, parse

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--encoder-self-attention", "--decoder-self-attention", "--cross-attention", "--max-relative-position",
         "--no-relative-values", "--window-segment-size", "--distance-mask-alpha", "--distance-mask-direction",
         "--attention-recompute-length"]


def test_fairseq_train_help_lists_every_flag():
    result = subprocess.run([BIN / "fairseq-train", "--user-dir", REPO / "fairseq_distattn", "--help"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0
    for flag in FLAGS:
        assert flag in result.stdout, flag


def test_flags_are_absent_unless_given_so_architectures_set_defaults():
    args = parse("translation", "distattn_window_wmt_en_de", ["--window-segment-size", "3"])
    assert args.window_segment_size == 3
    assert args.encoder_self_attention == "window-aw@0-2" and args.cross_attention == "window-aw-seg@0-2"
    assert args.max_relative_position == 16
    plain = parse("translation", "transformer", [])
    assert not hasattr(plain, "encoder_self_attention")


@pytest.mark.parametrize("flag", ["--encoder-self-attention", "--cross-attention"])
def test_language_model_refuses_encoder_and_cross_specs(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        language_model(extra=[*TINY_LM, flag, "window-mw"])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in message and "window-mw" in message and "decoder-only" in message
