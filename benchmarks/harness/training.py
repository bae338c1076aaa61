"""What the translation and language-model quality runs share about training: the
optimiser recipe, the training wall time their fairseq-train logs give, and how far
the mechanisms' parameters moved from the initial model."""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .process import log, run


def optimizer_args(updates: int) -> List[object]:
    """The optimiser and schedule of every quality recipe (translation and LM):
    Adam, inverse square root with a warm-up of a quarter of the run, at most 400."""
    return [
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--clip-norm",
        "1.0",
        "--lr",
        "1e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        max(1, min(updates // 4, 400)),
        "--warmup-init-lr",
        "1e-7",
    ]


TRAIN_WALL = re.compile(r"\bwall[= ](\d+(?:\.\d+)?)")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ", re.M)


def training_wall_seconds(train_log: str) -> Optional[float]:
    """Wall seconds of training, summed over the ``$ fairseq-train`` segments the log
    holds (a run cut off by the end of a session resumes in a new segment). A segment
    counts its meter's last ``wall`` value; fairseq 0.12 restores that meter from the
    checkpoint stopped, so a resumed segment reads ``wall=0`` throughout, and then
    counts the span between its first and last log timestamps instead."""
    # re.split with a group alternates [before, command, output, command, output, ...]
    parts = re.split(r"^(\$ .*)$", train_log, flags=re.M)
    segments = [output for command, output in zip(parts[1::2], parts[2::2]) if "fairseq-train" in command]
    walls = []
    for segment in segments:
        values = [float(value) for value in TRAIN_WALL.findall(segment)]
        stamps = [datetime.datetime.fromisoformat(stamp) for stamp in LOG_TIME.findall(segment)]
        if values and values[-1] > 0:
            walls.append(values[-1])
        elif values and len(stamps) > 1:
            walls.append((stamps[-1] - stamps[0]).total_seconds())
    return sum(walls) if walls else None


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


def backfill_mechanism_parameters(
    out: Path, model_of: Callable[[Dict[str, object], Path], Tuple[Path, Path, Path]]
) -> None:
    """Add ``mechanism_parameters`` to run files written before it was measured.
    ``model_of(record, run_file)``: where the run kept ``(checkpoint, data-bin, log)``;
    a run whose checkpoint or data is gone is left as it is."""
    for path in sorted((out / "runs").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if "mechanism_parameters" in record:
            continue
        found = model_of(record, path)
        if not found[0].is_file() or not found[1].is_dir():
            continue
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        record["mechanism_parameters"] = mechanism_parameters(*found, env)
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        log(f"measured the mechanism parameters of {path.stem}")
