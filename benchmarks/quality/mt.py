"""Translation quality on Multi30k En-De: ``python -m benchmarks.quality.mt``.

Trains every configuration of a grid on Multi30k En-De with the quickstart's
preprocessing and recipe (same model size, updates and lr schedule for all),
averages the last 5 update checkpoints, translates test_2016_flickr with beam 5
(``--required-batch-size-multiple 1``), scores tokenised BLEU (with compound
splitting, the papers' En-De metric) and sacreBLEU, and measures validation
perplexity of the averaged model with ``fairseq-validate``.

Each run writes one JSON file, ``<out>/runs/<config>-seed<seed>.json``, and
keeps its detokenised test translations beside it (``<config>-seed<seed>.hyp.gz``,
for the paired bootstrap of ``benchmarks.quality.methods``); a run whose file
exists is skipped, and an interrupted run resumes from its ``checkpoint_last.pt``
under ``--work``, so the grid can be spread over several sessions. ``--report``
(and the end of every invocation) rebuilds ``<out>/quality.md`` (mean +- std per
config, delta vs vanilla) and ``<out>/valid_loss.png`` from whatever JSON files exist.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_distattn.tools.generated_blocks import update_pages
from fairseq_distattn.tools.translation_scoring import read_text

from ..common import (
    REPO_ROOT,
    add_run_arguments,
    at_least,
    check_same_budget,
    comma_separated_ints,
    comma_separated_names,
    device_model,
    git_revision,
    scale_results,
    text_lines,
)
from ..harness.claims import claimed, file_version, train_unless_taken
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.process import BIN_DIR, log, run, tool, tool_env
from ..harness.report import movement_table, pending_lines, plot_curves, table_row
from ..harness.runs import hypotheses_file, load_runs, runs_by_config, save_lines
from ..harness.seeds import mean_std, mean_std_text, seed_std, seeds_cell
from ..harness.training import (
    backfill_mechanism_parameters,
    mechanism_parameters,
    optimizer_args,
    training_wall_seconds,
)
from .paper_tables import paper_table_lines, read_difference

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
# The papers' special configurations, each listed after the mechanism (or the family of
# SPECIAL_FAMILIES, the name before its first "-") it belongs to.
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
    # decoder-only mechanisms: the encoder takes the mechanism each one extends
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
}


SPECIAL_FAMILIES = ("window",)  # the paper's layer choices are the configurations: none derived


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
        family = info.name.split("-")[0]
        if family in SPECIAL_FAMILIES:
            candidates = PAPER_CONFIGS[family]
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
# an update checkpoint every 1/20 of training: the 5 averaged span its last quarter
CHECKPOINT_FRACTION = 20


def translation_args(data_bin: Path, model: Optional[Path] = None) -> List[object]:
    """The data, plugin and language-pair arguments every fairseq tool of the
    En-De recipe takes (and ``--path`` for the tools that load a model)."""
    args: List[object] = [
        data_bin,
        "--user-dir",
        "fairseq_distattn",
        "--task",
        "translation",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
    ]
    return args + (["--path", model] if model is not None else [])


def score_translation(generated: Path, test_prefix: Path, out_dir: Path, log_path: Path, env: Dict[str, str]) -> Dict:
    """Score fairseq-generate output against ``{test_prefix}.raw.de`` with
    ``scripts/evaluate.py`` (tokenised BLEU and sacreBLEU); returns its bleu.json."""
    run(
        [
            sys.executable,
            REPO_ROOT / "scripts" / "evaluate.py",
            "score",
            generated,
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--segmentation",
            "subword_nmt",
            "--src-raw",
            f"{test_prefix}.raw.en",
            "--ref-raw",
            f"{test_prefix}.raw.de",
            "--ref-tok",
            f"{test_prefix}.tok.de",
            "--output-dir",
            out_dir,
        ],
        log_path,
        env,
    )
    return json.loads((out_dir / "bleu.json").read_text(encoding="utf-8"))


def prepare(data: Path, work: Path, merges: int, env: Dict[str, str]) -> Tuple[Path, Path]:
    """The quickstart's steps 1-3 (sacremoses, joint BPE, fairseq-preprocess) into ``work``."""
    env = {
        **env,
        "WORK": str(work),
        "DATA": str(data),
        "MERGES": str(merges),
        "PREPARE_ONLY": "1",
        "PATH": f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}",
    }
    work.mkdir(parents=True, exist_ok=True)
    run(["bash", REPO_ROOT / "scripts" / "quickstart.sh"], work / "prepare.log", env)
    return work / "prep", work / "data-bin"


VALID_LINE = re.compile(
    r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \| ppl ([\d.]+).*?"
    r"\| num_updates (\d+)"
)


def validation_curve(train_log: str) -> List[Dict[str, float]]:
    """(updates, loss, nll_loss, ppl) of every validation in a fairseq-train log, by update."""
    points = {}
    for match in VALID_LINE.finditer(train_log):
        loss, nll_loss, ppl, updates = match.groups()
        points[int(updates)] = {
            "updates": int(updates),
            "loss": float(loss),
            "nll_loss": float(nll_loss),
            "ppl": float(ppl),
        }
    return [points[u] for u in sorted(points)]


def train_args(
    config: QualityConfig, scale: Dict, seed: int, data_bin: Path, save_dir: Path, precision: str = "fp32"
) -> List[object]:
    """The fairseq-train command of one run: the same recipe for every config, trained
    in ``precision`` (a key of PRECISION; its environment is the caller's to set)."""
    updates = scale["updates"]
    save_every = max(1, updates // CHECKPOINT_FRACTION)
    return [
        tool("fairseq-train"),
        *translation_args(data_bin),
        *config.arch_args(),
        "--encoder-layers",
        scale["layers"],
        "--decoder-layers",
        scale["layers"],
        "--encoder-embed-dim",
        scale["dim"],
        "--decoder-embed-dim",
        scale["dim"],
        "--encoder-ffn-embed-dim",
        scale["ffn"],
        "--decoder-ffn-embed-dim",
        scale["ffn"],
        "--encoder-attention-heads",
        scale["heads"],
        "--decoder-attention-heads",
        scale["heads"],
        "--share-all-embeddings",
        "--dropout",
        "0.1",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        *optimizer_args(updates),
        "--max-tokens",
        scale["max_tokens"],
        "--max-update",
        updates,
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--save-interval-updates",
        save_every,
        "--keep-interval-updates",
        CHECKPOINTS_AVERAGED,
        "--validate-interval-updates",
        save_every,
        "--required-batch-size-multiple",
        "1",
        "--seed",
        seed,
        "--num-workers",
        "0",
        "--log-format",
        "simple",
        "--log-interval",
        "50",
        *PRECISION[precision][0],
    ]


def average_last_checkpoints(checkpoints: Path, averaged: Path, log_path: Path, env: Dict[str, str]) -> None:
    """Write to ``averaged`` the mean of the last CHECKPOINTS_AVERAGED update checkpoints
    in ``checkpoints``: the model every evaluation of the run is of."""
    run(
        [
            sys.executable,
            REPO_ROOT / "scripts" / "average_checkpoints.py",
            "--inputs",
            checkpoints,
            "--num-update-checkpoints",
            CHECKPOINTS_AVERAGED,
            "--output",
            averaged,
        ],
        log_path,
        env,
    )


def translate_test_set(
    data_bin: Path,
    model: Path,
    generated: Path,
    log_path: Path,
    env: Dict[str, str],
    batch_size: int = 64,
    extra: Sequence[str] = (),
) -> None:
    """fairseq-generate's beam-5 translation of the test split into ``generated``
    (``extra``: more fairseq-generate flags, e.g. a longer ``--max-len-a``)."""
    run(
        [
            tool("fairseq-generate"),
            *translation_args(data_bin, model),
            "--gen-subset",
            "test",
            "--beam",
            "5",
            "--remove-bpe",
            "--batch-size",
            batch_size,
            "--required-batch-size-multiple",
            "1",
            *extra,
            "--num-workers",
            "0",
        ],
        log_path,
        env,
        stdout_path=generated,
    )


VALIDATION = re.compile(r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \| ppl ([\d.]+)")


def validation_loss_ppl(
    data_bin: Path, model: Path, max_tokens: int, log_path: Path, env: Dict[str, str]
) -> Tuple[float, float]:
    """The loss and perplexity of ``model`` on the valid split, by fairseq-validate."""
    run(
        [
            tool("fairseq-validate"),
            *translation_args(data_bin, model),
            "--valid-subset",
            "valid",
            "--max-tokens",
            max_tokens,
            "--required-batch-size-multiple",
            "1",
            "--num-workers",
            "0",
        ],
        log_path,
        env,
    )
    # the last validation in the log is this run's, not an interrupted earlier attempt's
    valid = VALIDATION.findall(log_path.read_text(encoding="utf-8"))
    if not valid:
        raise RuntimeError(f"fairseq-validate printed no loss; see {log_path}")
    valid_loss, _, valid_ppl = valid[-1]
    return float(valid_loss), float(valid_ppl)


def train_run(
    config: QualityConfig,
    seed: int,
    scale: Dict,
    prep: Path,
    data_bin: Path,
    run_dir: Path,
    env: Dict[str, str],
    precision: str = "fp32",
) -> Dict[str, object]:
    """Train, average, translate, score and validate one run; returns its record.
    ``precision`` (a key of PRECISION) is training's; the averaged model is evaluated
    in fp32 either way."""
    checkpoints = run_dir / "checkpoints"
    train_log = run_dir / "train.log"
    started = time.time()
    precision_env = PRECISION[precision][1]
    run(train_args(config, scale, seed, data_bin, checkpoints, precision), train_log, {**env, **precision_env})
    log_text = train_log.read_text(encoding="utf-8")
    train_wall = training_wall_seconds(log_text) or time.time() - started
    curve = validation_curve(log_text)

    averaged = run_dir / "averaged.pt"
    eval_log = run_dir / "eval.log"
    average_last_checkpoints(checkpoints, averaged, eval_log, env)
    generated = run_dir / "generate-test.txt"
    translate_test_set(data_bin, averaged, generated, eval_log, env)
    bleu = score_translation(generated, prep / "test", run_dir / "eval", eval_log, env)
    valid_loss, valid_ppl = validation_loss_ppl(data_bin, averaged, scale["max_tokens"], eval_log, env)
    moved = mechanism_parameters(averaged, data_bin, eval_log, env)
    # the averaged model is kept (for the extrapolation and inspection tools); the
    # training checkpoints with their optimizer state are several times its size
    shutil.rmtree(checkpoints)
    return {
        "config": config.name,
        "note": config.note,
        "train_args": config.arch_args(),
        "seed": seed,
        "updates": scale["updates"],
        "train_wall_s": round(train_wall, 1),
        "wall_s": round(time.time() - started, 1),
        "valid_curve": curve,
        "test_set": "Multi30k test_2016_flickr en-de",
        "test_sentences": bleu["sentences"],
        "tokenized_bleu_compound_split": bleu["tokenized_bleu_compound_split"],
        "tokenized_bleu": bleu["tokenized_bleu"],
        "sacrebleu": bleu["sacrebleu"],
        "sacrebleu_signature": bleu["sacrebleu_signature"],
        "averaged_checkpoints": CHECKPOINTS_AVERAGED,
        # which model every later evaluation of this run must be from (benchmarks.quality.mt_extrapolation)
        "checkpoint_sha256": checkpoint_fingerprint(averaged),
        "valid_loss_averaged": valid_loss,
        "valid_ppl_averaged": valid_ppl,
        "mechanism_parameters": moved,
    }


TARGET_LANG = "de"
TEST_SET = "test_2016_flickr"


def keep_hypotheses(run_dir: Path, run_file: Path) -> None:
    """The run's detokenised test hypotheses, what sacreBLEU scored (``scripts/evaluate.py``'s
    ``eval/hyp.detok.de``), gzipped beside its run file (:func:`..harness.runs.hypotheses_file`):
    the paired bootstrap of ``benchmarks.quality.methods`` reads them once the model is gone.
    A run that scored none leaves no file, not an earlier model's."""
    scored = run_dir / "eval" / f"hyp.detok.{TARGET_LANG}"
    kept = hypotheses_file(run_file)
    if scored.is_file():
        save_lines(kept, read_text(scored))
    else:
        kept.unlink(missing_ok=True)


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


# ------------------------------------------------------------------ report

VALID_LOSS_LABEL = "validation loss (label-smoothed, base 2)"
VALID_LOSS_TITLE = "Multi30k En-De validation loss, one line per seed"


def ablation_references() -> Dict[str, str]:
    """``{ablation: the default grid's configuration it is read against}``."""
    from .ablations import ablations  # imports fairseq_distattn: only when ablations ran

    return {ablation.name: ablation.reference for ablation in ablations(6)}  # neither depends on the depth


def mean_cell(records: Sequence[Dict], metric: str) -> str:
    return mean_std_text([r[metric] for r in records])


def delta_cell(records: Sequence[Dict], against: Optional[Sequence[Dict]], metric: str) -> str:
    if not against:
        return "-"
    return f"{mean_std([r[metric] for r in records])[0] - mean_std([r[metric] for r in against])[0]:+.2f}"


def report(out: Path) -> str:
    """Rebuild ``quality.md``, ``valid_loss.png`` and, once ablations ran,
    ``valid_loss_ablations.png`` from the run files; returns the markdown."""
    runs = load_runs(out)
    by_config = runs_by_config(runs)
    configs = default_configs()
    references = ablation_references() if set(by_config) - set(configs) else {}
    order = [name for name in configs if name in by_config] + sorted(set(by_config) - set(configs) - set(references))
    ablation_order = [name for name in references if name in by_config]
    baseline = by_config.get("vanilla")
    lines = [
        "| config | runs (seeds) | BLEU tok+compound | delta vs vanilla | sacreBLEU | delta vs vanilla | valid ppl "
        "| what |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in order:
        records = by_config[name]
        against = baseline if name != "vanilla" else None
        lines.append(
            table_row(
                [
                    name,
                    seeds_cell(records),
                    mean_cell(records, "tokenized_bleu_compound_split"),
                    delta_cell(records, against, "tokenized_bleu_compound_split"),
                    mean_cell(records, "sacrebleu"),
                    delta_cell(records, against, "sacrebleu"),
                    mean_cell(records, "valid_ppl_averaged"),
                    records[0]["note"],
                ]
            )
        )
    budgets = sorted({(r["updates"], r.get("scale", "?"), r.get("precision", "fp32")) for r in runs})
    # the machine and threads; how many runs shared it varied, so it is not claimed
    machines = sorted({re.sub(r", \d+ runs? at a time$", "", r.get("machine", "?")) for r in runs})
    header = [
        "# Model quality on Multi30k En-De (generated by `python -m benchmarks.quality.mt --report`)",
        "",
        f"Budget: {', '.join(f'{u} updates (scale {s}, {p} training)' for u, s, p in budgets) or 'no runs yet'}; "
        f"machine: {'; '.join(machines) or '-'}. Test set: test_2016_flickr "
        f"({', '.join(str(n) for n in sorted({r['test_sentences'] for r in runs})) or '-'} sentences), "
        f"average of the last {CHECKPOINTS_AVERAGED} update checkpoints, beam 5. Mean +- sample std over seeds "
        "(a single number: one seed so far).",
        "",
    ]
    grid = {name: config.note for name, config in configs.items()}
    sections = header + lines + pending_lines(by_config, grid)
    sections += ablation_table(by_config, ablation_order, references)
    if ablation_order:
        sections += window_paper_tables(by_config, runs)
    sections += movement_table(by_config, order + ablation_order)
    markdown = "\n".join(sections) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.md").write_text(markdown, encoding="utf-8")
    if order:
        plot_curves(by_config, order, out / "valid_loss.png", ylabel=VALID_LOSS_LABEL, title=VALID_LOSS_TITLE)
    if ablation_order:
        # each ablation beside the configuration it is read against, dashed
        compared = [name for name in dict.fromkeys(references[n] for n in ablation_order) if name in by_config]
        plot_curves(
            by_config,
            compared + ablation_order,
            out / "valid_loss_ablations.png",
            ylabel=VALID_LOSS_LABEL,
            title="Multi30k En-De validation loss: the papers' ablations (dashed: the papers' own choices)",
            dashed=lambda name, record: name in compared,
        )
    if out.resolve() == DEFAULT_OUT.resolve():
        update_pages(out / "quality.md")
    return markdown


def ablation_table(by_config: Dict[str, List[Dict]], order: Sequence[str], references: Dict[str, str]) -> List[str]:
    """The ``--grid ablations`` runs, each against the default grid's configuration
    holding its paper's own choice (and vanilla), with the ablations not run yet."""
    if not order:
        return []
    baseline = by_config.get("vanilla")
    lines = [
        "",
        "## The papers' ablations (`--grid ablations`)",
        "",
        "Same budget and recipe; each row is read against the configuration of the table above that holds its "
        "paper's own choice (da: learnable sigmoid, early multiply; qvi: gated; window: the paper's best "
        "Enc(AW)-Cr(AW,Seg)-Dec(MW)). A delta shows - while that configuration has no run. Each paper finds "
        "its own choice better than each of these (Wu et al. 2021 Figs. 4 and 5, Wu et al. (QVI) Fig. 2, "
        "Nguyen et al. 2020 Table 1's 28.25 BLEU against at most 28.13 in its Tables 2 and 3): *reading* says "
        "whether the delta vs it agrees (below zero by more than seed noise), disagrees, or is within seed "
        "noise, one standard error of the difference (vanilla's seed std times sqrt(1/n1 + 1/n2)).",
        "",
        "| ablation | runs (seeds) | BLEU tok+compound | read against | delta vs it | reading | delta vs vanilla "
        "| sacreBLEU | valid ppl | what |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    spread = vanilla_spread(by_config)
    tally: Dict[str, Dict[str, int]] = {}  # {reference: {reading: ablations}}
    for name in order:
        records = by_config[name]
        metric = ABLATION_METRIC
        against = by_config.get(references[name])
        verdict = paper_reading(records, against, spread)
        if verdict != "-":
            counts = tally.setdefault(references[name], {})
            counts[verdict] = counts.get(verdict, 0) + 1
        lines.append(
            table_row(
                [
                    name,
                    seeds_cell(records),
                    mean_cell(records, metric),
                    references[name],
                    delta_cell(records, against, metric),
                    verdict,
                    delta_cell(records, baseline, metric),
                    mean_cell(records, "sacrebleu"),
                    mean_cell(records, "valid_ppl_averaged"),
                    records[0]["note"],
                ]
            )
        )
    if tally:
        summary = "; ".join(
            f"{reference}: " + ", ".join(f"{n} {verdict}" for verdict, n in sorted(readings.items()))
            for reference, readings in tally.items()
        )
        lines += ["", f"Readings against the paper's choice, per paper: {summary}."]
    missing = [name for name in references if name not in by_config]
    if missing:
        lines += ["", f"Not run yet ({len(missing)} of {len(references)}): {', '.join(missing)}."]
    undecided = undecided_ablations(by_config, references)
    if undecided:
        spread = seed_noise(baseline)
        lines += [
            "",
            f"One seed within one vanilla std ({spread:.2f} BLEU over {len(baseline)} seeds) of the configuration "
            f"it is read against, so a second seed decides it ({len(undecided)}; "
            "`python -m benchmarks.quality.mt --grid ablations --undecided --seeds 2`): "
            f"{', '.join(undecided)}.",
        ]
    return lines


ABLATION_METRIC = "tokenized_bleu_compound_split"


def paper_reading(records: Sequence[Dict], against: Optional[Sequence[Dict]], spread: Optional[float]) -> str:
    """An ablation's delta vs its paper's choice read as the paper's tables are
    (:func:`.paper_tables.read_difference`); every paper finds its own choice better (a negative delta)."""
    return read_difference(records, against, -1.0, spread) if against else "-"


def window_paper_tables(by_config: Dict[str, List[Dict]], runs: Sequence[Dict]) -> List[str]:
    """:mod:`.paper_tables`'s section, with what Full and Partial are at the runs' depth."""
    from .ablations import window_extents

    depths = sorted({SCALES[r["scale"]]["layers"] for r in runs if r.get("scale") in SCALES})
    layers = "; ".join(
        f"Full = {extents['full'][1]}, Partial = {extents['partial'][1]}"
        for extents in (window_extents(depth) for depth in depths)
    )
    return paper_table_lines(by_config, vanilla_spread(by_config), layers or "the harness's depth")


def seed_noise(baseline: Sequence[Dict]) -> float:
    """Vanilla's sample std of the ablation metric over its seeds (at least two)."""
    return statistics.stdev(r[ABLATION_METRIC] for r in baseline)


def vanilla_spread(by_config: Dict[str, Sequence[Dict]]) -> Optional[float]:
    """Vanilla's sample std of the ablation metric over its seeds
    (:func:`..harness.seeds.seed_std`), None while it has fewer than two seeds."""
    return seed_std([r[ABLATION_METRIC] for r in by_config.get("vanilla", ())])


def undecided_ablations(by_config: Dict[str, Sequence[Dict]], references: Dict[str, str]) -> List[str]:
    """The ablations with one seed whose BLEU is within one vanilla std of their
    reference's mean: seed noise alone could put them on either side, so they get a
    second seed. Needs vanilla's spread (two seeds or more) and a reference run."""
    baseline = by_config.get("vanilla", ())
    if len(baseline) < 2:
        return []
    spread = seed_noise(baseline)
    undecided = []
    for name, reference in references.items():
        records, against = by_config.get(name, ()), by_config.get(reference)
        if len(records) == 1 and against:
            gap = records[0][ABLATION_METRIC] - statistics.fmean(r[ABLATION_METRIC] for r in against)
            if abs(gap) <= spread:
                undecided.append(name)
    return undecided


# -------------------------------------------------------------------- main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.mt", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--grid",
        choices=GRIDS,
        default="default",
        help="default: vanilla and each mechanism as its paper uses it; ablations: the papers' ablations "
        "(benchmarks/quality/ablations.py, examples/ablations/README.md), read against the default grid's "
        "runs (default: default)",
    )
    p.add_argument("--configs", default="", help="comma-separated subset of the grid's configurations")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default: 1,2)")
    p.add_argument(
        "--undecided",
        action="store_true",
        help="with --grid ablations: only the ablations with one seed in --out's run files whose BLEU is within "
        "one vanilla std of the configuration they are read against (the report lists them); give --seeds the "
        "next seed",
    )
    p.add_argument(
        "--scale",
        choices=sorted(SCALES),
        default="small",
        help="model size and budget: small = 3+3 layers x 256, 4 heads (CPU); base = IWSLT size (GPU)",
    )
    p.add_argument("--updates", type=at_least(1), default=None, help="training updates (default: the scale's)")
    p.add_argument(
        "--precision",
        choices=sorted(PRECISION),
        default="fp32",
        help="training precision on a GPU: tf32 (fp32 with TF32 matmuls) or amp (fairseq --amp, fp16 "
        "autocast); both need CUDA (default: fp32)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="Multi30k {train,val,test_2016_flickr}.{en,de}[.gz] (default: ../shared/data/multi30k "
        "when present, else the shipped data/multi30k)",
    )
    p.add_argument("--merges", type=int, default=None, help="joint BPE merges (default: the scale's)")
    p.add_argument("--jobs", type=at_least(1), default=2, help="runs at a time (default: 2)")
    add_run_arguments(
        p,
        DEFAULT_WORK,
        DEFAULT_OUT,
        "the log gives the recorded and the new BLEU), e.g. to have their models for "
        "benchmarks.quality.mt_extrapolation on a machine that lacks them",
    )
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    if not args.report and args.precision != "fp32":
        import torch

        if not torch.cuda.is_available():
            p.error(f"argument --precision: {args.precision} trains on a GPU, and CUDA is not available here")
    if not args.report:
        check_same_budget(
            p,
            args.out,
            {
                "scale": args.scale,
                "updates": args.updates or SCALES[args.scale]["updates"],
                "precision": args.precision,
            },
        )
    args.grid_configs = grid_configs(args.grid, SCALES[args.scale]["layers"])
    args.config_names = comma_separated_names(p, f"--configs (grid {args.grid})", args.configs, args.grid_configs)
    if args.undecided:
        if args.grid != "ablations":
            p.error("argument --undecided: only with --grid ablations")
        undecided = set(undecided_ablations(runs_by_config(load_runs(args.out)), ablation_references()))
        args.config_names = [name for name in args.config_names if name in undecided]
    args.seed_list = comma_separated_ints(p, "--seeds", args.seeds, 0)
    if args.data is None:
        args.data = default_data()
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        scale = dict(SCALES[args.scale])
        if args.updates is not None:
            scale["updates"] = args.updates
        merges = args.merges or scale["merges"] or 500
        env = tool_env(args.threads)
        with claimed(args.work / f"data-{merges}", wait=True):  # one process prepares, the others wait
            prep, data_bin = prepare(args.data, args.work / f"data-{merges}", merges, env)

        def run_file(config: QualityConfig, seed: int) -> Path:
            return args.out / "runs" / f"{config.name}-seed{seed}.json"

        todo = [
            (args.grid_configs[name], seed)
            for seed in args.seed_list
            for name in args.config_names
            if args.retrain or not run_file(args.grid_configs[name], seed).is_file()
        ]
        # each run file as this process saw it: one that changes meanwhile was written by another
        listed = {path: file_version(path) for path in (run_file(config, seed) for config, seed in todo)}
        log(f"{len(todo)} runs to do ({args.scale}, {scale['updates']} updates, {args.jobs} at a time)")
        machine = f"{device_model()}, {args.threads} thread(s) per run"
        revision = git_revision()

        def train_one(config: QualityConfig, seed: int, run_dir: Path, path: Path) -> None:
            log(f"start {config.name} seed {seed} ({run_dir})")
            record = train_run(config, seed, scale, prep, data_bin, run_dir, env, args.precision)
            record.update(
                scale=args.scale,
                precision=args.precision,
                machine=machine,
                git_revision=revision,
                data=args.data.name,
                bpe_merges=merges,
                max_tokens=scale["max_tokens"],
                model=f"{scale['layers']}+{scale['layers']} layers x {scale['dim']}, "
                f"FFN {scale['ffn']}, {scale['heads']} heads",
            )
            if path.is_file():
                recorded = json.loads(path.read_text(encoding="utf-8"))
                new, old = record["tokenized_bleu_compound_split"], recorded["tokenized_bleu_compound_split"]
                log(f"retrained {config.name} seed {seed}: BLEU {new}, recorded {old}")
            keep_hypotheses(run_dir, path)  # first: a run file that exists has its hypotheses beside it
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            log(
                f"done {config.name} seed {seed}: BLEU {record['tokenized_bleu_compound_split']}, "
                f"sacreBLEU {record['sacrebleu']}, {record['wall_s']:.0f}s"
            )

        def one(job):
            config, seed = job
            run_dir = args.work / args.scale / f"{config.name}-seed{seed}"
            path = run_file(config, seed)
            train = functools.partial(train_one, config, seed, run_dir, path)
            train_unless_taken(f"{config.name} seed {seed}", run_dir, path, listed[path], train, log)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for future in [pool.submit(one, job) for job in todo]:
                future.result()

    def model_of(record: Dict[str, object], path: Path) -> Tuple[Path, Path, Path]:
        run_dir = args.work / str(record.get("scale", "small")) / path.stem
        data_bin = args.work / f"data-{record.get('bpe_merges')}" / "data-bin"
        return run_dir / "averaged.pt", data_bin, run_dir / "eval.log"

    backfill_mechanism_parameters(args.out, model_of)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
