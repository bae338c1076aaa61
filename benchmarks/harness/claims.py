"""One process per run: two harnesses started on the same work directory (two shells,
two sessions) never train one run at once, and a run another process finished
meanwhile is not trained again."""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
from pathlib import Path
from typing import Callable, Iterator, Optional


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
