"""Running a fairseq tool (or one of the repository's scripts) from a harness: progress
lines on stderr, each tool's output appended to a log file, a failure raised with the
end of that log."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from ..common import REPO_ROOT

# the console scripts (fairseq-train, ...) of the Python that runs the harness
BIN_DIR = Path(sys.executable).parent


def log(message: str) -> None:
    print(f"[benchmarks {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tool(name: str) -> str:
    path = BIN_DIR / name
    return str(path) if path.exists() else name


def tool_env(threads: int) -> Dict[str, str]:
    """The environment the fairseq tools of a harness run in: ``threads`` OpenMP threads,
    unbuffered output (the log shows progress as it comes), and without
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD: checkpoints load with torch's ``weights_only=True``,
    as a user's do (the plugin allow-lists what fairseq checkpoints hold)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def run(cmd: Sequence, log_path: Path, env: Dict[str, str], stdout_path: Optional[Path] = None) -> None:
    """Run a command with its stderr, and its stdout unless ``stdout_path``,
    appended to ``log_path`` as it runs (fairseq logs progress to stdout); a
    failure raises with the end of the log."""
    cmd = [str(c) for c in cmd]
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write("$ " + shlex.join(cmd) + "\n")
        log_file.flush()
        with open(stdout_path or os.devnull, "w", encoding="utf-8") as stdout_file:
            proc = subprocess.run(
                cmd, cwd=REPO_ROOT, env=env, text=True, stdout=stdout_file if stdout_path else log_file, stderr=log_file
            )
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-20:])
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}); end of {log_path}:\n{tail}")
