"""The length-generalization harness (``benchmarks.quality.length_generalization``): its
metric on a fixture, how it reads fairseq's completions, its command-line errors, the
task folders it reads (a hand-made one, without task.json, needs no code), the methods it
derives from the methods table, its report from hand-made run files, and one tiny run
end to end (it checks that the harness works and writes well-formed outputs, not what
the models score)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.quality import length_generalization as harness
from benchmarks.quality import length_grid, length_report
from benchmarks.quality.methods import method_rows

from .conftest import write_lines

# ------------------------------------------------------------------------------ metric


def test_exact_match_counts_an_empty_or_over_long_completion_as_wrong():
    hypotheses = ["a b c", "", "a b c d", "a  b ", "x", ""]
    references = ["a b c", "a", "a b c", "a b", "y", ""]
    assert harness.exact_match(hypotheses, references) == {
        "correct": 2,  # the first, and the fourth: tokens are compared, not spacing
        "total": 6,
        "empty": 2,  # the second, and the last: empty is wrong even against an empty reference
        "over_long": 1,  # the third: a copy that runs on past its reference
        "accuracy": round(100 * 2 / 6, 2),
    }
    assert harness.exact_match([], [])["accuracy"] is None
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        harness.exact_match(["a", "b"], ["a"])


GENERATED = """S-0\tw1 w2 =
W-0\t0.003\tseconds
H-0\t-0.01\tw1 w2 = w1 w2
D-0\t-0.01\tw1 w2 = w1 w2
H-1\t-2.5\tw3 =
H-2\t-0.7\tw4 = w4 w4 w4
H-3\t-0.2\t
"""


def test_a_completion_is_what_follows_the_prompt_s_separator():
    by_id = harness.hypotheses_by_id(GENERATED)
    assert by_id == {0: "w1 w2 = w1 w2", 1: "w3 =", 2: "w4 = w4 w4 w4", 3: ""}
    decoder_only = [harness.completion(by_id[i], length_grid.DECODER_ONLY) for i in range(4)]
    assert decoder_only == ["w1 w2", "", "w4 w4 w4", ""]
    assert harness.completion("w1 w2", length_grid.ENCODER_DECODER) == "w1 w2"
    references = ["w1 w2", "w3", "w4"]
    counts = harness.exact_match(decoder_only[:3], references)
    assert (counts["correct"], counts["empty"], counts["over_long"]) == (1, 1, 1)
    assert harness.prompt("w1 w2", length_grid.DECODER_ONLY) == "w1 w2 ="
    assert harness.prompt("w1 w2", length_grid.ENCODER_DECODER) == "w1 w2"


# ------------------------------------------------------------------------------ data


def hand_made_task(folder: Path, buckets=("x1", "x2"), train: int = 60, test: int = 6, task_json=None) -> Path:
    """A task folder written by hand, no generator involved: ``mirror`` reverses a few letters."""
    import random

    rng = random.Random(0)

    def pairs(count, low, high):
        sources = [" ".join(rng.choice("abcd") for _ in range(rng.randint(low, high))) for _ in range(count)]
        return sources, [" ".join(source.split()[::-1]) for source in sources]

    for split, count, (low, high) in [("train", train, (1, 4)), ("valid", test, (1, 4))] + [
        (f"test-{bucket}", test, (5, 8)) for bucket in buckets
    ]:
        sources, targets = pairs(count, low, high)
        write_lines(folder / f"{split}.src", sources)
        write_lines(folder / f"{split}.tgt", targets)
    if task_json is not None:
        (folder / "task.json").write_text(json.dumps(task_json), encoding="utf-8")
    return folder


def test_a_hand_made_task_folder_is_read_without_code(tmp_path):
    folder = hand_made_task(tmp_path / "mirror", buckets=("x10", "x2", "long", "x1"))
    (task,) = length_grid.read_task_data(folder)
    assert (task.name, task.forms) == ("mirror", (length_grid.DECODER_ONLY,))  # no task.json: decoder-only
    assert task.buckets == ("x1", "x2", "x10", "long")  # by multiplier, other names last
    assert task.splits() == ("valid", "test-x1", "test-x2", "test-x10", "test-long")
    assert len(task.lines("test-x2")[0]) == 6
    # a folder of task folders: each one, by name; task.json names the forms
    hand_made_task(tmp_path / "all" / "b", task_json={"forms": ["decoder-only", "encoder-decoder"]})
    hand_made_task(tmp_path / "all" / "a")
    (tmp_path / "all" / "notes").mkdir()
    tasks = length_grid.read_task_data(tmp_path / "all")
    assert [(t.name, t.forms) for t in tasks] == [
        ("a", ("decoder-only",)),
        ("b", ("decoder-only", "encoder-decoder")),
    ]


def test_the_positions_fit_the_longest_bucket_and_its_answer(tmp_path):
    folder = hand_made_task(tmp_path / "mirror")
    write_lines(folder / "test-x2.src", ["a b c d e f g h i j"])  # 10 tokens, the longest source
    write_lines(folder / "test-x2.tgt", ["j i h g f e d c b a a a"])  # 12, the longest answer
    (task,) = length_grid.read_task_data(folder)
    assert harness.longest_answer(task) == 12
    # 10 + 1 (=) + 12 + MARGIN (8) + 3 (begin, end of sentence, one spare) = 34, rounded up
    assert harness.max_positions(task) == 64


def test_the_methods_are_the_methods_table_s_rows():
    from benchmarks.quality.lm_grid import lm_configs
    from benchmarks.quality.mt_grid import default_configs

    methods = length_grid.length_methods()
    rows = method_rows(list(default_configs()), list(lm_configs()))
    variants = [name for name, _ in length_grid.LM_VARIANT_ROWS.values()]
    assert list(methods) == [length_grid.BASELINE, *(row[0] for row in rows), *variants]
    baseline = methods[length_grid.BASELINE]
    assert baseline.decoder_only == ("--arch", "transformer_lm_gbw")
    assert baseline.encoder_decoder == ("--arch", "transformer_iwslt_de_en")
    for name, _, mt, lm in rows:
        flags = length_grid.DECODER_ONLY_FLAGS.get(name, ((), ""))[0]
        assert methods[name].decoder_only == (("--arch", lm, *flags) if lm else None), name
        assert methods[name].encoder_decoder == (tuple(default_configs()[mt].arch_args()) if mt else None), name
    assert methods["nope"].encoder_decoder is None and methods["nope"].decoder_only == (
        "--arch",
        "distattn_lm_nope_gbw",
    )
    # cross-attention gets a mechanism only where the translation configuration puts it
    assert "--cross-attention" not in methods["alibi"].encoder_decoder
    assert "--cross-attention" in methods["window"].encoder_decoder


def test_the_lm_grid_s_variants_train_decoder_only_with_the_task_s_positions_when_randomized():
    """Issue 64's rows: each LM grid variant of LM_VARIANT_ROWS with its grid flags (in place of
    them where DECODER_ONLY_FLAGS says), decoder-only; a randomized one draws from the task's positions."""
    from benchmarks.quality.lm_grid import lm_configs

    configs, methods = lm_configs(), length_grid.length_methods()
    for variant, (name, _) in length_grid.LM_VARIANT_ROWS.items():
        method, flags = methods[name], configs[variant].flags
        assert method.encoder_decoder is None, name
        assert method.randomized == (length_grid.RANDOMIZED_POSITIONS in flags), name
        if not method.randomized:
            flags = length_grid.DECODER_ONLY_FLAGS.get(name, (flags, ""))[0]
            assert method.decoder_only == ("--arch", configs[variant].arch, *flags), name
    assert methods["rope+randomized"].train_args(length_grid.DECODER_ONLY, 512) == (
        "--arch",
        "distattn_lm_rope_gbw",
        "--randomized-positions",
        "512",
        "--randomized-positions-at-evaluation",
    )
    assert methods["rope"].train_args(length_grid.DECODER_ONLY, 512) == ("--arch", "distattn_lm_rope_gbw")
    assert methods["llama4+interval-3"].decoder_only[-2:] == ("--llama4-floor-scale", "32")


# ------------------------------------------------------------------------------ command line

ERRORS = [
    (["--seeds", "1,x"], "argument --seeds: '1,x' is not a comma-separated list of integers"),
    (["--forms", "decoder-only,seq2seq"], "argument --forms: unknown seq2seq; choose from decoder-only"),
    (["--methods", "alibi,nosuch"], "argument --methods: unknown nosuch; choose from baseline, "),
    (["--updates", "0"], "argument --updates: invalid value '0': must be an integer >= 1"),
    (["--threads", "0"], "argument --threads: invalid value '0': must be an integer >= 1"),
    (["--task-data", "{missing}"], "argument --task-data: no such directory: {missing}"),
    (["--task-data", "{empty}"], "argument --task-data: {empty} holds no task folder"),
    (["--task-data", "{broken}"], "argument --task-data: {broken}/mirror: valid.src has 6 lines and valid.tgt 5"),
    (["--task-data", "{tasks}", "--tasks", "mirror,nosuch"], "argument --tasks: unknown nosuch; choose from mirror"),
    (
        ["--task-data", "{tasks}", "--forms", "encoder-decoder"],
        "argument --forms: no selected task has the form(s) encoder-decoder with a selected method",
    ),
    (
        ["--task-data", "{tasks}", "--methods", "window-mw", "--forms", "decoder-only"],
        "argument --forms: no selected task has the form(s) decoder-only",
    ),
]


@pytest.mark.parametrize("argv, message", ERRORS, ids=[" ".join(case[0]) for case in ERRORS])
def test_a_bad_flag_is_one_error_line_naming_it(argv, message, tmp_path, capsys):
    hand_made_task(tmp_path / "tasks" / "mirror")
    broken = hand_made_task(tmp_path / "broken" / "mirror")
    (broken / "valid.tgt").write_text("".join(f"{i}\n" for i in range(5)), encoding="utf-8")
    (tmp_path / "empty").mkdir()
    names = {name: tmp_path / name for name in ("missing", "empty", "broken", "tasks")}
    argv = [item.format(**names) for item in argv] + ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        harness.parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].split(": error: ", 1)[1].startswith(message.format(**names))
    assert not (tmp_path / "work").exists()  # nothing made before the flags are right


# ------------------------------------------------------------------------------ report


def fixture_run(
    out: Path, task: str, method: str, seed: int, accuracy: dict, form: str = "decoder-only", **recorded
) -> None:
    record = {
        "config": f"{task}-{form}-{method}",
        "task": task,
        "form": form,
        "method": method,
        "seed": seed,
        "updates": 2000,
        "model": length_grid.model_text(),
        "max_tokens": 2048,
        "machine": "a test",
        "train_wall_s": 100.0 + seed,
        "accuracy": accuracy,
        **recorded,
    }
    path = out / "runs" / f"{record['config']}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")


def cells(markdown: str, section: str, first_cell: str):
    """The cells of the row starting with ``first_cell`` in the table under heading ``section``."""
    table = markdown.split(f"### {section}\n", 1)[1].split("\n\n", 1)[0]
    for row in table.splitlines():
        if row.startswith(f"| {first_cell} |"):
            return [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
    raise AssertionError(f"no row {first_cell} under {section}")


def test_the_report_reads_each_delta_against_seed_noise(tmp_path):
    out = tmp_path / "out"
    for seed, (valid, x2, x4) in enumerate([(100, 40, 0), (98, 50, 10)], start=1):
        fixture_run(out, "copy", "baseline", seed, {"valid": valid, "x1": 99, "x2": x2, "x4": x4})
    for seed, (valid, x2, x4) in enumerate([(100, 90, 5), (100, 95, 5)], start=1):
        fixture_run(out, "copy", "alibi", seed, {"valid": valid, "x1": 100, "x2": x2, "x4": x4})
    fixture_run(out, "copy", "rope", 1, {"valid": 50, "x2": 0, "x4": 0}, form="encoder-decoder")
    markdown = length_report.report(out, [("copy", "decoder-only"), ("parity", "decoder-only")])
    assert markdown == (out / "length_generalization.md").read_text(encoding="utf-8")
    assert (out / "accuracy_vs_length.png").stat().st_size > 0
    baseline = cells(markdown, "copy (decoder-only)", "baseline")
    assert baseline[1:5] == ["2 (1,2)", "99.0 +- 1.4 (2)", "-", "-"] and baseline[-2:] == ["x1 99.0", "101, 102"]
    alibi = cells(markdown, "copy (decoder-only)", "`alibi`")
    # valid: +1.0 within one standard error (1.41 x sqrt(1/2 + 1/2)); x2: +47.5 beyond 7.07; x4: 0.0
    assert alibi[2:11] == [
        "100.0 +- 0.0 (2)",
        "+1.0",
        "within noise",
        "92.5 +- 3.5 (2)",
        "+47.5",
        "better, beyond noise",
        "5.0 +- 0.0 (2)",
        "+0.0",
        "within noise",
    ]
    assert cells(markdown, "copy (decoder-only)", "`rope`")[1:] == ["-"] * 12  # in the grid, not run
    assert cells(markdown, "parity (decoder-only)", "`alibi`")[1] == "-"  # a selected task without runs
    # the overview: methods x tasks, in distribution / x2 / x4
    overview = markdown.split("## decoder-only", 1)[1]
    assert "| `alibi` | 100 / 92 / 5 | - |" in overview and "| method | copy | parity |" in overview
    # the encoder-decoder form has its own section; one seed: no reading without the baseline's spread
    rope = cells(markdown, "copy (encoder-decoder)", "`rope`")
    assert rope[1:5] == ["1 (1)", "50.0 (1)", "-", "-"]
    assert "`nope`" not in markdown.split("## encoder-decoder", 1)[1]  # no translation configuration


def test_the_report_reads_kazemnejad_et_al_s_ordering_on_the_tasks_every_compared_method_has(tmp_path):
    out = tmp_path / "out"
    # per seed, the x2 accuracy on copy and reverse (the same on both)
    x2 = {"baseline": (0, 2), "rope": (1, 1), "alibi": (30, 34), "t5-bias": (20, 24), "nope": (22, 22)}
    for method, per_seed in x2.items():
        for seed, accuracy in enumerate(per_seed, start=1):
            for task in ("copy", "reverse"):
                fixture_run(out, task, method, seed, {"valid": 100, "x2": accuracy, "x4": 0})
    fixture_run(out, "parity", "nope", 1, {"valid": 100, "x2": 100, "x4": 0})  # only nope: not compared
    fixture_run(out, "copy", "alibi", 1, {"valid": 100, "x2": 0, "x4": 0}, form="encoder-decoder")  # not compared
    for method in x2:  # a task no method fits in distribution: not compared, and its table says why
        for seed in (1, 2):
            fixture_run(out, "addition", method, seed, {"valid": 2 + seed, "x2": 40 if method == "rope" else 0})
    markdown = length_report.report(out)
    section = markdown.split("## Against Kazemnejad et al. 2023\n", 1)[1]
    assert "fits in distribution (at least 50%): copy, reverse;" in section
    addition = markdown.split("### addition (decoder-only)\n", 1)[1].split("\n\n")[0].strip()
    assert addition == (
        "No method fits this task at the budget: the best in-distribution exact match is 3.5% (< 50%), so its "
        "longer buckets say nothing about length generalization."
    )
    assert "No method fits" not in markdown.split("### copy (decoder-only)\n", 1)[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    # the methods by mean (ties in the paper's order), then each claim: rope - baseline 0 within
    # the baseline's noise (1.41); alibi - rope +31 beyond rope's 0; t5 - alibi -10 beyond
    # alibi's 2.83; nope - t5 0 within t5's
    assert rows[1:6] == [
        "| `alibi` | ALiBi | 32.0 +- 2.8 (2) |",
        "| `nope` | NoPE | 22.0 +- 0.0 (2) |",
        "| `t5-bias` | T5's relative bias | 22.0 +- 2.8 (2) |",
        "| `rope` | Rotary | 1.0 +- 0.0 (2) |",
        "| baseline | APE | 1.0 +- 1.4 (2) |",
    ]
    assert rows[7:] == [
        "| NoPE ~ T5's relative bias | +0.0 | within noise | reproduced |",
        "| T5's relative bias > ALiBi | -10.0 | worse, beyond noise | contradicted |",
        "| ALiBi > Rotary | +31.0 | better, beyond noise | reproduced |",
        "| Rotary ~ APE | +0.0 | within noise | reproduced |",
    ]
    assert "Of the 4 claims: 3 reproduced, 1 contradicted, 0 not separated, 0 without a reading yet." in section


def test_the_kazemnejad_claims_have_no_reading_with_one_seed_and_no_section_tables_without_common_tasks(tmp_path):
    out = tmp_path / "out"
    for method in ("baseline", "rope", "alibi", "t5-bias", "nope"):
        fixture_run(out, "copy", method, 1, {"valid": 100, "x2": 10, "x4": 0})
    section = length_report.report(out).split("## Against Kazemnejad et al. 2023\n", 1)[1]
    assert "| T5's relative bias > ALiBi | +0.0 | - | - |" in section and "4 without a reading yet" in section
    fixture_run(out, "reverse", "rope", 1, {"valid": 100, "x2": 10, "x4": 0})
    assert "(at least 50%): copy;" in length_report.report(out)  # reverse lacks four of the five methods
    (out / "runs" / "copy-decoder-only-nope-seed1.json").unlink()
    section = length_report.report(out).split("## Against Kazemnejad et al. 2023\n", 1)[1]
    assert "(at least 50%): none yet;" in section and "| their claim |" not in section


def test_the_report_reads_ruoss_et_al_s_gain_of_randomized_positions_beyond_the_training_lengths(tmp_path):
    out = tmp_path / "out"
    section = length_report.report(out).split("## Against Ruoss et al. 2023\n", 1)[1]
    assert "No randomized row has runs yet." in section
    # per seed on copy and reverse: (x2, x4); rope+randomized gains 30 points, alibi+randomized 0
    beyond = {"rope": ((10, 0), (14, 0)), "rope+randomized": ((50, 30), (50, 34))}
    beyond |= {"alibi": ((40, 20), (44, 20)), "alibi+randomized": ((40, 20), (44, 20))}
    for method, per_seed in beyond.items():
        for seed, (x2, x4) in enumerate(per_seed, start=1):
            for task in ("copy", "reverse"):
                fixture_run(out, task, method, seed, {"valid": 100, "x1": 100, "x2": x2, "x4": x4})
    # parity: no row fits it in distribution; sort: the randomized row has no run of it
    fixture_run(out, "parity", "rope", 1, {"valid": 10, "x2": 0, "x4": 90})
    fixture_run(out, "parity", "rope+randomized", 1, {"valid": 10, "x2": 0, "x4": 0})
    fixture_run(out, "sort", "rope", 1, {"valid": 100, "x2": 90, "x4": 90})
    section = length_report.report(out).split("## Against Ruoss et al. 2023\n", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    # x1 is in distribution: not counted; rope per seed (10 + 0) / 2 = 5 and (14 + 0) / 2 = 7
    assert rows == [
        "| `alibi` | copy, reverse | 31.0 +- 1.4 (2) | 31.0 +- 1.4 (2) | +0.0 | within noise |",
        "| `rope` | copy, reverse | 6.0 +- 1.4 (2) | 41.0 +- 1.4 (2) | +35.0 | better, beyond noise |",
    ]
    gain = "Mean gain of randomized positions over the 2 encoding(s): +17.5 points (Ruoss et al. 2023: +12.0)"
    assert gain in section
    assert "readings: 1 better, beyond noise, 1 within noise." in section
    papers = (out / length_report.PAPERS).read_text(encoding="utf-8")  # the comparisons alone, for the docs
    assert papers.split("## Against Ruoss et al. 2023\n", 1)[1] == section
    assert "## Against Kazemnejad et al. 2023" in papers and "### copy" not in papers


def test_the_report_gives_the_core_hours_the_runs_cost_per_form_and_for_the_variants(tmp_path):
    out = tmp_path / "out"
    timed = [
        ("decoder-only", "baseline", 1, 1800.0),
        ("decoder-only", "alibi", 1, 5400.0),
        ("encoder-decoder", "rope", 1, 3600.0),
        ("decoder-only", "rope+randomized", 1, 360.0),
        ("decoder-only", "rope", 2, None),
    ]
    for form, method, seed, wall_s in timed:
        recorded = {} if wall_s is None else {"wall_s": wall_s}
        fixture_run(out, "copy", method, seed, {"valid": 100, "x2": 0, "x4": 0}, form=form, **recorded)
    markdown = length_report.report(out, [("copy", "decoder-only")])
    assert (
        "Cost: 3.1 core-hours, the runs' wall times on one thread each: decoder-only 2.0 h (2 runs, 60.0 min a "
        "run); encoder-decoder 1.0 h (1 run, 60.0 min a run); the LM grid's variants 0.1 h (1 run, 6.0 min a run); "
        "1 run without a recorded time.\n"
    ) in markdown


def test_the_report_without_runs_says_so(tmp_path):
    assert harness.main(["--report", "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out" / "length_generalization.md").read_text(encoding="utf-8")
    assert "Budget: no runs yet" in markdown and not (tmp_path / "out" / "accuracy_vs_length.png").exists()


# ------------------------------------------------------------------------------ end to end


def test_one_tiny_run_end_to_end_writes_its_run_file_and_is_not_run_twice(tmp_path, capsys):
    tasks, work, out = tmp_path / "tasks", tmp_path / "work", tmp_path / "out"
    hand_made_task(tasks / "mirror", train=40, test=4)
    argv = ["--task-data", str(tasks), "--methods", "baseline", "--seeds", "2", "--updates", "2"]
    argv += ["--work", str(work), "--out", str(out)]
    assert harness.main(argv) == 0
    (path,) = (out / "runs").glob("*.json")
    assert path.name == "mirror-decoder-only-baseline-seed2.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert (record["task"], record["form"], record["method"], record["seed"]) == (
        "mirror",
        "decoder-only",
        "baseline",
        2,
    )
    assert record["updates"] == 2 and record["train_args"] == ["--arch", "transformer_lm_gbw"]
    assert set(record["accuracy"]) == {"valid", "x1", "x2"} == set(record["counts"])
    assert all(count["total"] == 4 for count in record["counts"].values())
    assert "--criterion answer_cross_entropy" in record["train_command"] and "--seed 2" in record["train_command"]
    assert "fairseq-interactive" in record["eval_command"] and "--beam 1" in record["eval_command"]
    assert record["data_lines"] == {"train": 40, "valid": 4, "test-x1": 4, "test-x2": 4}
    assert record["git_revision"] and record["machine"] and record["checkpoint_sha256"]
    assert (
        work / "updates-2" / "mirror-decoder-only-baseline-seed2" / "checkpoint_best.pt"
    ).is_file()  # its budget names it
    assert (out / "length_generalization.md").is_file() and (out / "accuracy_vs_length.png").is_file()
    written = path.stat().st_mtime_ns
    capsys.readouterr()
    assert harness.main(argv) == 0  # done: skipped, the report rebuilt
    assert "0 runs to do" in capsys.readouterr().err and path.stat().st_mtime_ns == written


def test_a_randomized_row_trains_with_the_task_s_positions_as_its_n(tmp_path):
    """fairseq takes --randomized-positions N only with N at least the model's positions: the row's N
    is the task's; it draws in evaluation too, as the authors' code, so its buckets are scored by
    teacher forcing (decoding cannot draw), seeded by the run's seed."""
    tasks, work, out = tmp_path / "tasks", tmp_path / "work", tmp_path / "out"
    hand_made_task(tasks / "mirror", train=40, test=4)
    argv = ["--task-data", str(tasks), "--methods", "rope+randomized", "--seeds", "1", "--updates", "2"]
    assert harness.main([*argv, "--work", str(work), "--out", str(out)]) == 0
    record = json.loads((out / "runs" / "mirror-decoder-only-rope+randomized-seed1.json").read_text(encoding="utf-8"))
    positions = str(record["max_positions"])
    assert record["train_args"] == [
        "--arch",
        "distattn_lm_rope_gbw",
        "--randomized-positions",
        positions,
        "--randomized-positions-at-evaluation",
    ]
    assert f"--randomized-positions {positions} --randomized-positions-at-evaluation" in record["train_command"]
    scoring = record["scoring"]
    assert scoring.startswith("teacher forcing") and "--randomized-positions-at-evaluation" in scoring
    assert "benchmarks.quality.forced_match" in record["eval_command"] and record["eval_command"].endswith("--seed 1")
    assert set(record["accuracy"]) == {"valid", "x1", "x2"}


def test_one_tiny_encoder_decoder_run_translates_its_buckets_through_the_method_s_configuration(tmp_path):
    """The encoder-decoder form end to end: fairseq-preprocess of source and answer, a translation
    model with the method's translation configuration (rope: the plugin's encoder and decoder),
    fairseq-interactive's greedy translations scored per bucket."""
    tasks, work, out = tmp_path / "tasks", tmp_path / "work", tmp_path / "out"
    hand_made_task(tasks / "mirror", train=40, test=4, task_json={"forms": ["encoder-decoder"]})
    argv = ["--task-data", str(tasks), "--forms", "encoder-decoder", "--methods", "rope", "--seeds", "1"]
    argv += ["--updates", "2", "--work", str(work), "--out", str(out)]
    assert harness.main(argv) == 0
    (path,) = (out / "runs").glob("*.json")
    assert path.name == "mirror-encoder-decoder-rope-seed1.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert (record["form"], record["method"]) == ("encoder-decoder", "rope")
    assert record["train_args"] == list(length_grid.length_methods()["rope"].encoder_decoder)
    assert "--task translation" in record["train_command"] and "--user-dir" in record["train_command"]
    assert "--criterion answer_cross_entropy" not in record["train_command"]
    assert set(record["accuracy"]) == {"valid", "x1", "x2"}
    assert all(count["total"] == 4 for count in record["counts"].values())
    markdown = (out / "length_generalization.md").read_text(encoding="utf-8")
    assert "## encoder-decoder" in markdown and "### mirror (encoder-decoder)" in markdown


def test_teacher_forcing_gives_each_prompt_the_exact_match_of_fairseq_s_greedy_completion(tmp_path, monkeypatch):
    """A trained tiny language model: fairseq-interactive completes every prompt; forcing each
    completion that stopped must find it exactly (and not with its last token dropped), forcing the
    references must agree prompt by prompt with greedy exact match, and the harness scoring the
    same checkpoint again by forcing (as it does passkey's long prompts) records the same counts."""
    from benchmarks.quality import forced_match

    tasks, work, out = tmp_path / "tasks", tmp_path / "work", tmp_path / "out"
    task_folder = hand_made_task(tasks / "mirror", train=200, test=8)
    argv = ["--task-data", str(tasks), "--methods", "baseline", "--seeds", "1", "--updates", "60"]
    argv += ["--work", str(work), "--out", str(out)]
    assert harness.main(argv) == 0
    (path,) = (out / "runs").glob("*.json")
    generated = json.loads(path.read_text(encoding="utf-8"))
    assert generated["scoring"].startswith("greedy completion") and "fairseq-interactive" in generated["eval_command"]
    run_dir = work / "updates-60" / "mirror-decoder-only-baseline-seed1"
    (data_bin,) = work.glob("data/mirror-*/decoder-only/data-bin")
    prompts = (run_dir / "prompts.txt").read_text(encoding="utf-8").splitlines()
    by_id = harness.hypotheses_by_id((run_dir / "generate.txt").read_text(encoding="utf-8"))
    greedy = [harness.completion(by_id[number], "decoder-only") for number in range(len(prompts))]
    (task,) = length_grid.read_task_data(task_folder)
    references = [line for split in task.splits() for line in task.lines(split)[1]]

    def forced(answers):
        answers_file, scored = tmp_path / "answers.txt", tmp_path / "forced.json"
        write_lines(answers_file, answers)
        common = ["--path", str(run_dir / "checkpoint_best.pt"), "--data", str(data_bin)]
        assert (
            forced_match.main(
                [
                    *common,
                    "--prompts",
                    str(run_dir / "prompts.txt"),
                    "--answers",
                    str(answers_file),
                    "--out",
                    str(scored),
                ]
            )
            == 0
        )
        return json.loads(scored.read_text(encoding="utf-8"))

    # a completion shorter than the margin stopped at </s> (the length limit leaves more room)
    stopped = [number for number, answer in enumerate(greedy) if 0 < len(answer.split()) < harness.MARGIN]
    assert len(stopped) >= len(prompts) // 2
    found = forced([greedy[number] if number in stopped else "a" for number in range(len(prompts))])
    assert all(found["correct"][number] for number in stopped)
    truncated = [" ".join(answer.split()[:-1]) or "a b c d e f g h" for answer in greedy]
    assert not any(forced(truncated)["correct"][number] for number in stopped)
    against_references = forced(references)
    exact = [answer.split() == reference.split() for answer, reference in zip(greedy, references)]
    assert against_references["correct"] == exact and 0 < sum(exact) < len(exact)
    assert against_references["empty"] == [not answer.split() for answer in greedy]

    monkeypatch.setattr(harness, "FORCED_FROM", 0)
    assert harness.main([*argv, "--retrain"]) == 0
    rescored = json.loads(path.read_text(encoding="utf-8"))
    assert rescored["scoring"].startswith("teacher forcing") and "forced_match" in rescored["eval_command"]
    assert rescored["accuracy"] == generated["accuracy"]
    for bucket, counts in rescored["counts"].items():
        assert {key: generated["counts"][bucket][key] for key in ("correct", "total", "empty")} == counts
    markdown = (out / "length_generalization.md").read_text(encoding="utf-8")
    assert "mirror: the same exact match by teacher forcing" in markdown


def test_every_committed_run_trained_its_method_as_the_grid_trains_it_now():
    """A run file counts in the report for its method: one trained with other flags (a method whose
    flags changed since, as llama4-temperature's did: DECODER_ONLY_FLAGS) must be trained again, not kept."""
    methods = length_grid.length_methods()
    stale = [
        path.name
        for path in sorted((length_grid.DEFAULT_OUT / "runs").glob("*.json"))
        for record in [json.loads(path.read_text(encoding="utf-8"))]
        if record["method"] in methods
        and record["train_args"] != list(methods[record["method"]].train_args(record["form"], record["max_positions"]))
    ]
    assert not stale, f"run files trained with other flags than their method's now: {stale}"


def test_every_line_of_the_plot_has_a_style_of_its_own():
    """The plot's legend names every method of the grid: no two lines may share colour and
    marker (matplotlib's ten colours alone repeat), nor any the baseline's."""
    from benchmarks.harness.report import series_style

    styles = [tuple(sorted(series_style(i).items())) for i, _ in enumerate(length_grid.length_methods())]
    assert len(styles) > 10 and len(set(styles)) == len(styles)
    assert length_report.BASELINE_STYLE["color"] not in {dict(style)["color"] for style in styles}
