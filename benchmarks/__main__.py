"""``python -m benchmarks`` is the same as ``python -m benchmarks.run``."""

from .speed.run import main

if __name__ == "__main__":
    raise SystemExit(main())
