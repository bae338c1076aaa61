"""The length-generalization harness's report: ``length_generalization.md`` and
``accuracy_vs_length.png``.

Built from the run files alone (``python -m benchmarks.quality.length_generalization
--report``): per form, an overview of every method on every task (in-distribution, x2
and x4 exact match), then one table per task with the mean +- std over seeds, each
delta against the baseline and its reading against seed noise, read with the rule of
the methods table (``benchmarks.harness.seeds``); last, Kazemnejad et al.'s ordering read
against the runs (``length_papers``).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from ..harness.report import mean_std_cell, table_row
from ..harness.runs import load_runs
from ..harness.seeds import NOISE_RULE, compare_means, seed_std
from . import length_papers
from .length_grid import (
    BASELINE,
    DECODER_ONLY,
    DECODER_ONLY_FLAGS,
    FITTED_IN_DISTRIBUTION,
    FORMS,
    IN_DISTRIBUTION,
    bucket_multiplier,
    bucket_order,
    length_methods,
)

REPORT = "length_generalization.md"
PLOT = "accuracy_vs_length.png"
# the buckets of the tables: in distribution, and two and four times the training length
REPORTED = (IN_DISTRIBUTION, "x2", "x4")
BUCKET_TITLES = {IN_DISTRIBUTION: "in distribution (valid)", "x2": "x2", "x4": "x4"}

# {(task, form): {method: [run records]}}
Grid = Dict[Tuple[str, str], Dict[str, List[Dict]]]


def report(out: Path, selected: Sequence[Tuple[str, str]] = ()) -> str:
    """Rebuild the report and plot from ``out/runs``; ``selected``: (task, form) pairs to show
    even without runs (their cells "-"). Returns the markdown."""
    runs = load_runs(out)
    grid: Grid = {pair: {} for pair in selected}
    for record in runs:
        grid.setdefault((record["task"], record["form"]), {}).setdefault(record["method"], []).append(record)
    lines = header_lines(runs)
    for form in FORMS:
        tasks = [task for task, task_form in grid if task_form == form]
        if tasks:
            lines += form_section(form, tasks, grid)
    lines += length_papers.section(runs)
    markdown = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT).write_text(markdown, encoding="utf-8")
    if runs:
        plot_accuracy(grid, out / PLOT)
    return markdown


def method_order(form: str, present: Sequence[str]) -> List[str]:
    """The grid's methods of ``form`` (the baseline first, then the methods table's order), then any
    other method that has runs."""
    known = [name for name, method in length_methods().items() if method.arch_args(form) is not None]
    return known + sorted(set(present) - set(known))


def accuracies(records: Sequence[Dict], bucket: str) -> List[float]:
    return [r["accuracy"][bucket] for r in records if r["accuracy"].get(bucket) is not None]


def bucket_cells(records: Sequence[Dict], baseline: Sequence[Dict], bucket: str, is_baseline: bool) -> List[str]:
    """``[mean +- std (n), delta vs the baseline in points, its reading against seed noise]``."""
    values, base = accuracies(records, bucket), accuracies(baseline, bucket)
    if is_baseline:
        return [mean_std_cell(values, digits=1), "-", "-"]
    difference, _, reading = compare_means(values, base, seed_std(base), higher_is_better=True)
    return [mean_std_cell(values, digits=1), "-" if difference is None else f"{difference:+.1f}", reading]


def other_buckets(records: Sequence[Dict]) -> str:
    """The mean accuracy of the buckets the table has no column for (x1, passkey's x8...)."""
    buckets = sorted({b for r in records for b in r["accuracy"] if b not in REPORTED}, key=bucket_order)
    shown = [f"{b} {statistics.fmean(accuracies(records, b)):.1f}" for b in buckets if accuracies(records, b)]
    return ", ".join(shown) or "-"


def task_table(task: str, form: str, by_method: Dict[str, List[Dict]]) -> List[str]:
    """One task's table in one form: a row per method of the grid, "-" where it has no run."""
    headings = ["method", "runs (seeds)"]
    for bucket in REPORTED:
        headings += [BUCKET_TITLES[bucket], "delta", "reading"]
    headings += ["other buckets", "train wall s"]
    baseline = by_method.get(BASELINE, [])
    rows = []
    for method in method_order(form, list(by_method)):
        records = sorted(by_method.get(method, []), key=lambda r: r["seed"])
        cells = [f"`{method}`" if method != BASELINE else BASELINE]
        cells.append(f"{len(records)} ({','.join(str(r['seed']) for r in records)})" if records else "-")
        for bucket in REPORTED:
            cells += bucket_cells(records, baseline, bucket, method == BASELINE)
        cells += [other_buckets(records), ", ".join(f"{r['train_wall_s']:.0f}" for r in records) or "-"]
        rows.append(table_row(cells))
    return [
        "",
        f"### {task} ({form})",
        *fit_note(by_method),
        "",
        table_row(headings),
        "|" + "---|" * len(headings),
        *rows,
    ]


def best_in_distribution(by_method: Dict[str, List[Dict]]) -> float:
    """The best mean in-distribution accuracy of any method with runs (0 without any)."""
    means = [statistics.fmean(v) for v in (accuracies(r, IN_DISTRIBUTION) for r in by_method.values()) if v]
    return max(means, default=0.0)


def fit_note(by_method: Dict[str, List[Dict]]) -> List[str]:
    """A line under a task's heading where no method fits it in distribution (:data:`FITTED_IN_DISTRIBUTION`)."""
    best = best_in_distribution(by_method)
    if not by_method or best >= FITTED_IN_DISTRIBUTION:
        return []
    return [
        "",
        f"No method fits this task at the budget: the best in-distribution exact match is {best:.1f}% "
        f"(< {FITTED_IN_DISTRIBUTION:.0f}%), so its longer buckets say nothing about length generalization.",
    ]


def overview_table(form: str, tasks: Sequence[str], grid: Grid) -> List[str]:
    """Every method on every task of ``form``: mean in-distribution / x2 / x4 accuracy ("-": no run)."""
    present = [method for task in tasks for method in grid[task, form]]
    rows = []
    for method in method_order(form, present):
        cells = [f"`{method}`" if method != BASELINE else BASELINE]
        for task in tasks:
            records = grid[task, form].get(method, [])
            means = [accuracies(records, bucket) for bucket in REPORTED]
            cells.append(" / ".join(f"{statistics.fmean(v):.0f}" if v else "-" for v in means) if records else "-")
        rows.append(table_row(cells))
    headings = ["method", *tasks]
    return [table_row(headings), "|" + "---|" * len(headings), *rows]


def form_section(form: str, tasks: Sequence[str], grid: Grid) -> List[str]:
    title = "decoder-only (LM preset of the method)" if form == DECODER_ONLY else "encoder-decoder (translation config)"
    lines = [
        "",
        f"## {title}",
        "",
        "Mean exact match (%) in distribution / at x2 / at x4, over the seeds the tables below count:",
        "",
    ]
    lines += overview_table(form, tasks, grid)
    for task in tasks:
        lines += task_table(task, form, grid[task, form])
    return lines


def header_lines(runs: Sequence[Dict]) -> List[str]:
    """The title, what the tables measure, and the budgets and machines of ``runs``."""
    budgets = sorted({(r["updates"], r.get("model", "?"), r.get("max_tokens", "?")) for r in runs})
    machines = sorted({r.get("machine", "?") for r in runs})
    return [
        "# Length generalization (generated by `python -m benchmarks.quality.length_generalization --report`)",
        "",
        "Small models trained on short examples of each task and tested on longer ones, for every method of the "
        "methods table: the decoder-only form (`SOURCE = ANSWER`, loss on the answer only, the method's LM preset) "
        "and the encoder-decoder form (the method's translation configuration). Greedy decoding by "
        "fairseq-interactive with room for the longest answer and a margin; exact match (%) of the whole answer "
        "(an empty or over-long completion is wrong)"
        + forced_text(runs)
        + ". *in distribution*: the valid split, drawn like the training "
        "set; *xK*: test lengths in ((K/2)L, KL] for the training length L. Mean +- sample std over seeds, the seed "
        "count in brackets; - : not run yet.",
        "",
        f"*delta*: the difference of the mean accuracies against the baseline's in points; *reading*: that delta "
        f"read against seed noise as the methods table reads it ({NOISE_RULE}; the baseline's std is its accuracy's "
        "over its seeds at that bucket); - : the baseline has fewer than two seeds there, or the row no run.",
        "",
        "Budget: "
        + ("; ".join(f"{u} updates, {m}, {t} tokens per batch" for u, m, t in budgets) if budgets else "no runs yet"),
        f"Data: {data_text(runs)}. Machine: {'; '.join(machines) or '-'}.",
        *flags_lines(),
    ]


def flags_lines() -> List[str]:
    """What the decoder-only form gives a method's LM preset, and why (:data:`DECODER_ONLY_FLAGS`)."""
    if not DECODER_ONLY_FLAGS:
        return []
    added = "; ".join(f"`{method}`: {why}" for method, (_, why) in DECODER_ONLY_FLAGS.items())
    return ["", f"Decoder-only flags in place of the LM grid's for a preset: {added}."]


def forced_text(runs: Sequence[Dict]) -> str:
    """The tasks whose runs were scored by teacher forcing (long prompts), which gives the same exact match."""
    tasks = sorted({r["task"] for r in runs if r.get("scoring", "").startswith("teacher forcing")})
    if not tasks:
        return ""
    return (
        f"; {', '.join(tasks)}: the same exact match by teacher forcing (greedy decoding completes a prompt with its "
        "answer iff the argmax after each answer prefix is the next token, then </s>; one forward pass a prompt "
        "instead of one decoding step a prompt token: `benchmarks/quality/forced_match.py`)"
    )


def data_text(runs: Sequence[Dict]) -> str:
    """Each task's data the runs trained on: the hash of its files and its training lines."""
    found = sorted({(r["task"], r.get("data_digest", "?"), r.get("data_lines", {}).get("train", "?")) for r in runs})
    return "; ".join(f"{task} (files {digest}, {lines} training lines)" for task, digest, lines in found) or "-"


def plot_accuracy(grid: Grid, path: Path) -> None:
    """Mean exact match against the length bucket, one panel per task and form, one line per method."""
    import logging

    # importing fairseq sets the root logger to DEBUG, and matplotlib logs at import
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(pair, by_method) for pair, by_method in grid.items() if by_method]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False)
    # one colour per method in every panel: its place in the grid
    colour = {name: plt.get_cmap("tab20")(index % 20) for index, name in enumerate(length_methods())}
    for axis, ((task, form), by_method) in zip(axes.flat, panels):
        for method in method_order(form, list(by_method)):
            points = bucket_means(by_method.get(method, []))
            if points:
                axis.plot(
                    *zip(*points),
                    marker="o",
                    color="black" if method == BASELINE else colour.get(method, "grey"),
                    linestyle="--" if method == BASELINE else "-",
                    label=method,
                    linewidth=1,
                )
        multipliers = sorted({x for records in by_method.values() for x, _ in bucket_means(records)})
        axis.set_xscale("log", base=2)
        axis.set_xticks(multipliers, [f"x{x}" for x in multipliers])
        axis.minorticks_off()
        axis.set_title(f"{task} ({form})", fontsize=9)
        axis.set_xlabel("test length bucket (x training length)", fontsize=8)
        axis.set_ylabel("exact match (%)", fontsize=8)
        axis.set_ylim(-3, 103)
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    figure.tight_layout()
    figure.legend(*unique_legend(axes.flat), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def bucket_means(records: Sequence[Dict]) -> List[Tuple[int, float]]:
    """(multiplier, mean accuracy over seeds) of each ``xK`` test bucket the records hold."""
    buckets = {b for r in records for b in r["accuracy"] if bucket_multiplier(b) is not None}
    points = [(bucket_multiplier(b), accuracies(records, b)) for b in buckets]
    return sorted((x, statistics.fmean(values)) for x, values in points if values)


def unique_legend(axes) -> Tuple[List, List[str]]:
    """One legend entry per method over every panel, in order of first appearance."""
    seen: Dict[str, object] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)
