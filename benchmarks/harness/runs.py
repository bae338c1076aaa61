"""A harness's run files: one JSON record per run (or per run and evaluation setting)
under ``<out>/runs``, from which every report is rebuilt, and the outputs a run keeps
beside its record (a translation run's test hypotheses, ``<run>.hyp.gz``)."""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def load_runs(out: Path) -> List[Dict[str, object]]:
    """The records of ``out/runs/*.json``, in file-name order."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted((out / "runs").glob("*.json"))]


def runs_by_config(runs: Sequence[Dict]) -> Dict[str, List[Dict]]:
    """``{configuration: its run records}``, in the order the runs come."""
    by_config: Dict[str, List[Dict]] = {}
    for record in runs:
        by_config.setdefault(record["config"], []).append(record)
    return by_config


HYPOTHESES_SUFFIX = ".hyp.gz"


def hypotheses_file(run_file: Path) -> Path:
    """Where a run keeps its test hypotheses: beside its record, ``vanilla-seed1.json`` ->
    ``vanilla-seed1.hyp.gz``."""
    return run_file.with_name(run_file.stem + HYPOTHESES_SUFFIX)


def kept_hypotheses(runs: Path, config: str) -> Dict[int, Path]:
    """``{seed: hypotheses file}`` of ``config``'s runs in ``runs`` (a harness's ``<out>/runs``)
    that kept their test hypotheses (:func:`hypotheses_file` of ``<config>-seed<seed>.json``)."""
    prefix = f"{config}-seed"
    kept = {}
    for path in runs.glob(glob.escape(prefix) + "*" + HYPOTHESES_SUFFIX):
        seed = path.name[len(prefix) : -len(HYPOTHESES_SUFFIX)]
        if seed.isdigit():
            kept[int(seed)] = path
    return kept


def save_lines(path: Path, lines: Sequence[str]) -> None:
    """``lines`` gzipped, one a line, the same bytes for the same lines (no name or time in
    the gzip header); written beside and renamed, so a file that exists is whole."""
    partial = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))
    partial.replace(path)


def load_lines(path: Path) -> Optional[List[str]]:
    """The lines :func:`save_lines` wrote, None when ``path`` does not exist."""
    if not path.is_file():
        return None
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    return text.split("\n")[:-1] if text else []
