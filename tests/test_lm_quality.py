"""The LM quality and extrapolation harnesses end to end at a tiny size (it checks that they work and
that their outputs are well formed, not what the models score), and their report arithmetic."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import text_lines
from benchmarks.quality import lm as lm_quality
from benchmarks.quality import lm_extrapolation, lm_grid, lm_report

REPO_ROOT = Path(__file__).resolve().parent.parent

CONFIGS = ("transformer_lm_gbw", "distattn_lm_alibi_gbw")


def table_cells(markdown: str, first_cell: str):
    """The cells of the table rows whose first cell is ``first_cell``."""
    rows = [line for line in markdown.splitlines() if line.startswith(f"| {first_cell} |")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def test_lm_harnesses_write_one_json_per_run_skip_done_runs_and_report(tmp_path):
    # a slice of the shipped WikiText-2 sample (the full one takes minutes even at the tiny size)
    data = tmp_path / "wikitext-2"
    data.mkdir()
    for name, lines in (("valid.txt", 300), ("test.txt", 60)):
        text = text_lines(lm_grid.SHIPPED_DATA, name)[:lines]
        (data / name).write_text("".join(line + "\n" for line in text), encoding="utf-8")
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [
        "--scale",
        "tiny",
        "--updates",
        "4",
        "--configs",
        ",".join((*CONFIGS, "distattn_lm_llama4_gbw")),  # the last is rope's model at 2 layers: not trained
        "--seeds",
        "3",
        "--data",
        str(data),
        "--work",
        str(work),
        "--out",
        str(out),
    ]
    assert lm_quality.main(argv) == 0

    records = {path.stem: json.loads(path.read_text()) for path in (out / "runs").glob("*.json")}
    assert set(records) == {f"{config}-seed3" for config in CONFIGS}
    for name, record in records.items():
        assert record["config"] == name.rsplit("-seed", 1)[0] and record["seed"] == 3 and record["updates"] == 4
        assert record["baseline"] == "transformer_lm_gbw" and record["train_args"] == ["--arch", record["config"]]
        assert [p["updates"] for p in record["valid_curve"]] == [1, 2, 3, 4]
        best = min(record["valid_curve"], key=lambda p: p["loss"])
        assert (record["best_valid_updates"], record["best_valid_loss"]) == (best["updates"], best["loss"])
        # eval-lm prints ppl = 2 ** loss with the loss rounded to 4 decimals
        assert record["test_ppl"] > 1 and math.isclose(record["test_ppl"], 2 ** record["test_loss_base2"], rel_tol=1e-3)
        splits = record["data_splits"]
        assert record["test_tokens"] == splits["test"]["tokens"] and splits["test"]["lines"] == 60
        assert splits["train"]["lines"] + splits["valid"]["lines"] == 300 and splits["valid"]["lines"] > 0
        assert "fairseq-eval-lm" in record["eval_command"] and "--tokens-per-sample 64" in record["eval_command"]
        assert "--context-window 0" in record["eval_command"]
        assert f"--arch {record['config']}" in record["train_command"] and "--seed 3" in record["train_command"]
        assert record["git_revision"] and record["machine"] and record["train_wall_s"] > 0
        assert record["wall_s"] >= record["train_wall_s"]
        assert (work / "tiny" / name / "checkpoint_best.pt").is_file()
        assert record["mechanism_parameters"] == {}  # neither fairseq's LM nor alibi learns a mechanism parameter
        assert not (work / "tiny" / name / "checkpoints").exists()
    # training and dev sets are valid.txt cut in two
    prepared = next(work.glob("data-*"))
    split = [text_lines(prepared, f"{name}.txt") for name in ("train", "valid")]
    assert split[0] + split[1] == text_lines(data, "valid.txt") and 0 < len(split[1]) <= 30

    assert not any(work.glob("tiny/distattn_lm_llama4_gbw*"))
    markdown = (out / "lm_quality.md").read_text()
    assert "\nNot trained: distattn_lm_llama4_gbw, which at scale tiny (2 layers) is distattn_lm_rope_gbw's model" in (
        markdown
    )
    [alibi] = table_cells(markdown, "distattn_lm_alibi_gbw")
    [vanilla] = table_cells(markdown, "transformer_lm_gbw")
    assert alibi[1] == "1 (3)" and alibi[4] == "transformer_lm_gbw" and vanilla[3] == "-"
    assert alibi[2] == f"{records['distattn_lm_alibi_gbw-seed3']['test_ppl']:.2f}"
    assert (out / "valid_loss.png").stat().st_size > 1000

    # a second invocation finds both runs done: nothing is trained again
    before = {path: path.stat().st_mtime_ns for path in (out / "runs").glob("*.json")}
    assert lm_quality.main(argv) == 0
    assert {path: path.stat().st_mtime_ns for path in (out / "runs").glob("*.json")} == before
    # --retrain redoes a done run (from its kept checkpoint, as here), and only the runs asked for
    [retrained, *others] = sorted((out / "runs").glob("*.json"))
    config = retrained.stem.rsplit("-seed", 1)[0]
    assert lm_quality.main([*argv, "--configs", config, "--retrain"]) == 0
    assert retrained.stat().st_mtime_ns != before[retrained]
    assert {path: path.stat().st_mtime_ns for path in others} == {path: before[path] for path in others}

    # length extrapolation of one of the models: one JSON per (run, length), both modes
    extra = tmp_path / "extrapolation"
    extra_argv = [
        "--quality-work",
        str(work),
        "--scale",
        "tiny",
        "--lengths",
        "64,128",
        "--out",
        str(extra),
        "--quality-out",
        str(out),
        "--configs",
        "distattn_lm_alibi_gbw",
    ]
    assert lm_extrapolation.main(extra_argv) == 0
    found = {path.stem: json.loads(path.read_text()) for path in (extra / "runs").glob("*.json")}
    assert set(found) == {f"distattn_lm_alibi_gbw-seed3-L{n}" for n in (64, 128)}
    test_tokens = records["transformer_lm_gbw-seed3"]["test_tokens"]
    for record in found.values():
        n = record["tokens_per_sample"]
        assert record["train_tokens_per_sample"] == 64 and record["baseline"] == "transformer_lm_gbw"
        assert (record["blocks"]["context_window"], record["sliding"]["context_window"]) == (0, n // 2)
        # every token of test.txt is scored once in both modes, at every length
        assert record["blocks"]["tokens"] == record["sliding"]["tokens"] == test_tokens
        assert f"--tokens-per-sample {n}" in record["sliding"]["command"]
    # blocks at the training length is the quality harness's own evaluation
    at_training_length = found["distattn_lm_alibi_gbw-seed3-L64"]["blocks"]
    assert at_training_length["ppl"] == records["distattn_lm_alibi_gbw-seed3"]["test_ppl"]
    markdown = (extra / "lm_extrapolation.md").read_text()
    rows = table_cells(markdown, "distattn_lm_alibi_gbw")
    assert len(rows) == 2 and all(len(row) == 1 + 2 + 1 for row in rows)  # name, N = 64, N = 128, 128/64
    assert (extra / "ppl_vs_length.png").stat().st_size > 1000
    before = {path: path.stat().st_mtime_ns for path in (extra / "runs").glob("*.json")}
    assert lm_extrapolation.main(extra_argv) == 0
    assert {path: path.stat().st_mtime_ns for path in (extra / "runs").glob("*.json")} == before
    # a length evaluated from another checkpoint (the model was trained again since) is evaluated again
    stale = extra / "runs" / "distattn_lm_alibi_gbw-seed3-L128.json"
    fingerprint = json.loads(stale.read_text())["checkpoint_sha256"]
    assert len(fingerprint) == 64 and fingerprint == records["distattn_lm_alibi_gbw-seed3"]["checkpoint_sha256"]
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "checkpoint_sha256": "0" * 64}))
    assert lm_extrapolation.main(extra_argv) == 0
    assert json.loads(stale.read_text())["checkpoint_sha256"] == fingerprint
    after = {path: path.stat().st_mtime_ns for path in (extra / "runs").glob("*.json")}
    assert [path.name for path in after if after[path] != before[path]] == [stale.name]
    # so is a length from before fingerprints were recorded, as the quality run records one
    stale.write_text(json.dumps({k: v for k, v in json.loads(stale.read_text()).items() if k != "checkpoint_sha256"}))
    before = {path: path.stat().st_mtime_ns for path in (extra / "runs").glob("*.json")}
    assert lm_extrapolation.main(extra_argv) == 0
    assert json.loads(stale.read_text())["checkpoint_sha256"] == fingerprint
    after = {path: path.stat().st_mtime_ns for path in (extra / "runs").glob("*.json")}
    assert [path.name for path in after if after[path] != before[path]] == [stale.name]


def quality_record(config, baseline, seed, ppl):
    return {
        "config": config,
        "baseline": baseline,
        "seed": seed,
        "note": "n",
        "updates": 10,
        "tokens_per_sample": 64,
        "test_ppl": ppl,
        "test_loss_base2": math.log2(ppl),
        "best_valid_loss": 5.0,
        "best_valid_updates": 10,
        "train_wall_s": 7.0,
        "valid_curve": [{"updates": 10, "loss": 5.0, "ppl": 32.0}],
    }


def test_quality_report_means_stds_and_deltas_against_an_independent_computation(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    ppls = {"transformer_lm_gbw": [100.0, 110.0, 90.0], "distattn_lm_da_gbw": [80.0, 95.0], "distattn_lm": [120.0]}
    baselines = {
        "transformer_lm_gbw": "transformer_lm_gbw",
        "distattn_lm_da_gbw": "transformer_lm_gbw",
        "distattn_lm": "transformer_lm",
    }
    for config, values in ppls.items():
        for seed, ppl in enumerate(values, 1):
            record = quality_record(config, baselines[config], seed, ppl)
            (runs / f"{config}-seed{seed}.json").write_text(json.dumps(record), encoding="utf-8")
    markdown = lm_report.report(tmp_path)

    def sample_std(values):
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))

    [da] = table_cells(markdown, "distattn_lm_da_gbw")
    # mean 87.5, sample std sqrt(112.5) = 10.61; baseline mean 100: -12.50, -12.5%
    assert da[1] == "2 (1,2)" and da[2] == f"87.50 +- {sample_std([80.0, 95.0]):.2f}" == "87.50 +- 10.61"
    assert da[3] == "-12.50 (-12.5%)" and da[4] == "transformer_lm_gbw"
    [base] = table_cells(markdown, "transformer_lm_gbw")
    assert base[2] == "100.00 +- 10.00" and base[3] == "-"
    # one seed: no spread claimed; its baseline has no runs: no delta
    [single] = table_cells(markdown, "distattn_lm")
    assert single[2] == "120.00" and single[3] == "-" and single[4] == "transformer_lm"
    assert (tmp_path / "valid_loss.png").is_file()


def extrapolation_record(seed, length, blocks, sliding=None, **extra):
    return {
        "config": "distattn_lm_alibi_gbw",
        "seed": seed,
        "baseline": "transformer_lm_gbw",
        "train_tokens_per_sample": 64,
        "tokens_per_sample": length,
        "blocks": {"ppl": blocks},
        "sliding": {"ppl": blocks if sliding is None else sliding},
        **extra,
    }


def test_extrapolation_report_refuses_a_seed_evaluated_from_two_models(tmp_path):
    """One seed's row must come from one checkpoint: its lengths' fingerprints agree, and
    its training length scores what its quality run recorded (a model trained again
    whose old lengths were kept would mix two models in one row)."""
    out, quality = tmp_path / "extrapolation", tmp_path / "quality"
    (out / "runs").mkdir(parents=True)
    quality.mkdir()
    record = quality_record("distattn_lm_alibi_gbw", "transformer_lm_gbw", 1, 50.0)
    (quality / "distattn_lm_alibi_gbw-seed1.json").write_text(json.dumps(record))

    def write(length, blocks, fingerprint):
        path = out / "runs" / f"distattn_lm_alibi_gbw-seed1-L{length}.json"
        path.write_text(json.dumps(extrapolation_record(1, length, blocks, checkpoint_sha256=fingerprint)))

    write(64, 50.0, "a" * 64)
    write(128, 60.0, "a" * 64)
    assert "50.00" in lm_extrapolation.report(out, quality)
    write(128, 60.0, "b" * 64)
    with pytest.raises(SystemExit, match="distattn_lm_alibi_gbw seed 1: 2 checkpoints"):
        lm_extrapolation.report(out, quality)
    write(128, 60.0, "a" * 64)
    write(64, 48.0, "a" * 64)  # not the 50.0 the quality run recorded
    with pytest.raises(SystemExit, match="distattn_lm_alibi_gbw seed 1: 48.0 at the training length, 50.0 in"):
        lm_extrapolation.report(out, quality)
    assert "48.00" in lm_extrapolation.report(out)  # without quality runs only the fingerprints are checked
    write(64, 50.0, "a" * 64)
    (quality / "distattn_lm_alibi_gbw-seed1.json").write_text(json.dumps({**record, "checkpoint_sha256": "c" * 64}))
    with pytest.raises(SystemExit, match="distattn_lm_alibi_gbw seed 1: another model than the one .* records"):
        lm_extrapolation.report(out, quality)
    (quality / "distattn_lm_alibi_gbw-seed1.json").write_text(json.dumps({**record, "checkpoint_sha256": "a" * 64}))
    assert "50.00" in lm_extrapolation.report(out, quality)
    # a length from before fingerprints were recorded is from a model trained before the one the quality run
    # records, when it records one; with a quality run that records none it cannot be checked
    (out / "runs" / "distattn_lm_alibi_gbw-seed1-L128.json").write_text(json.dumps(extrapolation_record(1, 128, 60.0)))
    with pytest.raises(SystemExit, match="alibi_gbw seed 1: 1 result.* naming no checkpoint, from a model trained"):
        lm_extrapolation.report(out, quality)
    (quality / "distattn_lm_alibi_gbw-seed1.json").write_text(json.dumps(record))
    assert "50.00" in lm_extrapolation.report(out, quality)


def test_a_model_drawing_positions_in_evaluation_is_checked_by_its_fingerprint(tmp_path):
    """Two evaluations of a model that draws its positions in evaluation score two draws (the
    randomized sinusoidal LM, seed 1: 235.08 in its quality run, 235.16 at the training length in
    the extrapolation): there the checkpoint fingerprints both files name decide, not the
    perplexity; a model that does not draw keeps the perplexity check."""
    out, quality = tmp_path / "extrapolation", tmp_path / "quality"
    (out / "runs").mkdir(parents=True)
    quality.mkdir()

    def write(config, quality_ppl, quality_fingerprint, blocks, fingerprint):
        record = quality_record(config, "transformer_lm_gbw", 1, quality_ppl)
        if quality_fingerprint:
            record["checkpoint_sha256"] = quality_fingerprint
        (quality / f"{config}-seed1.json").write_text(json.dumps(record))
        result = extrapolation_record(1, 64, blocks, config=config, checkpoint_sha256=fingerprint)
        (out / "runs" / f"{config}-seed1-L64.json").write_text(json.dumps(result))

    drawing = "distattn_lm_gbw+randomized"
    write(drawing, 235.08, "a" * 64, 235.16, "a" * 64)
    markdown = lm_extrapolation.report(out, quality)
    assert "235.16" in markdown and f"`{drawing}`: positions drawn in evaluation too" in markdown
    write(drawing, 235.08, "c" * 64, 235.16, "a" * 64)
    with pytest.raises(SystemExit, match=r"randomized seed 1: another model than the one .* records"):
        lm_extrapolation.report(out, quality)
    write(drawing, 235.08, None, 235.16, "a" * 64)  # no fingerprint to decide: the perplexities must agree
    with pytest.raises(SystemExit, match=r"randomized seed 1: 235.16 at the training length, 235.08 in"):
        lm_extrapolation.report(out, quality)
    (quality / f"{drawing}-seed1.json").unlink()
    (out / "runs" / f"{drawing}-seed1-L64.json").unlink()
    write("distattn_lm_alibi_gbw", 50.0, "a" * 64, 50.3, "a" * 64)
    with pytest.raises(SystemExit, match=r"alibi_gbw seed 1: 50.3 at the training length, 50.0 in"):
        lm_extrapolation.report(out, quality)


def test_the_configs_said_to_draw_in_evaluation_are_those_whose_models_do(tmp_path):
    """draws_at_evaluation, which lets fingerprints replace the perplexity check, must name every
    config whose model in eval() scores the same tokens twice differently, and no other."""
    import torch

    from .model_helpers import dictionary

    d, configs = dictionary(), lm_grid.lm_configs()
    scale = {**lm_grid.SCALES["tiny"], "layers": lm_grid.SCALES["small"]["layers"]}
    tokens = torch.randint(d.nspecial, len(d), (2, 9), generator=torch.Generator().manual_seed(1))
    drawing = set()
    for name, config in configs.items():
        model, _ = parsed_model(config, scale, d, tmp_path)
        with torch.no_grad():
            if not torch.equal(model.eval()(tokens)[0], model(tokens)[0]):
                drawing.add(name)
    assert drawing == {name for name in configs if lm_grid.draws_at_evaluation(name)}
    assert {name.split("+")[-1] for name in drawing} == {"randomized"} and len(drawing) == 3


def test_extrapolation_report_ratios_against_an_independent_computation(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    values = {(1, 64): (50.0, 48.0), (1, 256): (80.0, 45.0), (2, 64): (54.0, 52.0), (2, 256): (100.0, 43.0)}
    for (seed, n), (blocks, sliding) in values.items():
        record = extrapolation_record(seed, n, blocks, sliding)
        (runs / f"alibi-seed{seed}-L{n}.json").write_text(json.dumps(record), encoding="utf-8")
    markdown = lm_extrapolation.report(tmp_path)
    blocks, sliding = table_cells(markdown, "distattn_lm_alibi_gbw")
    # blocks: means 52 and 90, stds sqrt(8) and sqrt(200), ratio 90/52
    assert blocks[1:] == ["52.00 +- 2.83", "90.00 +- 14.14", f"{90 / 52:.2f}"]
    assert sliding[1:] == ["50.00 +- 2.83", "44.00 +- 1.41", f"{44 / 50:.2f}"]


def test_each_row_that_changes_a_model_is_read_against_that_model(tmp_path):
    """A variant against its preset, a scaling's row against its model (only beyond the training
    length, where it has numbers of its own), a fine-tuned row at its length, a Llama 4 preset against
    the preset it changes; each difference read against the reference's seed std."""
    runs = tmp_path / "runs"
    runs.mkdir()
    rope = {64: (50.0, 52.0, 54.0), 256: (100.0, 102.0, 104.0), 2048: (200.0, 210.0, 220.0)}
    rows = {
        "distattn_lm_rope_gbw": rope,
        "distattn_lm_rope_gbw+p-rope-0.25": {64: (53.0,), 256: (99.0, 99.0, 99.0), 2048: (230.0,)},
        "distattn_lm_rope_gbw+yarn": {256: (100.5, 101.0, 101.5), 2048: (195.0, 205.0, 215.0)},
        "distattn_lm_rope_gbw+yarn-ft": {256: (95.0, 96.0, 97.0)},
        "distattn_lm_llama4_gbw": {64: (51.0, 52.0, 53.0), 2048: (209.0,)},
        "distattn_lm_llama4_gbw+interval-3": {64: (55.0, 56.0, 57.0)},
    }
    for config, values in rows.items():
        for n, ppls in values.items():
            for seed, ppl in enumerate(ppls, 1):
                record = {**extrapolation_record(seed, n, ppl, scale="small"), "config": config}
                (runs / f"{config}-seed{seed}-L{n}.json").write_text(json.dumps(record), encoding="utf-8")
    markdown = lm_extrapolation.report(tmp_path)
    section = markdown.split("## Against the model each row changes", 1)[1]
    assert "| row | against | N = 64 (1x) | N = 256 (4x) | N = 2048 (32x) |" in section
    # rope's seed std: 2 at 64 and 256, 10 at 2048; one standard error of the difference: std * sqrt(1/n1 + 1/n2)
    noise_3_3, noise_1_3 = math.sqrt(2 / 3), math.sqrt(4 / 3)
    assert 1.0 < 2 * noise_3_3 < 3.0 and 5.0 < 10 * noise_3_3 and 1.0 < 2 * noise_1_3 and 1.0 < 10 * noise_1_3 < 20.0
    assert table_cells(section, "distattn_lm_rope_gbw+p-rope-0.25") == [
        ["distattn_lm_rope_gbw+p-rope-0.25", "distattn_lm_rope_gbw", "+1.00 (within noise)",
         "-3.00 (better, beyond noise)", "+20.00 (worse, beyond noise)"]
    ]  # fmt: skip
    # the scaling shows rope's own numbers at 64: nothing of its own to read there
    assert table_cells(section, "distattn_lm_rope_gbw+yarn")[0][2:] == [
        "-",
        "-1.00 (within noise)",
        "-5.00 (within noise)",
    ]
    assert table_cells(section, "distattn_lm_rope_gbw+yarn-ft")[0][2:] == ["-", "-6.00 (better, beyond noise)", "-"]
    assert table_cells(section, "distattn_lm_llama4_gbw")[0][1:] == [
        "distattn_lm_rope_gbw", "+0.00 (within noise)", "-", "-1.00 (within noise)"
    ]  # fmt: skip
    # a variant of a preset that is rope's model at the runs' scale (3 layers, no NoPE layer): against rope
    assert table_cells(section, "distattn_lm_llama4_gbw+interval-3")[0][1:3] == [
        "distattn_lm_rope_gbw", "+4.00 (worse, beyond noise)"
    ]  # fmt: skip
    assert not table_cells(section, "distattn_lm_rope_gbw")  # the model itself changes nothing
    assert (
        "worse, beyond noise: `distattn_lm_llama4_gbw+interval-3` (+4.00 at 1x), `distattn_lm_rope_gbw+p-rope-0.25` "
        "(+20.00 at 32x)" in section
    )
    assert "better, beyond noise: `distattn_lm_rope_gbw+yarn-ft` (-6.00 at 4x);" in section
    # the presets read against another are presets of the grid, as that one is
    presets = {name for name, config in lm_grid.lm_configs().items() if not config.arch}
    assert {*lm_grid.PRESET_REFERENCES, *lm_grid.PRESET_REFERENCES.values()} <= presets


def test_dev_split_starts_at_an_article_title_and_every_lm_preset_is_in_the_grid():
    lines = [" = A = ", " a", " a", " = = Section = = ", " a", " = B = ", " b", " ", " = C = ", " c"]
    train, dev = lm_quality.split_train_dev(lines, fraction=0.3)
    assert (train, dev) == (lines[:8], lines[8:])  # the first article title at or after line 7
    train, dev = lm_quality.split_train_dev([" x"] * 10, fraction=0.2)
    assert (len(train), len(dev)) == (8, 2)  # no title: a line cut

    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    configs = lm_grid.lm_configs()
    presets = {arch for arch, model in ARCH_MODEL_NAME_REGISTRY.items() if model == "distattn_lm"}
    assert presets and presets <= set(configs)
    assert {configs[name].baseline for name in configs} <= set(configs)
    assert configs["distattn_lm_rpr_gbw"].baseline == "transformer_lm_gbw"
    assert configs["distattn_lm"].baseline == "transformer_lm"
    assert "no position embeddings" in configs["distattn_lm_alibi_gbw"].note
    assert "sinusoidal" in configs["distattn_lm_window_gbw"].note


def test_the_reports_print_no_debug_logging(tmp_path):
    """Both harnesses import fairseq, which sets the root logger to DEBUG: matplotlib, imported
    after it to plot, logged its font search and paths into every --report."""
    quality_out, extrapolation_out = tmp_path / "quality", tmp_path / "extrapolation"
    (quality_out / "runs").mkdir(parents=True)
    (extrapolation_out / "runs").mkdir(parents=True)
    record = quality_record("transformer_lm_gbw", "transformer_lm_gbw", 1, 100.0)
    (quality_out / "runs" / "transformer_lm_gbw-seed1.json").write_text(json.dumps(record), encoding="utf-8")
    record = {
        "config": "transformer_lm_gbw",
        "seed": 1,
        "baseline": "transformer_lm_gbw",
        "train_tokens_per_sample": 64,
        "tokens_per_sample": 64,
        "blocks": {"ppl": 100.0},
        "sliding": {"ppl": 98.0},
    }
    (extrapolation_out / "runs" / "transformer_lm_gbw-seed1-L64.json").write_text(json.dumps(record), encoding="utf-8")
    for module, arguments, plot in (
        ("benchmarks.quality.lm", ["--out", str(quality_out)], quality_out / "valid_loss.png"),
        (
            "benchmarks.quality.lm_extrapolation",
            ["--out", str(extrapolation_out), "--quality-out", str(quality_out)],
            extrapolation_out / "ppl_vs_length.png",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", module, "--report", *arguments],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        assert plot.is_file()
        assert "DEBUG" not in done.stderr, (module, done.stderr[:500])


def parsed_model(config, scale, dictionary, tmp_path):
    """``config``'s model at ``scale`` as fairseq-train builds it from the harness's flags, and its args."""
    from fairseq import options
    from fairseq.tasks.language_modeling import LanguageModelingTask

    command = lm_quality.train_args(config, scale, 1, tmp_path, tmp_path / "checkpoints")
    flags = [str(c) for c in command[2:]]  # the tool and the data-bin
    flags[flags.index("--user-dir") + 1] = str(lm_quality.REPO_ROOT / "fairseq_distattn")
    args = options.parse_args_and_arch(options.get_training_parser(), [str(tmp_path), *flags])
    return LanguageModelingTask(args, dictionary).build_model(args), args


def test_every_lm_config_builds_the_same_model_width_and_the_vanilla_presets_equal_their_baselines(tmp_path):
    """The recipe's fairseq-train flags must give fairseq's baselines the model the presets get.
    --arch transformer_lm defaults --decoder-input-dim and --decoder-output-dim to 512 whatever
    --decoder-embed-dim is (the gbw architectures follow --decoder-embed-dim), which once made that
    baseline 512-wide embeddings projected to the model width: a different, larger model."""
    from .model_helpers import dictionary

    # tiny widths, and the small scale's depth: the window preset names layers 0-2
    scale = {**lm_grid.SCALES["tiny"], "layers": lm_grid.SCALES["small"]["layers"]}
    assert scale["dim"] != 512  # else the flags under test would change nothing
    d = dictionary()

    def built(config):
        model, _ = parsed_model(config, scale, d, tmp_path)
        return {name: tuple(p.shape) for name, p in model.named_parameters()}, model

    configs = lm_grid.lm_configs()
    shapes = {}
    for name, config in configs.items():
        shapes[name], model = built(config)
        assert model.decoder.embed_tokens.weight.shape == (len(d), scale["dim"]), name
        assert model.decoder.project_in_dim is None and model.decoder.project_out_dim is None, name
    vanilla_presets = [name for name, config in configs.items() if "vanilla self-attention" in config.note]
    assert vanilla_presets
    for name in vanilla_presets:
        assert shapes[name] == shapes[configs[name].baseline], name


def test_a_config_the_grid_leaves_out_as_another_configs_model_builds_that_model(tmp_path):
    """same_models must name only configurations whose models are equal at the scale's depth:
    the same parameters from the same seed, the same outputs."""
    import torch

    from .model_helpers import dictionary

    assert lm_grid.same_models("small") == {"distattn_lm_llama4_gbw": "distattn_lm_rope_gbw"}
    assert lm_grid.same_models("base") == {}  # 6 layers: Llama 4's period of 4 puts a NoPE layer at 3
    configs, d = lm_grid.lm_configs(), dictionary()
    scale = {**lm_grid.SCALES["tiny"], "layers": lm_grid.SCALES["small"]["layers"]}

    def outputs(name):
        torch.manual_seed(0)
        model, args = parsed_model(configs[name], scale, d, tmp_path)
        model.eval()
        tokens = torch.randint(d.nspecial, len(d), (2, 9), generator=torch.Generator().manual_seed(1))
        return model.state_dict(), model(tokens)[0], args.decoder_self_attention

    rope, llama4 = outputs("distattn_lm_rope_gbw"), outputs("distattn_lm_llama4_gbw")
    assert rope[0].keys() == llama4[0].keys() and all(torch.equal(rope[0][k], llama4[0][k]) for k in rope[0])
    assert torch.equal(rope[1], llama4[1]) and llama4[2] == "rope"
    # the variant of the table's Llama 4 row is not rope's model: its last layer has no rope
    variant = outputs("distattn_lm_llama4_gbw+interval-3")
    assert variant[2] == "rope@0-1,llama4-temperature@2" and not torch.allclose(variant[1], rope[1])


def test_every_rope_scaling_of_the_extrapolation_builds_a_valid_model():
    """The overrides each scaling row evaluates the rope models with are what the plugin
    accepts (linear and ntk refuse the training length, which yarn and llama3 read)."""
    from benchmarks.quality.lm_extrapolation import ROPE_SCALINGS, scaling_overrides
    from fairseq_distattn.functional.rotary import LENGTH_MODES

    from .model_helpers import TINY_LM, language_model

    for scaling in ROPE_SCALINGS:
        overrides = scaling_overrides(scaling, 256, 64)
        assert ("rope_original_length" in overrides) == (scaling in LENGTH_MODES), scaling
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in overrides.items()]
        language_model("distattn_lm", [*TINY_LM, "--decoder-self-attention", "rope", *flags])


def test_lm_finetune_fine_tunes_each_rope_run_with_each_scaling_and_the_report_shows_it(tmp_path):
    """``benchmarks.quality.lm_finetune`` at the tiny size: a rope run fine-tuned with linear,
    yarn, llama3 and (once ``lm_longrope`` searched its factors) longrope by 2 for 2 updates, one
    result file each (skipped when present), and rows of
    their own in the extrapolation report (no values borrowed from the model as trained)."""
    from benchmarks.quality import lm_finetune, lm_longrope

    data = tmp_path / "wikitext-2"
    data.mkdir()
    for name, lines in (("valid.txt", 200), ("test.txt", 40)):
        text = text_lines(lm_grid.SHIPPED_DATA, name)[:lines]
        (data / name).write_text("".join(line + "\n" for line in text), encoding="utf-8")
    quality_out, work, out = tmp_path / "quality", tmp_path / "work", tmp_path / "extrapolation"
    trained = ["--scale", "tiny", "--updates", "3", "--configs", "distattn_lm_rope_gbw", "--seeds", "1"]
    assert lm_quality.main([*trained, "--data", str(data), "--work", str(work), "--out", str(quality_out)]) == 0
    argv = ["--quality-work", str(work), "--scale", "tiny", "--factor", "2", "--updates", "2", "--out", str(out)]
    assert lm_finetune.main(argv) == 0  # longrope skipped: no factors searched yet
    assert not list((out / "runs").glob("*longrope*"))
    search = ["--quality-work", str(work), "--scale", "tiny", "--factors", "2", "--samples", "1", "--out", str(out)]
    assert lm_longrope.main([*search, "--evo-scale", "0.0625"]) == 0
    searched = json.loads((out / "longrope" / "distattn_lm_rope_gbw-seed1-L128.json").read_text())
    # evo_scale 1/16 of the authors' counts: a population of 4, then 2 iterations of 1 mutant and 1 child
    assert searched["evaluations"] == 4 + 2 * 2 and searched["ppl"] <= searched["initial_ppl"]
    assert len(searched["factors"]) == 4 and searched["factors"] == sorted(searched["factors"])  # head dim 8: 4 pairs
    assert lm_finetune.main(argv) == 0
    files = sorted(path.name for path in (out / "runs").glob("*-ft-*.json"))
    assert files == [
        "distattn_lm_rope_gbw+linear-ft-seed1-L128.json",
        "distattn_lm_rope_gbw+llama3-ft-seed1-L128.json",
        "distattn_lm_rope_gbw+longrope-ft-seed1-L128.json",
        "distattn_lm_rope_gbw+yarn-ft-seed1-L128.json",
    ]
    longrope_log = (work / "tiny" / "distattn_lm_rope_gbw-seed1" / "finetune-longrope-x2" / "train.log").read_text()
    assert "--rope-long-factor " + ",".join(repr(f) for f in searched["factors"]) in longrope_log
    for scaling in lm_finetune.SCALINGS:
        record = json.loads((out / "runs" / f"distattn_lm_rope_gbw+{scaling}-ft-seed1-L128.json").read_text())
        assert record["finetune"] == {"scaling": scaling, "factor": 2, "updates": 2, "lr": lm_finetune.FINETUNE_LR}
        assert record["checkpoint_sha256"] != record["finetuned_from_sha256"]
        assert record["blocks"]["ppl"] > 1 and record["sliding"]["ppl"] > 1
        log = (work / "tiny" / "distattn_lm_rope_gbw-seed1" / f"finetune-{scaling}-x2" / "train.log").read_text()
        assert f"--rope-scaling {scaling}" in log and "--finetune-from-model" in log
        assert ("--rope-original-length 64" in log) == (scaling in ("yarn", "llama3", "longrope"))
    stamp = (out / "runs" / files[0]).stat().st_mtime
    assert lm_finetune.main(argv) == 0 and (out / "runs" / files[0]).stat().st_mtime == stamp
    # beside the model as trained, at its training length and at the fine-tuned one
    extrapolation = ["--quality-work", str(work), "--scale", "tiny", "--lengths", "64,128", "--out", str(out)]
    assert (
        lm_extrapolation.main([*extrapolation, "--quality-out", str(quality_out), "--configs", "distattn_lm_rope_gbw"])
        == 0
    )
    markdown = (out / "lm_extrapolation.md").read_text()
    # the model as trained with the searched factors at 128 tokens, its ppl the search's on valid.txt's blocks
    longrope = json.loads((out / "runs" / "distattn_lm_rope_gbw-seed1-longrope-L128.json").read_text())
    assert longrope["model_overrides"]["rope_long_factor"] == ",".join(repr(f) for f in searched["factors"])
    for scaling in lm_finetune.SCALINGS:
        finetuned, as_trained = (table_cells(markdown, f"distattn_lm_rope_gbw+{scaling}{ft}")[0] for ft in ("-ft", ""))
        # at 64 tokens: nothing (the fine-tuned model was not evaluated there; a scaling row borrows the model's)
        assert finetuned[1] == "-" and as_trained[1] != "-" and finetuned[2] not in ("-", as_trained[2])


def test_only_a_scaling_row_reads_another_rows_model():
    """``X+yarn`` evaluates X's model; a preset's variant (``X+per-layer``) and a fine-tuned
    scaling (``X+yarn-ft``) are models of their own, so their fingerprints are not X's."""
    from benchmarks.quality.lm_extrapolation import model_of

    assert model_of("distattn_lm_rope_gbw+yarn") == "distattn_lm_rope_gbw"
    assert model_of("distattn_lm_kerple_gbw+per-layer") == "distattn_lm_kerple_gbw+per-layer"
    assert model_of("distattn_lm_rope_gbw+yarn-ft") == "distattn_lm_rope_gbw+yarn-ft"


def test_a_run_another_process_evaluates_is_skipped(tmp_path, monkeypatch):
    """Each evaluation reads its numbers from the run's shared extrapolation.log: a second process
    on the same run (another shell, a second lane) must leave it to the one holding it."""
    from benchmarks.harness.claims import claimed

    evaluated = []
    monkeypatch.setattr(lm_extrapolation, "evaluate_run", lambda run_dir, *rest: evaluated.append(run_dir.name))
    runs = [tmp_path / "a-seed1", tmp_path / "b-seed1"]
    with claimed(runs[0]) as holder:
        assert holder is None
        lm_extrapolation.evaluate_unclaimed(runs, [64], tmp_path / "out", tmp_path / "quality", {})
    assert evaluated == ["b-seed1"]
    lm_extrapolation.evaluate_unclaimed(runs, [64], tmp_path / "out", tmp_path / "quality", {})
    assert evaluated == ["b-seed1", "a-seed1", "b-seed1"]


def test_an_extrapolation_length_that_scores_fewer_tokens_than_the_first_is_refused():
    """fairseq-eval-lm drops samples longer than the model's max positions without an error:
    a length whose modes score other token counts than the first length did is refused."""
    same = {"blocks": {"tokens": 100}, "sliding": {"tokens": 100}}
    lm_extrapolation.check_every_token_scored("run at 256", same, reference=100)
    with pytest.raises(RuntimeError, match="skipped samples longer than the model's max positions"):
        lm_extrapolation.check_every_token_scored("run at 512", same, reference=120)
    with pytest.raises(RuntimeError, match=r"run at 512: scored .*'sliding': 90"):
        lm_extrapolation.check_every_token_scored(
            "run at 512", {"blocks": {"tokens": 100}, "sliding": {"tokens": 90}}, reference=100
        )
