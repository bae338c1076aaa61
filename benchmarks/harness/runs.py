"""A harness's run files: one JSON record per run (or per run and evaluation setting)
under ``<out>/runs``, from which every report is rebuilt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence


def load_runs(out: Path) -> List[Dict[str, object]]:
    """The records of ``out/runs/*.json``, in file-name order."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted((out / "runs").glob("*.json"))]


def runs_by_config(runs: Sequence[Dict]) -> Dict[str, List[Dict]]:
    """``{configuration: its run records}``, in the order the runs come."""
    by_config: Dict[str, List[Dict]] = {}
    for record in runs:
        by_config.setdefault(record["config"], []).append(record)
    return by_config
