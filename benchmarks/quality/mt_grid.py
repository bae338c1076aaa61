"""What the translation harness (``benchmarks.quality.mt``) trains, and on what.

The grids' configurations (the default grid derives from the registry, plus the
papers' special configurations; ``--grid ablations`` holds the papers' ablations),
the model scales and training precisions, the Multi30k data and its test set, and
where runs and results go. The harness, its report and the harnesses that read its
runs (``mt_extrapolation``, ``methods``) take these from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..common import REPO_ROOT, text_lines

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "quality"
DEFAULT_WORK = REPO_ROOT / "work" / "quality"


@dataclass(frozen=True)
class QualityConfig:
    """One model of the grid: attention flags on top of the shared recipe."""

    name: str
    attention: Tuple[str, ...]
    absolute_positions: bool
    note: str

    def arch_args(self) -> List[str]:
        if not self.attention and self.absolute_positions:
            # the baseline is fairseq's own model, not the plugin's with vanilla layers
            return ["--arch", "transformer_iwslt_de_en"]
        positions = [] if self.absolute_positions else ["--no-token-positional-embeddings"]
        return ["--arch", "distattn_transformer_iwslt_de_en", *self.attention, *positions]


def both_self(mechanism: str) -> Tuple[str, ...]:
    return ("--encoder-self-attention", mechanism, "--decoder-self-attention", mechanism)


WINDOW_PAPER = (
    "--encoder-self-attention",
    "window-aw@0-2",
    "--decoder-self-attention",
    "window-mw@0-2",
    "--cross-attention",
    "window-aw-seg@0-2",
)
BASELINE = QualityConfig("vanilla", (), True, "fairseq transformer_iwslt_de_en, sinusoidal positions")
# The papers' special configurations, each listed after the mechanism it belongs to (for a
# mechanism its papers place in named layers, papers_place_it: after its family, MechanismInfo.family).
PAPER_CONFIGS = {
    "rpr": (QualityConfig("rpr+abs", both_self("rpr"), True, "rpr with sinusoidal positions kept"),),
    "da": (QualityConfig("da+abs", both_self("da"), True, "da with sinusoidal positions kept"),),
    "window": (
        QualityConfig(
            "window",
            WINDOW_PAPER,
            True,
            "Nguyen et al.'s best: Enc AW, Dec MW, Cross AW-seg (b = 5) in layers 0-2, positions kept",
        ),
        # the paper's configuration one attention kind at a time (its Table 2 reading, at this depth)
        QualityConfig("window-enc-only", WINDOW_PAPER[:2], True, "the window configuration's encoder AW@0-2 alone"),
        QualityConfig("window-dec-only", WINDOW_PAPER[2:4], True, "the window configuration's decoder MW@0-2 alone"),
        QualityConfig("window-cross-only", WINDOW_PAPER[4:], True, "the window configuration's cross AW-seg@0-2 alone"),
        QualityConfig(
            "window-expected-mask",
            (*WINDOW_PAPER, "--window-expected-mask"),
            True,
            "the window configuration with M = E[window indicator] in [0, 1] (departs from eq. 9: l = r counted once)",
        ),
        QualityConfig(
            "window-mw",
            (*both_self("window-mw"), "--cross-attention", "window-mw"),
            True,
            "MW in every layer of all three kinds",
        ),
    ),
    "distance-mask": (
        QualityConfig(
            "distance-mask-noabs", both_self("distance-mask"), False, "distance-mask without position embeddings"
        ),
    ),
    # decoder-only mechanisms: the encoder takes the position method each one extends (selective attention,
    # which encodes no position, a vanilla encoder with the sinusoidal positions)
    "xpos": (
        QualityConfig(
            "xpos",
            ("--encoder-self-attention", "rope", "--decoder-self-attention", "xpos"),
            False,
            "Sun et al. 2023: xPos in decoder self-attention, rope in the encoder (xPos is RoPE with a decay, "
            "which a bidirectional encoder cannot take), no position embeddings",
        ),
    ),
    "cope": (
        QualityConfig(
            "cope",
            ("--encoder-self-attention", "rpr", "--no-relative-values", "--decoder-self-attention", "cope"),
            False,
            "Golovneva et al. 2024: CoPE in decoder self-attention, rpr keys-only in the encoder (the relative PE "
            "CoPE generalises: with every gate at 1 its positions count i - j + 1), no position embeddings",
        ),
    ),
    "stick-breaking": (
        QualityConfig(
            "stick-breaking",
            ("--encoder-self-attention", "alibi", "--decoder-self-attention", "stick-breaking"),
            False,
            "Tan et al. 2024: stick-breaking in decoder self-attention (the authors define no bidirectional form), "
            "alibi in the encoder (the log of a stick-breaking weight sums log(1 - beta) over the keys between key "
            "and query: a recency bias, which ALiBi fixes and stick-breaking learns per token), no position embeddings",
        ),
    ),
    "path": (
        QualityConfig(
            "path",
            ("--encoder-self-attention", "rope", "--decoder-self-attention", "path"),
            False,
            "Yang et al. 2025: PaTH in decoder self-attention (the authors define no bidirectional form), rope in "
            "the encoder (PaTH accumulates data-dependent Householder transforms where RoPE applies fixed rotations), "
            "no position embeddings",
        ),
    ),
    "selective": (
        QualityConfig(
            "selective",
            ("--decoder-self-attention", "selective"),
            True,
            "Leviathan et al. 2024: selective attention in decoder self-attention (the authors define no "
            "bidirectional form), a vanilla encoder, sinusoidal positions kept (selective attention masks by "
            "content and encodes no position)",
        ),
    ),
}


def derived_config(info) -> Optional[QualityConfig]:
    """A registered mechanism in every encoder and decoder self-attention layer, without
    the position embeddings it replaces (kept where its papers keep them); None for
    one that does not apply to both."""
    from fairseq_distattn.registry import DECODER_SELF_KIND, ENCODER_SELF_KIND

    if not {ENCODER_SELF_KIND, DECODER_SELF_KIND} <= info.kinds:
        return None
    positions = "positions kept" if info.keeps_position_embeddings else "no position embeddings"
    paper = info.paper.split(", *")[0]
    return QualityConfig(
        info.name,
        both_self(info.name),
        info.keeps_position_embeddings,
        f"{paper}: {info.name} in every self-attention layer, {positions}",
    )


def default_configs() -> Dict[str, QualityConfig]:
    """The default grid: vanilla, then per registered mechanism (the papers' order) its
    derived configuration and its papers' special ones (:data:`PAPER_CONFIGS`; a
    special one of the mechanism's own name replaces the derived one)."""
    import fairseq_distattn.mechanisms  # noqa: F401  discovers the registry
    from fairseq_distattn.registry import registered

    configs = {BASELINE.name: BASELINE}
    for info in registered():
        if info.papers_place_it:  # the papers' layer choices are its configurations: none derived
            candidates = PAPER_CONFIGS[info.family]
        else:
            special = PAPER_CONFIGS.get(info.name, ())
            derived = derived_config(info)
            own_name = derived is not None and any(config.name == derived.name for config in special)
            candidates = (() if derived is None or own_name else (derived,)) + special
        for config in candidates:
            configs.setdefault(config.name, config)
    return configs


GRIDS = ("default", "ablations")


def ablation_configs(layers: int) -> Dict[str, QualityConfig]:
    """The papers' ablations (:mod:`.ablations`) for a model of ``layers``
    encoder and decoder layers; the DA ones drop the position embeddings as the
    default grid's ``da`` does."""
    from .ablations import ablations  # imports fairseq_distattn: only for this grid

    configs = {}
    for ablation in ablations(layers):
        flags = tuple(flag for flag in ablation.train_args if flag != "--no-token-positional-embeddings")
        configs[ablation.name] = QualityConfig(
            ablation.name, flags, len(flags) == len(ablation.train_args), ablation.note
        )
    return configs


def grid_configs(grid: str, layers: int) -> Dict[str, QualityConfig]:
    """Every configuration a grid can run (``--configs`` picks from these)."""
    return default_configs() if grid == "default" else ablation_configs(layers)


# Model size and budget. small: the quickstart's CPU model; base: IWSLT-size for a GPU.
SCALES = {
    "tiny": dict(layers=3, dim=16, ffn=32, heads=2, updates=6, max_tokens=512, merges=None),  # a smoke test
    "small": dict(layers=3, dim=256, ffn=512, heads=4, updates=2000, max_tokens=2048, merges=6000),
    "base": dict(layers=6, dim=512, ffn=1024, heads=4, updates=20000, max_tokens=4096, merges=10000),
}
# Training precision on a GPU, as (fairseq-train flags, environment). fairseq 0.12's --bf16
# implies --tpu, so it is not offered; amp is fairseq's --amp (fp16 autocast, loss scaling);
# tf32 keeps fp32 weights and activations and lets cuBLAS matmuls use TF32 tensor cores.
PRECISION = {
    "fp32": ([], {}),
    "tf32": ([], {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}),
    "amp": (["--amp"], {}),
}
CHECKPOINTS_AVERAGED = 5


TARGET_LANG = "de"
TEST_SET = "test_2016_flickr"


def default_data() -> Path:
    """The Multi30k folder the harness trains on: ``../shared/data/multi30k`` where it is,
    else the sample shipped in ``data/multi30k``."""
    shared = REPO_ROOT.parent / "shared" / "data" / "multi30k"
    return shared if (shared / "train.en").is_file() else REPO_ROOT / "data" / "multi30k"


def raw_references(data: Optional[Path] = None) -> List[str]:
    """The raw target side of the test set (``test_2016_flickr.de`` or its ``.gz``), the
    references sacreBLEU scores the kept hypotheses against (``quickstart.sh``'s
    ``test.raw.de``)."""
    return text_lines(data or default_data(), f"{TEST_SET}.{TARGET_LANG}")


def ablation_references() -> Dict[str, str]:
    """``{ablation: the default grid's configuration it is read against}``."""
    from .ablations import ablations  # imports fairseq_distattn: only when ablations ran

    return {ablation.name: ablation.reference for ablation in ablations(6)}  # neither depends on the depth
