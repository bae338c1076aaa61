"""RoPE scaling as its papers use it, after a short fine-tune at the longer length:
``python -m benchmarks.quality.lm_finetune``.

Position interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023) report their
models after fine-tuning at the extended length (PI: 1000 steps; YaRN: 400), where
``benchmarks.quality.lm_extrapolation`` applies the scalings to the models as trained.
Llama 3.1 was trained with its scaling on (Meta 2024), LongRoPE fine-tuned with the factors its
search found. Here every trained run of the rope preset (``benchmarks.quality.lm``'s
``checkpoint_best.pt``) is fine-tuned with ``--rope-scaling linear``, ``yarn``, ``llama3`` and
``longrope`` (with the factors ``benchmarks.quality.lm_longrope`` searched for it at the
fine-tune's length; a run without them is skipped) by the
factor ``--factor`` (default 4), on samples of the training length times it, for
``--updates`` updates (default 150, a quarter of the 600 it trained for) of the
training recipe (``--finetune-from-model``, a fresh optimizer, ``--lr 1e-4`` after
``--warmup-updates 15``), then scores WikiText-2 test.txt at that length (blocks and
sliding, as ``lm_extrapolation`` does). Results go to ``lm_extrapolation``'s run files
as the configuration ``<preset>+<scaling>-ft``, so its table shows each scaling beside
the same scaling without fine-tuning; one JSON per (run, scaling), skipped when present (and
refused, in one line, when it was fine-tuned from another checkpoint than the run's now).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import (
    add_quality_work_argument,
    at_least,
    check_quality_work,
    comma_separated_names,
    scale_results,
    without_machine_paths,
)
from ..harness.claims import claimed
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.process import log, run, tool_env
from .lm import eval_lm, train_args
from .lm_extrapolation import (
    DEFAULT_OUT,
    MODES,
    SEARCHED_SCALING,
    context_window,
    longrope_overrides,
    rotary_configs,
    scaling_overrides,
    searched_longrope,
    trained_runs,
    training_setup,
)
from .lm_grid import DEFAULT_WORK, SCALES, lm_configs

PROG = "python -m benchmarks.quality.lm_finetune"
# longrope with the factors benchmarks.quality.lm_longrope searched for the run at the fine-tune's length
# (LongRoPE fine-tunes with the factors its search found for the target); a run without them is skipped
SCALINGS = ("linear", "yarn", "llama3", SEARCHED_SCALING)
FACTOR = 4
UPDATES = 150
FINETUNE_LR, FINETUNE_WARMUP = "1e-4", 15
# the recipe's flags that shape the model's parameters, beside its configuration's own (--arch ...): a
# checkpoint trained with other values does not load into the model the fine-tune builds
SHAPE_FLAGS = (
    "--decoder-layers",
    "--decoder-embed-dim",
    "--decoder-input-dim",
    "--decoder-output-dim",
    "--decoder-ffn-embed-dim",
    "--decoder-attention-heads",
)


def finetuned_name(config: str, scaling: str) -> str:
    return f"{config}+{scaling}-ft"


def with_value(args: List[object], flag: str, value: object) -> List[object]:
    """``args`` with ``flag``'s value replaced (``flag`` must be in it)."""
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


def finetune_args(
    run_dir: Path, setup: Dict[str, object], overrides: Dict[str, object], factor: int, updates: int, save_dir: Path
) -> List[object]:
    """The run's own training command (``setup``: its :func:`training_setup`), fine-tuning
    its best checkpoint with a scaling's ``overrides`` (as flags) on samples ``factor`` times as long."""
    config, seed = run_dir.name.rsplit("-seed", 1)
    trained = setup["tokens_per_sample"]
    scale = dict(SCALES[run_dir.parent.name], updates=updates)
    args = train_args(lm_configs()[config], scale, int(seed), setup["data_bin"], save_dir)
    args = with_value(args, "--tokens-per-sample", trained * factor)
    args = with_value(with_value(args, "--lr", FINETUNE_LR), "--warmup-updates", FINETUNE_WARMUP)
    flags = [item for name, value in overrides.items() for item in (f"--{name.replace('_', '-')}", value)]
    return [*args, *flags, "--finetune-from-model", run_dir / "checkpoint_best.pt"]


def source_fingerprint(checkpoint: Path) -> str:
    """:func:`checkpoint_fingerprint` of a run's checkpoint, hashed once per version of the file: each
    scaling compares it with its result file and records it, and a large checkpoint takes a while."""
    stat = checkpoint.stat()
    return _fingerprint(checkpoint.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _fingerprint(checkpoint: Path, size: int, mtime_ns: int) -> str:
    # size and time in the key: a checkpoint replaced meanwhile (its run trained again) is hashed again
    return checkpoint_fingerprint(checkpoint)


def check_finetuned_from(result: Path, checkpoint: Path, work: Path) -> None:
    """Refuse (one line naming both hashes) a result file fine-tuned from another model than
    ``checkpoint``. Refused, where ``lm_extrapolation`` evaluates a stale result again: fine-tuning
    again costs a training run and replaces the result (maybe a committed one), the cause may as well
    be a --quality-work of other runs (a copy, another machine's) as a run trained again, and a
    fine-tune would resume from ``work``, whose checkpoints are the old model's too. So the
    researcher chooses: rerun, or point at the model the result came from."""
    recorded = json.loads(result.read_text(encoding="utf-8")).get("finetuned_from_sha256")
    if recorded is None:
        return  # a result that names no model: nothing to compare it with
    current = source_fingerprint(checkpoint)
    if recorded != current:
        raise SystemExit(
            f"{result} was fine-tuned from another model than {checkpoint}: sha256 {recorded}, not {current}; "
            f"to fine-tune this one, delete that result file and {work}; to keep the result, give "
            "--quality-work the runs it came from"
        )


def flag_value(args: Sequence[object], flag: str) -> object:
    """The value of ``flag`` in a command's ``args`` (True for a flag without one)."""
    after = args[args.index(flag) + 1 :][:1]
    return True if not after or str(after[0]).startswith("--") else after[0]


def recipe_differences(checkpoint: Path, args: Sequence[object], flags: Sequence[str]) -> List[Tuple[str, object]]:
    """``(flag, the checkpoint's value)`` of each of ``flags`` whose value in the checkpoint's model
    configuration is not the one ``args`` gives it; a checkpoint that cannot be read is one error line."""
    from fairseq_distattn.patches.checkpoint_loading import read_checkpoint
    from fairseq_distattn.tools.check import failure_reason
    from fairseq_distattn.trained_settings import model_config

    try:
        config = model_config(read_checkpoint(checkpoint))
    except Exception as error:  # every reason a file cannot be read is reported alike
        raise SystemExit(f"cannot read {checkpoint}: {failure_reason(error)}") from None
    if config is None:
        raise SystemExit(f"{checkpoint} holds no fairseq model configuration: not a fairseq checkpoint")
    recorded = {flag: getattr(config, flag[2:].replace("-", "_"), None) for flag in flags}
    return [(flag, value) for flag, value in recorded.items() if str(value) != str(flag_value(args, flag))]


def check_fits_recipe(run_dir: Path, args: Sequence[object]) -> None:
    """Refuse (one line) a run whose checkpoint the fine-tune's command ``args`` cannot load: fairseq-train
    would start, then fail with a traceback (e.g. a run of another scale's sizes under this scale)."""
    config = run_dir.name.rsplit("-seed", 1)[0]
    flags = [*(item for item in lm_configs()[config].arch_args() if item.startswith("--")), *SHAPE_FLAGS]
    found = recipe_differences(run_dir / "checkpoint_best.pt", args, flags)
    if found:
        differences = ", ".join(f"{flag} {value} (the recipe: {flag_value(args, flag)})" for flag, value in found)
        raise SystemExit(
            f"{run_dir.name}: {run_dir / 'checkpoint_best.pt'} does not fit the {run_dir.parent.name}-scale "
            f"recipe: it was trained with {differences}; fine-tune the runs of that recipe (--quality-work, --scale)"
        )


def finetune_work(run_dir: Path, scaling: str, factor: int) -> Path:
    """The folder a fine-tune of ``run_dir`` trains and evaluates in."""
    return run_dir / f"finetune-{scaling}-x{factor}"


def finetune_run(run_dir: Path, scaling: str, factor: int, updates: int, out: Path, env: Dict[str, str]) -> None:
    """Fine-tune one run with one scaling (resumed if stopped) and write its result file, unless another
    process holds the fine-tune's folder (``claimed``): two processes would train into one checkpoints
    folder, and each evaluation reads its numbers back from the folder's shared eval.log from where it
    stood when it started, so each would take the other's numbers."""
    config, seed = run_dir.name.rsplit("-seed", 1)
    name = finetuned_name(config, scaling)
    setup = training_setup(run_dir)
    length = setup["tokens_per_sample"] * factor
    path = out / "runs" / f"{name}-seed{seed}-L{length}.json"
    work = finetune_work(run_dir, scaling, factor)
    if path.is_file():
        check_finetuned_from(path, run_dir / "checkpoint_best.pt", work)
        return
    overrides = scaling_overrides_for(run_dir, scaling, setup["tokens_per_sample"], length, out)
    if overrides is None:
        log(f"{run_dir.name}: no LongRoPE factors searched at {length} tokens (lm_longrope): no {name}")
        return
    args = finetune_args(run_dir, setup, overrides, factor, updates, work / "checkpoints")
    if not (work / "checkpoint_best.pt").is_file():
        check_fits_recipe(run_dir, args)
    with claimed(work) as holder:
        if holder:
            log(f"{run_dir.name} with {scaling} x{factor}: skipped, held by {holder} (one process per fine-tune)")
        elif path.is_file():  # another process finished it between the check above and the claim
            check_finetuned_from(path, run_dir / "checkpoint_best.pt", work)
        else:
            record = train_and_evaluate(run_dir, setup, scaling, factor, updates, args, env)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(without_machine_paths(json.dumps(record, indent=1)) + "\n", encoding="utf-8")


def scaling_overrides_for(
    run_dir: Path, scaling: str, trained: int, length: int, out: Path
) -> Optional[Dict[str, object]]:
    """The --model-overrides that scale ``run_dir``'s rotary positions from ``trained`` to ``length``
    tokens; None for LongRoPE when lm_longrope has not searched its factors at that length."""
    if scaling != SEARCHED_SCALING:
        return scaling_overrides(scaling, length, trained)
    factors = searched_longrope(out, run_dir, length, source_fingerprint(run_dir / "checkpoint_best.pt"))
    return None if factors is None else longrope_overrides(factors, trained, length)


def train_and_evaluate(
    run_dir: Path,
    setup: Dict[str, object],
    scaling: str,
    factor: int,
    updates: int,
    args: List[object],
    env: Dict[str, str],
) -> Dict[str, object]:
    """Fine-tune (``args``: fairseq-train's command) unless its checkpoint is there, evaluate it in every
    mode, and return the result record (``setup``: the run's :func:`training_setup`)."""
    config, seed = run_dir.name.rsplit("-seed", 1)
    trained = setup["tokens_per_sample"]
    length = trained * factor
    work = finetune_work(run_dir, scaling, factor)
    best, started = work / "checkpoint_best.pt", time.time()
    if not best.is_file():
        log(f"fine-tune {run_dir.name} with {scaling} x{factor}, {updates} updates at {length} tokens")
        run(args, work / "train.log", env)
        (work / "checkpoints" / "checkpoint_best.pt").replace(best)
    results = {
        mode: eval_lm(best, setup["data_bin"], length, context_window(mode, length), work / "eval.log", env)
        for mode in MODES
    }
    return {
        "config": finetuned_name(config, scaling),
        "seed": int(seed),
        "baseline": lm_configs()[config].baseline,
        "train_tokens_per_sample": trained,
        "tokens_per_sample": length,
        "scale": run_dir.parent.name,
        "finetune": {"scaling": scaling, "factor": factor, "updates": updates, "lr": FINETUNE_LR},
        "finetuned_from_sha256": source_fingerprint(run_dir / "checkpoint_best.pt"),
        "checkpoint_sha256": checkpoint_fingerprint(best),
        "wall_s": round(time.time() - started, 1),
        **results,
    }


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_quality_work_argument(p, DEFAULT_WORK, "benchmarks.quality.lm")
    p.add_argument(
        "--scale", default="small", choices=sorted(SCALES), help="the lm_quality runs' scale (default: small)"
    )
    p.add_argument("--configs", default="", help="comma-separated rope configurations (default: every rope preset)")
    p.add_argument("--scalings", default=",".join(SCALINGS), help=f"comma-separated (default: {','.join(SCALINGS)})")
    p.add_argument("--factor", type=at_least(2), default=FACTOR, help=f"length factor (default: {FACTOR})")
    p.add_argument("--updates", type=at_least(1), default=UPDATES, help=f"fine-tuning updates (default: {UPDATES})")
    p.add_argument("--out", type=Path, default=None, help=f"lm_extrapolation's --out (default: {DEFAULT_OUT})")
    p.add_argument("--threads", type=at_least(1), default=1, help="OMP_NUM_THREADS (default: 1)")
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    check_quality_work(p, args.quality_work, args.scale, "benchmarks.quality.lm")
    # the rope presets of the LM grid (rotary_configs also lists translation ones, which it has no recipe for)
    rotary = [name for name in rotary_configs() if name in lm_configs()]
    args.configs = comma_separated_names(p, "--configs", args.configs, rotary) if args.configs else rotary
    args.scalings = comma_separated_names(p, "--scalings", args.scalings, SCALINGS)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    env = tool_env(args.threads)
    runs = trained_runs(args.quality_work / args.scale, args.configs)
    log(f"{len(runs)} trained rope models under {args.quality_work / args.scale}")
    for run_dir in runs:
        for scaling in args.scalings:
            finetune_run(run_dir, scaling, args.factor, args.updates, args.out, env)
    log(f"done: `python -m benchmarks.quality.lm_extrapolation --report --out {args.out}` shows them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
