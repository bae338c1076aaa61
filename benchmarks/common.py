"""What every harness shares, the speed harness included: the repository's paths (and
how results name them), command-line checks and the description of the machine a
result was measured on. What only the harnesses that train and evaluate models share
is in :mod:`benchmarks.harness`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

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


# fairseq flag (without "--") -> value: True a bare switch, None or False left out; the
# harnesses state their fairseq-train recipes as these, merged, and :func:`command_line`
# writes them out
Flags = Dict[str, object]


def command_line(*flags: Mapping[str, object]) -> List[object]:
    """The fairseq command-line arguments of ``flags``, merged in order (a later value
    of a flag replaces an earlier one, where it stood)."""
    merged: Flags = {}
    for part in flags:
        merged.update(part)
    arguments: List[object] = []
    for name, value in merged.items():
        if value is None or value is False:
            continue
        arguments.append(f"--{name}")
        if value is not True:
            arguments.append(value)
    return arguments


def model_size(
    dim: int, ffn: int, heads: int, layers: Optional[int] = None, sides: Sequence[str] = ("encoder", "decoder")
) -> Flags:
    """A Transformer's size, each for every side in ``sides`` (``("decoder",)`` for a language
    model): ``{side}-layers`` (unless None), ``{side}-embed-dim``, ``{side}-ffn-embed-dim``,
    ``{side}-attention-heads``."""
    sizes = {"layers": layers, "embed-dim": dim, "ffn-embed-dim": ffn, "attention-heads": heads}
    return {f"{side}-{name}": value for name, value in sizes.items() for side in sides}


def size_flags(
    dim: int, ffn: int, heads: int, layers: Optional[int] = None, sides: Sequence[str] = ("encoder", "decoder")
) -> List[str]:
    """:func:`model_size` as command-line strings."""
    return [str(item) for item in command_line(model_size(dim, ffn, heads, layers, sides))]


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


def add_run_arguments(parser, default_work: Path, default_out: Path, retrain_help: str) -> None:
    """The flags of a harness that trains its runs under ``--work`` and keeps one result
    file a run under ``--out``: ``--work``, ``--out`` (:func:`add_out_argument`),
    ``--threads``, ``--retrain`` (``retrain_help``: what a retrained run's log compares and
    what retraining is for) and ``--report``."""
    parser.add_argument(
        "--work", type=Path, default=default_work, help=f"checkpoints and logs (default: {default_work})"
    )
    add_out_argument(parser, default_out)
    parser.add_argument("--threads", type=at_least(1), default=1, help="OMP_NUM_THREADS of each run (default: 1)")
    parser.add_argument(
        "--retrain",
        action="store_true",
        help="train the selected runs again even where their run file exists (replacing it; " + retrain_help,
    )
    parser.add_argument("--report", action="store_true", help="only rebuild the table and plot from the run files")


def add_quality_work_argument(parser, default: Path, harness: str) -> None:
    """``--quality-work``: the ``--work`` of the training harness ``harness`` (e.g.
    ``benchmarks.quality.lm``), whose checkpoints an evaluation harness reads."""
    parser.add_argument("--quality-work", type=Path, default=default, help=f"{harness}'s --work (default: {default})")


def check_quality_work(parser, work: Path, scale: str, harness: str) -> None:
    """A parser error unless ``work`` holds ``harness``'s runs at ``scale``."""
    if not (work / scale).is_dir():
        parser.error(f"argument --quality-work: no {scale}-scale runs of {harness}: {work / scale} is not a directory")


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
    available (they take it unasked), else the CPU's, with the vector kernels torch
    picked for it: two CPUs of one name (AVX2, AVX-512) train the same seed into
    different models (docs/fairseq-traps.md)."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (GPU), {os.cpu_count()} CPU cores"
    return f"{cpu_model()} (torch kernels: {torch.backends.cpu.get_cpu_capability()})"


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


def text_lines(directory: Path, name: str) -> List[str]:
    """Lines of ``directory/name`` or of its ``.gz`` (the shipped samples are gzipped)."""
    path = directory / name
    if not path.is_file():
        path = directory / f"{name}.gz"
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = data.decode("utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines
