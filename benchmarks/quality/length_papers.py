"""The length-generalization report's reading of the literature: Kazemnejad et al.'s ordering
of position encodings, restated as pairwise claims and read against this grid's runs.

Kazemnejad et al. 2023, *The Impact of Positional Encoding on Length Generalization in
Transformers* (Figures 1-3, github McGill-NLP/length-generalization): decoder-only models
trained on lengths up to L and tested up to 2L; NoPE performs on par with T5's relative bias,
both ahead of ALiBi, ahead of Rotary and APE, which perform alike. Their APE is sinusoidal
(Section 3: the learned one cannot embed unseen positions), which is this grid's baseline.
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from ..harness.report import mean_std_cell, table_row
from ..harness.seeds import BETTER, WITHIN_NOISE, WORSE, compare_means, seed_std
from .length_grid import BASELINE, DECODER_ONLY, FITTED_IN_DISTRIBUTION, IN_DISTRIBUTION

PAPER = "Kazemnejad et al. 2023"
# the tasks both have (theirs also: polynomial evaluation, summation, LEGO, SCAN, PCFG)
SHARED_TASKS = ("copy", "reverse", "sort", "addition", "parity")
# their test lengths reach 2L: this grid's x2 bucket, ((1/2)2L, 2L]
BUCKET = "x2"
# this grid's method -> their name
NAMES = {"nope": "NoPE", "t5-bias": "T5's relative bias", "alibi": "ALiBi", "rope": "Rotary", BASELINE: "APE"}
SIMILAR, AHEAD = "~", ">"
# NoPE ~ T5 > ALiBi > Rotary ~ APE, as pairs of neighbours
CLAIMS = (
    ("nope", SIMILAR, "t5-bias"),
    ("t5-bias", AHEAD, "alibi"),
    ("alibi", AHEAD, "rope"),
    ("rope", SIMILAR, BASELINE),
)

REPRODUCED, CONTRADICTED, NOT_SEPARATED, NO_READING = "reproduced", "contradicted", "not separated", "-"

# {method: {task: {seed: accuracy at BUCKET}}}
TaskSeeds = Dict[str, Dict[str, Dict[int, float]]]


def task_seed_accuracies(records: Sequence[Dict], bucket: str = BUCKET) -> TaskSeeds:
    """The decoder-only accuracy at ``bucket`` of every run of the compared methods on the shared tasks."""
    found: TaskSeeds = {}
    for r in records:
        accuracy = r["accuracy"].get(bucket)
        if r["form"] == DECODER_ONLY and r["method"] in NAMES and r["task"] in SHARED_TASKS and accuracy is not None:
            found.setdefault(r["method"], {}).setdefault(r["task"], {})[r["seed"]] = accuracy
    return found


def fitted(fits: TaskSeeds, task: str) -> bool:
    """Whether some compared method fits ``task`` in distribution (mean over its seeds at least
    FITTED_IN_DISTRIBUTION): on a task none fits, every method's longer buckets are 0 for a reason that
    is not length."""
    means = [statistics.fmean(by_task[task].values()) for by_task in fits.values() if by_task.get(task)]
    return max(means, default=0.0) >= FITTED_IN_DISTRIBUTION


def common_tasks(found: TaskSeeds, fits: TaskSeeds) -> List[str]:
    """The shared tasks on which every compared method has a run (a mean over other tasks would compare
    methods on different tasks) and which some of them fits in distribution."""
    return [
        task for task in SHARED_TASKS if all(task in found.get(method, {}) for method in NAMES) and fitted(fits, task)
    ]


def seed_means(found: TaskSeeds, method: str, tasks: Sequence[str]) -> List[float]:
    """One value per seed that has a run on every task of ``tasks``: the mean accuracy over them."""
    by_task = found.get(method, {})
    seeds = set.intersection(*(set(by_task[t]) for t in tasks)) if tasks else set()
    return [statistics.fmean(by_task[t][seed] for t in tasks) for seed in sorted(seeds)]


def verdict(relation: str, reading: str) -> str:
    """What the grid says of one claim, from the reading of "left minus right" against the right's seed noise."""
    if reading not in (BETTER, WORSE, WITHIN_NOISE):
        return NO_READING
    if relation == SIMILAR:
        return REPRODUCED if reading == WITHIN_NOISE else CONTRADICTED
    return {BETTER: REPRODUCED, WORSE: CONTRADICTED}.get(reading, NOT_SEPARATED)


def claim_row(claim: Tuple[str, str, str], values: Dict[str, List[float]]) -> Tuple[List[str], str]:
    left, relation, right = claim
    difference, _, reading = compare_means(values[left], values[right], seed_std(values[right]), higher_is_better=True)
    found = verdict(relation, reading)
    cells = [
        f"{NAMES[left]} {relation} {NAMES[right]}",
        "-" if difference is None else f"{difference:+.1f}",
        reading,
        found,
    ]
    return cells, found


def section(records: Sequence[Dict]) -> List[str]:
    """The report's section: each compared method's mean accuracy at x2 over the common tasks, then each
    claim of the paper with the grid's difference, its reading and whether it reproduces."""
    found = task_seed_accuracies(records)
    tasks = common_tasks(found, task_seed_accuracies(records, IN_DISTRIBUTION))
    lines = ["", f"## Against {PAPER}", "", intro_text(tasks), ""]
    if not tasks:
        return lines
    values = {method: seed_means(found, method, tasks) for method in NAMES}
    lines += [table_row(["method", "their name", f"exact match at {BUCKET}"]), "|---|---|---|"]
    # best first; ties keep the paper's order
    for method in sorted(NAMES, key=lambda m: -statistics.fmean(values[m]) if values[m] else 0.0):
        lines.append(
            table_row(
                [
                    f"`{method}`" if method != BASELINE else BASELINE,
                    NAMES[method],
                    mean_std_cell(values[method], digits=1),
                ]
            )
        )
    lines += ["", table_row(["their claim", "difference (points)", "reading", "here"]), "|---|---|---|---|"]
    verdicts = []
    for claim in CLAIMS:
        cells, claimed = claim_row(claim, values)
        verdicts.append(claimed)
        lines.append(table_row(cells))
    lines += ["", summary_text(verdicts)]
    return lines


def intro_text(tasks: Sequence[str]) -> str:
    ordering = " > ".join(
        " ~ ".join(NAMES[m] for m in group) for group in (("nope", "t5-bias"), ("alibi",), ("rope", BASELINE))
    )
    shared = ", ".join(SHARED_TASKS)
    common: Optional[str] = ", ".join(tasks) if tasks else None
    return (
        f"{PAPER} (Figures 1-3; decoder-only, trained up to L, tested up to 2L; their APE is sinusoidal, this "
        f"grid's baseline) rank the encodings {ordering}. The tasks both have: {shared}. Compared here: the "
        f"decoder-only exact match at {BUCKET}, per seed the mean over the shared tasks every compared method has "
        f"a run of and one of them fits in distribution (at least {FITTED_IN_DISTRIBUTION:.0f}%): "
        f"{common or 'none yet'}; each claim as the difference of the left method's mean and the "
        "right's, read against the right's seed noise with the rule above. *reproduced*: a claimed lead beyond "
        "noise, or a claimed tie within it; *contradicted*: the reverse lead beyond noise, or a claimed tie "
        "beyond it; *not separated*: a claimed lead within noise; - : fewer than two seeds."
    )


def summary_text(verdicts: Sequence[str]) -> str:
    counts = {v: verdicts.count(v) for v in (REPRODUCED, CONTRADICTED, NOT_SEPARATED, NO_READING)}
    return (
        f"Of the {len(verdicts)} claims: {counts[REPRODUCED]} reproduced, {counts[CONTRADICTED]} contradicted, "
        f"{counts[NOT_SEPARATED]} not separated, {counts[NO_READING]} without a reading yet."
    )
