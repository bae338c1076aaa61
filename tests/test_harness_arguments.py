"""Every benchmark harness refuses a bad command line with one argparse error that names
the flag, before any work (before these, several ended in a traceback, or ran nothing and
said nothing)."""

from __future__ import annotations

import pytest

from benchmarks import extrapolation, lm_extrapolation, lm_quality, parameter_movement, quality

CASES = [
    (quality.parse_args, ["--seeds", "1,x"], "argument --seeds: '1,x' is not a comma-separated list of integers"),
    (quality.parse_args, ["--seeds", ","], "argument --seeds: give at least one value"),
    (quality.parse_args, ["--seeds", "-1"], "argument --seeds: invalid value '-1': each must be an integer >= 0"),
    (quality.parse_args, ["--configs", "vanilla,nosuch"], "argument --configs (grid default): unknown nosuch; "),
    (quality.parse_args, ["--jobs", "0"], "argument --jobs: invalid value '0': must be an integer >= 1"),
    (quality.parse_args, ["--threads", "0"], "argument --threads: invalid value '0': must be an integer >= 1"),
    (quality.parse_args, ["--updates", "0"], "argument --updates: invalid value '0': must be an integer >= 1"),
    (lm_quality.parse_args, ["--configs", "nosuch"], "argument --configs: unknown nosuch; choose from transformer_lm"),
    (lm_quality.parse_args, ["--seeds", ""], "argument --seeds: give at least one value"),
    (lm_quality.parse_args, ["--threads", "two"], "argument --threads: invalid value 'two': must be an integer >= 1"),
    (extrapolation.parse_args, ["--threads", "0"], "argument --threads: invalid value '0': must be an integer >= 1"),
    (extrapolation.parse_args, ["--factors", "0,2"], "argument --factors: invalid value '0,2': each must be"),
    (extrapolation.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of "),
    (lm_extrapolation.parse_args, ["--lengths", "64,0"], "argument --lengths: invalid value '64,0': each must be"),
    (lm_extrapolation.parse_args, ["--lengths", "65"], "argument --lengths: each length must be an even number"),
    (lm_extrapolation.parse_args, ["--quality-work", "{missing}"], "argument --quality-work: no small-scale runs of"),
    (
        lm_extrapolation.parse_args,
        ["--quality-work", "{work}", "--configs", "nosuch"],
        "argument --configs: unknown nosuch; choose from transformer_lm",
    ),
    (parameter_movement.main, ["{missing}"], "argument checkpoint: no such file: {missing}"),
    (parameter_movement.main, ["{afile}", "--data", "{missing}"], "argument --data: no such directory: {missing}"),
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


def test_an_unreadable_checkpoint_or_data_directory_is_one_error_line(tmp_path, capsys):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint\n")
    with pytest.raises(SystemExit) as exit_info:
        parameter_movement.main([str(broken)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"python -m benchmarks.parameter_movement: error: cannot read {broken}: ")
