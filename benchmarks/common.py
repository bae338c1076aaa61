"""What every harness shares: the repository's paths, command-line checks and the
description of the machine a result was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- command line


def at_least(least: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``least`` (argparse names the flag in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be an integer >= {least}")
        return value

    return parse


def scale_results(default: Path, scale: str) -> Path:
    """A harness's default ``--out`` for ``--scale``: ``default`` for "small" (the CPU
    budget of the README's tables), ``<default>-<scale>`` otherwise, so that a GPU grid at
    ``--scale base`` neither skips the CPU runs' files as done nor mixes with them."""
    return default if scale == "small" else default.with_name(f"{default.name}-{scale}")


def add_out_argument(parser, default: Path) -> None:
    """``--out``, whose default depends on ``--scale`` (:func:`scale_results`): after
    parsing, ``args.out = args.out or scale_results(default, args.scale)``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"result files (default: {default} for --scale small, {default}-SCALE for the others)",
    )


def check_same_budget(parser, out: Path, expected: Dict[str, object]) -> None:
    """The harnesses skip a run whose result file exists, and average the files of a
    configuration: both are right only if every file under ``out/runs`` has the budget
    asked for now (``expected``: record fields such as scale and updates)."""
    for path in sorted((out / "runs").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        differs = [key for key, value in expected.items() if key in record and record[key] != value]
        if differs:
            found = ", ".join(f"{key} {record[key]}" for key in differs)
            wanted = ", ".join(f"{key} {expected[key]}" for key in differs)
            parser.error(
                f"argument --out: {path} is a run with {found}, not {wanted}: one --out holds one budget "
                "(give another --out)"
            )


def comma_separated_ints(parser, flag: str, text: str, least: int) -> List[int]:
    """``--seeds 1,2``-style values, each an integer >= ``least``; at least one (an empty
    list would run nothing and say nothing). Errors go through ``parser.error``."""
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        parser.error(f"argument {flag}: {text!r} is not a comma-separated list of integers")
    if not values:
        parser.error(f"argument {flag}: give at least one value")
    if any(value < least for value in values):
        parser.error(f"argument {flag}: invalid value {text!r}: each must be an integer >= {least}")
    return values


def comma_separated_names(parser, flag: str, text: str, known: Iterable[str]) -> List[str]:
    """``--configs a,b``: names from ``known`` (all of them when ``text`` is empty)."""
    known = list(known)
    names = [item.strip() for item in text.split(",") if item.strip()] or known
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"argument {flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


# --------------------------------------------------------------------------- one process per run


@contextlib.contextmanager
def claimed(directory: Path, wait: bool = False) -> Iterator[Optional[str]]:
    """Claims ``directory`` for this process while the block runs: an exclusive
    ``flock`` on its ``.lock`` file, so two harnesses started on the same work
    directory (two shells, two sessions) never train one run at once. The kernel
    drops the lock when its holder exits, killed or not, so a claim is never stale.
    Yields None once claimed; without ``wait``, yields instead who holds it (the
    holder's ``pid N on HOST``) when another process does, and runs the block
    without the claim."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            yield handle.read().strip() or "another process"
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {platform.node()}")
        handle.flush()
        try:
            yield None
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_version(path: Path) -> Optional[int]:
    """The modification time of ``path`` in ns, None when there is no such file."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def train_unless_taken(
    run: str,
    run_dir: Path,
    run_file: Path,
    listed: Optional[int],
    train: Callable[[], None],
    log: Callable[[str], None],
) -> None:
    """Calls ``train`` holding the claim on ``run_dir``, unless another process holds
    it or wrote ``run_file`` since this one listed its runs (``listed``: the file's
    ``file_version`` then); logs why it skips ``run`` (e.g. ``da seed 2``)."""
    with claimed(run_dir) as holder:
        if holder is not None:
            log(f"skip {run}: {holder} is training it in {run_dir}")
        elif file_version(run_file) not in (None, listed):
            log(f"skip {run}: another process finished it")
        else:
            train()


# --------------------------------------------------------------------------- which model a result is from


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


# --------------------------------------------------------------------------- paths in results


def without_machine_paths(text: str) -> str:
    """``text`` with this checkout's directories written relative to the repository
    (``work/...``, ``.venv/bin/...``; ``../shared/...`` beside it): committed results
    must read the same on every machine. Only whole paths are rewritten: a
    directory of the same name deeper in a path (``/x/repo/work/`` with the
    checkout in ``/x``) stays as it is."""
    for directory, written in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        text = re.sub(r"(?<![\w./-])" + re.escape(f"{directory}/"), written, text)
    return text


def shown(path: Path) -> str:
    """A path as results files record it: relative to the repository, so
    committed results name no directory of the machine that produced them."""
    return os.path.relpath(path, REPO_ROOT)


# --------------------------------------------------------------------------- machine


def device_model() -> str:
    """What a harness's fairseq tools train on: the GPU's name where CUDA is
    available (they take it unasked), else the CPU's."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (GPU), {os.cpu_count()} CPU cores"
    return cpu_model()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def physical_cores() -> Optional[int]:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo, or None."""
    try:
        cores = set()
        physical = core = None
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((physical, core))
                    physical = core = None
        if core is not None:
            cores.add((physical, core))
        return len(cores) or None
    except OSError:
        return None


def load_average() -> Optional[Tuple[float, float, float]]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover
        return None


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        rev = out.stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_description(device) -> Dict[str, object]:
    import numpy
    import torch

    try:
        import fairseq

        fairseq_version = fairseq.__version__
    except Exception:  # pragma: no cover
        fairseq_version = "unknown"
    info: Dict[str, object] = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fairseq": fairseq_version,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "git": git_revision(),
        "load_average_start": load_average(),
    }
    device = torch.device(device)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    return info
