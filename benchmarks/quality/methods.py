"""One row per position method: ``python -m benchmarks.quality.methods``.

Reads the run files the other harnesses wrote (nothing is trained here) and
answers, per method, on the same data and budget: translation BLEU on Multi30k
and its delta against fairseq's transformer (``benchmarks.quality.mt``), LM test
perplexity on WikiText-2 and its delta against ``transformer_lm_gbw``
(``benchmarks.quality.lm``), and the LM's perplexity at 8x and 32x its training
length (``benchmarks.quality.lm_extrapolation``, non-overlapping blocks), each
as mean +- std over seeds with the seed count. Each delta is read against seed
noise with the rule every table here uses (``benchmarks.harness.seeds``: beyond
noise past one standard error of the difference of the means, the baseline's seed
std times sqrt(1/n1 + 1/n2)); a translation row also gets sacreBLEU's paired
bootstrap against vanilla on one seed whose test translations both runs kept, and
a generated summary under the table says what the readings find.

The rows derive from the registry: each registered mechanism (in the papers'
order) with the translation configuration of its name and the LM preset
``distattn_lm_<name>_gbw`` (a window variant reads the ``window``
configuration and preset: the paper's combination; one with a translation
configuration of its own but no preset names the row of its family's), then
NoPE, the preset without any position information. Writes ``<out>/methods.md``
and its copy in the README.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path
from typing import Callable, Collection, Dict, List, NamedTuple, Optional, Sequence, Tuple

from fairseq_distattn.tools.generated_blocks import update_pages
from fairseq_distattn.tools.translation_scoring import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, paired_bootstrap

from ..common import REPO_ROOT, shown
from ..harness.report import mean_std_cell, table_row
from ..harness.runs import kept_hypotheses, load_lines, load_runs
from ..harness.seeds import (
    BETTER,
    NOISE_RULE,
    WITHIN_NOISE,
    WORSE,
    beyond_noise,
    compare_means,
    difference_noise,
    difference_text,
    read_means,
    seed_std,
)

RESULTS = REPO_ROOT / "benchmarks" / "results"
DEFAULT_OUT = RESULTS / "methods"
MT_METRIC = "tokenized_bleu_compound_split"  # the translation table's headline BLEU
MT_BASELINE = "vanilla"
LM_BASELINE = "transformer_lm_gbw"
FACTORS = (8, 32)  # extrapolation lengths, as multiples of the training length
NOPE_PRESET = "distattn_lm_nope_gbw"
# why a method has no translation configuration, in its row's translation cell
NO_TRANSLATION = {
    "nope": "none: an encoder without positions gives each token the same output whatever the word order "
    "(a bag of words)",
}
BASELINE_LABEL = "the baseline"  # how the summary under the table names the baseline row
# the length-generalization summary: benchmarks.quality.length_generalization's runs of this form, at this bucket
LENGTH_FORM, LENGTH_BUCKET, LENGTH_BASELINE = "decoder-only", "x2", "baseline"
LENGTH_TITLE = f"Length generalization (exact match at {LENGTH_BUCKET}, {LENGTH_FORM})"


def by_config(records: Sequence[Dict], value) -> Dict[str, List[float]]:
    table: Dict[str, List[float]] = {}
    for record in records:
        table.setdefault(record["config"], []).append(value(record))
    return table


def method_rows(
    mt_configs: Sequence[str], lm_configs: Sequence[str]
) -> List[Tuple[str, str, Optional[str], Optional[str]]]:
    """``(method, paper, translation config, LM config)`` per registered mechanism that has
    either, then NoPE; a mechanism whose name has no configuration reads its family's
    (``window-aw-seg`` -> ``window-aw`` -> ``window``), listed once per family."""
    import fairseq_distattn.mechanisms  # noqa: F401  discovers the registry
    from fairseq_distattn.models.distattn_lm import preset_name
    from fairseq_distattn.registry import registered

    rows, seen = [], set()
    for info in registered():
        for name in family_names(info.name):
            mt = name if name in mt_configs else None
            lm = preset_name(name)
            lm = lm if lm in lm_configs else None
            if mt or lm:
                break
        if not (mt or lm) or (mt, lm) in seen:
            continue
        seen.add((mt, lm))
        paper = info.paper.split(", *")[0]
        rows.append((name, paper, mt, lm))
    if NOPE_PRESET in lm_configs:
        rows.append(("nope", "Haviv et al. 2022", None, NOPE_PRESET))
    return rows


def family_names(name: str) -> List[str]:
    """``name`` and the family names it extends, longest first: ``window-aw-seg``,
    ``window-aw``, ``window``."""
    parts = name.split("-")
    return ["-".join(parts[:end]) for end in range(len(parts), 0, -1)]


def shared_preset_note(method: str, listed_presets: Collection[str]) -> str:
    """The LM test-ppl cell of a row without an LM preset of its own: the row that holds
    its family's preset when the table lists one (``window-mw`` -> ``window``'s row, named
    like the preset, as :func:`method_rows` names every row; the preset is not repeated,
    so that the summary counts it once), else "-"."""
    from fairseq_distattn.models.distattn_lm import preset_name

    for name in family_names(method)[1:]:
        preset = preset_name(name)
        if preset in listed_presets:
            return f"in `{name}`'s row: the family's one LM preset, `{preset}`"
    return "-"


def report(out: Path, results: Path = RESULTS, data: Optional[Path] = None) -> str:
    """Rebuild ``methods.md`` (and its copies in the README and docs) from the harnesses'
    run files under ``results``; returns the markdown."""
    columns, base_length = measured_columns(results)
    headings = column_headings(base_length)
    rows, entries = method_table_rows(columns, results, data)
    lines = [
        "# Every method on the same data and budget (generated by `python -m benchmarks.quality.methods --report`)",
        "",
        caption(base_length),
        "",
        table_row(headings),
        "|" + "---|" * len(headings),
        *rows,
        *summary_lines(columns, entries),
    ]
    markdown = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "methods.md").write_text(markdown, encoding="utf-8")
    if out.resolve() == DEFAULT_OUT.resolve():
        update_pages(out / "methods.md")
    return markdown


def column_headings(base_length: int) -> List[str]:
    """The table's headings: each measured column with its delta and reading; the extrapolation
    columns name their factor and length."""
    return [
        "method",
        "paper",
        "translation config",
        "BLEU (seeds)",
        f"delta vs {MT_BASELINE}",
        "reading",
        f"paired bootstrap vs {MT_BASELINE}",
        "LM test ppl (seeds)",
        f"delta vs {LM_BASELINE}",
        "reading",
        *(
            heading
            for factor in FACTORS
            for heading in (f"ppl at {factor}x ({factor * base_length} tokens)", "delta", "reading")
        ),
        f"exact match at {LENGTH_BUCKET} ({LENGTH_FORM}, mean over tasks)",
        "delta",
        "reading",
        "CPU train speed vs vanilla",
    ]


def method_table_rows(
    columns: Sequence["Column"], results: Path, data: Optional[Path]
) -> Tuple[List[str], List[Tuple[str, Dict[str, Optional[str]]]]]:
    """The baseline's row, then one per method (:func:`method_rows`); and the ``(label, its
    configuration of each column kind)`` of each, for :func:`summary_lines`."""
    from .lm_grid import lm_configs
    from .mt_grid import default_configs, raw_references

    references = functools.lru_cache(maxsize=None)(lambda: raw_references(data))
    speeds = train_speed_ratios(results)
    baseline = ["baseline: sinusoidal positions", "Vaswani et al. 2017", f"{MT_BASELINE}+abs"]
    baseline_configs = {"mt": MT_BASELINE, "lm": LM_BASELINE, "length": LENGTH_BASELINE}
    rows = [table_row([*baseline, *row_cells(columns, baseline_configs, "-"), "1 (the reference)"])]
    entries: List[Tuple[str, Dict[str, Optional[str]]]] = [(BASELINE_LABEL, baseline_configs)]
    configs = default_configs()
    listed = method_rows(list(configs), list(lm_configs()))
    listed_presets = {lm for _, _, _, lm in listed if lm}
    for method, paper, mt, lm in listed:
        translation = (
            (mt + ("+abs" if configs[mt].absolute_positions else "")) if mt else NO_TRANSLATION.get(method, "-")
        )
        bootstrap = bootstrap_cell(results / "quality" / "runs", mt, references)
        no_lm = "-" if lm else shared_preset_note(method, listed_presets)
        row_configs = {"mt": mt, "lm": lm, "length": method}
        cells = [*row_cells(columns, row_configs, bootstrap, no_lm), speed_cell(speeds, mt)]
        rows.append(table_row([f"`{method}`", paper, translation, *cells]))
        entries.append((f"`{method}`", row_configs))
    return rows, entries


def train_speed_ratios(results: Path) -> Dict[str, Dict[str, float]]:
    """The CPU training speed of each translation candidate of the committed speed report
    (``benchmarks/results/speed/results.json``, ``python -m benchmarks.run``): its tokens/s as a
    ratio to vanilla fairseq's in the same run, median, min and max over the rounds. Empty where
    no report is committed."""
    path = results / "speed" / "results.json"
    if not path.is_file():
        return {}
    train = json.loads(path.read_text(encoding="utf-8")).get("train", {}).get("translation", {})
    return {key: entry["ratio"] for key, entry in train.items() if entry.get("ratio")}


def speed_cell(speeds: Dict[str, Dict[str, float]], config: Optional[str]) -> str:
    """``median [min-max]`` of the speed report's candidate for a row's translation configuration:
    the mechanism of that name in every attention that accepts it, or (a family's paper
    configuration, ``window``) its preset, ``<name>-preset``; "-" without one."""
    ratio = speeds.get(config or "") or speeds.get(f"{config}-preset")
    if not config or ratio is None:
        return "-"
    return f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"


class Column(NamedTuple):
    """One measured quantity of the table: its values per configuration and seed, and the
    baseline each delta is against and read against the seed noise of."""

    title: str
    kind: str  # "mt": a row's translation configuration holds it, "lm": its LM preset
    values: Dict[str, List[float]]  # {configuration: one value per seed}
    baseline: str
    higher_is_better: bool


def measured_columns(results: Path) -> Tuple[List[Column], int]:
    """BLEU, LM test ppl and the LM's ppl at each of FACTORS its training length, from the
    run files under ``results``; and that training length (tokens)."""
    mt_runs = load_runs(results / "quality")
    lm_runs = load_runs(results / "lm_quality")
    extrapolation = load_runs(results / "lm_extrapolation")
    trained = {record["train_tokens_per_sample"] for record in extrapolation} or {64}
    at_length = {
        factor: by_config(
            [r for r in extrapolation if r["tokens_per_sample"] == factor * r["train_tokens_per_sample"]],
            lambda record: record["blocks"]["ppl"],
        )
        for factor in FACTORS
    }
    columns = [
        Column("Translation BLEU", "mt", by_config(mt_runs, lambda record: record[MT_METRIC]), MT_BASELINE, True),
        Column("LM test ppl", "lm", by_config(lm_runs, lambda record: record["test_ppl"]), LM_BASELINE, False),
        *(Column(f"LM ppl at {factor}x", "lm", at_length[factor], LM_BASELINE, False) for factor in FACTORS),
        Column(LENGTH_TITLE, "length", length_generalization_values(results), LENGTH_BASELINE, True),
    ]
    return columns, min(trained)


def length_generalization_values(results: Path) -> Dict[str, List[float]]:
    """``{method: one value per seed}``: the exact match (%) at LENGTH_BUCKET of
    ``benchmarks.quality.length_generalization``'s decoder-only runs, averaged over the tasks the
    method has a run of at that seed (the per-task cells are in its report)."""
    by_seed: Dict[Tuple[str, int], List[float]] = {}
    for record in load_runs(results / "length_generalization"):
        accuracy = record.get("accuracy", {}).get(LENGTH_BUCKET)
        if record.get("form") == LENGTH_FORM and accuracy is not None:
            by_seed.setdefault((record["method"], record["seed"]), []).append(accuracy)
    values: Dict[str, List[float]] = {}
    for (method, _), accuracies in sorted(by_seed.items()):
        values.setdefault(method, []).append(statistics.fmean(accuracies))
    return values


def measured_cells(column: Column, config: Optional[str], absent: str = "-") -> List[str]:
    """``[mean +- std (seeds), delta vs the baseline, its reading against seed noise]`` of
    ``config`` (without one: ``absent``, then dashes; the baseline's own row has no delta)."""
    if not config:
        return [absent, "-", "-"]
    values, baseline = column.values.get(config), column.values.get(column.baseline) or []
    if config == column.baseline:
        return [mean_std_cell(values), "-", "-"]
    reading = read_means(values or [], baseline, seed_std(baseline), column.higher_is_better)
    return [mean_std_cell(values), difference_text(values or [], baseline), reading]


def bootstrap_cell(runs: Path, config: Optional[str], references: Callable[[], Sequence[str]]) -> str:
    """sacreBLEU's paired bootstrap of ``config``'s test translations against MT_BASELINE's,
    on the lowest seed whose translations both runs kept: ``<sacreBLEU difference>, p =
    <p-value> (seed <n>)``; "-" without such a seed."""
    if not config or config == MT_BASELINE:
        return "-"
    mine, baseline = kept_hypotheses(runs, config), kept_hypotheses(runs, MT_BASELINE)
    seeds = sorted(set(mine) & set(baseline))
    if not seeds:
        return "-"
    seed = seeds[0]
    result = paired_bootstrap(load_lines(mine[seed]), load_lines(baseline[seed]), references())
    return f"{result.score - result.baseline_score:+.2f}, p = {result.p_value:.4f} (seed {seed})"


def caption(base_length: int) -> str:
    return (
        "Translation: Multi30k En-De test_2016_flickr, BLEU (tokenized, compound-split: the translation table's "
        "headline) of `benchmarks.quality.mt`'s configuration of the method's name (the mechanism in encoder and "
        "decoder self-attention; *+abs*: sinusoidal position embeddings kept; delta against fairseq's transformer). "
        "Language model: WikiText-2 test perplexity of "
        f"`benchmarks.quality.lm` (the `distattn_lm_<method>_gbw` preset; delta against `{LM_BASELINE}`), and the "
        f"same models on non-overlapping blocks of {' and '.join(f'{f}x' for f in FACTORS)} their "
        f"{base_length}-token training length (`benchmarks.quality.lm_extrapolation`), each delta against "
        f"`{LM_BASELINE}` at that length. Mean +- std over seeds, the seed count in brackets; - : not run yet (or no "
        "such configuration).\n\n"
        "*reading*: each delta read against seed noise, as the translation table reads the papers' ablations "
        f"(`benchmarks/harness/seeds.py`), {NOISE_RULE}; the baseline's std is `{MT_BASELINE}`'s BLEU over its "
        f"seeds for translation and `{LM_BASELINE}`'s ppl (at that length) over its seeds for the language model, "
        "so a row with fewer seeds has a larger standard error. Better is higher BLEU, lower perplexity; - : the "
        "baseline has fewer than two seeds, or the row no run.\n\n"
        f"*paired bootstrap*: sacreBLEU's paired bootstrap (`--paired-bs`, {BOOTSTRAP_SAMPLES} resampled test sets, "
        f"seed {BOOTSTRAP_SEED}) of the method's detokenised test translations against `{MT_BASELINE}`'s of the "
        "same seed, the lowest seed whose translations both runs kept (named in the cell): their sacreBLEU "
        "difference and sacreBLEU's p-value. It measures test-set sampling, whether another test set drawn like "
        "this one would rank the two systems the same, on one seed each; the reading measures training "
        "randomness (another seed), and is the one the summary below uses. - : no seed with both runs' "
        "translations (the runs before the harness kept them have none).\n\n"
        f"*exact match at {LENGTH_BUCKET}*: `benchmarks.quality.length_generalization` "
        "(`benchmarks/results/length_generalization/length_generalization.md` has every task, bucket and form): "
        f"the method's LM preset (the baseline: `{LM_BASELINE}`, sinusoidal positions) trained on the algorithmic "
        f"tasks' training lengths, its greedy answers' exact match (%) at twice them ({LENGTH_FORM} form), per seed "
        "the mean over the tasks the method has a run of, then mean +- std over seeds; read against the "
        "baseline's seed noise as above.\n\n"
        "*CPU train speed*: the cost beside the quality: training tokens/s of the method's translation "
        "configuration as a ratio to vanilla fairseq's measured in the same run, median [min-max] over the "
        "rounds, from the committed speed report (`benchmarks/results/speed`, `python -m benchmarks.run` on "
        "the CPU, transformer_wmt_en_de size; the mechanism in every attention that accepts it, the window "
        "family's paper configuration for `window`); - : no candidate in that report."
    )


def row_cells(
    columns: Sequence[Column], configs: Dict[str, Optional[str]], bootstrap: str, no_lm: str = "-"
) -> List[str]:
    """A row's measured cells, each column's from the row's configuration of its kind (``configs``):
    translation (with the paired bootstrap after its reading), the language model's (``no_lm`` in
    the first of them when the row has no LM preset), then length generalization."""
    cells: List[str] = []
    for index, column in enumerate(columns):
        first_lm = column.kind == "lm" and all(other.kind != "lm" for other in columns[:index])
        cells += measured_cells(column, configs.get(column.kind), no_lm if first_lm else "-")
        if column.kind == "mt":
            cells.append(bootstrap)
    return cells


def summary_lines(columns: Sequence[Column], entries: Sequence[Tuple[str, Dict[str, Optional[str]]]]) -> List[str]:
    """The section under the table: per column, the methods beyond seed noise of the baseline
    (better, worse), and the methods the data cannot separate from the best."""
    lines = [
        "",
        "## What the table says",
        "",
        f"Generated from the readings above ({NOISE_RULE}). The best of a column is the best mean; the methods "
        "the data cannot separate from it are those whose difference to it is within one standard error of "
        "the difference (the same rule and the same baseline std).",
        "",
    ]
    for column in columns:
        named = [
            (label, column.values[config])
            for label, configs in entries
            for config in [configs.get(column.kind)]
            if config and column.values.get(config)
        ]
        lines.append(f"- **{column.title}**: " + column_summary(column, named))
    return lines


def column_summary(column: Column, named: Sequence[Tuple[str, List[float]]]) -> str:
    """One column's sentence of :func:`summary_lines`, from its ``(label, values)`` pairs."""
    baseline = column.values.get(column.baseline) or []
    std = seed_std(baseline)
    if not named:
        return "no runs yet."
    if std is None:
        return f"no reading: `{column.baseline}` has fewer than two seeds."
    readings: Dict[str, List[Tuple[float, str]]] = {BETTER: [], WORSE: [], WITHIN_NOISE: []}
    for label, values in named:
        if label != BASELINE_LABEL:
            difference, _, reading = compare_means(values, baseline, std, column.higher_is_better)
            readings[reading].append((difference, label))
    # largest difference first, table order on a tie (sorted is stable)
    shown = {
        reading: ", ".join(
            f"{label} ({difference:+.2f})" for difference, label in sorted(pairs, key=lambda p: -abs(p[0]))
        )
        or "none"
        for reading, pairs in readings.items()
    }
    best = inseparable_from_best(named, std, column.higher_is_better)
    return (
        f"against `{column.baseline}` (seed std {std:.2f} over {len(baseline)} seeds), {BETTER}: {shown[BETTER]}; "
        f"{WORSE}: {shown[WORSE]}; {WITHIN_NOISE}: {shown[WITHIN_NOISE]}. The best and the methods the data cannot "
        f"separate from it: {', '.join(f'{label} ({mean:.2f})' for label, mean in best)} "
        f"({len(best)} of {len(named)})."
    )


def inseparable_from_best(
    named: Sequence[Tuple[str, List[float]]], std: float, higher_is_better: bool
) -> List[Tuple[str, float]]:
    """``(label, mean)`` of the best mean (the first in table order on a tie) and of every other
    whose difference to it is not :func:`..harness.seeds.beyond_noise` of
    :func:`..harness.seeds.difference_noise` (``std``, both seed counts), best mean first."""
    means = [(label, statistics.fmean(values), len(values)) for label, values in named]
    sign = 1 if higher_is_better else -1
    best_label, best_mean, best_n = max(means, key=lambda entry: sign * entry[1])
    close = [
        (label, mean)
        for label, mean, n in means
        if label != best_label and not beyond_noise(mean - best_mean, difference_noise(std, n, best_n))
    ]
    return [(best_label, best_mean), *sorted(close, key=lambda entry: -sign * entry[1])]


def check_out(parser: argparse.ArgumentParser, out: Path) -> None:
    """A parser error unless ``out`` can be a folder, which --out is here as in every harness (a page
    such as README.md holds a copy of methods.md that only the default --out rewrites, from that file)."""
    if out.suffix == ".md" or (out.exists() and not out.is_dir()):
        parser.error(
            f"argument --out: {out} names a file, and --out is the folder methods.md is written to; the "
            f"default, {shown(DEFAULT_OUT)}, also rewrites the table where README.md and docs/ copy it"
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.methods", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--report", action="store_true", help="rebuild the table (the only thing this does; accepted for symmetry)"
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the folder methods.md goes to (default: {DEFAULT_OUT})"
    )
    args = p.parse_args(argv)
    check_out(p, args.out)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
