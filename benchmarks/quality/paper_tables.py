"""Nguyen et al. 2020's ablation tables laid out as in the paper, this harness's
BLEU beside the paper's, and each ordering the paper reads from them checked
against the runs here.

The paper's numbers (*Differentiable Window for Dynamic Local Attention*, ACL 2020,
Tables 2 and 3) are case-sensitive tokenized BLEU on newstest2014 En-De of
Transformer-base models trained on WMT'16, 6 layers each side, "Partial" being the
first 3; the runs here are Multi30k at the harness's budget and depth. The values
cannot be compared, only the orderings: which of AW and MW is better in a module,
whether the lower layers beat all of them, whether segments beat tokens. Each such
comparison gets a reading: the same direction as the paper, the opposite one, or
within seed noise, which is one standard error of a difference of two means whose
seeds vary as vanilla's do (``std * sqrt(1/n1 + 1/n2)``).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..harness.seeds import beyond_noise, difference_noise

PAPER = "Nguyen et al. 2020"
# the ablation table's BLEU (mt.ABLATION_METRIC); the paper gives case-sensitive tokenized BLEU
METRIC = "tokenized_bleu_compound_split"


class Cell(NamedTuple):
    config: str  # a configuration of the quality harness (default grid or ablations)
    paper_bleu: float


class PaperTable(NamedTuple):
    title: str
    label_headers: Tuple[str, ...]
    columns: Tuple[str, ...]
    rows: Tuple[Tuple[Tuple[str, ...], Tuple[Optional[Cell], ...]], ...]


class Comparison(NamedTuple):
    what: str
    first: Cell  # "first - second" is the difference shown
    second: Cell


_MODULES = (("Encoder", "enc"), ("Decoder", "dec"), ("Cross", "cross"))
# Table 2: {(method, module): (Full, Partial)}
_TABLE2 = {
    ("AW", "enc"): (27.77, 27.90),
    ("MW", "enc"): (27.25, 27.40),
    ("AW", "dec"): (27.73, 27.85),
    ("MW", "dec"): (27.88, 28.04),
    ("AW", "cross"): (27.78, 27.97),
    ("MW", "cross"): (27.58, 27.79),
}
TRANSFORMER = Cell("vanilla", 27.46)


def table2_cell(method: str, kind: str, extent: str) -> Cell:
    full, partial = _TABLE2[(method, kind)]
    return Cell(f"window-{method.lower()}-{kind}-{extent}", full if extent == "full" else partial)


TABLE2 = PaperTable(
    f"{PAPER} Table 2: AW and MW alone in one module, Full against Partial",
    ("Method", "Module"),
    ("Full", "Partial"),
    (
        (("Transformer", "-"), (TRANSFORMER, None)),
        *(
            ((method, module), (table2_cell(method, kind, "full"), table2_cell(method, kind, "partial")))
            for module, kind in _MODULES
            for method in ("AW", "MW")
        ),
    ),
)
# Cr(AW) token-based is Table 2's AW Cross Partial (27.97 in both tables)
CROSS_TOKENS = table2_cell("AW", "cross", "partial")
CROSS_SEGMENTS = Cell("window-cross-aw-seg-partial", 28.13)
ENC_DEC_TOKENS = Cell("window-enc-aw-dec-mw-partial", 28.11)
ENC_DEC_SEGMENTS = Cell("window-enc-aw-seg-dec-mw-partial", 27.91)
TABLE3 = PaperTable(
    f"{PAPER} Table 3: token- against segment-based masking, Partial (the decoder is always token-based)",
    ("Model",),
    ("Token-based", "Segment-based"),
    (
        (("Cr(AW)",), (CROSS_TOKENS, CROSS_SEGMENTS)),
        (("Enc(AW)-Dec(MW)",), (ENC_DEC_TOKENS, ENC_DEC_SEGMENTS)),
    ),
)
TABLES = (TABLE2, TABLE3)

COMPARISONS = (
    *(
        Comparison(f"AW - MW, {module}, {extent.capitalize()}", *(table2_cell(m, kind, extent) for m in ("AW", "MW")))
        for module, kind in _MODULES
        for extent in ("full", "partial")
    ),
    *(
        Comparison(f"Partial - Full, {method} {module}", *(table2_cell(method, kind, e) for e in ("partial", "full")))
        for module, kind in _MODULES
        for method in ("AW", "MW")
    ),
    Comparison("Segment - Token, Cr(AW)", CROSS_SEGMENTS, CROSS_TOKENS),
    Comparison("Segment - Token, Enc(AW)-Dec(MW)", ENC_DEC_SEGMENTS, ENC_DEC_TOKENS),
)


def configs() -> List[str]:
    """Every configuration the tables name, each once."""
    cells = [cell for table in TABLES for _, row in table.rows for cell in row if cell]
    return list(dict.fromkeys(cell.config for cell in cells))


def _mean(records: Sequence[Dict]) -> float:
    return statistics.fmean(r[METRIC] for r in records)


def _here(records: Sequence[Dict]) -> str:
    if not records:
        return "-"
    if len(records) == 1:
        return f"{_mean(records):.2f} (1)"
    return f"{_mean(records):.2f} +- {statistics.stdev(r[METRIC] for r in records):.2f} ({len(records)})"


def reading(difference: float, paper_difference: float, noise: float) -> str:
    if difference == 0:
        return "within seed noise (no difference)"
    same = (difference > 0) == (paper_difference > 0)
    if not beyond_noise(difference, noise):
        # the sign alone, over many comparisons, still says whether the paper's effects carry over
        return f"within seed noise ({'same' if same else 'opposite'} sign)"
    return "as the paper" if same else "opposite to the paper"


def read_difference(
    first: Sequence[Dict], second: Sequence[Dict], paper_difference: float, seed_std: Optional[float]
) -> str:
    """``first``'s mean minus ``second``'s, read against the sign the paper finds with
    :func:`reading` (noise: :func:`..harness.seeds.difference_noise`, ``seed_std`` times
    sqrt(1/n1 + 1/n2)); "-" without a seed std."""
    if seed_std is None:
        return "-"
    noise = difference_noise(seed_std, len(first), len(second))
    return reading(_mean(first) - _mean(second), paper_difference, noise)


def paper_table_lines(by_config: Dict[str, Sequence[Dict]], seed_std: Optional[float], layers_here: str) -> List[str]:
    """The section of the quality report: both tables and the comparisons, from the run
    records per configuration; ``seed_std`` is vanilla's std over seeds (None: fewer
    than two vanilla seeds, so no reading), ``layers_here`` says what Full and Partial
    are in the models here. Empty while no ablation of the tables has a run."""
    if not any(by_config.get(name) for name in configs() if name != TRANSFORMER.config):
        return []
    lines = [
        "",
        f"## {PAPER}'s ablation tables, here and in the paper",
        "",
        f"Tables 2 and 3 of {PAPER} as the paper lays them out: BLEU here (mean +- std (seeds)) beside the "
        "paper's newstest2014 En-De BLEU (Transformer base, 6 layers a side, Partial = the first 3; "
        f"here: {layers_here}). "
        "Data and model size differ, so only the orderings compare: each comparison below is read as the "
        "paper's direction, the opposite one, or within seed noise (one standard error of the difference, "
        "vanilla's seed std times sqrt(1/n1 + 1/n2); its sign is still shown).",
    ]
    for table in TABLES:
        header = [*table.label_headers, *(f"{c} {where}" for c in table.columns for where in ("here", "paper"))]
        lines += ["", f"{table.title}:", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for labels, cells in table.rows:
            values = []
            for cell in cells:
                values += [_here(by_config.get(cell.config, ())), f"{cell.paper_bleu:.2f}"] if cell else ["-", "-"]
            lines.append("| " + " | ".join([*labels, *values]) + " |")
    lines += [
        "",
        "| comparison | paper | here | seeds | reading |",
        "|---|---|---|---|---|",
    ]
    for comparison in COMPARISONS:
        first, second = (by_config.get(cell.config, ()) for cell in (comparison.first, comparison.second))
        paper = comparison.first.paper_bleu - comparison.second.paper_bleu
        if first and second:
            cells = [f"{_mean(first) - _mean(second):+.2f}", f"{len(first)}, {len(second)}"]
            cells.append(read_difference(first, second, paper, seed_std))
        else:
            cells = ["-", f"{len(first)}, {len(second)}", "-"]
        lines.append("| " + " | ".join([comparison.what, f"{paper:+.2f}", *cells]) + " |")
    return lines
