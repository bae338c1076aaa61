"""``python -m fairseq_distattn.mechanisms``: print the mechanism table the
registry gives; ``--write`` writes it to docs/mechanisms.md and copies it into
README.md (between its markers), from the repository root."""

import argparse
import sys
from pathlib import Path

from ..registry import MECHANISM_TABLE, mechanism_table
from . import MECHANISM_REGISTRY  # noqa: F401 (every mechanism registered)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_distattn.mechanisms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {MECHANISM_TABLE} and its README.md block")
    args = parser.parse_args(argv)
    table = mechanism_table()
    if not args.write:
        sys.stdout.write(table)
        return 0
    root = Path(__file__).resolve().parents[2]
    path = root / MECHANISM_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table, encoding="utf-8")
    from benchmarks.readme_blocks import update_readme  # the repository's README tooling

    if not update_readme(path, root / "README.md"):
        print(f"README.md has no block generated from {MECHANISM_TABLE}", file=sys.stderr)
        return 1
    print(f"wrote {MECHANISM_TABLE} and its README.md block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
