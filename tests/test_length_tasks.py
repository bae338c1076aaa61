"""The length-generalization data (scripts/lib/length_tasks.py, written by
scripts/make_length_tasks.py): every answer is right, recomputed here from the source
alone; lengths fall in the documented range of their split or bucket; a seed gives
byte-identical folders and another seed other data; tokens are ones fairseq's
dictionaries keep as they are; task.json describes the files beside it.

Every list of cases derives from the registry (length_tasks.TASKS), so a new task is
tested as soon as it is registered, and fails until this file knows how to check its
answers and measure its lengths (ORACLES)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from .conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "make_length_tasks.py"


def load_script(name: str = "distattn_make_length_tasks_script"):
    """scripts/make_length_tasks.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_length_tasks = load_script()
length_tasks = make_length_tasks.length_tasks
TASKS = length_tasks.TASKS
TASK_NAMES = list(TASKS)
SPLITS = [
    (name, split)
    for name, task in TASKS.items()
    for split in make_length_tasks.split_plan(task, {"train": 0, "valid": 0, "test": 0})
]
SPLIT_IDS = [f"{name}-{split[0]}" for name, split in SPLITS]

# small, but enough for every length of every range to be likely drawn
SIZES = {"train": 300, "valid": 30, "test": 30}
SEED = 7
# what fairseq's Dictionary adds or reads specially; `|` is the word boundary of its
# letter-level dictionaries (wav2letter) and of its command lines
FAIRSEQ_SPECIAL = {"<s>", "</s>", "<pad>", "<unk>", "<mask>", "|"}


# --------------------------------------------------------------------------- oracles
# Each answer is recomputed from the source with plain Python, and each length measured
# from the source as documented per task; neither uses the generators.


def answer_addition(source: List[str]) -> List[str]:
    plus = source.index("+")
    a, b = source[:plus], source[plus + 1 :]
    assert len(a) == len(b), "both operands have n digits"
    for operand in (a, b):
        assert all(t.isdigit() and len(t) == 1 for t in operand)
        assert len(operand) == 1 or operand[-1] != "0", "no leading zero (digits are least significant first)"
    total = int("".join(reversed(a))) + int("".join(reversed(b)))
    return list(reversed(str(total)))


def answer_flip_flop(source: List[str]) -> List[str]:
    assert len(source) % 2 == 1 and source[0] == "w" and source[-1] == "r"
    memory = None
    for op, bit in zip(source[0:-1:2], source[1::2]):
        assert op in {"w", "r", "i"} and bit in {"0", "1"}
        if op == "w":
            memory = bit
        elif op == "r":
            assert bit == memory, "an intermediate read shows the last written bit"
    return [memory]


def passkey_parts(source: List[str]) -> Tuple[List[str], int, List[str]]:
    """(filler tokens, depth of the key sentence in them, key) of a passkey source."""
    question = "what is the pass key ?".split()
    assert source[-len(question) :] == question
    digits = [i for i, token in enumerate(source) if token.isdigit()]
    assert len(digits) == 5 and digits == list(range(digits[0], digits[0] + 5)), "one run of five digits"
    start, end = digits[0] - 4, digits[-1] + 5
    assert source[start : digits[0]] == ["the", "pass", "key", "is"]
    assert source[digits[-1] + 1 : end] == [".", "remember", "it", "."]
    filler = source[:start] + source[end : -len(question)]
    return filler, start, [source[i] for i in digits]


def answer_passkey(source: List[str]) -> List[str]:
    key = passkey_parts(source)[2]
    assert key[0] != "0", "a 5-digit key"
    return key


def length_addition(source: List[str]) -> int:
    assert len(source) % 2 == 1
    return source.index("+")


ORACLES = {
    "copy": (list, len),
    "reverse": (lambda s: s[::-1], len),
    "sort": (sorted, len),
    "addition": (answer_addition, length_addition),
    "parity": (lambda s: ["odd" if s.count("1") % 2 else "even"], len),
    "flip-flop": (answer_flip_flop, lambda s: (len(s) + 1) // 2),
    "passkey": (answer_passkey, lambda s: len(passkey_parts(s)[0])),
}


def test_every_registered_task_has_an_oracle():
    assert set(ORACLES) == set(TASKS)


# --------------------------------------------------------------------------- files


def read_lines(path: Path) -> List[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), f"{path} ends with a newline"
    return text[:-1].split("\n")


def read_split(folder: Path, split: str) -> List[Tuple[List[str], List[str]]]:
    sources, targets = read_lines(folder / f"{split}.src"), read_lines(folder / f"{split}.tgt")
    assert len(sources) == len(targets)
    return [(s.split(" "), t.split(" ")) for s, t in zip(sources, targets)]


def folder_bytes(folder: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def make(out: Path, seed: int = SEED, sizes: Dict[str, int] = SIZES, tasks=TASK_NAMES) -> Path:
    argv = ["--out", str(out), "--seed", str(seed), "--tasks", ",".join(tasks)]
    argv += [f"--{split}-size={size}" for split, size in sizes.items()]
    assert make_length_tasks.main(argv) == 0
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("length-tasks"))


# --------------------------------------------------------------------------- answers and lengths


@pytest.mark.parametrize("name, split", SPLITS, ids=SPLIT_IDS)
def test_answers_are_right_and_lengths_in_range(made, name, split):
    split_name, (low, high), _ = split
    answer, measure = ORACLES[name]
    examples = read_split(made / name, split_name)
    assert examples
    lengths = set()
    for source, target in examples:
        assert target == answer(source), " ".join(source)
        lengths.add(measure(source))
    assert low <= min(lengths) and max(lengths) <= high, (split_name, sorted(lengths))
    # the range is covered, not a corner of it (30 draws over at most 1024 lengths)
    assert max(lengths) - min(lengths) >= (high - low) // 2


@pytest.mark.parametrize("name", TASK_NAMES)
def test_documented_ranges(name):
    task = TASKS[name]
    assert task.train_range() == (task.min_length, task.train_length)
    assert task.multipliers[:3] == (1, 2, 4)
    previous_high = task.train_length // 2
    for k in task.multipliers:
        low, high = task.bucket_range(k)
        assert (low, high) == (k * task.train_length // 2 + 1, k * task.train_length)
        assert low == previous_high + 1, "buckets are contiguous and do not overlap"
        previous_high = high
    assert task.bucket_range(1)[0] > task.min_length
    with pytest.raises(ValueError):
        task.draw(random.Random(0), task.min_length - 1, task.train_length)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_drawn_lengths_cover_the_whole_range(name):
    task = TASKS[name]
    _, measure = ORACLES[name]
    low, high = task.train_range()
    rng = random.Random(0)
    lengths = {measure(task.draw(rng, low, high)[0]) for _ in range(40 * (high - low + 1))}
    assert lengths == set(range(low, high + 1))


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_length_of_a_range_is_right(name):
    """Each length from the minimum to the end of x2, a few examples each (the files
    hold a sample; this leaves no length out, the shortest included)."""
    task = TASKS[name]
    answer, measure = ORACLES[name]
    rng = random.Random(name)
    for length in range(task.min_length, task.bucket_range(2)[1] + 1):
        for _ in range(3):
            source, target = task.generate(rng, length)
            assert measure(source) == length
            assert target == answer(source)


def test_passkey_depth_is_uniform():
    task = TASKS["passkey"]
    rng = random.Random(0)
    depths = [passkey_parts(task.generate(rng, 40)[0])[1] for _ in range(4100)]
    counts = [depths.count(d) for d in range(41)]
    assert min(counts) > 50 and max(counts) < 160, counts  # about 100 each


def test_flip_flop_instruction_mix():
    rng = random.Random(0)
    ops = [op for _ in range(200) for op in TASKS["flip-flop"].generate(rng, 102)[0][2:-1:2]]
    assert abs(ops.count("i") / len(ops) - 0.8) < 0.02
    assert abs(ops.count("w") / len(ops) - 0.1) < 0.02


def test_generators_leave_the_global_random_state_alone():
    state = random.getstate()
    for seed in (0, 123):
        random.seed(seed)
        drawn = [task.draw(random.Random(5), *task.train_range()) for task in TASKS.values()]
        if seed == 0:
            first = drawn
        assert drawn == first, "the global seed changes nothing"
    random.setstate(state)
    before = random.getstate()
    for task in TASKS.values():
        task.draw(random.Random(5), *task.train_range())
    assert random.getstate() == before


# --------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("name", TASK_NAMES)
def test_tokens_are_plain_words_fairseq_keeps(made, name):
    task = TASKS[name]
    vocabulary = set(task.vocabulary)
    assert length_tasks.SEPARATOR not in vocabulary
    for token in vocabulary:
        assert token and token == token.strip() and not any(c.isspace() for c in token)
        assert token not in FAIRSEQ_SPECIAL and "|" not in token and not token.startswith("<")
        assert not token.startswith("madeupword") and not token.startswith("#fairseq")
    for path in sorted((made / name).glob("*.src")) + sorted((made / name).glob("*.tgt")):
        for line in read_lines(path):
            tokens = line.split(" ")
            assert tokens == line.split(), f"{path.name}: single spaces only: {line!r}"
            assert set(tokens) <= vocabulary, f"{path.name}: {set(tokens) - vocabulary}"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_decoder_only_line(name):
    source, target = TASKS[name].generate(random.Random(1), TASKS[name].train_length)
    line = length_tasks.decoder_only_line(source, target)
    assert line.split(" = ") == [" ".join(source), " ".join(target)]


# --------------------------------------------------------------------------- task.json and layout


def expected_files(task) -> set:
    splits = ["train", "valid"] + [f"test-{bucket}" for bucket in task.buckets()]
    return {"task.json"} | {f"{split}.{side}" for split in splits for side in ("src", "tgt")}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_task_json_matches_the_files(made, name):
    task = TASKS[name]
    folder = made / name
    assert {p.name for p in folder.iterdir()} == expected_files(task)
    meta = json.loads((folder / "task.json").read_text(encoding="utf-8"))
    assert meta["name"] == name and meta["description"] == task.description
    assert meta["train_length"] == task.train_length and meta["min_length"] == task.min_length
    assert meta["buckets"] == {bucket: list(lengths) for bucket, lengths in task.buckets().items()}
    assert meta["forms"] == list(task.forms) and meta["vocabulary"] == list(task.vocabulary)
    assert meta["seed"] == SEED and meta["sizes"] == SIZES
    assert meta["generator_version"] == length_tasks.GENERATOR_VERSION
    assert list(meta["splits"]) == ["train", "valid"] + [f"test-{bucket}" for bucket in task.buckets()]
    for split, counts in meta["splits"].items():
        lines = len(read_lines(folder / f"{split}.src"))
        assert counts["written"] == lines == len(read_lines(folder / f"{split}.tgt"))
        size = SIZES[split if split in SIZES else "test"]
        assert counts["drawn"] == size
        assert counts["written"] == size - counts.get("dropped_as_in_train", 0)
        if split.startswith("test-"):
            assert counts["lengths"] == meta["buckets"][split[len("test-") :]]
        else:
            assert counts["lengths"] == [task.min_length, task.train_length]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_no_test_example_occurs_in_train(made, name):
    train = set(read_lines(made / name / "train.src"))
    meta = json.loads((made / name / "task.json").read_text(encoding="utf-8"))
    for split in meta["splits"]:
        if split.startswith("test-"):
            assert not train & set(read_lines(made / name / f"{split}.src")), split


def test_parity_drops_test_examples_seen_in_training(tmp_path):
    """Short bit strings collide by chance: x1 of parity (9 to 16 bits, against 5000
    training strings) loses some, and task.json says how many."""
    make(tmp_path, seed=1, sizes={"train": 5000, "valid": 10, "test": 200}, tasks=["parity"])
    counts = json.loads((tmp_path / "parity" / "task.json").read_text(encoding="utf-8"))["splits"]
    assert counts["test-x1"]["dropped_as_in_train"] > 0
    assert counts["test-x1"]["written"] == len(read_lines(tmp_path / "parity" / "test-x1.src"))
    assert counts["test-x2"]["dropped_as_in_train"] == 0


# --------------------------------------------------------------------------- seeds


def test_the_same_seed_gives_byte_identical_folders(made, tmp_path):
    again = make(tmp_path / "again")
    assert folder_bytes(again) == folder_bytes(made)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_another_seed_gives_other_data(made, tmp_path, name):
    other = make(tmp_path, seed=SEED + 1, tasks=[name])
    for split in ["train", "valid", "test-x1"]:
        assert (other / name / f"{split}.src").read_bytes() != (made / name / f"{split}.src").read_bytes(), split


def test_splits_draw_from_independent_seeds():
    seeds = {make_length_tasks.split_seed(seed, name, split[0]) for seed in (1, 2) for name, split in SPLITS}
    assert len(seeds) == 2 * len(SPLITS)


def test_a_task_does_not_depend_on_the_others_generated_with_it(made, tmp_path):
    alone = make(tmp_path, tasks=["sort"])
    assert folder_bytes(alone / "sort") == folder_bytes(made / "sort")


# --------------------------------------------------------------------------- command line


def test_the_command_line_writes_the_layout(tmp_path, capsys):
    out = tmp_path / "out"
    make(out, sizes={"train": 3, "valid": 2, "test": 1}, tasks=["copy", "passkey"])
    assert sorted(p.name for p in out.iterdir()) == ["copy", "passkey"]
    for name in ("copy", "passkey"):
        assert {p.name for p in (out / name).iterdir()} == expected_files(TASKS[name])
        assert len(read_lines(out / name / "train.src")) == 3
        assert len(read_lines(out / name / "valid.tgt")) == 2
    assert "test-x32" in (out / "passkey" / "task.json").read_text(encoding="utf-8")
    assert "copy: train 3, valid 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["--tasks", "copy,nope"], ["--tasks", ","], ["--train-size", "0"], ["--test-size", "x"], []],
    ids=["unknown-task", "no-task", "zero-size", "not-a-number", "no-out"],
)
def test_the_command_line_refuses_bad_arguments(tmp_path, capsys, argv):
    if argv:
        argv = ["--out", str(tmp_path / "out"), *argv]
    with pytest.raises(SystemExit) as stopped:
        make_length_tasks.main(argv)
    assert stopped.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_importing_the_script_has_no_side_effects(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    load_script("distattn_make_length_tasks_script_again")
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr() == ("", "")
    assert sys.path == path_before
