"""The LM extrapolation report's reading of each row that changes one model: the section
"Against the model each row changes" of ``lm_extrapolation.md``.

The long-context practice changes a model in one way each: a RoPE scaling at evaluation
(``X+yarn``) or after a short fine-tune (``X+yarn-ft``), a variant trained beside its preset
(``X+p-rope-0.25``, ``X+randomized``: ``lm_grid.VARIANTS``), or a preset that is another one
changed (Llama 4's interleaving is rope with NoPE layers: ``lm_grid.PRESET_REFERENCES``). A user
of the practice asks whether the change helps the model it is applied to by more than training
another seed would move it, so each row's perplexity at a length is read against that model's
with the rule of ``benchmarks/harness/seeds.py`` (the reference's seed std).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..harness.report import table_row
from ..harness.seeds import BETTER, NOISE_RULE, WITHIN_NOISE, WORSE, compare_means, seed_std

READINGS = (BETTER, WITHIN_NOISE, WORSE)


@dataclass(frozen=True)
class Comparison:
    """A row, the row of the model it changes, and the lengths at which the row has numbers of its
    own (a scaling's row shows its model's up to the training length, where it scales by 1)."""

    row: str
    reference: str
    lengths: Tuple[int, ...]


def reading(values: Sequence[float], reference: Sequence[float]) -> Tuple[Optional[float], str]:
    """The difference of the mean perplexities (row minus reference) and its reading against the
    reference's seed noise (lower is better)."""
    difference, _, read = compare_means(values, reference, seed_std(reference), higher_is_better=False)
    return difference, read


def readings(table: Dict, comparison: Comparison, columns: Sequence[int]) -> Dict[int, Tuple[Optional[float], str]]:
    """The comparison's :func:`reading` at each of ``columns`` where the row has numbers of its own and
    both rows have seeds."""
    own, reference = table[comparison.row]["blocks"], table[comparison.reference]["blocks"]
    return {
        n: reading(own[n], reference[n]) for n in columns if n in comparison.lengths and own.get(n) and reference.get(n)
    }


def cell(found: Optional[Tuple[Optional[float], str]]) -> str:
    if found is None:
        return "-"
    difference, read = found
    return f"{difference:+.2f} ({read})" if read != "-" else f"{difference:+.2f}"


def section(table: Dict, comparisons: Sequence[Comparison], columns: Sequence[int], trained: int) -> List[str]:
    """The table of every comparison's difference at each of ``columns`` (blocks mode), then which rows
    are better, not separated or worse at the longest column."""
    lines = ["## Against the model each row changes", "", intro_text(trained), ""]
    header = ["row", "against", *(f"N = {n} ({n // trained}x)" for n in columns)]
    lines += [table_row(header), "|" + "---|" * len(header)]
    found = {comparison: readings(table, comparison, columns) for comparison in comparisons}
    for comparison, at in found.items():
        lines.append(table_row([comparison.row, comparison.reference, *(cell(at.get(n)) for n in columns)]))
    return lines + ["", summary_text(found, columns, trained), ""]


def intro_text(trained: int) -> str:
    return (
        "Each row that changes one model (a RoPE scaling, at evaluation or after the short fine-tune; a variant "
        "trained beside its preset; Llama 4's presets, against rope and NoPE) against that model, in the blocks "
        f"mode: the difference of the mean test perplexities (row minus model; below 0 the change helps) at the "
        f"training length ({trained} tokens), the fine-tunes' length and 8x and 32x it, read against the model's "
        f"seed std ({NOISE_RULE}). A scaling's rows and its model are the same checkpoints seed for seed, so for "
        "them this reading is the cautious one. -: no numbers of the row's own at that length, or no seeds yet."
    )


def summary_text(
    found: Dict[Comparison, Dict[int, Tuple[Optional[float], str]]], columns: Sequence[int], trained: int
) -> str:
    """The rows by their reading at the longest column they have numbers of their own at."""
    by_reading: Dict[str, List[str]] = {read: [] for read in READINGS}
    for comparison, at in found.items():
        longest = max((n for n in columns if n in comparison.lengths), default=None)
        if longest in at and at[longest][1] in by_reading:
            difference, read = at[longest]
            by_reading[read].append(f"`{comparison.row}` ({difference:+.2f} at {longest // trained}x)")
    parts = [f"{read}: {', '.join(rows) if rows else 'none'}" for read, rows in by_reading.items()]
    return "At the longest length each row has: " + "; ".join(parts) + "."
