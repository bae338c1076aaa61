"""Language-model quality on WikiText-2: ``python -m benchmarks.quality.lm``.

Trains fairseq's ``transformer_lm`` and every LM preset the plugin registers
(``fairseq_distattn/models/distattn_lm.py``) at one model size, with the same
updates, lr schedule and regularisation for all, and measures test perplexity
with ``fairseq-eval-lm``. Only WikiText-2's ``valid.txt`` and ``test.txt`` are at
hand (see ../shared/data/README.md), so the models train on ``valid.txt`` less its
last ~10% (whole articles), which is the dev set the validation curve and the
best checkpoint come from; ``test.txt`` is the test set. Word level, the
vocabulary of the training part (``fairseq-preprocess --only-source``); test
words outside it count as ``<unk>``, the share is reported.

Each preset is compared with the fairseq architecture it extends (``--arch
transformer_lm_gbw`` for the ``*_gbw`` presets, ``transformer_lm`` for
``distattn_lm``): same defaults, only the attention and, where the preset drops
them, the sinusoidal position embeddings differ. Every model is trained with
``--max-target-positions 2048`` so that ``benchmarks.quality.lm_extrapolation`` can
evaluate it on longer samples than it saw (no model here has learned position
embeddings; the limit only sets the longest sample fairseq-eval-lm accepts
instead of silently skipping it).

Each run writes one JSON file, ``<out>/runs/<config>-seed<seed>.json``; a run
whose file exists is skipped, and an interrupted run resumes from its
``checkpoint_last.pt`` under ``--work``. ``--report`` (and the end of every
invocation) rebuilds ``<out>/lm_quality.md`` (mean +- std per config, delta vs
the fairseq baseline, and how far each mechanism's parameters moved from the
initial model: ``benchmarks.diagnostics.parameter_movement``, measured on the best
checkpoint, and added to run files written before it was) and
``<out>/valid_loss.png`` from whatever JSON files exist.
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_distattn.tools.generated_blocks import update_pages

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
    without_machine_paths,
)
from ..harness.claims import claimed, file_version, train_unless_taken
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.process import log, run, tool, tool_env
from ..harness.report import movement_table, pending_lines, plot_curves, table_row
from ..harness.runs import load_runs, runs_by_config
from ..harness.seeds import mean_std, mean_std_text, seeds_cell
from ..harness.training import (
    backfill_mechanism_parameters,
    mechanism_parameters,
    optimizer_args,
    training_wall_seconds,
)

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "lm_quality"
DEFAULT_WORK = REPO_ROOT / "work" / "lm_quality"
SHIPPED_DATA = REPO_ROOT / "data" / "wikitext-2"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "wikitext-2"
# the longest sample (eval tokens + context) a model accepts; see the module docstring
MAX_POSITIONS = 2048
DEV_FRACTION = 0.1
ARTICLE = re.compile(r"^ = [^=].* = $")  # a WikiText article title; section titles have == or more

# Model size and budget. tiny: a smoke test; small: one CPU thread; base: a GPU.
SCALES = {
    "tiny": dict(layers=2, dim=16, ffn=32, heads=2, updates=6, max_tokens=512, tokens_per_sample=64),
    "small": dict(layers=3, dim=256, ffn=1024, heads=4, updates=600, max_tokens=2048, tokens_per_sample=64),
    "base": dict(layers=6, dim=512, ffn=2048, heads=8, updates=20000, max_tokens=8192, tokens_per_sample=64),
}
# a validation (and checkpoint) every 1/20 of training
VALIDATIONS = 20


@dataclass(frozen=True)
class LMConfig:
    """One model of the grid: an ``--arch`` and the fairseq architecture it is compared with."""

    name: str
    baseline: str
    note: str
    # a variant of a preset: its --arch and the flags that make it the variant
    arch: str = ""
    flags: Tuple[str, ...] = ()

    def arch_args(self) -> List[str]:
        return ["--arch", self.arch or self.name, *self.flags]


# variants of a preset that the grid trains beside it: (name, preset, flags, what it is)
VARIANTS = (
    (
        "distattn_lm_kerple_gbw+per-layer",
        "distattn_lm_kerple_gbw",
        ("--kerple-per-layer",),
        "the preset with r1, r2 per layer (the plugin's kerple up to revision f2ecd07) instead of the authors' "
        "one pair per head shared by the layers",
    ),
)


@functools.lru_cache(maxsize=None)
def lm_configs() -> Dict[str, LMConfig]:
    """fairseq's LM architectures that the plugin's presets extend, each followed by the
    presets, read from the registered architectures (so a new preset joins the grid)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_INV_REGISTRY

    import fairseq_distattn  # noqa: F401  registers the architectures
    from fairseq_distattn.models.arguments import ARCHITECTURES
    from fairseq_distattn.models.distattn_lm import transformer_lm_architecture

    presets = [name for name in ARCH_MODEL_INV_REGISTRY["distattn_lm"] if name in ARCHITECTURES]
    configs: Dict[str, LMConfig] = {}
    for preset in presets:
        fairseq_architecture, specs = ARCHITECTURES[preset]
        # the shortest fairseq name of that function (transformer_lm_gbw, not transformer_lm_baevski_gbw);
        # --arch transformer_lm is registered as a no-op (its dataclass's defaults), which distattn_lm copies
        baseline = min(
            (
                name
                for name in ARCH_MODEL_INV_REGISTRY["transformer_lm"]
                if ARCH_CONFIG_REGISTRY[name] is fairseq_architecture
            ),
            key=len,
            default="transformer_lm" if fairseq_architecture is transformer_lm_architecture else None,
        )
        if baseline is None:
            raise RuntimeError(f"no fairseq transformer_lm architecture matches the defaults of --arch {preset}")
        configs.setdefault(baseline, LMConfig(baseline, baseline, f"fairseq {baseline}, sinusoidal positions"))
        mechanism = specs.get("decoder_self_attention", "vanilla")
        positions = "no position embeddings" if _drops_positions(preset) else "sinusoidal positions"
        configs[preset] = LMConfig(
            preset, baseline, f"{mechanism} self-attention on {baseline}'s defaults, {positions}"
        )
    for name, preset, flags, note in VARIANTS:
        if preset in configs:
            configs[name] = LMConfig(name, configs[preset].baseline, note, preset, flags)
    # baselines first, then mechanism presets, then the plugin's vanilla presets (a check against the baseline);
    # the baseline most presets extend first
    family = collections.Counter(c.baseline for c in configs.values())
    rank = {
        name: (name != c.baseline, "vanilla self-attention" in c.note, -family[c.baseline])
        for name, c in configs.items()
    }
    return {name: configs[name] for name in sorted(configs, key=lambda name: rank[name])}


def _drops_positions(arch: str) -> bool:
    """Whether ``--arch`` defaults to no position embeddings (its registered defaults, applied to no flags)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    return bool(args.no_token_positional_embeddings)


# -------------------------------------------------------------------- data


def split_train_dev(lines: Sequence[str], fraction: float = DEV_FRACTION) -> Tuple[List[str], List[str]]:
    """Training lines and a dev set of about the last ``fraction`` of them, starting at
    an article title when there is one (at a line otherwise)."""
    target = max(1, min(len(lines) - 1, round(len(lines) * (1 - fraction))))
    cut = next((i for i in range(target, len(lines)) if ARTICLE.match(lines[i])), target)
    return list(lines[:cut]), list(lines[cut:])


PREPROCESSED = re.compile(r"\[None\] \S*/(train|valid|test)\.txt: (\d+) sents, (\d+) tokens, ([\d.e+-]+)% replaced")


def prepare(data: Path, work: Path, env: Dict[str, str]) -> Tuple[Path, Dict[str, Dict[str, float]]]:
    """Split, write and binarise the corpus under ``work/data-<digest of the text>``;
    returns the data-bin directory and, per split, lines, tokens and % replaced by <unk>."""
    source, test = text_lines(data, "valid.txt"), text_lines(data, "test.txt")
    digest = hashlib.md5("\n".join(source + ["\0"] + test).encode("utf-8")).hexdigest()[:10]
    directory = work / f"data-{digest}"
    data_bin = directory / "data-bin"
    if not (data_bin / ".done").is_file():
        directory.mkdir(parents=True, exist_ok=True)
        train, dev = split_train_dev(source)
        for split, lines in (("train", train), ("valid", dev), ("test", test)):
            (directory / f"{split}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (directory / "preprocess.log").unlink(missing_ok=True)
        run(
            [
                tool("fairseq-preprocess"),
                "--only-source",
                "--trainpref",
                directory / "train.txt",
                "--validpref",
                directory / "valid.txt",
                "--testpref",
                directory / "test.txt",
                "--destdir",
                data_bin,
                "--workers",
                "1",
            ],
            directory / "preprocess.log",
            env,
        )
        (data_bin / ".done").touch()
    stats = {
        split: {"lines": int(lines), "tokens": int(tokens), "unk_percent": float(unk)}
        for split, lines, tokens, unk in PREPROCESSED.findall((directory / "preprocess.log").read_text("utf-8"))
    }
    if set(stats) != {"train", "valid", "test"}:
        raise RuntimeError(f"cannot read the split sizes from {directory / 'preprocess.log'}")
    return data_bin, stats


# --------------------------------------------------------------- train, eval


VALID_LINE = re.compile(r"valid on 'valid' subset \| loss ([\d.]+) \| ppl ([\d.]+).*?\| num_updates (\d+)")


def validation_curve(train_log: str) -> List[Dict[str, float]]:
    """(updates, loss in base 2, ppl) of every validation in a fairseq-train LM log, by update."""
    points = {
        int(updates): {"updates": int(updates), "loss": float(loss), "ppl": float(ppl)}
        for loss, ppl, updates in VALID_LINE.findall(train_log)
    }
    return [points[u] for u in sorted(points)]


def train_args(config: LMConfig, scale: Dict, seed: int, data_bin: Path, save_dir: Path) -> List[object]:
    """The fairseq-train command of one run: the same recipe for every config."""
    updates = scale["updates"]
    every = max(1, updates // VALIDATIONS)
    return [
        tool("fairseq-train"),
        data_bin,
        "--user-dir",
        "fairseq_distattn",
        "--task",
        "language_modeling",
        *config.arch_args(),
        "--decoder-layers",
        scale["layers"],
        "--decoder-embed-dim",
        scale["dim"],
        # --arch transformer_lm (and so distattn_lm) defaults both to 512 whatever --decoder-embed-dim
        # says, while the named architectures (transformer_lm_gbw, ...) follow it: without them the
        # transformer_lm baseline got 512-wide token embeddings projected down to the model width and
        # back (9.3M parameters against the gbw presets' 5.7M at scale small)
        "--decoder-input-dim",
        scale["dim"],
        "--decoder-output-dim",
        scale["dim"],
        "--decoder-ffn-embed-dim",
        scale["ffn"],
        "--decoder-attention-heads",
        scale["heads"],
        "--share-decoder-input-output-embed",
        "--dropout",
        "0.3",
        "--attention-dropout",
        "0.1",
        "--tokens-per-sample",
        scale["tokens_per_sample"],
        "--sample-break-mode",
        "none",
        "--max-target-positions",
        MAX_POSITIONS,
        "--criterion",
        "cross_entropy",
        *optimizer_args(updates),
        "--weight-decay",
        "0.01",
        "--max-tokens",
        scale["max_tokens"],
        "--max-update",
        updates,
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--save-interval-updates",
        every,
        "--keep-interval-updates",
        1,
        "--validate-interval-updates",
        every,
        # no extra validation at the end of each (short) epoch: an evenly spaced curve
        "--validate-interval",
        10**6,
        "--save-interval",
        10**6,
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
    ]


EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in ([\d.]+)s")
EVAL_LOSS = re.compile(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)")


def eval_lm(
    checkpoint: Path,
    data_bin: Path,
    tokens_per_sample: int,
    context_window: int,
    log_path: Path,
    env: Dict[str, str],
    max_tokens: int = 4096,
    model_overrides: Optional[Dict[str, object]] = None,
) -> Dict[str, object]:
    """Test perplexity with fairseq-eval-lm: samples of ``tokens_per_sample`` tokens, of which the
    first ``context_window`` are context only (0: non-overlapping blocks, each scored from its start);
    ``model_overrides``: options the trained model is evaluated with (``--model-overrides``)."""
    cmd = [
        tool("fairseq-eval-lm"),
        data_bin,
        "--user-dir",
        "fairseq_distattn",
        "--path",
        checkpoint,
        "--gen-subset",
        "test",
        "--sample-break-mode",
        "none",
        "--tokens-per-sample",
        tokens_per_sample,
        "--context-window",
        context_window,
        "--max-tokens",
        max(max_tokens, tokens_per_sample),
        "--num-workers",
        "0",
        "--log-format",
        "simple",
        *(["--model-overrides", repr(model_overrides)] if model_overrides else []),
    ]
    before = log_path.stat().st_size if log_path.is_file() else 0
    run(cmd, log_path, env)
    with open(log_path, encoding="utf-8") as log_file:
        log_file.seek(before)
        text = log_file.read()
    evaluated, loss = EVALUATED.search(text), EVAL_LOSS.search(text)
    if evaluated is None or loss is None:
        raise RuntimeError(f"fairseq-eval-lm printed no perplexity; see {log_path}")
    return {
        "tokens_per_sample": tokens_per_sample,
        "context_window": context_window,
        "tokens": int(evaluated.group(1).replace(",", "")),
        "loss_base2": float(loss.group(1)),
        "ppl": float(loss.group(2)),
        "eval_s": float(evaluated.group(2)),
        "command": shlex.join(str(c) for c in cmd),
    }


def train_run(
    config: LMConfig, seed: int, scale: Dict, data_bin: Path, run_dir: Path, env: Dict[str, str]
) -> Dict[str, object]:
    """Train one run, evaluate its best-on-dev checkpoint on the test set; returns its record."""
    save_dir = run_dir / "checkpoints"
    train_log = run_dir / "train.log"
    started = time.time()
    best = run_dir / "checkpoint_best.pt"
    if not best.is_file():  # else trained already, stopped before its JSON was written
        run(train_args(config, scale, seed, data_bin, save_dir), train_log, env)
        os.replace(save_dir / "checkpoint_best.pt", best)
        # kept: the best checkpoint (benchmarks.quality.lm_extrapolation evaluates it); the others are not needed
        for path in save_dir.glob("*.pt"):
            path.unlink()
        save_dir.rmdir()
    log_text = train_log.read_text(encoding="utf-8")
    curve = validation_curve(log_text)
    test = eval_lm(best, data_bin, scale["tokens_per_sample"], 0, run_dir / "eval.log", env)
    moved = mechanism_parameters(best, data_bin, run_dir / "eval.log", env)
    best_point = min(curve, key=lambda p: p["loss"]) if curve else None
    return {
        "config": config.name,
        "baseline": config.baseline,
        "note": config.note,
        "train_args": config.arch_args(),
        "seed": seed,
        "updates": scale["updates"],
        "tokens_per_sample": scale["tokens_per_sample"],
        "train_wall_s": round(training_wall_seconds(log_text) or time.time() - started, 1),
        "wall_s": round(time.time() - started, 1),
        "valid_curve": curve,
        "best_valid_updates": best_point and best_point["updates"],
        "best_valid_loss": best_point and best_point["loss"],
        "test_loss_base2": test["loss_base2"],
        "test_ppl": test["ppl"],
        "test_tokens": test["tokens"],
        # which model every later evaluation of this run must be from (benchmarks.quality.lm_extrapolation)
        "checkpoint_sha256": checkpoint_fingerprint(best),
        "eval_command": test["command"],
        "train_command": shlex.join(str(c) for c in train_args(config, scale, seed, data_bin, save_dir)),
        "mechanism_parameters": moved,
    }


# ------------------------------------------------------------------ report


def report(out: Path) -> str:
    """Rebuild ``lm_quality.md`` and ``valid_loss.png`` from the run files; returns the markdown."""
    runs = load_runs(out)
    by_config = runs_by_config(runs)
    order = sorted(
        by_config, key=lambda name: (by_config[name][0]["baseline"], name != by_config[name][0]["baseline"], name)
    )
    lines = [
        "| config | runs (seeds) | test ppl | delta vs baseline | baseline | test loss (bits) | best dev loss "
        "(at update) | train wall s | what |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in order:
        records = sorted(by_config[name], key=lambda r: r["seed"])
        baseline_name = records[0]["baseline"]
        cells = [name, seeds_cell(records), mean_std_text([r["test_ppl"] for r in records])]
        baseline = by_config.get(baseline_name)
        if baseline and name != baseline_name:
            mean = mean_std([r["test_ppl"] for r in records])[0]
            base_mean = mean_std([r["test_ppl"] for r in baseline])[0]
            cells.append(f"{mean - base_mean:+.2f} ({100 * (mean / base_mean - 1):+.1f}%)")
        else:
            cells.append("-")
        cells.append(baseline_name)
        cells.append(mean_std_text([r["test_loss_base2"] for r in records], digits=3))
        cells.append(
            ", ".join(
                f"{r['best_valid_loss']:.3f} ({r['best_valid_updates']})"
                for r in records
                if r["best_valid_loss"] is not None
            )
            or "-"
        )
        cells.append(", ".join(f"{r['train_wall_s']:.0f}" for r in records))
        cells.append(records[0]["note"])
        lines.append(table_row(cells))
    budgets = sorted({(r["updates"], r.get("scale", "?"), r.get("model", "?"), r["tokens_per_sample"]) for r in runs})
    machines = sorted({r.get("machine", "?") for r in runs})
    splits = sorted({json.dumps(r["data_splits"], sort_keys=True) for r in runs if "data_splits" in r})
    data = (
        "; ".join(
            f"train {s['train']['tokens']:,} tokens, dev {s['valid']['tokens']:,}, test {s['test']['tokens']:,} "
            f"({s['test']['unk_percent']:.2f}% of test tokens outside the training vocabulary, scored as <unk>)"
            for s in map(json.loads, splits)
        )
        or "-"
    )
    header = [
        "# Language-model quality on WikiText-2 (generated by `python -m benchmarks.quality.lm --report`)",
        "",
        "Word-level LMs trained on WikiText-2 `valid.txt` less its last ~10% (the dev set: validation curve and "
        "best checkpoint), tested on `test.txt` with `fairseq-eval-lm` in non-overlapping blocks of the training "
        "length (each block scored from its first token, no context carried over). Each preset is compared with "
        "the fairseq architecture it extends (`baseline`); every model gets the same recipe (updates, lr "
        "schedule, dropout 0.3, tied embeddings). Test ppl: mean +- sample std over seeds (a single number: one "
        "seed so far); delta: difference of the means (negative = better than the baseline).",
        "",
        f"Budget: {'; '.join(f'{u} updates, scale {s} ({m}), {t} tokens per sample' for u, s, m, t in budgets)}"
        if budgets
        else "Budget: no runs yet",
        f"Data: {data}. Machine: {'; '.join(machines) or '-'}.",
        "",
        "The training text is small (at most WikiText-2's valid.txt, a tenth of the size of its training set, "
        "which is not available here): the numbers compare the mechanisms at this budget, they are not "
        "WikiText-2 results comparable with published ones.",
        "",
    ]
    grid = {name: config.note for name, config in lm_configs().items()}
    markdown = "\n".join(header + lines + pending_lines(by_config, grid) + movement_table(by_config, order)) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm_quality.md").write_text(markdown, encoding="utf-8")
    if runs:
        plot_curves(
            by_config,
            order,
            out / "valid_loss.png",
            ylabel="dev loss (cross-entropy, bits per token)",
            title="WikiText-2 LM dev loss, one line per seed (dashed: fairseq baselines)",
            dashed=lambda name, record: record["baseline"] == name,
        )
    if out.resolve() == DEFAULT_OUT.resolve():
        update_pages(out / "lm_quality.md")
    return markdown


# -------------------------------------------------------------------- main


def default_data() -> Path:
    """../shared/data/wikitext-2 when present, else the sample the repository ships."""
    return SHARED_DATA if (SHARED_DATA / "valid.txt").is_file() else SHIPPED_DATA


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.lm", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        default="",
        help="comma-separated subset of the configurations (default: all: fairseq's transformer_lm "
        "architectures and every distattn_lm preset)",
    )
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default: 1,2)")
    p.add_argument(
        "--scale",
        choices=sorted(SCALES),
        default="small",
        help="model size and budget: small = 3 layers x 256, 4 heads (one CPU thread); base: a GPU",
    )
    p.add_argument("--updates", type=at_least(1), default=None, help="training updates (default: the scale's)")
    p.add_argument("--tokens-per-sample", type=int, default=None, help="training sample length (default: 64)")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"a folder with WikiText-2 valid.txt and test.txt (or .txt.gz) (default: {SHARED_DATA} "
        f"when present, else the shipped sample {SHIPPED_DATA.relative_to(REPO_ROOT)})",
    )
    add_run_arguments(
        p,
        DEFAULT_WORK,
        DEFAULT_OUT,
        "the log gives the recorded and the new test ppl), e.g. to have their checkpoints for "
        "benchmarks.quality.lm_extrapolation on a machine that lacks them; a run whose checkpoint is still here "
        "is evaluated again from it",
    )
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    if args.report:
        return args
    scale = SCALES[args.scale]
    check_same_budget(
        p,
        args.out,
        {
            "scale": args.scale,
            "updates": args.updates or scale["updates"],
            "tokens_per_sample": args.tokens_per_sample or scale["tokens_per_sample"],
        },
    )
    configs = lm_configs()
    args.config_names = comma_separated_names(p, "--configs", args.configs, configs)
    args.seed_list = comma_separated_ints(p, "--seeds", args.seeds, 0)
    args.data = args.data or default_data()
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        scale = dict(SCALES[args.scale])
        scale["updates"] = args.updates or scale["updates"]
        scale["tokens_per_sample"] = args.tokens_per_sample or scale["tokens_per_sample"]
        env = tool_env(args.threads)
        with claimed(args.work, wait=True):  # one process prepares, the others wait
            data_bin, splits = prepare(args.data, args.work, env)
        configs = lm_configs()

        def run_file(name: str, seed: int) -> Path:
            return args.out / "runs" / f"{name}-seed{seed}.json"

        todo = [
            (configs[name], seed)
            for seed in args.seed_list
            for name in args.config_names
            if args.retrain or not run_file(name, seed).is_file()
        ]
        # each run file as this process saw it: one that changes meanwhile was written by another
        listed = {path: file_version(path) for path in (run_file(config.name, seed) for config, seed in todo)}
        log(f"{len(todo)} runs to do ({args.scale}, {scale['updates']} updates, one at a time)")
        machine = f"{device_model()}, {args.threads} thread(s) per run"
        revision = git_revision()

        def train_one(config: LMConfig, seed: int, run_dir: Path, path: Path) -> None:
            log(f"start {config.name} seed {seed} ({run_dir})")
            record = train_run(config, seed, scale, data_bin, run_dir, env)
            record.update(
                scale=args.scale,
                machine=machine,
                git_revision=revision,
                data=str(args.data),
                data_splits=splits,
                max_tokens=scale["max_tokens"],
                model=f"{scale['layers']} layers x {scale['dim']}, FFN {scale['ffn']}, {scale['heads']} heads",
            )
            if path.is_file():
                recorded = json.loads(path.read_text(encoding="utf-8"))
                new, old = record["test_ppl"], recorded["test_ppl"]
                log(f"retrained {config.name} seed {seed}: test ppl {new}, recorded {old}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(without_machine_paths(json.dumps(record, indent=1)) + "\n", encoding="utf-8")
            log(f"done {config.name} seed {seed}: test ppl {record['test_ppl']}, {record['wall_s']:.0f}s")

        for config, seed in todo:
            run_dir = args.work / args.scale / f"{config.name}-seed{seed}"
            path = run_file(config.name, seed)
            train = functools.partial(train_one, config, seed, run_dir, path)
            train_unless_taken(f"{config.name} seed {seed}", run_dir, path, listed[path], train, log)

        def model_of(record: Dict[str, object], path: Path) -> Tuple[Path, Path, Path]:
            run_dir = args.work / str(record.get("scale", args.scale)) / path.stem
            return run_dir / "checkpoint_best.pt", data_bin, run_dir / "eval.log"

        backfill_mechanism_parameters(args.out, model_of)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
