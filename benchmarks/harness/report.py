"""The pieces of the quality reports that more than one harness writes: a table row,
the configurations still to run, the table of how far the mechanisms' parameters
moved, and the plot of the validation curves."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence


def table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"  # notes say |i-j|


def pending_lines(by_config: Dict[str, Sequence[Dict]], grid: Dict[str, str]) -> List[str]:
    """What the table does not show yet: the configurations of ``grid`` (name: note)
    without a run, and those short of the two seeds each needs for a spread."""
    missing = [name for name in grid if name not in by_config]
    single = [name for name in grid if len(by_config.get(name, ())) == 1]
    lines = []
    if missing:
        lines.append("Not run yet: " + "; ".join(f"{name} ({grid[name]})" for name in missing) + ".")
    if single:
        lines.append(f"One seed so far (no spread yet): {', '.join(single)}.")
    # each its own paragraph below the table
    return [text for line in lines for text in ("", line)]


def movement_table(by_config: Dict[str, List[Dict]], order: Sequence[str]) -> List[str]:
    """Did the mechanism parameters move? Per config, over its seeds: the least and most
    moved parameter group (change relative to the initial value; absolute for DA's
    w and v, which start at 0) and the range of DA's learned per-head w and v."""
    lines = []
    for name in order:
        measured = [r["mechanism_parameters"] for r in by_config[name] if r.get("mechanism_parameters")]
        if not measured:
            continue
        groups: Dict[str, List[float]] = {}
        for result in measured:
            for group, entry in result.items():
                groups.setdefault(group, []).append(entry["relative_change"])
        means = {group: statistics.fmean(changes) for group, changes in groups.items()}
        least, most = min(means, key=means.get), max(means, key=means.get)
        da = []
        for parameter, label in (("distance_weight", "w"), ("sharpness", "v")):
            entries = [entry for result in measured for group, entry in result.items() if group.endswith(parameter)]
            if entries:
                da.append(
                    f"{label} in [{min(e['value_min'] for e in entries):.2f}, "
                    f"{max(e['value_max'] for e in entries):.2f}]"
                )
        lines.append(
            f"| {name} | {len(measured)} | {len(groups)} | {means[least]:.3g} ({least}) | "
            f"{means[most]:.3g} ({most}) | {'; '.join(da) or '-'} |"
        )
    if not lines:
        return []
    return [
        "",
        "## Did the mechanisms' parameters move?",
        "",
        "Distance of each mechanism parameter group from fairseq-train's initial model, relative to its",
        "initial norm (absolute for DA's w and v, which start at 0), mean over layers and seeds",
        "(`python -m benchmarks.diagnostics.parameter_movement CHECKPOINT` for every group).",
        "",
        "| config | runs | parameter groups | least moved | most moved | DA's learned per-head values |",
        "|---|---|---|---|---|---|",
        *lines,
    ]


# after matplotlib's ten colours, each further ten series take the next marker
MARKERS = ("o", "s", "^", "D", "v", "P")


def series_style(index: int) -> Dict[str, str]:
    """Colour and marker of a plot's ``index``-th series: distinct for the first 60, so that a
    legend of every method tells each line apart (the colours alone repeat after ten)."""
    return {"color": f"C{index % 10}", "marker": MARKERS[index // 10 % len(MARKERS)]}


def plot_curves(
    by_config: Dict[str, List[Dict]],
    order: Sequence[str],
    path: Path,
    *,
    ylabel: str,
    title: str,
    dashed: Callable[[str, Dict], bool] = lambda name, record: False,
) -> None:
    """One line per run's validation curve, one colour per config (shared by the
    translation and LM harnesses; ``dashed`` marks baselines)."""
    import logging

    # importing fairseq sets the root logger to DEBUG, and matplotlib logs at import
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for index, name in enumerate(order):
        for number, record in enumerate(by_config[name]):
            curve = record["valid_curve"]
            axes.plot(
                [p["updates"] for p in curve],
                [p["loss"] for p in curve],
                **series_style(index),
                markersize=3,
                linestyle="--" if dashed(name, record) else "-",
                label=name if number == 0 else None,
                alpha=0.8,
                linewidth=1,
            )
    axes.set_xlabel("updates")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def mean_std_cell(values: Optional[Sequence[float]], digits: int = 2) -> str:
    """A table cell of per-seed values: ``mean +- std (n)``; one seed: ``mean (1)``; none: ``-``."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f} (1)"
    return f"{mean:.{digits}f} +- {statistics.stdev(values):.{digits}f} ({len(values)})"
