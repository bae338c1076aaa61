"""Which model a result is from: a result file records the sha256 of the checkpoint it
was evaluated from, so that a table row never mixes models (a run trained again, an
evaluation left over from the model before)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple


def checkpoint_fingerprint(path: Path) -> str:
    """sha256 of a checkpoint file: which model a result was evaluated from."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recorded_fingerprint(quality_file: Optional[Path]) -> Optional[str]:
    """The ``checkpoint_sha256`` a quality run file records (None: no such file, or
    one written before fingerprints were recorded)."""
    if quality_file is None or not quality_file.is_file():
        return None
    return json.loads(quality_file.read_text(encoding="utf-8")).get("checkpoint_sha256")


def evaluated_from(record: dict, fingerprint: str, quality_fingerprint: Optional[str]) -> bool:
    """Whether a run's result ``record`` may come from its model with ``fingerprint``,
    given the fingerprint its quality run file records. A record naming a checkpoint:
    when it names that one. A record naming none (written before fingerprints were
    recorded): unless the quality run names one, for a quality run that records
    a fingerprint was trained after fingerprints came, and every evaluation of its
    model since names it: such a record is from a model trained before (the run was
    trained again, e.g. ``--retrain``)."""
    if "checkpoint_sha256" in record:
        return record["checkpoint_sha256"] == fingerprint
    return quality_fingerprint is None


def models_per_run(
    records: Iterable[dict],
    run_of: Callable[[dict], Tuple[str, int]],
    quality_file: Callable[[str, int], Optional[Path]],
) -> List[str]:
    """What keeps result records from coming from one model per run: per run
    (``run_of(record)``: its configuration and seed), the ``checkpoint_sha256``
    its records name must be one, and the one its quality run file
    (``quality_file(config, seed)``; None or absent: not compared) records where
    that file records one; there, every record must name it (see
    ``evaluated_from``). Records from before fingerprints were recorded, of a run
    whose quality run file records none, cannot be checked. Returns the problems,
    one line each."""
    fingerprints: Dict[Tuple[str, int], set] = {}
    unnamed: Counter = Counter()
    for record in records:
        if "checkpoint_sha256" in record:
            fingerprints.setdefault(run_of(record), set()).add(record["checkpoint_sha256"])
        else:
            unnamed[run_of(record)] += 1
    problems = []
    for config, seed in sorted({*fingerprints, *unnamed}):
        found = fingerprints.get((config, seed), set())
        if len(found) > 1:
            problems.append(f"{config} seed {seed}: {len(found)} checkpoints")
            continue
        quality = quality_file(config, seed)
        recorded = recorded_fingerprint(quality)
        if recorded is None:
            continue
        if found and recorded not in found:
            problems.append(f"{config} seed {seed}: another model than the one {quality} records")
        elif unnamed[config, seed]:
            problems.append(
                f"{config} seed {seed}: {unnamed[config, seed]} result(s) naming no checkpoint, from a model "
                f"trained before the one {quality} records"
            )
    return problems
