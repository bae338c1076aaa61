"""The one-table summary per method (``benchmarks.quality.methods``): its rows
derive from the registry, and its cells from the other harnesses' run files."""

import json

from benchmarks.quality import methods
from benchmarks.quality.lm_grid import lm_configs
from benchmarks.quality.mt_grid import default_configs
from fairseq_distattn.registry import registered


def test_every_registered_mechanism_has_a_row_with_a_configuration():
    rows = methods.method_rows(list(default_configs()), list(lm_configs()))
    names = [name for name, _, mt, lm in rows]
    for info in registered():
        family = [name for name in names if info.name == name or info.name.startswith(name + "-")]
        assert family, f"{info.name} has neither a translation configuration nor an LM preset to compare"
    assert all(mt or lm for _, _, mt, lm in rows)
    assert names[-1] == "nope"


def write(path, records):
    path.mkdir(parents=True)
    for index, record in enumerate(records):
        (path / f"{record['config']}-{index}.json").write_text(json.dumps(record))


def test_cells_are_mean_std_and_seed_count_with_deltas(tmp_path):
    results = tmp_path / "results"
    write(
        results / "quality" / "runs",
        [
            {"config": "vanilla", methods.MT_METRIC: 30.0},
            {"config": "vanilla", methods.MT_METRIC: 32.0},
            {"config": "alibi", methods.MT_METRIC: 33.0},
        ],
    )
    write(
        results / "lm_quality" / "runs",
        [{"config": "transformer_lm_gbw", "test_ppl": 200.0}, {"config": "distattn_lm_alibi_gbw", "test_ppl": 190.0}],
    )
    write(
        results / "lm_extrapolation" / "runs",
        [
            {
                "config": "distattn_lm_alibi_gbw",
                "train_tokens_per_sample": 64,
                "tokens_per_sample": 512,
                "blocks": {"ppl": 180.0},
            },
            {
                "config": "distattn_lm_alibi_gbw",
                "train_tokens_per_sample": 64,
                "tokens_per_sample": 2048,
                "blocks": {"ppl": 185.5},
            },
        ],
    )
    markdown = methods.report(tmp_path / "out", results)
    baseline = next(line for line in markdown.splitlines() if line.startswith("| baseline"))
    assert "| 31.00 +- 1.41 (2) |" in baseline and "| 200.00 (1) |" in baseline
    alibi = next(line for line in markdown.splitlines() if line.startswith("| `alibi`"))
    cells = [cell.strip() for cell in alibi.strip("|").split("|")]
    # BLEU: +2.00 against vanilla's std 1.41 * sqrt(1/1 + 1/2) = 1.73; the LM baseline's one seed has no spread
    translation = ["alibi", "33.00 (1)", "+2.00", "better, beyond noise", "-"]
    lm = ["190.00 (1)", "-10.00", "-", "180.00 (1)", "-", "-", "185.50 (1)", "-", "-"]
    # no length-generalization runs nor speed report in these results: dashes
    assert cells[2:] == [*translation, *lm, "-", "-", "-", "-"]
    kerple = next(line for line in markdown.splitlines() if line.startswith("| `kerple`"))
    assert kerple.count("| - ") >= 12  # not run: dashes, no numbers
    # window-mw has a translation configuration but no LM preset: its LM cell names the family's row
    window_mw = next(line for line in markdown.splitlines() if line.startswith("| `window-mw`"))
    lm_cell = [cell.strip() for cell in window_mw.strip("|").split("|")][7]
    assert lm_cell == "in `window`'s row: the family's one LM preset, `distattn_lm_window_gbw`"
    assert (tmp_path / "out" / "methods.md").read_text() == markdown


def test_a_row_without_an_lm_preset_names_its_familys_row_or_says_nothing():
    presets = {"distattn_lm_window_gbw", "distattn_lm_rpr_gbw"}
    assert methods.shared_preset_note("window-mw-seg", presets) == (
        "in `window`'s row: the family's one LM preset, `distattn_lm_window_gbw`"
    )
    assert methods.shared_preset_note("window", presets) == "-"  # its own preset is no family's
    assert methods.shared_preset_note("qvi", presets) == "-"


def test_the_speed_cell_reads_the_committed_speed_report(tmp_path):
    """Cost beside quality: a row's CPU train-speed ratio to vanilla, from the speed report's
    candidate of its translation configuration (the preset of a family's paper configuration)."""
    report = {
        "train": {
            "translation": {
                "transformer": {"throughput": {"median": 800.0}},
                "alibi": {"ratio": {"median": 0.987, "min": 0.85, "max": 1.04}},
                "window-preset": {"ratio": {"median": 0.77, "min": 0.7, "max": 0.8}},
            }
        }
    }
    (tmp_path / "speed").mkdir()
    (tmp_path / "speed" / "results.json").write_text(json.dumps(report))
    speeds = methods.train_speed_ratios(tmp_path)
    assert methods.speed_cell(speeds, "alibi") == "0.99 [0.85-1.04]"
    assert methods.speed_cell(speeds, "window") == "0.77 [0.70-0.80]"
    assert methods.speed_cell(speeds, "rope") == "-" and methods.speed_cell(speeds, None) == "-"
    committed = methods.train_speed_ratios(methods.RESULTS)
    assert all(methods.speed_cell(committed, name) != "-" for name in ("rpr", "alibi", "rope", "window"))


def test_the_length_generalization_cell_is_the_mean_over_tasks_per_seed(tmp_path):
    """Per seed, the mean exact match at 2x over the tasks the method has a run of (decoder-only
    form); then mean +- std over seeds, read against the baseline's seed noise."""

    def run(task, method, seed, x2, form="decoder-only"):
        return {
            "config": f"{task}-{form}-{method}",
            "task": task,
            "form": form,
            "method": method,
            "seed": seed,
            "accuracy": {"valid": 99.0, "x2": x2},
        }

    write(
        tmp_path / "length_generalization" / "runs",
        [
            run("copy", "baseline", 1, 10.0),
            run("parity", "baseline", 1, 50.0),  # seed 1: 30
            run("copy", "baseline", 2, 20.0),
            run("parity", "baseline", 2, 60.0),  # seed 2: 40
            run("copy", "alibi", 1, 90.0),
            run("parity", "alibi", 1, 70.0),  # seed 1: 80
            run("copy", "alibi", 2, 5.0, form="encoder-decoder"),  # another form: not in the cell
        ],
    )
    values = methods.length_generalization_values(tmp_path)
    assert values == {"baseline": [30.0, 40.0], "alibi": [80.0]}
    markdown = methods.report(tmp_path / "out", tmp_path)
    alibi = next(line for line in markdown.splitlines() if line.startswith("| `alibi`"))
    cells = [cell.strip() for cell in alibi.strip("|").split("|")]
    # +45 against the baseline's std 7.07 * sqrt(1/1 + 1/2) = 8.66: beyond noise
    assert cells[-4:-1] == ["80.00 (1)", "+45.00", "better, beyond noise"]
    assert "Length generalization (exact match at x2, decoder-only)" in markdown
