"""The papers' ablations as configurations of the quality harness (``--grid ablations``).

Each :class:`Ablation` is a name, the attention flags it adds to the harness's
training recipe (``benchmarks/quality/mt.py``: the plugin's
``distattn_transformer_iwslt_de_en`` with the shared sizes and schedule) and a
note saying which paper table or section it reproduces. Absolute position
embeddings follow the reference configuration of the default grid: DA replaces
them (``--no-token-positional-embeddings`` is part of its flags, as for the grid's
``da``), QVI and the window keep them.

- Wu et al. 2021 (DA) sec. 4.3, Fig. 4: the mapping f (``--da-mapping``), with
  the paper's early-multiply adjustment; sec. 4.4, Fig. 5: the adjustment
  (``--da-adjusting``), with the paper's learnable sigmoid. The paper's own
  choice is the default grid's ``da``.
- Wu et al. (QVI) sec. 4.3, Fig. 2: g(Q, V) (``--qvi-interaction``); the gated
  g is the default grid's ``qvi``.
- Nguyen et al. 2020 (DW) Table 2: AW or MW alone in encoder self-, decoder
  self- or cross-attention, in every layer ("full") or the lower half
  ("partial": the paper's first 3 of 6 layers); Table 3: token- vs
  segment-based masking for Cr(AW) and Enc(AW)-Dec(MW), partial. Their Table 1
  best, Enc(AW)-Cr(AW,Seg)-Dec(MW), is the default grid's ``window``.
- Chi et al. 2022 (KERPLE): r1, r2 per layer (``--kerple-per-layer``, the
  plugin's kerple up to revision f2ecd07) against the authors' code's one pair
  per head shared by a stack's layers, the default grid's ``kerple``.

Layer ranges depend on the model depth, so :func:`ablations` takes it; the
names do not (:data:`ABLATION_NAMES`). ``python -m benchmarks.quality.ablations
[--layers N]`` prints them, one tab-separated line each: name, flags, note
(examples/ablations/README.md lists them as command lines).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from fairseq_distattn.functional.distance_aware import DA_ADJUSTINGS, DA_MAPPINGS
from fairseq_distattn.functional.query_value_interaction import QVI_INTERACTIONS


class Ablation(NamedTuple):
    name: str
    train_args: Tuple[str, ...]  # attention flags added to the harness's recipe
    note: str
    reference: str  # the default grid's configuration holding the paper's own choice


# the default grid's configurations that hold the papers' own choices: each
# ablation is read against one of these (and all against vanilla)
REFERENCE_CONFIGS = ("vanilla", "da", "qvi", "window", "kerple")

DA_PAPER = "Wu et al. 2021"
QVI_PAPER = "Wu et al. (QVI)"
DW_PAPER = "Nguyen et al. 2020"
KERPLE_PAPER = "Chi et al. 2022"

# as the default grid's "da": every self-attention layer, no absolute positions
_DA = ("--encoder-self-attention", "da", "--decoder-self-attention", "da", "--no-token-positional-embeddings")
_QVI = ("--encoder-self-attention", "qvi", "--decoder-self-attention", "qvi")
# as the default grid's "kerple"
_KERPLE = (
    "--encoder-self-attention",
    "kerple",
    "--decoder-self-attention",
    "kerple",
    "--no-token-positional-embeddings",
)
_KIND_FLAGS = {"enc": "--encoder-self-attention", "dec": "--decoder-self-attention", "cross": "--cross-attention"}
_KIND_NAMES = {"enc": "encoder self-attention", "dec": "decoder self-attention", "cross": "cross-attention"}


def partial_layers(num_layers: int) -> str:
    """The SPEC layer suffix of the lower half of ``num_layers`` layers (at least
    layer 0): the paper's "first 3 layers" of 6."""
    last = max(1, num_layers // 2) - 1
    return f"@0-{last}" if last else "@0"


def da_ablations() -> List[Ablation]:
    mappings = [
        Ablation(
            f"da-map-{mapping}",
            (*_DA, "--da-mapping", mapping),
            f"{DA_PAPER} sec. 4.3 / Fig. 4: f = {mapping}, early multiply; read against da (learnable sigmoid)",
            "da",
        )
        for mapping in DA_MAPPINGS
        if mapping != "learnable-sigmoid"
    ]
    adjustings = [
        Ablation(
            f"da-adjust-{adjusting}",
            (*_DA, "--da-adjusting", adjusting),
            f"{DA_PAPER} sec. 4.4 / Fig. 5: {adjusting.replace('-', ' ')}, learnable sigmoid; "
            "read against da (early multiply)",
            "da",
        )
        for adjusting in DA_ADJUSTINGS
        if adjusting != "early-multiply"
    ]
    return mappings + adjustings


def qvi_ablations() -> List[Ablation]:
    return [
        Ablation(
            f"qvi-{interaction}",
            (*_QVI, "--qvi-interaction", interaction),
            f"{QVI_PAPER} sec. 4.3 / Fig. 2: g = {interaction}; read against qvi (gated)",
            "qvi",
        )
        for interaction in QVI_INTERACTIONS
        if interaction != "gated"
    ]


def kerple_ablations() -> List[Ablation]:
    return [
        Ablation(
            "kerple-per-layer",
            (*_KERPLE, "--kerple-per-layer"),
            f"{KERPLE_PAPER}: r1, r2 per layer (the plugin's kerple up to f2ecd07); read against kerple (one pair "
            "per head shared by the layers, as the authors' code builds it)",
            "kerple",
        )
    ]


def window_extents(num_layers: int) -> Dict[str, Tuple[str, str]]:
    """``{"full" | "partial": (its SPEC layer suffix, the layers in words)}`` for
    ``num_layers`` layers: the paper's Full (every layer) and Partial (the lower half)."""
    partial = partial_layers(num_layers)
    partial_where = f"layer {partial[1:]}" if "-" not in partial else f"layers {partial[1:]}"
    return {"full": ("", f"all {num_layers} layers"), "partial": (partial, partial_where)}


def window_ablations(num_layers: int) -> List[Ablation]:
    extents = window_extents(num_layers)
    partial = extents["partial"][0]
    table2 = [
        Ablation(
            f"window-{method}-{kind}-{extent}",
            (_KIND_FLAGS[kind], f"window-{method}{suffix}"),
            f"{DW_PAPER} Table 2: {method.upper()} in {_KIND_NAMES[kind]} only, {where} "
            f"({'Full' if extent == 'full' else 'Partial'}), token-based",
            "window",
        )
        for method in ("aw", "mw")
        for kind in ("enc", "dec", "cross")
        for extent, (suffix, where) in extents.items()
    ]
    where = extents["partial"][1]
    table3 = [
        # Cr(AW) token-based is Table 2's window-aw-cross-partial
        Ablation(
            "window-cross-aw-seg-partial",
            ("--cross-attention", f"window-aw-seg{partial}"),
            f"{DW_PAPER} Table 3 (and Table 1 Cr(AW,Seg)): Cr(AW) segment-based, {where}; "
            "token-based is window-aw-cross-partial",
            "window",
        ),
        Ablation(
            "window-enc-aw-dec-mw-partial",
            ("--encoder-self-attention", f"window-aw{partial}", "--decoder-self-attention", f"window-mw{partial}"),
            f"{DW_PAPER} Table 3 (and Table 1): Enc(AW)-Dec(MW) token-based, {where}",
            "window",
        ),
        Ablation(
            "window-enc-aw-seg-dec-mw-partial",
            ("--encoder-self-attention", f"window-aw-seg{partial}", "--decoder-self-attention", f"window-mw{partial}"),
            f"{DW_PAPER} Table 3: Enc(AW)-Dec(MW) segment-based in the encoder (the decoder is always "
            f"token-based), {where}",
            "window",
        ),
    ]
    return table2 + table3


def ablations(num_layers: int) -> List[Ablation]:
    """Every ablation for a model with ``num_layers`` encoder and decoder layers."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return [*da_ablations(), *qvi_ablations(), *window_ablations(num_layers), *kerple_ablations()]


ABLATION_NAMES = tuple(ablation.name for ablation in ablations(6))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.ablations",
        description="Print the papers' ablations, one line each: name, attention flags, note (tab-separated).",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=6,
        help="encoder and decoder layers of the model (default: 6, the papers' Transformer base)",
    )
    args = parser.parse_args(argv)
    if args.layers < 1:
        parser.error(f"argument --layers: invalid value {args.layers}: must be >= 1")
    for ablation in ablations(args.layers):
        print("\t".join([ablation.name, shlex.join(ablation.train_args), ablation.note]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
