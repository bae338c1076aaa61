"""The methods table reads each delta against seed noise with the rule the ablation
tables use (``benchmarks.harness.seeds``), says under the table what the readings find,
and gives each translation row sacreBLEU's paired bootstrap against vanilla on the
test translations the harness keeps beside its run files."""

from __future__ import annotations

import json
import logging
import math

import pytest

from benchmarks.harness import seeds
from benchmarks.harness.runs import hypotheses_file, kept_hypotheses, load_lines, save_lines
from benchmarks.quality import methods, mt_grid, paper_tables
from benchmarks.quality import mt as quality
from fairseq_distattn.tools import translation_scoring

BLEU = methods.MT_METRIC


def write_runs(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    for record in records:
        (folder / f"{record['config']}-seed{record['seed']}.json").write_text(json.dumps(record))


def bleu_runs(config, values, first_seed=1):
    return [{"config": config, "seed": first_seed + i, BLEU: value} for i, value in enumerate(values)]


def ppl_runs(config, values):
    return [{"config": config, "seed": 1 + i, "test_ppl": value} for i, value in enumerate(values)]


def length_runs(config, values, factor):
    return [
        {
            "config": config,
            "seed": 1 + i,
            "train_tokens_per_sample": 64,
            "tokens_per_sample": 64 * factor,
            "blocks": {"ppl": value},
        }
        for i, value in enumerate(values)
    ]


@pytest.fixture
def results(tmp_path):
    """vanilla's BLEU 30, 31, 32 (std 1.00 over 3 seeds): rope +2.10 over 2 seeds (noise
    0.91: better), t5-bias -1.80 over 2 (worse), alibi +1.10 over 1 seed (noise 1.00 *
    sqrt(1 + 1/3) = 1.15: within, though beyond vanilla's std alone); the LM baseline
    200, 202 (std 1.41): xpos -6.00 over 1 seed (noise 1.73: better), nope +0.00."""
    root = tmp_path / "results"
    write_runs(
        root / "quality" / "runs",
        [
            *bleu_runs("vanilla", [30.0, 31.0, 32.0]),
            *bleu_runs("rope", [33.0, 33.2]),
            *bleu_runs("t5-bias", [29.0, 29.4]),
            *bleu_runs("alibi", [32.1]),
        ],
    )
    write_runs(
        root / "lm_quality" / "runs",
        [
            *ppl_runs("transformer_lm_gbw", [200.0, 202.0]),
            *ppl_runs("distattn_lm_xpos_gbw", [195.0]),
            *ppl_runs("distattn_lm_nope_gbw", [201.0]),
        ],
    )
    extrapolation = root / "lm_extrapolation" / "runs"
    extrapolation.mkdir(parents=True)
    for index, record in enumerate(
        [
            *length_runs("transformer_lm_gbw", [300.0, 310.0], 8),
            *length_runs("distattn_lm_xpos_gbw", [250.0], 8),
            *length_runs("transformer_lm_gbw", [400.0], 32),
            *length_runs("distattn_lm_xpos_gbw", [260.0], 32),
        ]
    ):
        (extrapolation / f"{index}.json").write_text(json.dumps(record))
    return root


def row(markdown, start):
    line = next(line for line in markdown.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def summary(markdown, title):
    return next(line for line in markdown.splitlines() if line.startswith(f"- **{title}**"))


def test_the_standard_error_of_a_difference_counts_both_seed_counts():
    assert seeds.difference_noise(2.0, 1, 3) == pytest.approx(2.0 * math.sqrt(4 / 3))
    assert seeds.difference_noise(1.0, 2, 2) == pytest.approx(1.0)
    assert seeds.beyond_noise(1.01, 1.0) and seeds.beyond_noise(-1.01, 1.0)
    assert not seeds.beyond_noise(1.0, 1.0)  # at one standard error: within
    assert seeds.noise_reading(-2.0, 1.0, higher_is_better=False) == seeds.BETTER
    assert seeds.noise_reading(-2.0, 1.0, higher_is_better=True) == seeds.WORSE
    assert seeds.read_means([1.0], [1.0], None, True) == "-"  # no baseline spread, no reading
    # the difference, its standard error (std 1 over 2 and 2 seeds: 1.0) and the reading, together
    assert seeds.compare_means([2.0, 2.0], [1.0, 1.0], 1.0, True) == (1.0, 1.0, seeds.WITHIN_NOISE)
    assert seeds.compare_means([3.0, 3.0], [1.0, 1.0], 1.0, True) == (2.0, 1.0, seeds.BETTER)
    assert seeds.compare_means([1.5], [1.0], None, True) == (0.5, None, "-")


def test_every_table_takes_a_difference_of_means_one_way():
    assert seeds.mean_difference([2.0, 4.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert seeds.difference_text([1.0], [1.5]) == "-0.50"
    assert seeds.difference_text([3.0], [1.0]) == "+2.00"  # the sign even when positive
    assert seeds.mean_difference([1.0], []) is None and seeds.difference_text([], [1.0]) == "-"


@pytest.mark.parametrize("difference", [0.5, 0.99, 1.0, 1.01, -1.0, -1.01, 3.0])
def test_the_ablation_reading_and_the_methods_reading_decide_beyond_noise_alike(difference):
    paper = paper_tables.reading(difference, +1.0, 1.0)
    methods_reading = seeds.noise_reading(difference, 1.0, higher_is_better=True)
    assert paper.startswith("within seed noise") == (methods_reading == seeds.WITHIN_NOISE)


def test_each_delta_has_a_reading_from_the_seeds_of_its_row_and_its_baseline(results, tmp_path):
    markdown = methods.report(tmp_path / "out", results)
    assert row(markdown, "| `rope`")[3:7] == ["33.10 +- 0.14 (2)", "+2.10", seeds.BETTER, "-"]
    assert row(markdown, "| `t5-bias`")[4:6] == ["-1.80", seeds.WORSE]
    # one seed: noise 1.00 * sqrt(1/1 + 1/3) = 1.15 > 1.10; without the factor 1.00 < 1.10 would read beyond
    assert row(markdown, "| `alibi`")[4:6] == ["+1.10", seeds.WITHIN_NOISE]
    xpos = row(markdown, "| `xpos`")
    # LM: better is lower; at 8x the baseline has two seeds, at 32x one (no spread, no reading)
    assert xpos[7:10] == ["195.00 (1)", "-6.00", seeds.BETTER]
    assert xpos[10:16] == ["250.00 (1)", "-55.00", seeds.BETTER, "260.00 (1)", "-140.00", "-"]
    assert row(markdown, "| `nope`")[8:10] == ["+0.00", seeds.WITHIN_NOISE]
    baseline = row(markdown, "| baseline")
    assert baseline[4:7] == ["-", "-", "-"]
    assert "sqrt(1/n1 + 1/n2)" in markdown.split("| method |")[0]  # the caption states the rule


def test_the_summary_names_the_methods_beyond_noise_and_those_the_data_cannot_separate_from_the_best(results, tmp_path):
    markdown = methods.report(tmp_path / "out", results)
    assert "## What the table says" in markdown
    translation = summary(markdown, "Translation BLEU")
    assert f"{seeds.BETTER}: `rope` (+2.10);" in translation
    assert f"{seeds.WORSE}: `t5-bias` (-1.80);" in translation
    assert f"{seeds.WITHIN_NOISE}: `alibi` (+1.10)." in translation
    # alibi is 1.00 under rope, within 1.00 * sqrt(1/1 + 1/2) = 1.22; vanilla is 2.10 under, beyond 0.91
    assert "cannot separate from it: `rope` (33.10), `alibi` (32.10) (2 of 4)." in translation
    lm = summary(markdown, "LM test ppl")
    assert f"{seeds.BETTER}: `xpos` (-6.00); {seeds.WORSE}: none; {seeds.WITHIN_NOISE}: `nope` (+0.00)." in lm
    assert "cannot separate from it: `xpos` (195.00) (1 of 3)." in lm
    assert summary(markdown, "LM ppl at 32x").endswith("no reading: `transformer_lm_gbw` has fewer than two seeds.")
    # deterministic: the same runs give the same text
    assert methods.report(tmp_path / "again", results) == markdown


REFERENCES = [
    "Ein Mann fährt Fahrrad auf der Straße .",
    "Zwei Hunde spielen im Schnee .",
    "Eine Frau liest ein Buch im Park .",
    "Kinder spielen Fußball auf einer Wiese .",
    "Ein Junge springt in einen See .",
    "Eine Gruppe von Menschen steht vor einem Gebäude .",
]
BETTER_SYSTEM = [
    "Ein Mann fährt Fahrrad auf der Straße .",
    "Zwei Hunde spielen im Schnee .",
    "Eine Frau liest ein Buch im Park .",
    "Kinder spielen Fußball auf der Wiese .",
    "Ein Junge springt in einen See .",
    "Eine Gruppe Menschen steht vor einem Gebäude .",
]
WORSE_SYSTEM = [
    "Ein Mann fährt auf einer Straße .",
    "Hunde spielen draußen .",
    "Eine Frau liest im Garten .",
    "Kinder spielen mit einem Ball .",
    "Ein Kind springt in das Wasser .",
    "Menschen stehen draußen .",
]


def test_the_paired_bootstrap_is_sacrebleus_with_a_fixed_seed(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    for name, lines in (("better", BETTER_SYSTEM), ("worse", WORSE_SYSTEM)):
        save_lines(tmp_path / f"{name}.hyp.gz", lines)
    better, worse = load_lines(tmp_path / "better.hyp.gz"), load_lines(tmp_path / "worse.hyp.gz")
    assert better == BETTER_SYSTEM
    result = translation_scoring.paired_bootstrap(better, worse, REFERENCES)
    assert result.score == pytest.approx(translation_scoring.detok_bleu(better, REFERENCES)[0].score)
    assert result.baseline_score == pytest.approx(translation_scoring.detok_bleu(worse, REFERENCES)[0].score)
    assert "bs:1000" in result.signature and "seed:12345" in result.signature
    # sacreBLEU's p-value: (resamples whose centred |difference| exceeds the real one + 1) / 1001
    assert result.p_value == pytest.approx(1 / 1001)
    # the seed is fixed whatever SACREBLEU_SEED says, and the environment is left as it was
    monkeypatch.setenv("SACREBLEU_SEED", "none")
    assert translation_scoring.paired_bootstrap(better, worse, REFERENCES) == result
    same = translation_scoring.paired_bootstrap(worse, worse, REFERENCES)
    assert same.score == same.baseline_score
    import os

    assert os.environ["SACREBLEU_SEED"] == "none"
    with pytest.raises(ValueError):
        translation_scoring.paired_bootstrap(better[:-1], worse, REFERENCES)
    # quiet: sacreBLEU's INFO narration is not the report's output, and its level is restored
    assert not [r for r in caplog.records if r.name.startswith("sacrebleu")]
    assert logging.getLogger("sacrebleu").level == logging.NOTSET


def test_the_bootstrap_column_uses_the_lowest_seed_both_runs_kept_translations_of(results, tmp_path):
    runs = results / "quality" / "runs"
    write_runs(runs, bleu_runs("rope", [33.0, 33.2, 33.1]) + bleu_runs("vanilla", [30.0, 31.0, 32.0, 31.0]))
    save_lines(hypotheses_file(runs / "rope-seed1.json"), BETTER_SYSTEM)  # vanilla kept no seed 1
    save_lines(hypotheses_file(runs / "rope-seed3.json"), BETTER_SYSTEM)
    save_lines(hypotheses_file(runs / "vanilla-seed3.json"), WORSE_SYSTEM)
    save_lines(hypotheses_file(runs / "vanilla-seed4.json"), WORSE_SYSTEM)
    assert sorted(kept_hypotheses(runs, "rope")) == [1, 3] and sorted(kept_hypotheses(runs, "vanilla")) == [3, 4]
    data = tmp_path / "multi30k"
    data.mkdir()
    (data / "test_2016_flickr.de").write_text("".join(line + "\n" for line in REFERENCES), encoding="utf-8")
    assert mt_grid.raw_references(data) == REFERENCES

    markdown = methods.report(tmp_path / "out", results, data)
    expected = translation_scoring.paired_bootstrap(BETTER_SYSTEM, WORSE_SYSTEM, REFERENCES)
    difference = expected.score - expected.baseline_score
    assert row(markdown, "| `rope`")[6] == f"{difference:+.2f}, p = {expected.p_value:.4f} (seed 3)"
    assert row(markdown, "| `alibi`")[6] == "-"  # no kept translations
    assert row(markdown, "| baseline")[6] == "-"
    assert "paired bootstrap" in markdown.split("| method |")[0] and "test-set sampling" in markdown


def test_the_translation_harness_keeps_a_runs_scored_hypotheses_beside_its_run_file(tmp_path):
    run_dir, run_file = tmp_path / "work" / "rope-seed1", tmp_path / "out" / "runs" / "rope-seed1.json"
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "eval" / "hyp.detok.de").write_text("".join(line + "\n" for line in BETTER_SYSTEM), encoding="utf-8")
    quality.keep_hypotheses(run_dir, run_file)
    kept = tmp_path / "out" / "runs" / "rope-seed1.hyp.gz"
    assert hypotheses_file(run_file) == kept and load_lines(kept) == BETTER_SYSTEM
    first = kept.read_bytes()
    quality.keep_hypotheses(run_dir, run_file)
    assert kept.read_bytes() == first  # the same lines, the same bytes (no time in the gzip header)
    # a run that scored nothing does not keep an earlier model's translations
    (run_dir / "eval" / "hyp.detok.de").unlink()
    quality.keep_hypotheses(run_dir, run_file)
    assert not kept.exists()
