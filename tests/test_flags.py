"""The plugin's flags reach the model (that fairseq-train --help lists them is
tests/test_cli.py::test_help_lists_plugin_flags); flags that do not apply to
the LM are refused like any bad value."""

import pytest

from .model_helpers import TINY_LM, language_model, parse


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
