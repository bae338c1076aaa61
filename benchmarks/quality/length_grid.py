"""What the length-generalization harness (``benchmarks.quality.length_generalization``)
trains, and on what.

The methods (every row of the methods table, ``benchmarks.quality.methods``: the
baseline with sinusoidal positions, each mechanism, NoPE), each with the decoder-only
model of its LM preset and the encoder-decoder model of its translation
configuration; the one budget every run gets; the task folders it reads; and where
runs and results go. The harness and its report take these from here.

A task is a folder of text files, nothing else: ``train``, ``valid`` and one
``test-<bucket>`` per length bucket, each as ``<split>.src`` and ``<split>.tgt`` (one
example a line, tokens separated by spaces), and optionally ``task.json``, whose
``forms`` say which forms it has (without it: the decoder-only form alone).
``scripts/make_length_tasks.py`` writes such folders; a new task needs no code here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "length_generalization"
DEFAULT_WORK = REPO_ROOT / "work" / "length_generalization"
# the generator of the default tasks, run as a command: the benchmarks import nothing from scripts/
MAKE_TASKS = REPO_ROOT / "scripts" / "make_length_tasks.py"
DEFAULT_DATA_SEED = 1

DECODER_ONLY = "decoder-only"
ENCODER_DECODER = "encoder-decoder"
FORMS = (DECODER_ONLY, ENCODER_DECODER)
# what the decoder-only form puts between a source and its answer (scripts/lib/length_tasks.py's SEPARATOR)
SEPARATOR = "="
IN_DISTRIBUTION = "valid"  # the split of the training lengths, drawn like the training set
BASELINE = "baseline"
# a task that no method fits in distribution at least this well (mean exact match, %) is not learned at
# the budget: its longer buckets measure nothing about length (the report says so; the comparison with
# the literature leaves it out)
FITTED_IN_DISTRIBUTION = 50.0

# The one budget of every run (both forms; the encoder-decoder has `layers` on each side). Three
# layers because the window method's paper configuration names layers 0-2; 64 wide so that a run
# (training and greedy decoding of every bucket) takes a few minutes on one CPU thread; 2000
# updates of 2048 tokens: the baseline copies every in-distribution example of `copy` by then.
BUDGET = dict(layers=3, dim=64, ffn=256, heads=4, updates=2000, max_tokens=2048, dropout=0.1)


# Flags the decoder-only form gives a method's LM preset in place of the LM grid's (lm_grid.PRESET_FLAGS),
# and why: a preset that does nothing at these tasks' lengths would only repeat another row. Llama 4's floor
# scale (8192 positions) leaves its temperature 1 at every length here: the row was NoPE's (8 of its 10
# runs gave NoPE's accuracies exactly, the other 2 within 2.5 points). At the shortest training sequence
# (copy: 16 + 1 + 16 tokens) the temperature grows beyond the training lengths of every task, as Llama 4's
# does beyond its 8192; the LM grid's 64, its training length, would leave copy's x2 bucket nearly untouched.
DECODER_ONLY_FLAGS = {
    "llama4-temperature": (
        ("--llama4-floor-scale", "32"),
        "--llama4-floor-scale 32 (Llama 4's 8192 leaves the temperature 1 at every length of these tasks)",
    ),
    "llama4+interval-3": (
        ("--llama4-nope-interval", "3", "--llama4-floor-scale", "32"),
        "--llama4-floor-scale 32 in place of the LM grid's 64, as llama4-temperature's",
    ),
}

# The LM grid's variants (lm_grid.VARIANTS) that the decoder-only form trains too: issue 64's long-context
# practice, each a row named for the method it varies, with its paper. Ruoss et al.'s randomized positions
# are the length-generalization literature's own, on the sinusoidal baseline, rope and alibi. The LM grid's
# other variant (kerple's per-layer pairs) is an ablation of the plugin's history, not a position method.
LM_VARIANT_ROWS = {
    "distattn_lm_rope_gbw+p-rope-0.25": ("rope+p-rope-0.25", "Barbero et al. 2025"),
    "distattn_lm_rope_gbw+p-rope-0.75": ("rope+p-rope-0.75", "Barbero et al. 2025"),
    "distattn_lm_llama4_gbw+interval-3": ("llama4+interval-3", "Meta 2025 (Llama 4)"),
    "distattn_lm_gbw+randomized": (f"{BASELINE}+randomized", "Ruoss et al. 2023"),
    "distattn_lm_rope_gbw+randomized": ("rope+randomized", "Ruoss et al. 2023"),
    "distattn_lm_alibi_gbw+randomized": ("alibi+randomized", "Ruoss et al. 2023"),
}
RANDOMIZED_POSITIONS = "--randomized-positions"
AT_EVALUATION = "--randomized-positions-at-evaluation"


def model_text(budget: Dict = BUDGET) -> str:
    return f"{budget['layers']} layers x {budget['dim']}, FFN {budget['ffn']}, {budget['heads']} heads"


# ------------------------------------------------------------------------------ methods


@dataclass(frozen=True)
class LengthMethod:
    """One row of the methods table as the two forms train it: the ``--arch`` and flags of its
    decoder-only model (its LM preset) and of its encoder-decoder one (its translation
    configuration); None where the methods table has no such configuration."""

    name: str
    paper: str
    decoder_only: Optional[Tuple[str, ...]]
    encoder_decoder: Optional[Tuple[str, ...]]
    decoder_only_note: str = "-"
    encoder_decoder_note: str = "-"
    # trains with --randomized-positions N, N the task's positions (train_args): every position a test
    # bucket reads, as the LM grid's N is its models' positions; and evaluates as the authors' code does,
    # drawing positions in evaluation too (--randomized-positions-at-evaluation: validation, and the
    # buckets scored by teacher forcing, which decoding could not do)
    randomized: bool = False

    def arch_args(self, form: str) -> Optional[Tuple[str, ...]]:
        return self.decoder_only if form == DECODER_ONLY else self.encoder_decoder

    def train_args(self, form: str, positions: int) -> Tuple[str, ...]:
        """The flags of this method's model in ``form``, for a task of ``positions`` positions."""
        randomized = (RANDOMIZED_POSITIONS, str(positions), AT_EVALUATION) if self.randomized else ()
        return (*self.arch_args(form), *randomized)

    def note(self, form: str) -> str:
        return self.decoder_only_note if form == DECODER_ONLY else self.encoder_decoder_note


@functools.lru_cache(maxsize=None)
def length_methods() -> Dict[str, LengthMethod]:
    """The baseline, then every row of the methods table (:func:`..methods.method_rows`, in its
    order): the LM preset trains the decoder-only form (the mechanism in decoder self-attention,
    the sinusoidal positions dropped where the preset drops them), the translation
    configuration the encoder-decoder one (cross-attention gets the mechanism only where that
    configuration puts it); last, the LM grid's variants of LM_VARIANT_ROWS, decoder-only."""
    from .lm_grid import lm_configs
    from .methods import LM_BASELINE, MT_BASELINE, method_rows
    from .mt_grid import default_configs

    lm, mt = lm_configs(), default_configs()
    methods = {
        BASELINE: LengthMethod(
            BASELINE,
            "Vaswani et al. 2017",
            tuple(lm[LM_BASELINE].arch_args()),
            tuple(mt[MT_BASELINE].arch_args()),
            lm[LM_BASELINE].note,
            mt[MT_BASELINE].note,
        )
    }
    for name, paper, mt_name, lm_name in method_rows(list(mt), list(lm)):
        preset = lm.get(lm_name)
        if preset is not None and name in DECODER_ONLY_FLAGS:  # in place of the LM grid's flags for the preset
            flags, why = DECODER_ONLY_FLAGS[name]
            preset = dataclasses.replace(preset, flags=flags, note=f"{preset.note}; here {why}")
        methods[name] = LengthMethod(
            name,
            paper,
            tuple(preset.arch_args()) if preset else None,
            tuple(mt[mt_name].arch_args()) if mt_name else None,
            f"{lm_name}: {preset.note}" if preset else "-",
            f"{mt_name}: {mt[mt_name].note}" if mt_name else "-",
        )
    for variant, (name, paper) in LM_VARIANT_ROWS.items():
        methods[name] = variant_method(lm[variant], name, paper)
    return methods


def without_randomized(flags: Tuple[str, ...]) -> Tuple[str, ...]:
    """``flags`` less ``--randomized-positions N`` and ``--randomized-positions-at-evaluation``."""
    kept: List[str] = []
    for index, flag in enumerate(flags):
        if flag not in (RANDOMIZED_POSITIONS, AT_EVALUATION) and flags[index - 1 : index] != (RANDOMIZED_POSITIONS,):
            kept.append(flag)
    return tuple(kept)


def variant_method(variant, name: str, paper: str) -> LengthMethod:
    """A row of LM_VARIANT_ROWS: the LM grid's variant in the decoder-only form, with the flags
    DECODER_ONLY_FLAGS gives it in place of the grid's; a randomized one draws from the task's
    positions instead of the LM models' (--randomized-positions leaves its flags for train_args)."""
    flags, note = variant.flags, f"{variant.name}: {variant.note}"
    randomized = RANDOMIZED_POSITIONS in flags
    if randomized:
        flags = without_randomized(flags)
        note = (
            f"{variant.name}: {variant.arch} with randomized positions ({paper}), {RANDOMIZED_POSITIONS} N with N "
            "the task's positions (every position its longest bucket reads, as the LM grid's N is its models'), "
            f"drawn in evaluation too ({AT_EVALUATION}, as the authors' code): scored by teacher forcing"
        )
    if name in DECODER_ONLY_FLAGS:
        flags, why = DECODER_ONLY_FLAGS[name]
        note = f"{note}; here {why}"
    model = dataclasses.replace(variant, flags=flags)
    return LengthMethod(name, paper, tuple(model.arch_args()), None, note, randomized=randomized)


# ------------------------------------------------------------------------------ tasks


class TaskDataError(ValueError):
    """A folder that is not the task data the harness reads (the message says why, in one line)."""


@dataclass(frozen=True)
class LengthTask:
    """One task folder: its name (the folder's), its forms and its test buckets, shortest first."""

    name: str
    folder: Path
    forms: Tuple[str, ...]
    buckets: Tuple[str, ...]

    def splits(self) -> Tuple[str, ...]:
        """The splits a run is scored on: in distribution, then every test bucket."""
        return (IN_DISTRIBUTION, *(f"test-{bucket}" for bucket in self.buckets))

    def lines(self, split: str) -> Tuple[List[str], List[str]]:
        """The source and target lines of ``split``."""
        return tuple(read_lines(self.folder / f"{split}.{side}") for side in ("src", "tgt"))

    def digest(self) -> str:
        """A hash of every file the runs read: data that changes is binarised anew."""
        md5 = hashlib.md5()
        for split in ("train", *self.splits()):
            for side in ("src", "tgt"):
                md5.update((self.folder / f"{split}.{side}").read_bytes() + b"\0")
        return md5.hexdigest()[:10]


def read_lines(path: Path) -> List[str]:
    """The lines of a text file, split at "\\n" alone, as fairseq reads them (not str.splitlines,
    which also splits at other line separators a token could hold)."""
    text = path.read_text(encoding="utf-8")
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def bucket_order(bucket: str) -> Tuple[float, str]:
    """``x2`` before ``x16`` (by the multiplier), other names after them, alphabetically."""
    match = re.fullmatch(r"x(\d+)", bucket)
    return (int(match.group(1)) if match else float("inf"), bucket)


def bucket_multiplier(bucket: str) -> Optional[int]:
    multiplier = bucket_order(bucket)[0]
    return None if multiplier == float("inf") else int(multiplier)


def is_task_folder(folder: Path) -> bool:
    return (folder / "train.src").is_file()


def read_task_folder(folder: Path) -> LengthTask:
    """The task a folder holds; :class:`TaskDataError` when a file is missing or a split's two
    sides differ in length."""
    buckets = sorted((path.name[len("test-") : -len(".src")] for path in folder.glob("test-*.src")), key=bucket_order)
    if not buckets:
        raise TaskDataError(f"{folder} has no test-<bucket>.src (a task folder holds train, valid and test-<bucket>)")
    task = LengthTask(folder.name, folder, task_forms(folder), tuple(buckets))
    for split in ("train", *task.splits()):
        missing = [f"{split}.{side}" for side in ("src", "tgt") if not (folder / f"{split}.{side}").is_file()]
        if missing:
            raise TaskDataError(f"{folder} has no {' nor '.join(missing)}")
        sources, targets = task.lines(split)
        if len(sources) != len(targets):
            raise TaskDataError(f"{folder}: {split}.src has {len(sources)} lines and {split}.tgt {len(targets)}")
    return task


def task_forms(folder: Path) -> Tuple[str, ...]:
    """The forms ``task.json`` names (those the harness knows), else the decoder-only form alone."""
    metadata = folder / "task.json"
    if not metadata.is_file():
        return (DECODER_ONLY,)
    try:
        named = json.loads(metadata.read_text(encoding="utf-8")).get("forms", [DECODER_ONLY])
    except (json.JSONDecodeError, AttributeError) as error:
        raise TaskDataError(f"{metadata} is not a JSON object: {error}") from None
    return tuple(form for form in FORMS if form in named)


def read_task_data(path: Path) -> List[LengthTask]:
    """The tasks under ``path``: the folder itself when it is a task folder, else each of its
    task folders, by name; :class:`TaskDataError` when there is none."""
    if not path.is_dir():
        raise TaskDataError(f"no such directory: {path}")
    if is_task_folder(path):
        return [read_task_folder(path)]
    tasks = [read_task_folder(folder) for folder in sorted(path.iterdir()) if is_task_folder(folder)]
    if not tasks:
        raise TaskDataError(
            f"{path} holds no task folder (one with train, valid and test-<bucket> .src/.tgt files), nor is one"
        )
    return tasks


def default_task_data(work: Path) -> Path:
    """Where the harness makes the generated tasks (seed DEFAULT_DATA_SEED) under ``--work``."""
    return work / f"tasks-seed{DEFAULT_DATA_SEED}"


def longest(lines: Sequence[str]) -> int:
    """The most tokens of any line."""
    return max((len(line.split()) for line in lines), default=0)


# ------------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class LengthRun:
    """What one run trains, before its seed: a task in one form, with one method. Its name
    is the run file's, less the seed: ``copy-decoder-only-alibi``."""

    task: LengthTask
    form: str
    method: LengthMethod

    @property
    def name(self) -> str:
        return f"{self.task.name}-{self.form}-{self.method.name}"


def planned_configs(tasks: Sequence[LengthTask], forms: Sequence[str], methods: Sequence[str]) -> List[LengthRun]:
    """Every (task, form, method) of the selection that exists: a task in the forms it has,
    a method in the forms it has a configuration for; by task, form, then method."""
    known = length_methods()
    return [
        LengthRun(task, form, known[name])
        for task in tasks
        for form in FORMS
        if form in forms and form in task.forms
        for name in methods
        if known[name].arch_args(form) is not None
    ]
