"""Length generalization: ``python -m benchmarks.quality.length_generalization``.

Trains small models on short examples of algorithmic tasks (copy, reverse, sort,
addition, parity, flip-flop, passkey: ``scripts/make_length_tasks.py``) and tests them
on longer ones, for every method of the methods table (``benchmarks.quality.methods``):
the baseline with sinusoidal positions, each mechanism, NoPE. Two forms: decoder-only
(a language model reads ``SOURCE =`` and completes the answer, trained with the loss on
the answer only: ``--criterion answer_cross_entropy``, one line a sample) with each
method's LM preset, and encoder-decoder (translation from source to answer) with each
method's translation configuration. Every run gets the same budget
(:data:`.length_grid.BUDGET`), whatever the task, form or method.

A run trains, keeps its checkpoint best on the validation loss, and decodes greedily
(beam 1) through fairseq's own generation (``fairseq-interactive``) every validation and
test source, with room for the longest answer and a margin, so that a completion that
runs on shows as one. A decoder-only task with prompts of over FORCED_FROM tokens
(passkey) is scored by teacher forcing instead, which gives the same exact match in one
forward pass a prompt (:mod:`.forced_match`). The metric is exact match per bucket (:func:`exact_match`):
``valid`` is in distribution (the training lengths), ``test-xK`` holds lengths in
``((K/2)L, KL]`` for a training length ``L``.

Each run writes one JSON file, ``<out>/runs/<task>-<form>-<method>-seed<N>.json``; a run
whose file exists is skipped, and an interrupted run resumes from its
``checkpoint_last.pt`` under ``--work``. ``--report`` (and the end of every invocation)
rebuilds ``<out>/length_generalization.md`` and ``<out>/accuracy_vs_length.png`` from
the run files (:mod:`.length_report`).

Task data (``--task-data``): a folder of task folders, or one task folder
(:mod:`.length_grid`); by default the generated tasks, made once (seed 1) under
``--work`` by running ``scripts/make_length_tasks.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import (
    at_least,
    check_same_budget,
    comma_separated_ints,
    comma_separated_names,
    command_line,
    device_model,
    git_revision,
    model_size,
)
from ..harness.claims import claimed
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.grid import PlannedRun, plan_runs, train_planned, write_run_file
from ..harness.process import log, run, tool, tool_env
from ..harness.training import (
    best_validation,
    optimizer,
    routine,
    train_keeping_best,
    train_wall,
    validation_curve,
)
from .length_grid import (
    BUDGET,
    DECODER_ONLY,
    DEFAULT_DATA_SEED,
    DEFAULT_OUT,
    DEFAULT_WORK,
    FORMS,
    IN_DISTRIBUTION,
    MAKE_TASKS,
    SEPARATOR,
    LengthRun,
    LengthTask,
    TaskDataError,
    default_task_data,
    length_methods,
    longest,
    model_text,
    planned_configs,
    read_task_data,
)
from .length_report import report

# generation room past the longest answer: a completion that does not stop shows as over-long
MARGIN = 8
VALIDATIONS = 10  # a validation (and checkpoint) every 1/10 of training
GENERATION_BATCH = 64
# and at most this many tokens a batch: long prompts (passkey's 2000 tokens) go in small batches of
# near-equal lengths, about a third faster on one CPU thread than 64 padded to the longest
GENERATION_TOKENS = 16384
# a decoder-only task with a longer prompt is scored by teacher forcing (:func:`scored_by_forcing`)
FORCED_FROM = 512

# ----------------------------------------------------------------------------- metric


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, object]:
    """Exact match of whitespace-split token sequences: ``correct`` of ``total``, ``accuracy``
    in percent (None without examples), and how many hypotheses were ``empty`` or
    ``over_long`` (more tokens than their reference). An empty hypothesis is wrong whatever
    its reference."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    correct = empty = over_long = 0
    for hypothesis, reference in zip(hypotheses, references):
        hypothesis_tokens, reference_tokens = hypothesis.split(), reference.split()
        empty += not hypothesis_tokens
        over_long += len(hypothesis_tokens) > len(reference_tokens)
        correct += bool(hypothesis_tokens) and hypothesis_tokens == reference_tokens
    total = len(references)
    return {
        "correct": correct,
        "total": total,
        "empty": empty,
        "over_long": over_long,
        "accuracy": percent(correct, total),
    }


def percent(correct: int, total: int) -> Optional[float]:
    """Exact-match accuracy in percent, None without examples."""
    return round(100 * correct / total, 2) if total else None


HYPOTHESIS = re.compile(r"^H-(\d+)\t[^\t]*\t?(.*)$", re.M)


def hypotheses_by_id(generated: str) -> Dict[int, str]:
    """``{prompt number: hypothesis text}`` of a fairseq-interactive (or -generate) output."""
    return {int(number): text.strip() for number, text in HYPOTHESIS.findall(generated)}


def completion(hypothesis: str, form: str) -> str:
    """What the model answered: for the decoder-only form fairseq's hypothesis is the prompt and
    its completion, and the answer is what follows the prompt's separator (the first one: no
    source holds it); the encoder-decoder form's hypothesis is the answer."""
    if form != DECODER_ONLY:
        return hypothesis
    tokens = hypothesis.split()
    return " ".join(tokens[tokens.index(SEPARATOR) + 1 :]) if SEPARATOR in tokens else ""


def prompt(source: str, form: str) -> str:
    return f"{source} {SEPARATOR}".strip() if form == DECODER_ONLY else source


# ------------------------------------------------------------------------------- data


def make_default_tasks(work: Path, env: Dict[str, str]) -> Path:
    """The generated tasks (``scripts/make_length_tasks.py``, seed DEFAULT_DATA_SEED), made once
    under ``work`` (one process makes them, the others wait)."""
    folder = default_task_data(work)
    with claimed(work, wait=True):
        if not (folder / ".done").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, MAKE_TASKS, "--out", folder, "--seed", DEFAULT_DATA_SEED]
            run(command, folder / "make.log", env)
            (folder / ".done").touch()
    return folder


def max_positions(task: LengthTask) -> int:
    """The positions every model of ``task`` is built and decoded with: the longest source, its
    separator, the longest answer with the generation margin, begin and end of sentence,
    rounded up to a power of two (the longest bucket's, not the training lengths')."""
    sources = [line for split in ("train", *task.splits()) for line in task.lines(split)[0]]
    needed = longest(sources) + 1 + longest_answer(task) + MARGIN + 3
    return 2 ** math.ceil(math.log2(needed))


def longest_answer(task: LengthTask) -> int:
    return max(longest(task.lines(split)[1]) for split in ("train", *task.splits()))


def prepare(task: LengthTask, form: str, work: Path, env: Dict[str, str]) -> Path:
    """Binarise ``task``'s training and validation splits in ``form`` once, under
    ``work/data/<task>-<digest of its files>/<form>``; returns the data-bin folder (its
    dictionary is the one the models and the generation read)."""
    directory = work / "data" / f"{task.name}-{task.digest()}" / form
    data_bin = directory / "data-bin"
    with claimed(directory, wait=True):
        if not (data_bin / ".done").is_file():
            (directory / "preprocess.log").unlink(missing_ok=True)
            run(preprocess_args(task, form, directory, data_bin), directory / "preprocess.log", env)
            (data_bin / ".done").touch()
    return data_bin


def preprocess_args(task: LengthTask, form: str, directory: Path, data_bin: Path) -> List[object]:
    """fairseq-preprocess of one form: ``SOURCE = ANSWER`` lines with ``--only-source`` (one
    dictionary for both sides), or the source and target files with ``--joined-dictionary``."""
    common = ["--destdir", data_bin, "--workers", "1"]
    if form == DECODER_ONLY:
        for split in ("train", IN_DISTRIBUTION):
            lines = [f"{prompt(source, form)} {target}".strip() for source, target in zip(*task.lines(split))]
            (directory / f"{split}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        splits = ["--trainpref", directory / "train.txt", "--validpref", directory / f"{IN_DISTRIBUTION}.txt"]
        return [tool("fairseq-preprocess"), "--only-source", *splits, *common]
    prefixes = ["--trainpref", task.folder / "train", "--validpref", task.folder / IN_DISTRIBUTION]
    languages = ["--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary"]
    return [tool("fairseq-preprocess"), *languages, *prefixes, *common]


# ------------------------------------------------------------------------ train, eval


def task_args(form: str, positions: int) -> List[object]:
    """The fairseq task of a form, with room for ``positions`` tokens (training and decoding)."""
    if form == DECODER_ONLY:
        return ["--task", "language_modeling", "--tokens-per-sample", positions, "--max-target-positions", positions]
    languages = ["--source-lang", "src", "--target-lang", "tgt"]
    return [
        "--task",
        "translation",
        *languages,
        "--max-source-positions",
        positions,
        "--max-target-positions",
        positions,
    ]


def train_args(
    config: LengthRun, seed: int, budget: Dict, positions: int, data_bin: Path, save_dir: Path
) -> List[object]:
    """The fairseq-train command of one run: the same recipe for every task, form and method."""
    updates = budget["updates"]
    every = max(1, updates // VALIDATIONS)
    decoder_only = config.form == DECODER_ONLY
    sides = ("decoder",) if decoder_only else ("encoder", "decoder")
    form_flags = (
        {"sample-break-mode": "eos", "share-decoder-input-output-embed": True}
        | {"criterion": "answer_cross_entropy", "answer-separator": SEPARATOR}
        if decoder_only
        else {"share-all-embeddings": True, "criterion": "cross_entropy"}
    )
    return [
        tool("fairseq-train"),
        data_bin,
        "--user-dir",
        "fairseq_distattn",
        *task_args(config.form, positions),
        *config.method.train_args(config.form, positions),
        *command_line(
            model_size(budget["dim"], budget["ffn"], budget["heads"], budget["layers"], sides),
            form_flags,
            {"dropout": budget["dropout"], "attention-dropout": budget["dropout"], "weight-decay": "0.01"},
            {"max-tokens": budget["max_tokens"]},
            optimizer(updates),
            routine(save_dir, seed, updates, every, keep=1, log_interval=100),
        ),
    ]


def generation_args(
    config: LengthRun, checkpoint: Path, data_bin: Path, positions: int, prompts: Path, count: int
) -> List[object]:
    """Greedy decoding of every prompt by fairseq-interactive, with room for the longest answer and
    MARGIN more tokens: a language model's length limit counts its prompt (``--max-len-a 1``: from
    the longest prompt of its batch, so a shorter prompt's completion may run on further, wrong all
    the same), a translation model's does not."""
    room = longest_answer(config.task) + MARGIN
    return [
        tool("fairseq-interactive"),
        data_bin,
        "--user-dir",
        "fairseq_distattn",
        *task_args(config.form, positions),
        *["--path", checkpoint, "--beam", 1, "--nbest", 1],
        *["--max-len-a", 1 if config.form == DECODER_ONLY else 0, "--max-len-b", room],
        *["--batch-size", GENERATION_BATCH, "--max-tokens", max(GENERATION_TOKENS, positions)],
        *["--buffer-size", max(count, GENERATION_BATCH)],
        *["--input", prompts, "--num-workers", 0],
    ]


def evaluate(
    config: LengthRun,
    checkpoint: Path,
    data_bin: Path,
    positions: int,
    run_dir: Path,
    env: Dict[str, str],
    seed: int = 1,
) -> Dict[str, object]:
    """Exact match per bucket (``valid``, then the test buckets by name: ``x1``, ``x2``...) of the
    greedy completion of every split of the task, from one fairseq-interactive call, or by
    teacher forcing where the prompts are long (:func:`scored_by_forcing`) or the method draws
    randomized positions in evaluation, which decoding cannot (its draws seeded by ``seed``)."""
    prompts, references, spans = [], [], {}
    for split in config.task.splits():
        sources, targets = config.task.lines(split)
        spans[split.removeprefix("test-")] = (len(prompts), len(prompts) + len(sources))
        prompts += [prompt(source, config.form) for source in sources]
        references += targets
    prompts_file = run_dir / "prompts.txt"
    prompts_file.write_text("".join(line + "\n" for line in prompts), encoding="utf-8")
    started = time.time()
    if config.method.randomized or scored_by_forcing(config.form, prompts):
        command, counts = forced_counts(checkpoint, data_bin, prompts_file, references, spans, run_dir, env, seed)
        scoring = "teacher forcing (the exact match of greedy completion: benchmarks/quality/forced_match.py)"
        if config.method.randomized:
            scoring += "; positions drawn as in training (--randomized-positions-at-evaluation), seeded by the run's"
    else:
        command = generation_args(config, checkpoint, data_bin, positions, prompts_file, len(prompts))
        counts = generated_counts(config.form, command, references, spans, run_dir, env)
        scoring = "greedy completion (fairseq-interactive)"
    return {
        "accuracy": {bucket: entry.pop("accuracy") for bucket, entry in counts.items()},
        "counts": counts,
        "scoring": scoring,
        "generation_margin": MARGIN,
        "eval_wall_s": round(time.time() - started, 1),
        "eval_command": shlex.join(str(c) for c in command),
    }


def scored_by_forcing(form: str, prompts: Sequence[str]) -> bool:
    """Whether a run is scored by teacher forcing: a decoder-only run with a prompt of more than
    FORCED_FROM tokens. fairseq's generation forces a language model's prompt one token a step:
    passkey's baseline took 2844 s to decode its buckets after 592 s of training, and forcing
    gives the same exact match (see :mod:`.forced_match`)."""
    return form == DECODER_ONLY and max(len(line.split()) for line in prompts) > FORCED_FROM


def generated_counts(
    form: str, command: Sequence, references: Sequence[str], spans: Dict, run_dir: Path, env: Dict[str, str]
) -> Dict[str, Dict]:
    generated = run_dir / "generate.txt"
    run(command, run_dir / "eval.log", env, stdout_path=generated)
    by_id = hypotheses_by_id(generated.read_text(encoding="utf-8"))
    missing = [number for number in range(len(references)) if number not in by_id]
    if missing:
        raise RuntimeError(f"fairseq-interactive gave no hypothesis for {len(missing)} prompts; see {generated}")
    answers = [completion(by_id[number], form) for number in range(len(references))]
    return {bucket: exact_match(answers[lo:hi], references[lo:hi]) for bucket, (lo, hi) in spans.items()}


def forced_counts(
    checkpoint: Path,
    data_bin: Path,
    prompts_file: Path,
    references: Sequence[str],
    spans: Dict,
    run_dir: Path,
    env: Dict[str, str],
    seed: int = 1,
) -> Tuple[List[object], Dict[str, Dict]]:
    answers_file, scored = run_dir / "answers.txt", run_dir / "forced.json"
    answers_file.write_text("".join(line + "\n" for line in references), encoding="utf-8")
    command = [sys.executable, "-m", "benchmarks.quality.forced_match", "--path", checkpoint, "--data", data_bin]
    command += ["--prompts", prompts_file, "--answers", answers_file, "--out", scored, "--seed", seed]
    run(command, run_dir / "eval.log", env)
    result = json.loads(scored.read_text(encoding="utf-8"))
    counts = {}
    for bucket, (lo, hi) in spans.items():
        correct, total = sum(result["correct"][lo:hi]), hi - lo
        counts[bucket] = {
            "correct": correct,
            "total": total,
            "empty": sum(result["empty"][lo:hi]),
            "accuracy": percent(correct, total),
        }
    return command, counts


def train_run(
    config: LengthRun, seed: int, budget: Dict, data_bin: Path, run_dir: Path, env: Dict[str, str]
) -> Dict[str, object]:
    """Train one run (resuming from its last checkpoint), score its best-on-valid checkpoint; its record."""
    positions = max_positions(config.task)
    command = train_args(config, seed, budget, positions, data_bin, run_dir / "checkpoints")
    started = time.time()
    best = train_keeping_best(command, run_dir, env)
    log_text = (run_dir / "train.log").read_text(encoding="utf-8")
    curve = validation_curve(log_text)
    evaluation = evaluate(config, best, data_bin, positions, run_dir, env, seed)
    return {
        "config": config.name,
        "task": config.task.name,
        "form": config.form,
        "method": config.method.name,
        "note": config.method.note(config.form),
        "train_args": list(config.method.train_args(config.form, positions)),
        "seed": seed,
        "updates": budget["updates"],
        "max_positions": positions,
        "train_wall_s": train_wall(log_text, started),
        "wall_s": round(time.time() - started, 1),
        "valid_curve": curve,
        **best_validation(curve),
        **evaluation,
        "checkpoint_sha256": checkpoint_fingerprint(best),
        "train_command": shlex.join(str(c) for c in command),
    }


# ------------------------------------------------------------------------------- main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.length_generalization", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--task-data",
        type=Path,
        default=None,
        help="a folder of task folders, or one task folder (train, valid, test-<bucket> .src/.tgt; task.json "
        "optional) (default: the generated tasks, made once under --work by scripts/make_length_tasks.py)",
    )
    p.add_argument("--tasks", default="", help="comma-separated subset of the tasks (default: all)")
    p.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated forms (default: {','.join(FORMS)})")
    p.add_argument("--methods", default="", help="comma-separated methods (default: every row of the methods table)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
    p.add_argument(
        "--updates",
        type=at_least(1),
        default=BUDGET["updates"],
        help=f"training updates (default: {BUDGET['updates']})",
    )
    p.add_argument(
        "--work", type=Path, default=DEFAULT_WORK, help=f"data, checkpoints and logs (default: {DEFAULT_WORK})"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"result files (default: {DEFAULT_OUT})")
    p.add_argument("--threads", type=at_least(1), default=1, help="OMP_NUM_THREADS of each run (default: 1)")
    p.add_argument(
        "--retrain",
        action="store_true",
        help="run the selected runs again even where their run file exists (replacing it; the log gives the "
        "recorded and the new accuracies); a run whose checkpoint is still under --work is evaluated again from it",
    )
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot from the run files")
    args = p.parse_args(argv)
    if args.report:
        return args
    args.seed_list = comma_separated_ints(p, "--seeds", args.seeds, 0)
    args.form_names = comma_separated_names(p, "--forms", args.forms, FORMS)
    args.method_names = comma_separated_names(p, "--methods", args.methods, length_methods())
    check_same_budget(p, args.out, {"updates": args.updates, "model": model_text()})
    args.task_list = selected_tasks(p, args)
    args.configs = planned_configs(args.task_list, args.form_names, args.method_names)
    if not args.configs:
        p.error(
            f"argument --forms: no selected task has the form(s) {', '.join(args.form_names)} with a selected "
            "method (a task folder without task.json has the decoder-only form alone)"
        )
    return args


def selected_tasks(p: argparse.ArgumentParser, args: argparse.Namespace) -> List[LengthTask]:
    """The ``--tasks`` of ``--task-data`` (made first when it is the default); a parser error
    naming the flag when the folder is not task data."""
    if args.task_data is not None and not args.task_data.is_dir():
        p.error(f"argument --task-data: no such directory: {args.task_data}")
    folder = args.task_data or make_default_tasks(args.work, tool_env(args.threads))
    try:
        tasks = {task.name: task for task in read_task_data(folder)}
    except TaskDataError as error:
        p.error(f"argument --task-data: {error}")
    return [tasks[name] for name in comma_separated_names(p, "--tasks", args.tasks, tasks)]


def train_grid(args: argparse.Namespace) -> None:
    """Binarise each selected task in each form, then train each run without a run file
    (every one with ``--retrain``), one at a time: seeds, then tasks, forms and methods."""
    budget = {**BUDGET, "updates": args.updates}
    env = tool_env(args.threads)
    data_bins = {}
    for config in args.configs:
        key = (config.task.name, config.form)
        if key not in data_bins:
            data_bins[key] = prepare(config.task, config.form, args.work, env)
    # a run's folder names its budget: a checkpoint of another --updates is never taken for this run's
    run_root = args.work / f"updates-{args.updates}"
    jobs = ((config, seed) for seed in args.seed_list for config in args.configs)
    runs = plan_runs(jobs, run_root, args.out, args.retrain)
    log(f"{len(runs)} runs to do ({args.updates} updates, {model_text(budget)}, one at a time)")
    context = dict(
        model=model_text(budget),
        max_tokens=budget["max_tokens"],
        dropout=budget["dropout"],
        machine=f"{device_model()}, {args.threads} thread(s) per run",
        git_revision=git_revision(),
    )

    def train_one(planned: PlannedRun) -> None:
        log(f"start {planned.label} ({planned.run_dir})")
        config = planned.config
        data_bin = data_bins[config.task.name, config.form]
        record = train_run(config, planned.seed, budget, data_bin, planned.run_dir, env)
        save_run(planned, {**record, **context, **data_context(config.task)})

    train_planned(runs, train_one, log)


def data_context(task: LengthTask) -> Dict[str, object]:
    """What a run file records of its data: the folder, a hash of its files, lines per split."""
    return {
        "task_data": str(task.folder),  # the run file is written without this machine's paths
        "data_digest": task.digest(),
        "data_lines": {split: len(task.lines(split)[0]) for split in ("train", *task.splits())},
    }


def save_run(planned: PlannedRun, record: Dict[str, object]) -> None:
    write_run_file(planned, record, "accuracy", "accuracy", log)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    selected: Sequence[Tuple[str, str]] = ()
    if not args.report:
        train_grid(args)
        selected = [(config.task.name, config.form) for config in args.configs]
    print(report(args.out, selected))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
