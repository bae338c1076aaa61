"""``python -m fairseq_distattn.mechanisms``: print the mechanism table, the flag
table and the SPEC grammar the registry gives; ``--write`` writes them to docs/ and copies
them into README.md (between their markers), from the repository root;
``--accepted-by KIND ...`` prints, one per line, the mechanisms that every
given attention kind accepts (what ``scripts/quickstart.sh`` offers as MECH)."""

import argparse
import sys
from pathlib import Path

from ..registry import KINDS, MECHANISM_TABLE, mechanism_table
from ..spec import FLAG_TABLE, SPEC_GRAMMAR, accepted_by, flag_table, spec_grammar


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_distattn.mechanisms", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--write",
        action="store_true",
        help=f"write {MECHANISM_TABLE}, {FLAG_TABLE} and {SPEC_GRAMMAR} and their README.md blocks",
    )
    action.add_argument(
        "--accepted-by",
        nargs="+",
        choices=KINDS,
        metavar="KIND",
        help=f"print the mechanisms every KIND accepts ({', '.join(KINDS)})",
    )
    args = parser.parse_args(argv)
    if args.accepted_by:
        sys.stdout.write("".join(f"{name}\n" for name in accepted_by(args.accepted_by)))
        return 0
    generated = {MECHANISM_TABLE: mechanism_table(), FLAG_TABLE: flag_table(), SPEC_GRAMMAR: spec_grammar()}
    if not args.write:
        sys.stdout.write("\n".join(generated.values()))
        return 0
    root = Path(__file__).resolve().parents[2]
    from benchmarks.readme_blocks import update_readme  # the repository's README tooling

    for relative, text in generated.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not update_readme(path, root / "README.md"):
            print(f"README.md has no block generated from {relative}", file=sys.stderr)
            return 1
        print(f"wrote {relative} and its README.md block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
