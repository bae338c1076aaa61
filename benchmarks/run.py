"""``python -m benchmarks.run`` and ``python benchmarks/run.py``: the speed benchmark,
whose code is :mod:`benchmarks.speed.run`."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/run.py`: the repository is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.speed.run import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
