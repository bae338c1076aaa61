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

What is trained (the configurations, scales, data) is :mod:`.lm_grid`; the report is
:mod:`.lm_report`; this module prepares the data, trains, scores and holds the
command line.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import (
    REPO_ROOT,
    add_run_arguments,
    at_least,
    check_same_budget,
    comma_separated_ints,
    comma_separated_names,
    command_line,
    device_model,
    git_revision,
    model_size,
    scale_results,
    text_lines,
)
from ..harness.claims import claimed
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.grid import PlannedRun, plan_runs, train_planned, write_run_file
from ..harness.process import log, run, tool, tool_env
from ..harness.training import (
    best_validation,
    mechanism_parameters,
    optimizer,
    routine,
    train_keeping_best,
    train_wall,
    validation_curve,
)
from .lm_grid import (
    DEFAULT_OUT,
    DEFAULT_WORK,
    MAX_POSITIONS,
    SCALES,
    SHARED_DATA,
    SHIPPED_DATA,
    LMConfig,
    default_data,
    lm_configs,
    same_model_text,
    same_models,
)
from .lm_report import report

DEV_FRACTION = 0.1
ARTICLE = re.compile(r"^ = [^=].* = $")  # a WikiText article title; section titles have == or more

# a validation (and checkpoint) every 1/20 of training
VALIDATIONS = 20


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


def train_args(config: LMConfig, scale: Dict, seed: int, data_bin: Path, save_dir: Path) -> List[object]:
    """The fairseq-train command of one run: the same recipe for every config."""
    updates = scale["updates"]
    every = max(1, updates // VALIDATIONS)
    return [
        tool("fairseq-train"),
        data_bin,
        *config.arch_args(),
        *command_line(
            {"user-dir": "fairseq_distattn", "task": "language_modeling"},
            model_size(scale["dim"], scale["ffn"], scale["heads"], scale["layers"], ("decoder",)),
            {
                # --arch transformer_lm (and so distattn_lm) defaults both to 512 whatever --decoder-embed-dim
                # says, while the named architectures (transformer_lm_gbw, ...) follow it: without them the
                # transformer_lm baseline got 512-wide token embeddings projected down to the model width and
                # back (9.3M parameters against the gbw presets' 5.7M at scale small)
                "decoder-input-dim": scale["dim"],
                "decoder-output-dim": scale["dim"],
                "share-decoder-input-output-embed": True,
                "dropout": "0.3",
                "attention-dropout": "0.1",
                "tokens-per-sample": scale["tokens_per_sample"],
                "sample-break-mode": "none",
                "max-target-positions": MAX_POSITIONS,
                "criterion": "cross_entropy",
                "weight-decay": "0.01",
                "max-tokens": scale["max_tokens"],
            },
            optimizer(updates),
            routine(save_dir, seed, updates, every, keep=1, log_interval=50),
        ),
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
    command = train_args(config, scale, seed, data_bin, run_dir / "checkpoints")
    started = time.time()
    # the best checkpoint is kept: benchmarks.quality.lm_extrapolation evaluates it
    best = train_keeping_best(command, run_dir, env)
    log_text = (run_dir / "train.log").read_text(encoding="utf-8")
    curve = validation_curve(log_text)
    test = eval_lm(best, data_bin, scale["tokens_per_sample"], 0, run_dir / "eval.log", env)
    moved = mechanism_parameters(best, data_bin, run_dir / "eval.log", env)
    return {
        "config": config.name,
        "baseline": config.baseline,
        "note": config.note,
        "train_args": config.arch_args(),
        "seed": seed,
        "updates": scale["updates"],
        "tokens_per_sample": scale["tokens_per_sample"],
        "train_wall_s": train_wall(log_text, started),
        "wall_s": round(time.time() - started, 1),
        "valid_curve": curve,
        **best_validation(curve),
        "test_loss_base2": test["loss_base2"],
        "test_ppl": test["ppl"],
        "test_tokens": test["tokens"],
        # which model every later evaluation of this run must be from (benchmarks.quality.lm_extrapolation)
        "checkpoint_sha256": checkpoint_fingerprint(best),
        "eval_command": test["command"],
        "train_command": shlex.join(str(c) for c in command),
        "mechanism_parameters": moved,
    }


# -------------------------------------------------------------------- main


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


def train_grid(args: argparse.Namespace) -> Path:
    """Prepare the data, then train each ``--configs`` x ``--seeds`` run without a run file
    (every one with ``--retrain``), one at a time; returns the binarised data's folder."""
    scale = dict(SCALES[args.scale])
    scale["updates"] = args.updates or scale["updates"]
    scale["tokens_per_sample"] = args.tokens_per_sample or scale["tokens_per_sample"]
    env = tool_env(args.threads)
    with claimed(args.work, wait=True):  # one process prepares, the others wait
        data_bin, splits = prepare(args.data, args.work, env)
    configs = lm_configs()
    repeats = same_models(args.scale)
    for name in args.config_names:
        if name in repeats:
            log(f"not trained: {same_model_text(name, args.scale)}")
    names = [name for name in args.config_names if name not in repeats]
    jobs = ((configs[name], seed) for seed in args.seed_list for name in names)
    runs = plan_runs(jobs, args.work / args.scale, args.out, args.retrain)
    log(f"{len(runs)} runs to do ({args.scale}, {scale['updates']} updates, one at a time)")
    context = dict(
        scale=args.scale,
        machine=f"{device_model()}, {args.threads} thread(s) per run",
        git_revision=git_revision(),
        data=str(args.data),
        data_splits=splits,
        max_tokens=scale["max_tokens"],
        model=f"{scale['layers']} layers x {scale['dim']}, FFN {scale['ffn']}, {scale['heads']} heads",
    )

    def train_one(planned: PlannedRun) -> None:
        log(f"start {planned.label} ({planned.run_dir})")
        record = train_run(planned.config, planned.seed, scale, data_bin, planned.run_dir, env)
        save_run(planned, {**record, **context})

    train_planned(runs, train_one, log)
    return data_bin


def save_run(planned: PlannedRun, record: Dict[str, object]) -> None:
    write_run_file(planned, record, "test_ppl", "test ppl", log)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        train_grid(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
