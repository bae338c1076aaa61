"""The quality and extrapolation harnesses end to end at a tiny size: it checks that the harness
works and its outputs are well formed, not what the models score."""

from __future__ import annotations

import json
import re

import pytest

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import SHARED_DATA, read_lines, write_lines
except ImportError:  # rootdir-relative import mode without the package
    from conftest import SHARED_DATA, read_lines, write_lines

from benchmarks.harness import training
from benchmarks.harness.runs import hypotheses_file, load_lines
from benchmarks.quality import mt as quality
from benchmarks.quality import mt_grid, mt_report, paper_tables
from fairseq_distattn.tools import translation_scoring

SPLITS = ("train", "val", "test_2016_flickr")


def test_quality_and_extrapolation_harnesses_write_one_json_per_run_skip_done_runs_and_report(real_text, tmp_path):
    data = tmp_path / "multi30k"
    names = {"train": "train", "val": "valid", "test_2016_flickr": "test"}
    for split in SPLITS:
        for lang in ("en", "de"):
            write_lines(data / f"{split}.{lang}", read_lines(real_text[f"{names[split]}.{lang}"], limit=120))
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [
        "--scale",
        "tiny",
        "--updates",
        "5",
        "--configs",
        "vanilla,window",
        "--seeds",
        "3",
        "--data",
        str(data),
        "--work",
        str(work),
        "--out",
        str(out),
        "--jobs",
        "1",
    ]
    assert quality.main(argv) == 0

    records = {path.stem: json.loads(path.read_text()) for path in (out / "runs").glob("*.json")}
    assert set(records) == {"vanilla-seed3", "window-seed3"}
    for name, record in records.items():
        assert record["config"] == name.rsplit("-seed", 1)[0] and record["seed"] == 3 and record["updates"] == 5
        assert record["test_sentences"] == 120
        assert 0 <= record["sacrebleu"] <= 100 and record["sacrebleu_signature"].startswith("nrefs:1")
        assert record["valid_ppl_averaged"] > 1
        assert [p["updates"] for p in record["valid_curve"]] == [1, 2, 3, 4, 5]
        assert record["git_revision"] and record["machine"]
        # its detokenised test translations, kept beside the run file: sacreBLEU of them is the record's
        kept = load_lines(hypotheses_file(out / "runs" / f"{name}.json"))
        references = mt_grid.raw_references(data)
        assert len(kept) == len(references) == 120
        assert round(translation_scoring.detok_bleu(kept, references)[0].score, 2) == round(record["sacrebleu"], 2)
    assert records["vanilla-seed3"]["mechanism_parameters"] == {}
    moved = records["window-seed3"]["mechanism_parameters"]
    assert (
        "cross extra_query_proj.left_query.weight" in moved and "decoder self extra_key_proj.right_key.weight" in moved
    )
    assert all(entry["relative_change"] > 0 for entry in moved.values())
    assert records["vanilla-seed3"]["train_args"] == ["--arch", "transformer_iwslt_de_en"]
    assert "--cross-attention" in records["window-seed3"]["train_args"]
    assert (work / "tiny" / "window-seed3" / "averaged.pt").is_file()
    assert not (work / "tiny" / "window-seed3" / "checkpoints").exists()

    table = (out / "quality.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| window | 1 (3) |")]
    assert len(rows) == 1
    assert (out / "valid_loss.png").stat().st_size > 1000
    moved_rows = [line for line in table.splitlines() if line.startswith("| window | 1 |")]
    assert len(moved_rows) == 1 and "extra_" in moved_rows[0]

    # a second invocation finds both runs done: nothing is trained again
    before = {path: path.stat().st_mtime_ns for path in (out / "runs").glob("*.json")}
    assert quality.main(argv) == 0
    assert {path: path.stat().st_mtime_ns for path in (out / "runs").glob("*.json")} == before
    # --retrain trains a done run again, and only the runs asked for
    assert quality.main([*argv, "--configs", "window", "--retrain"]) == 0
    after = {path: path.stat().st_mtime_ns for path in (out / "runs").glob("*.json")}
    assert [path.stem for path in after if after[path] != before[path]] == ["window-seed3"]
    assert json.loads((out / "runs" / "window-seed3.json").read_text())["updates"] == 5

    # an ablation runs by name under --grid ablations, with the same recipe, and gets its own table
    assert quality.main([*argv, "--grid", "ablations", "--configs", "da-map-clip"]) == 0  # the last --configs wins
    clip = json.loads((out / "runs" / "da-map-clip-seed3.json").read_text())
    mapping = clip["train_args"].index("--da-mapping")
    assert clip["train_args"][mapping + 1] == "clip" and clip["updates"] == 5
    assert 0 <= clip["tokenized_bleu_compound_split"] <= 100 and clip["valid_ppl_averaged"] > 1
    assert "encoder self mechanism.distance_weight" in clip["mechanism_parameters"]
    table, ablations = (out / "quality.md").read_text().split("## The papers' ablations")
    ablations = ablations.split("## Did the mechanisms' parameters move?")[0]
    assert "| da-map-clip |" not in table
    assert [line.split(" | ")[3] for line in ablations.splitlines() if line.startswith("| da-map-clip |")] == ["da"]

    # length extrapolation of the same models: one JSON per (run, factor), table and plot
    from benchmarks.quality import mt_extrapolation as extrapolation

    extra = tmp_path / "extrapolation"
    assert (
        extrapolation.main(["--quality-work", str(work), "--scale", "tiny", "--factors", "1,4", "--out", str(extra)])
        == 0
    )
    records = {path.stem: json.loads(path.read_text()) for path in (extra / "runs").glob("*.json")}
    assert set(records) == {f"{run}-x{factor}" for run in ("vanilla-seed3", "window-seed3") for factor in (1, 4)}
    single, grouped = records["window-seed3-x1"], records["window-seed3-x4"]
    assert single["sentences"] == 120 and grouped["sentences"] == 30
    assert grouped["mean_source_bpe_tokens"] > 3 * single["mean_source_bpe_tokens"]
    assert sum(bucket["sentences"] for bucket in grouped["per_source_length"].values()) == 30
    rows = [line for line in (extra / "extrapolation.md").read_text().splitlines() if line.startswith("| window |")]
    assert len(rows) == 2 and rows[0].count("|") == 1 + 2 + 1 + 1  # name, x1, x4, x4/x1
    assert (extra / "bleu_vs_length.png").stat().st_size > 1000
    # pooling the buckets of one factor alone reproduces that factor's per-bucket BLEU
    pooled = extrapolation.pooled_bucket_bleu([grouped])
    assert {bucket: round(bleu, 2) for bucket, bleu in pooled.items()} == {
        bucket: entry["tokenized_bleu_compound_split"] for bucket, entry in grouped["per_source_length"].items()
    }
    assert "## BLEU by source length" in (extra / "extrapolation.md").read_text()

    # every factor names the averaged model it translated with, the one its quality run recorded
    quality_records = {name: json.loads((out / "runs" / f"{name}.json").read_text()) for name in ("window-seed3",)}
    fingerprint = quality_records["window-seed3"]["checkpoint_sha256"]
    assert len(fingerprint) == 64 and single["checkpoint_sha256"] == grouped["checkpoint_sha256"] == fingerprint
    # a factor from another model (a run trained again after it was evaluated) is evaluated again, and only it
    stale = extra / "runs" / "window-seed3-x4.json"
    stale.write_text(json.dumps({**grouped, "checkpoint_sha256": "0" * 64, "sentences": -1}))
    others = {p: p.stat().st_mtime_ns for p in (extra / "runs").glob("*.json") if p != stale}
    argv = ["--quality-work", str(work), "--scale", "tiny", "--factors", "1,4", "--out", str(extra)]
    assert extrapolation.main([*argv, "--quality-out", str(out)]) == 0
    again = json.loads(stale.read_text())
    assert again["checkpoint_sha256"] == fingerprint and again["sentences"] == 30
    assert {p: p.stat().st_mtime_ns for p in others} == others
    # so is one from before fingerprints were recorded, when the quality run records one (a model trained again)
    stale.write_text(json.dumps({**{k: v for k, v in again.items() if k != "checkpoint_sha256"}, "sentences": -1}))
    assert extrapolation.main([*argv, "--quality-out", str(out)]) == 0
    assert json.loads(stale.read_text())["checkpoint_sha256"] == fingerprint
    assert {p: p.stat().st_mtime_ns for p in others} == others


def extrapolation_record(config, seed, factor, bleu, **extra):
    """A run file of benchmarks.quality.mt_extrapolation, for (config, seed, factor, BLEU)."""
    return {
        "config": config,
        "seed": seed,
        "factor": factor,
        "scale": "tiny",
        "sentences": 10,
        "mean_source_bpe_tokens": 16.0 * factor,
        "max_source_bpe_tokens": 20 * factor,
        "tokenized_bleu_compound_split": bleu,
        "sacrebleu": bleu,
        "per_source_length": {},
        **extra,
    }


def test_extrapolation_report_refuses_a_run_evaluated_from_two_models(tmp_path):
    """One run's row must come from one model: its factors' fingerprints agree, and
    they name the averaged model its quality run file records."""
    from benchmarks.quality import mt_extrapolation as extrapolation

    out, quality = tmp_path / "extrapolation", tmp_path / "quality"
    (out / "runs").mkdir(parents=True)
    write_run_records(quality, (("window", 1, 30.0),))
    run_file = quality / "runs" / "window-seed1.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "checkpoint_sha256": "a" * 64}))

    def write(factor, bleu, fingerprint):
        record = extrapolation_record("window", 1, factor, bleu, checkpoint_sha256=fingerprint)
        (out / "runs" / f"window-seed1-x{factor}.json").write_text(json.dumps(record))

    write(1, 30.0, "a" * 64)
    write(2, 24.0, "a" * 64)
    assert "| window | 30.00 | 24.00 | 0.80 |" in extrapolation.report(out, quality / "runs")
    write(2, 24.0, "b" * 64)
    with pytest.raises(SystemExit, match="window seed 1: 2 checkpoints"):
        extrapolation.report(out, quality / "runs")
    write(1, 30.0, "b" * 64)  # one model, but not the run's
    with pytest.raises(SystemExit, match="window seed 1: another model than the one .* records"):
        extrapolation.report(out, quality / "runs")
    assert "| window | 30.00 | 24.00 | 0.80 |" in extrapolation.report(out)  # without quality runs: fingerprints only
    # files from before fingerprints were recorded are reported as they are, unless the quality run
    # records one: then they are from a model trained before it (the run was trained again)
    write(1, 30.0, "a" * 64)
    (out / "runs" / "window-seed1-x2.json").write_text(json.dumps(extrapolation_record("window", 1, 2, 21.0)))
    with pytest.raises(SystemExit, match="window seed 1: 1 result.* naming no checkpoint, from a model trained before"):
        extrapolation.report(out, quality / "runs")
    (out / "runs" / "window-seed1-x1.json").write_text(json.dumps(extrapolation_record("window", 1, 1, 30.0)))
    with pytest.raises(SystemExit, match="window seed 1: 2 result.* naming no checkpoint"):
        extrapolation.report(out, quality / "runs")
    without = {key: value for key, value in json.loads(run_file.read_text()).items() if key != "checkpoint_sha256"}
    run_file.write_text(json.dumps(without))
    assert "| window | 30.00 | 21.00 | 0.70 |" in extrapolation.report(out, quality / "runs")


def write_run_records(out, runs, notes=None):
    """Run files as the harness writes them, for (config, seed, BLEU) triples."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    notes = {
        **{name: config.note for name, config in {**mt_grid.default_configs(), **mt_grid.ablation_configs(3)}.items()},
        **(notes or {}),
    }
    for config, seed, bleu in runs:
        record = {
            "config": config,
            "seed": seed,
            "note": notes[config],
            "updates": 10,
            "scale": "tiny",
            "machine": "m",
            "test_sentences": 5,
            "tokenized_bleu_compound_split": bleu,
            "sacrebleu": bleu,
            "valid_ppl_averaged": 9.0,
            "valid_curve": [{"updates": 10, "loss": 3.0, "nll_loss": 2.0, "ppl": 4.0}],
        }
        (out / "runs" / f"{config}-seed{seed}.json").write_text(json.dumps(record), encoding="utf-8")


def test_a_note_with_a_pipe_stays_in_its_table_cell(tmp_path):
    """Notes that say -|i-j| (the distance-mask runs' do): unescaped, the row gains two columns."""
    note = "Im & Cho: -|i-j| on the logits, positions kept"
    runs = (("vanilla", 1, 30.0), ("distance-mask", 1, 31.0), ("distance-mask", 2, 32.0))
    write_run_records(tmp_path, runs, {"distance-mask": note})
    rows = [line for line in mt_report.report(tmp_path).splitlines() if line.startswith("| distance-mask ")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", rows[0])[1:-1]]
    assert cells[:2] == ["distance-mask", "2 (1,2)"] and cells[2] == "31.50 +- 0.71" and cells[3] == "+1.50"
    assert len(cells) == 8 and cells[-1] == note.replace("|", "\\|")


def test_the_report_names_the_grid_configurations_without_a_run_or_with_one_seed(tmp_path):
    """A reader must be able to tell a configuration not run yet from one left out of the grid."""
    names = list(mt_grid.default_configs())
    write_run_records(tmp_path, [("vanilla", 1, 30.0), ("vanilla", 2, 31.0), ("rpr", 1, 32.0)])
    lines = mt_report.report(tmp_path).splitlines()
    not_run = [line for line in lines if line.startswith("Not run yet: ")]
    assert len(not_run) == 1
    listed = [item.split(" (", 1)[0] for item in not_run[0].split(": ", 1)[1].split("; ")]
    assert listed == [name for name in names if name not in ("vanilla", "rpr")]
    assert f"t5-bias ({mt_grid.default_configs()['t5-bias'].note})" in not_run[0]
    assert "One seed so far (no spread yet): rpr." in lines

    write_run_records(tmp_path, [(name, seed, 30.0) for name in names for seed in (1, 2)])
    text = mt_report.report(tmp_path)
    assert "Not run yet" not in text and "One seed so far" not in text
    assert "ablations" not in text and not (tmp_path / "valid_loss_ablations.png").exists()


def table_cells(text, name):
    rows = [line for line in text.splitlines() if line.startswith(f"| {name} ")]
    assert len(rows) == 1, (name, rows)
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", rows[0])[1:-1]]


def test_ablation_runs_have_their_own_table_each_read_against_its_papers_choice(tmp_path):
    """An ablation answers "better or worse than the paper's choice?": its delta is against
    the default grid's run of that choice (da, qvi, window), not only against vanilla."""
    write_run_records(
        tmp_path,
        [
            ("vanilla", 1, 30.0),
            ("vanilla", 2, 32.0),
            ("da", 1, 32.0),
            ("da-map-clip", 1, 32.5),
            ("da-map-clip", 2, 33.5),
            ("qvi-summation", 1, 30.0),
        ],
    )
    main_table, ablation_section = mt_report.report(tmp_path).split("## The papers' ablations (`--grid ablations`)")
    assert "| da-map-clip " not in main_table and "| qvi-summation " not in main_table
    assert table_cells(main_table, "da")[:4] == ["da", "1 (1)", "32.00", "+1.00"]
    clip = table_cells(ablation_section, "da-map-clip")
    # +1.00 against one da seed: within 1.41 * sqrt(1/2 + 1/1), above it (the paper: below)
    assert clip[:7] == [
        "da-map-clip",
        "2 (1,2)",
        "33.00 +- 0.71",
        "da",
        "+1.00",
        "within seed noise (opposite sign)",
        "+2.00",
    ]
    assert clip[-1] == mt_grid.ablation_configs(3)["da-map-clip"].note
    # its reference has no run yet: no delta to claim
    assert table_cells(ablation_section, "qvi-summation")[:7] == [
        "qvi-summation",
        "1 (1)",
        "30.00",
        "qvi",
        "-",
        "-",
        "-1.00",
    ]
    not_run = [line for line in ablation_section.splitlines() if line.startswith("Not run yet")]
    assert len(not_run) == 1 and not_run[0].startswith("Not run yet (24 of 26): da-map-sigmoid, ")
    assert "da-map-clip" not in not_run[0] and "window-enc-aw-seg-dec-mw-partial" in not_run[0]
    # one plot per grid
    assert (tmp_path / "valid_loss.png").is_file() and (tmp_path / "valid_loss_ablations.png").is_file()


def test_each_ablation_is_read_against_its_papers_finding_that_its_own_choice_is_better(tmp_path):
    """Every paper finds its choice better than each ablation of it: a delta vs it below
    minus one standard error of the difference agrees, one above it disagrees."""
    write_run_records(
        tmp_path,
        [
            ("vanilla", 1, 30.0),
            ("vanilla", 2, 32.0),  # std 1.41; one seed against two: noise 1.41 * sqrt(1.5) = 1.73
            ("da", 1, 34.0),
            ("da", 2, 34.0),
            ("da-map-linear", 1, 32.0),
            ("da-map-exponent", 1, 36.0),
            ("da-map-sigmoid", 1, 33.0),
        ],
    )
    section = mt_report.report(tmp_path).split("## The papers' ablations (`--grid ablations`)")[1]
    readings = {
        name: table_cells(section, name)[4:6] for name in ("da-map-linear", "da-map-exponent", "da-map-sigmoid")
    }
    assert readings == {
        "da-map-linear": ["-2.00", "as the paper"],
        "da-map-exponent": ["+2.00", "opposite to the paper"],
        "da-map-sigmoid": ["-1.00", "within seed noise (same sign)"],
    }
    assert (
        "Readings against the paper's choice, per paper: da: 1 as the paper, 1 opposite to the paper, "
        "1 within seed noise (same sign)." in section
    )


def test_an_ablation_within_one_vanilla_std_of_its_reference_is_due_a_second_seed(tmp_path):
    """The issue's rule for the ablation grid's second seeds: one seed that seed noise alone
    could put on either side of its reference is listed, and --undecided runs exactly those."""
    write_run_records(
        tmp_path,
        [
            ("vanilla", 1, 30.0),
            ("vanilla", 2, 32.0),  # std 1.41
            ("da", 1, 33.0),
            ("da", 2, 35.0),  # reference mean 34
            ("da-map-clip", 1, 33.0),  # -1.00: within
            ("da-map-linear", 1, 35.5),  # +1.50: outside
            ("da-map-sigmoid", 1, 32.0),  # -2.00: outside
            ("da-adjust-late-add", 1, 35.4),  # +1.40: within
            ("da-adjust-early-add", 1, 34.0),
            ("da-adjust-early-add", 2, 34.0),  # two seeds: decided
            ("qvi-summation", 1, 30.0),  # no qvi run to read it against
        ],
    )
    text = mt_report.report(tmp_path)
    due = [line for line in text.splitlines() if line.startswith("One seed within one vanilla std")]
    assert len(due) == 1 and due[0].startswith("One seed within one vanilla std (1.41 BLEU over 2 seeds) ")
    assert due[0].endswith(
        "(2; `python -m benchmarks.quality.mt --grid ablations --undecided --seeds 2`): "
        "da-map-clip, da-adjust-late-add."
    )
    argv = ["--grid", "ablations", "--undecided", "--seeds", "2", "--scale", "tiny", "--updates", "10"]
    args = quality.parse_args([*argv, "--out", str(tmp_path)])
    assert args.config_names == ["da-map-clip", "da-adjust-late-add"]
    assert quality.parse_args(
        [*argv, "--out", str(tmp_path), "--configs", "da-map-linear,da-map-clip"]
    ).config_names == ["da-map-clip"]
    # vanilla with one seed has no spread: nothing is due yet
    (tmp_path / "runs" / "vanilla-seed2.json").unlink()
    assert "One seed within one vanilla std" not in mt_report.report(tmp_path)
    assert quality.parse_args([*argv, "--out", str(tmp_path)]).config_names == []


def paper_section(text):
    title = "## Nguyen et al. 2020's ablation tables, here and in the paper"
    assert text.count(title) == 1
    return text.split(title)[1].split("\n## ")[0]


def test_the_window_ablations_are_laid_out_as_the_papers_tables_and_each_ordering_is_read(tmp_path):
    """Tables 2 and 3 of the differentiable-window paper with the runs here beside the paper's
    BLEU, and each ordering the paper draws read as its direction, the opposite one, or
    within seed noise (vanilla's std times sqrt(1/n1 + 1/n2))."""
    write_run_records(
        tmp_path,
        [
            ("vanilla", 1, 30.0),
            ("vanilla", 2, 32.0),  # std 1.41
            ("window-aw-enc-full", 1, 33.0),
            ("window-aw-enc-full", 2, 35.0),
            ("window-mw-enc-full", 1, 31.0),
            ("window-mw-enc-full", 2, 31.0),  # AW - MW = +3.00 > 1.41: the paper's +0.52 direction
            ("window-aw-enc-partial", 1, 33.0),
            ("window-mw-enc-partial", 1, 32.5),  # +0.50: noise, the paper's sign (+0.50)
            ("window-aw-dec-full", 1, 32.8),
            ("window-mw-dec-full", 1, 31.0),  # +1.80 > 1.41 but < 1.41 * sqrt(2): noise with one seed each
            ("window-aw-cross-full", 1, 30.0),
            ("window-mw-cross-full", 1, 33.0),  # -3.00 > 1.41 * sqrt(2): against the paper's +0.20
            ("window-cross-aw-seg-partial", 1, 30.0),  # its token-based partner has no run
        ],
    )
    section = paper_section(mt_report.report(tmp_path))
    assert "here: Full = all 3 layers, Partial = layer 0)" in section
    expected = [
        "| Transformer | - | 31.00 +- 1.41 (2) | 27.46 | - | - |",
        "| AW | Encoder | 34.00 +- 1.41 (2) | 27.77 | 33.00 (1) | 27.90 |",
        "| MW | Decoder | 31.00 (1) | 27.88 | - | 28.04 |",
        "| Cr(AW) | - | 27.97 | 30.00 (1) | 28.13 |",
        "| Enc(AW)-Dec(MW) | - | 28.11 | - | 27.91 |",
        "| AW - MW, Encoder, Full | +0.52 | +3.00 | 2, 2 | as the paper |",
        "| AW - MW, Encoder, Partial | +0.50 | +0.50 | 1, 1 | within seed noise (same sign) |",
        "| AW - MW, Decoder, Full | -0.15 | +1.80 | 1, 1 | within seed noise (opposite sign) |",
        "| AW - MW, Cross, Full | +0.20 | -3.00 | 1, 1 | opposite to the paper |",
        "| Partial - Full, AW Encoder | +0.13 | -1.00 | 1, 2 | within seed noise (opposite sign) |",
        "| Segment - Token, Cr(AW) | +0.16 | - | 1, 0 | - |",
    ]
    assert [row for row in expected if row not in section] == []
    # every comparison the paper draws has one row
    rows = [line for line in section.splitlines() if line.startswith(("| AW - MW", "| Partial - Full", "| Segment"))]
    assert len(rows) == len(paper_tables.COMPARISONS) == 14


def test_no_paper_table_without_a_window_ablation_and_no_reading_without_vanilla_seeds(tmp_path):
    write_run_records(tmp_path, [("vanilla", 1, 30.0), ("vanilla", 2, 32.0), ("da-map-clip", 1, 31.0)])
    assert "ablation tables, here and in the paper" not in mt_report.report(tmp_path)
    write_run_records(tmp_path, [("window-aw-enc-full", 1, 33.0), ("window-mw-enc-full", 1, 32.0)])
    (tmp_path / "runs" / "vanilla-seed2.json").unlink()
    section = paper_section(mt_report.report(tmp_path))
    assert "| AW - MW, Encoder, Full | +0.52 | +1.00 | 1, 1 | - |" in section


def test_the_paper_tables_name_every_window_ablation_and_only_harness_configurations():
    named = paper_tables.configs()
    window = [name for name in mt_grid.ablation_configs(3) if name.startswith("window-")]
    assert sorted(set(named) - {"vanilla"}) == sorted(window)
    assert set(named) <= {*mt_grid.default_configs(), *mt_grid.ablation_configs(3)}
    assert paper_tables.METRIC == mt_report.ABLATION_METRIC


PAPER_TEXT = SHARED_DATA.parent / "papers" / "differentiable-window-nguyen2020.txt"


@pytest.mark.skipif(not PAPER_TEXT.is_file(), reason="the seed papers are in ../shared/papers, not in a user's clone")
def test_the_paper_numbers_are_those_of_the_papers_tables():
    """Each row of both tables, numbers as printed in the paper's text (a typo in a
    constant would invert an ordering the report reads)."""
    rows = {}
    for line in PAPER_TEXT.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 1:
            rows.setdefault(tuple(cells), None)
    for table in paper_tables.TABLES:
        for labels, cells in table.rows:
            printed = [f"{cell.paper_bleu:.2f}" if cell else "-" for cell in cells]
            assert (*labels, *printed) in rows, (table.title, labels, printed)


def test_training_wall_time_sums_the_segments_of_a_resumed_run():
    """Each fairseq-train segment's last wall value counts; fairseq 0.12 prints wall=0 all
    through a segment resumed from a checkpoint (a transformer-xl run recorded 183 s of
    about 2000 that way), and such a segment counts its log's time span instead."""
    log = "\n".join(
        [
            "$ fairseq-train data-bin --max-update 20",
            "2026-11-26 10:44:19 | INFO | train_inner | epoch 001:     10 / 20 loss=9.1, train_wall=3, wall=4",
            "2026-11-26 10:44:22 | INFO | train | epoch 001 | loss 9 | train_wall 5 | wall 7.5",
            "$ fairseq-train data-bin --max-update 20",
            "2026-11-26 11:52:30 | INFO | fairseq_cli.train | loaded checkpoint checkpoint_last.pt",
            "2026-11-26 11:54:01 | INFO | train_inner | epoch 002:     15 / 20 loss=8.1, train_wall=2, wall=0",
            "2026-11-26 12:23:43 | INFO | train | epoch 002 | loss 8 | train_wall 4 | wall 0",
            "$ fairseq-generate data-bin --beam 5 | wall 99",
        ]
    )
    assert training.training_wall_seconds(log) == 7.5 + 31 * 60 + 13
    # a segment whose meter ran, resumed or not, keeps its own value
    assert training.training_wall_seconds(log.replace("wall=0", "wall=6").replace("wall 0", "wall 8")) == 15.5
    assert training.training_wall_seconds("$ fairseq-train data-bin\ncrashed before any log line") is None


# validation lines as fairseq 0.12 logs them: translation's label smoothing logs nll_loss, a
# language model's cross entropy does not; best_loss must not be read as the loss
MT_VALIDATION = (
    "2026-11-26 10:44:22 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.362 | nll_loss 8.797 | "
    "ppl 444.84 | wps 18530 | wpb 1789.5 | bsz 74 | num_updates {updates} | best_loss {best}"
)
LM_VALIDATION = (
    "2026-12-04 23:18:50 | INFO | valid | epoch 005 | valid on 'valid' subset | loss {loss} | ppl 5.89 | "
    "wps 20230.6 | wpb 1292 | bsz 66.7 | num_updates {updates}"
)


def test_validation_curve_reads_each_criterions_fields_once_per_update():
    """One point per validation, by update; the fields a criterion logs and no others; a
    validation logged again by a resumed run counts as last logged; a line whose loss is
    not a number (an inf or nan loss) is not a point."""
    mt_log = "\n".join(
        [
            MT_VALIDATION.format(updates=400, best=9.0),
            "2026-11-26 10:44:23 | INFO | train | epoch 001 | loss 9 | train_wall 5 | wall 7.5",
            MT_VALIDATION.format(updates=200, best=9.362),
        ]
    )
    assert training.validation_curve(mt_log) == [
        {"updates": 200, "loss": 9.362, "nll_loss": 8.797, "ppl": 444.84},
        {"updates": 400, "loss": 9.362, "nll_loss": 8.797, "ppl": 444.84},
    ]
    lm_log = "\n".join(
        [
            LM_VALIDATION.format(loss=2.558, updates=200),
            LM_VALIDATION.format(loss="inf", updates=400),
            "$ fairseq-train data-bin --max-update 600",
            LM_VALIDATION.format(loss=2.5, updates=200),
            LM_VALIDATION.format(loss=2.1, updates=600),
        ]
    )
    curve = training.validation_curve(lm_log)
    assert curve == [{"updates": 200, "loss": 2.5, "ppl": 5.89}, {"updates": 600, "loss": 2.1, "ppl": 5.89}]
    assert training.best_validation(curve) == {"best_valid_updates": 600, "best_valid_loss": 2.1}
    assert training.best_validation([]) == {"best_valid_updates": None, "best_valid_loss": None}
    assert training.validation_curve("no validation yet") == []


def test_train_once_does_not_resume_a_finished_training(tmp_path):
    """A log whose last fairseq-train segment finished, with its checkpoints, is not trained
    again (fairseq would train one update past --max-update); an interrupted segment, none,
    or a finished one whose checkpoints are gone (a run evaluated and cleaned up) is."""
    import sys

    train_log, save_dir = tmp_path / "train.log", tmp_path / "checkpoints"
    fails = [sys.executable, "-c", "raise SystemExit(1)", "fairseq-train"]
    with pytest.raises(RuntimeError):
        training.train_once(fails, train_log, {}, save_dir)  # no finished segment yet: it runs
    finishes = [sys.executable, "-c", "print('2026 | INFO | fairseq_cli.train | done training in 3.0 seconds')"]
    training.train_once([*finishes, "fairseq-train"], train_log, {}, save_dir)
    with pytest.raises(RuntimeError):
        training.train_once(fails, train_log, {}, save_dir)  # finished, but no checkpoints left: it runs
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(b"")
    training.train_once([*finishes, "fairseq-train"], train_log, {}, save_dir)
    training.train_once(fails, train_log, {}, save_dir)  # finished, checkpoints there: not run
    with open(train_log, "a", encoding="utf-8") as log_file:
        log_file.write("$ fairseq-train --seed 1\nepoch 001 | loss 3.2\n")  # a later attempt, cut off
    with pytest.raises(RuntimeError):
        training.train_once(fails, train_log, {}, save_dir)


def test_train_keeping_best_keeps_the_best_checkpoint_alone_and_trains_once(tmp_path):
    """The best checkpoint moves to the run dir and the save dir goes; a run dir that holds it
    already is not trained again (the command would fail if it ran)."""
    import sys

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writes = (
        "import pathlib, sys; d = pathlib.Path(sys.argv[1]); d.mkdir(); "
        "[(d / name).write_text(name) for name in ('checkpoint_best.pt', 'checkpoint_last.pt', 'checkpoint_1_200.pt')]"
    )
    command = [sys.executable, "-c", writes, run_dir / "checkpoints"]
    best = training.train_keeping_best(command, run_dir, {})
    assert best == run_dir / "checkpoint_best.pt" and best.read_text() == "checkpoint_best.pt"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_best.pt", "train.log"]
    assert training.train_keeping_best([sys.executable, "-c", "raise SystemExit(1)"], run_dir, {}) == best
