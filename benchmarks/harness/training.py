"""What the quality runs (translation, language models, length generalization) share about
training: the recipe's shared flags (:func:`optimizer`, :func:`routine`; the model's size is
``common.model_size``, and ``common.command_line`` writes them out), the training wall time
their fairseq-train logs give, and how far the mechanisms' parameters moved from the initial
model."""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..common import Flags
from .process import run


def optimizer(updates: int) -> Flags:
    """The optimiser and schedule of every quality recipe (translation, LM, length
    generalization): Adam, inverse square root with a warm-up of a quarter of the run, at most 400."""
    return {
        "optimizer": "adam",
        "adam-betas": "(0.9, 0.98)",
        "clip-norm": "1.0",
        "lr": "1e-3",
        "lr-scheduler": "inverse_sqrt",
        "warmup-updates": max(1, min(updates // 4, 400)),
        "warmup-init-lr": "1e-7",
    }


def routine(
    save_dir: Path, seed: int, updates: int, every: int, keep: int, log_interval: int, epoch_ends: bool = False
) -> Flags:
    """What every quality run does besides learning: ``updates`` updates, a checkpoint and a
    validation every ``every`` updates (the last ``keep`` checkpoints kept, none per epoch), its
    ``seed``, single-process data loading and plain logs. ``epoch_ends``: also validate at the end
    of each epoch, as fairseq does by default; without it, only the evenly spaced validations."""
    return {
        "max-update": updates,
        "save-dir": save_dir,
        "no-epoch-checkpoints": True,
        "save-interval-updates": every,
        "keep-interval-updates": keep,
        "validate-interval-updates": every,
        "validate-interval": None if epoch_ends else 10**6,
        "save-interval": None if epoch_ends else 10**6,
        "required-batch-size-multiple": 1,
        "seed": seed,
        "num-workers": 0,
        "log-format": "simple",
        "log-interval": log_interval,
    }


# a validation line of a fairseq-train log, and the fields of it a run records
VALIDATION = re.compile(r"valid on 'valid' subset( \|.*)$", re.M)
VALIDATION_FIELD = re.compile(r" \| (loss|nll_loss|ppl|num_updates) ([\d.]+)(?= \||$)")


def validation_curve(train_log: str) -> List[Dict[str, float]]:
    """``updates``, ``loss``, ``nll_loss`` (where the criterion logs one: translation's label
    smoothing) and ``ppl`` of every validation of a fairseq-train log, by update; a validation
    logged twice (a run resumed from an earlier checkpoint) counts once, as last logged."""
    points = {}
    for line in VALIDATION.findall(train_log):
        fields = dict(VALIDATION_FIELD.findall(line))
        if not {"loss", "ppl", "num_updates"} <= fields.keys():
            continue
        updates = int(fields["num_updates"])
        points[updates] = {
            "updates": updates,
            **{name: float(fields[name]) for name in ("loss", "nll_loss", "ppl") if name in fields},
        }
    return [points[u] for u in sorted(points)]


def best_validation(curve: Sequence[Dict[str, float]]) -> Dict[str, Optional[float]]:
    """The run record's fields of the validation with the lowest loss (None without one)."""
    best = min(curve, key=lambda point: point["loss"]) if curve else None
    return {
        "best_valid_updates": best and best["updates"],
        "best_valid_loss": best and best["loss"],
    }


# fairseq-train's last line of a run that reached its --max-update (or --max-epoch)
TRAINING_DONE = re.compile(r"\| fairseq_cli\.train \| done training in ")


def train_once(command: Sequence[object], train_log: Path, env: Dict[str, str], save_dir: Path) -> None:
    """Run fairseq-train ``command`` (saving to ``save_dir``), logged to ``train_log``,
    unless the log's last fairseq-train segment finished and its checkpoints are still
    there: fairseq resumed from a checkpoint_last at --max-update trains one update more
    (and logs one validation more) before it checks the limit, so a run stopped after
    training, while it was evaluated, would otherwise record a budget it did not have.
    Without the checkpoints (a run evaluated and cleaned up, asked for again) it trains."""
    if train_log.is_file() and (save_dir / "checkpoint_last.pt").is_file():
        segments = fairseq_train_segments(train_log.read_text(encoding="utf-8"))
        if segments and TRAINING_DONE.search(segments[-1]):
            return
    run(command, train_log, env)


def train_keeping_best(command: Sequence[object], run_dir: Path, env: Dict[str, str]) -> Path:
    """``run_dir/checkpoint_best.pt`` of fairseq-train ``command`` (whose ``--save-dir`` is
    ``run_dir/checkpoints``; logged to ``run_dir/train.log``), the other checkpoints deleted:
    what a run evaluates later is its best-on-valid model alone. A run dir that holds it
    already (trained, stopped before its run file was written) is not trained again."""
    best, save_dir = run_dir / "checkpoint_best.pt", run_dir / "checkpoints"
    if not best.is_file():
        train_once(command, run_dir / "train.log", env, save_dir)
        os.replace(save_dir / "checkpoint_best.pt", best)
        for path in save_dir.glob("*.pt"):
            path.unlink()
        save_dir.rmdir()
    return best


def train_wall(train_log: str, started: float) -> float:
    """Training's wall seconds from its log (:func:`training_wall_seconds`), else the time
    since ``started``, to 0.1 s."""
    return round(training_wall_seconds(train_log) or time.time() - started, 1)


TRAIN_WALL = re.compile(r"\bwall[= ](\d+(?:\.\d+)?)")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ", re.M)


def training_wall_seconds(train_log: str) -> Optional[float]:
    """Wall seconds of training, summed over the ``$ fairseq-train`` segments the log
    holds (a run cut off by the end of a session resumes in a new segment). A segment
    counts its meter's last ``wall`` value; fairseq 0.12 restores that meter from the
    checkpoint stopped, so a resumed segment reads ``wall=0`` throughout, and then
    counts the span between its first and last log timestamps instead."""
    walls = []
    for segment in fairseq_train_segments(train_log):
        values = [float(value) for value in TRAIN_WALL.findall(segment)]
        stamps = [datetime.datetime.fromisoformat(stamp) for stamp in LOG_TIME.findall(segment)]
        if values and values[-1] > 0:
            walls.append(values[-1])
        elif values and len(stamps) > 1:
            walls.append((stamps[-1] - stamps[0]).total_seconds())
    return sum(walls) if walls else None


def fairseq_train_segments(train_log: str) -> List[str]:
    """The output of each ``$ fairseq-train`` command of a log (:func:`process.run` writes
    the command line before its output), in order; another command's output ends one."""
    # re.split with a group alternates [before, command, output, command, output, ...]
    parts = re.split(r"^(\$ .*)$", train_log, flags=re.M)
    return [output for command, output in zip(parts[1::2], parts[2::2]) if "fairseq-train" in command]


def mechanism_parameters(checkpoint: Path, data_bin: Path, log_path: Path, env: Dict[str, str]) -> Dict[str, Dict]:
    """How far each mechanism parameter group of ``checkpoint`` moved from
    fairseq-train's initial model (``benchmarks.diagnostics.parameter_movement``; {} for vanilla)."""
    output = log_path.with_name("mechanism_parameters.json")
    run(
        [sys.executable, "-m", "benchmarks.diagnostics.parameter_movement", checkpoint, "--data", data_bin, "--json"],
        log_path,
        env,
        stdout_path=output,
    )
    return json.loads(output.read_text(encoding="utf-8"))
