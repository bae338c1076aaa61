#!/usr/bin/env python3
"""Write the length-generalization tasks (scripts/lib/length_tasks.py) as text files.

  python scripts/make_length_tasks.py --out data/length-tasks
  python scripts/make_length_tasks.py --out DIR --tasks copy,reverse --seed 2 \\
      --train-size 5000 --valid-size 200 --test-size 200

One folder per task, ``DIR/<task>/``, holding ``train``, ``valid`` and one ``test-xK``
per length bucket, each as ``<split>.src`` and ``<split>.tgt`` (one example per line,
tokens separated by single spaces: what ``fairseq-preprocess --source-lang src
--target-lang tgt --trainpref train --validpref valid --testpref test-x1,test-x2,...``
reads), and ``task.json``: the task's description, what its length counts, L, the
length range, seed and counts of every split, its forms and vocabulary, and the
generator version. The decoder-only form is made from the same files by joining each
pair with ``=`` (``length_tasks.decoder_only_line``).

The output depends on the seed alone (byte-identical files for a seed). Each split
draws from its own ``random.Random``, seeded by a hash of (seed, task, split), so the
splits are independent samples and adding a task or a bucket changes no other file.
Test examples that also occur in the training split are dropped (a chance collision
of short strings over a small alphabet: parity's 2**9 strings of 9 bits, for one), so
a test bucket can hold fewer than --test-size lines; task.json counts what was drawn,
dropped and written. The validation split keeps such examples: it is a sample of the
training distribution, for the validation loss.

The defaults (5000 training examples, 200 for validation and for each test bucket) are
sized for a tiny model trained for about five minutes on one CPU thread: a few epochs
over 5000 lines, and 200 examples measure an exact-match accuracy to within about
+-7 points (95%).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

LIBRARY = Path(__file__).resolve().parent / "lib" / "length_tasks.py"
LIBRARY_MODULE = "distattn_length_tasks"


def load_library():
    """scripts/lib/length_tasks.py, loaded from its path: scripts/ is no package, and
    putting scripts/lib on sys.path would change what other modules import. Registered
    in sys.modules (its dataclass needs it), once, so the tests and this script share it."""
    if LIBRARY_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(LIBRARY_MODULE, LIBRARY)
        module = importlib.util.module_from_spec(spec)
        sys.modules[LIBRARY_MODULE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[LIBRARY_MODULE]
            raise
    return sys.modules[LIBRARY_MODULE]


length_tasks = load_library()

DEFAULT_SEED = 1
DEFAULT_TRAIN_SIZE = 5000
DEFAULT_VALID_SIZE = 200
DEFAULT_TEST_SIZE = 200


def split_seed(seed: int, task: str, split: str) -> int:
    """The seed of one split: a hash, so nearby seeds or names give unrelated streams
    (and not Python's hash(), which is randomised per process)."""
    digest = hashlib.sha256(f"length-tasks/{seed}/{task}/{split}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def draw_lines(task, seed: int, low: int, high: int, size: int) -> List[Tuple[str, str]]:
    """``size`` examples of ``task`` as (source line, target line), lengths in ``low..high``."""
    rng = random.Random(seed)
    lines = []
    for _ in range(size):
        source, target = task.draw(rng, low, high)
        lines.append((" ".join(source), " ".join(target)))
    return lines


def write_lines(path: Path, lines: Sequence[str]) -> None:
    # written aside and renamed, so a killed run leaves no truncated file under the final name
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def write_split(folder: Path, split: str, pairs: Sequence[Tuple[str, str]]) -> None:
    write_lines(folder / f"{split}.src", [source for source, _ in pairs])
    write_lines(folder / f"{split}.tgt", [target for _, target in pairs])


def split_plan(task, sizes: Dict[str, int]) -> List[Tuple[str, Tuple[int, int], int]]:
    """(split name, inclusive length range, size) of every split of ``task``, train first."""
    plan = [("train", task.train_range(), sizes["train"]), ("valid", task.train_range(), sizes["valid"])]
    plan += [(f"test-{bucket}", lengths, sizes["test"]) for bucket, lengths in task.buckets().items()]
    return plan


def make_task(out: Path, task, seed: int, sizes: Dict[str, int]) -> Dict:
    """Write every split of ``task`` under ``out/<task>/`` and return its task.json."""
    folder = out / task.name
    folder.mkdir(parents=True, exist_ok=True)
    splits: Dict[str, Dict] = {}
    in_train: Set[str] = set()
    for split, (low, high), size in split_plan(task, sizes):
        seed_of_split = split_seed(seed, task.name, split)
        pairs = draw_lines(task, seed_of_split, low, high, size)
        counts = {"drawn": len(pairs)}
        if split == "train":
            in_train = {source for source, _ in pairs}
        elif split == "valid":
            counts["also_in_train"] = sum(source in in_train for source, _ in pairs)
        else:
            kept = [pair for pair in pairs if pair[0] not in in_train]
            counts["dropped_as_in_train"] = len(pairs) - len(kept)
            pairs = kept
        counts["written"] = len(pairs)
        write_split(folder, split, pairs)
        splits[split] = {"lengths": [low, high], "seed": seed_of_split, **counts}
    metadata = task_metadata(task, seed, sizes, splits)
    write_lines(folder / "task.json", [json.dumps(metadata, indent=2)])
    return metadata


def task_metadata(task, seed: int, sizes: Dict[str, int], splits: Dict[str, Dict]) -> Dict:
    return {
        "name": task.name,
        "description": task.description,
        "length_unit": task.length_unit,
        "train_length": task.train_length,
        "min_length": task.min_length,
        "buckets": {bucket: list(lengths) for bucket, lengths in task.buckets().items()},
        "bucket_rule": "test bucket xK holds lengths K*L//2+1 .. K*L; train and valid hold min_length .. L",
        "forms": list(task.forms),
        "decoder_only_separator": length_tasks.SEPARATOR,
        "vocabulary": list(task.vocabulary),
        "generator_version": length_tasks.GENERATOR_VERSION,
        "seed": seed,
        "sizes": dict(sizes),
        "splits": splits,
        "files": {split: [f"{split}.src", f"{split}.tgt"] for split in splits},
    }


def task_list(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in length_tasks.TASKS]
    if unknown or not names:
        known = ", ".join(length_tasks.TASKS)
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(unknown) or '(none given)'}; known: {known}")
    return list(dict.fromkeys(names))


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make_length_tasks.py",
        description="Write the seeded length-generalization tasks, one folder per task.",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder (DIR/<task>/ is written)")
    parser.add_argument(
        "--tasks", type=task_list, default=list(length_tasks.TASKS), help="comma-separated tasks (default: all)"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"(default: {DEFAULT_SEED})")
    parser.add_argument("--train-size", type=positive, default=DEFAULT_TRAIN_SIZE, help="(default: %(default)s)")
    parser.add_argument("--valid-size", type=positive, default=DEFAULT_VALID_SIZE, help="(default: %(default)s)")
    parser.add_argument(
        "--test-size", type=positive, default=DEFAULT_TEST_SIZE, help="examples per test bucket (default: %(default)s)"
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    sizes = {"train": args.train_size, "valid": args.valid_size, "test": args.test_size}
    for name in args.tasks:
        metadata = make_task(args.out, length_tasks.TASKS[name], args.seed, sizes)
        written = ", ".join(f"{split} {counts['written']}" for split, counts in metadata["splits"].items())
        print(f"{name}: {written} -> {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
