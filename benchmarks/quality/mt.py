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

What is trained (the grids, scales, data) is :mod:`.mt_grid`; the report is
:mod:`.mt_report`; this module trains, scores and holds the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_distattn.tools.translation_scoring import read_text

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
)
from ..harness.claims import claimed
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.grid import PlannedRun, plan_runs, train_planned, write_run_file
from ..harness.process import BIN_DIR, log, run, tool, tool_env
from ..harness.runs import hypotheses_file, load_runs, runs_by_config, save_lines
from ..harness.training import (
    mechanism_parameters,
    optimizer,
    routine,
    train_once,
    train_wall,
    validation_curve,
)
from .mt_grid import (
    CHECKPOINTS_AVERAGED,
    DEFAULT_OUT,
    DEFAULT_WORK,
    GRIDS,
    PRECISION,
    SCALES,
    TARGET_LANG,
    QualityConfig,
    ablation_references,
    default_data,
    grid_configs,
)
from .mt_report import report, undecided_ablations

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
        *command_line(
            model_size(scale["dim"], scale["ffn"], scale["heads"], scale["layers"], ("encoder", "decoder")),
            {
                "share-all-embeddings": True,
                "dropout": "0.1",
                "criterion": "label_smoothed_cross_entropy",
                "label-smoothing": "0.1",
                "max-tokens": scale["max_tokens"],
            },
            optimizer(updates),
            routine(save_dir, seed, updates, save_every, keep=CHECKPOINTS_AVERAGED, log_interval=50, epoch_ends=True),
        ),
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
    command = train_args(config, scale, seed, data_bin, checkpoints, precision)
    train_once(command, train_log, {**env, **precision_env}, checkpoints)
    log_text = train_log.read_text(encoding="utf-8")
    train_wall_s = train_wall(log_text, started)
    averaged = run_dir / "averaged.pt"
    average_last_checkpoints(checkpoints, averaged, run_dir / "eval.log", env)
    evaluation = evaluate_averaged(averaged, scale, prep, data_bin, run_dir, env)
    # the averaged model is kept (for the extrapolation and inspection tools); the
    # training checkpoints with their optimizer state are several times its size
    shutil.rmtree(checkpoints)
    return {
        "config": config.name,
        "note": config.note,
        "train_args": config.arch_args(),
        "seed": seed,
        "updates": scale["updates"],
        "train_wall_s": train_wall_s,
        "wall_s": round(time.time() - started, 1),
        "valid_curve": validation_curve(log_text),
        **evaluation,
    }


def evaluate_averaged(
    averaged: Path, scale: Dict, prep: Path, data_bin: Path, run_dir: Path, env: Dict[str, str]
) -> Dict[str, object]:
    """The averaged model's test BLEU (beam search, scored three ways), validation loss and
    mechanism parameters, with its fingerprint: the run record's evaluation fields, in its order."""
    eval_log = run_dir / "eval.log"
    generated = run_dir / "generate-test.txt"
    translate_test_set(data_bin, averaged, generated, eval_log, env)
    bleu = score_translation(generated, prep / "test", run_dir / "eval", eval_log, env)
    valid_loss, valid_ppl = validation_loss_ppl(data_bin, averaged, scale["max_tokens"], eval_log, env)
    moved = mechanism_parameters(averaged, data_bin, eval_log, env)
    return {
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


def train_grid(args: argparse.Namespace) -> None:
    """Prepare the data, then train each ``--configs`` x ``--seeds`` run without a run file
    (every one with ``--retrain``), ``--jobs`` at a time."""
    scale = dict(SCALES[args.scale])
    if args.updates is not None:
        scale["updates"] = args.updates
    merges = args.merges or scale["merges"] or 500
    env = tool_env(args.threads)
    with claimed(args.work / f"data-{merges}", wait=True):  # one process prepares, the others wait
        prep, data_bin = prepare(args.data, args.work / f"data-{merges}", merges, env)
    jobs = ((args.grid_configs[name], seed) for seed in args.seed_list for name in args.config_names)
    runs = plan_runs(jobs, args.work / args.scale, args.out, args.retrain)
    log(f"{len(runs)} runs to do ({args.scale}, {scale['updates']} updates, {args.jobs} at a time)")
    context = dict(
        scale=args.scale,
        precision=args.precision,
        machine=f"{device_model()}, {args.threads} thread(s) per run",
        git_revision=git_revision(),
        data=args.data.name,
        bpe_merges=merges,
        max_tokens=scale["max_tokens"],
        model=f"{scale['layers']}+{scale['layers']} layers x {scale['dim']}, "
        f"FFN {scale['ffn']}, {scale['heads']} heads",
    )

    def train_one(planned: PlannedRun) -> None:
        log(f"start {planned.label} ({planned.run_dir})")
        record = train_run(planned.config, planned.seed, scale, prep, data_bin, planned.run_dir, env, args.precision)
        save_run(planned, {**record, **context})

    train_planned(runs, train_one, log, args.jobs)


def save_run(planned: PlannedRun, record: Dict[str, object]) -> None:
    """Write a run's file, its test hypotheses beside it (first: a run file that exists
    has its hypotheses), and log its scores (and the recorded ones it replaces)."""
    keep_hypotheses(planned.run_dir, planned.run_file)
    details = f", sacreBLEU {record['sacrebleu']}"
    write_run_file(planned, record, "tokenized_bleu_compound_split", "BLEU", log, details)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        train_grid(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
