"""LongRoPE's factors for each trained rope model: ``python -m benchmarks.quality.lm_longrope``.

``--rope-scaling longrope`` divides each rotated pair's frequency by its own factor
beyond the training length; LongRoPE finds those factors per model by an evolutionary
search rated by the model's perplexity at the target length
(:mod:`.longrope_search`, restating microsoft/LongRoPE's ``dim_mono`` search). Here
every trained run of a rope preset (``benchmarks.quality.lm``'s ``checkpoint_best.pt``)
gets a search for each target length ``--factors`` times its training length (default
4 and 32: the fine-tune of ``lm_finetune`` and the longest evaluation of
``lm_extrapolation``), rated on ``--samples`` blocks of that length of WikiText-2
valid.txt (the test text stays unseen: ``lm_extrapolation`` scores it), each candidate
the model loaded as fairseq-eval-lm loads it, with the candidate's ``--model-overrides``.
The counts are the authors' (population 64, 40 iterations) times ``--evo-scale`` (their
own knob; default 0.25, so that a search fits a CPU thread).

One JSON per (run, target length) under ``<out>/longrope``, skipped when present and
from the run's checkpoint: the factors ``lm_extrapolation`` (rows ``+longrope``, the
target 32x) and ``lm_finetune`` (``+longrope-ft``, 4x) evaluate the model with.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import List, Optional, Sequence

from ..common import (
    add_out_argument,
    add_quality_work_argument,
    at_least,
    check_quality_work,
    comma_separated_ints,
    comma_separated_names,
    scale_results,
    without_machine_paths,
)
from ..harness.fingerprints import checkpoint_fingerprint
from ..harness.process import log
from .lm_extrapolation import (
    DEFAULT_OUT,
    longrope_file,
    longrope_overrides,
    rotary_configs,
    trained_runs,
    training_setup,
)
from .lm_grid import DEFAULT_WORK, lm_configs
from .longrope_search import DimMonoSearch, SearchSettings

PROG = "python -m benchmarks.quality.lm_longrope"
FACTORS = (4, 32)
SAMPLES = 4
EVO_SCALE = 0.25
SEARCH_SEED = 42  # the authors' set_seed()


def valid_blocks(data_bin: Path, dictionary, length: int, samples: int):
    """The first ``samples`` blocks of ``length + 1`` tokens of the binarised valid.txt, one
    stream as fairseq's ``--sample-break-mode none`` reads it (each block's last token is
    the next one's first: the targets of ``length`` inputs)."""
    import torch
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(data_bin / "valid"), dictionary)
    needed, pieces, count = samples * length + 1, [], 0
    for index in range(len(dataset)):
        if count >= needed:
            break
        pieces.append(dataset[index])
        count += len(pieces[-1])
    if count < needed:
        raise SystemExit(f"{data_bin}: valid has {count} tokens, fewer than {samples} blocks of {length} need")
    stream = torch.cat(pieces)
    return [stream[i * length : (i + 1) * length + 1] for i in range(samples)]


class ModelPerplexity:
    """The perplexity of a run's checkpoint, loaded with a candidate's longrope overrides,
    on fixed blocks of valid.txt at the target length."""

    def __init__(self, run_dir: Path, data_bin: Path, trained: int, target: int, samples: int):
        self.checkpoint, self.data_bin = run_dir / "checkpoint_best.pt", data_bin
        self.trained, self.target = trained, target
        # the model as trained: its rope options, and the dictionary of the blocks
        self.as_trained, task = self.load(None)
        self.blocks = valid_blocks(data_bin, task.source_dictionary, target, samples)

    def load(self, factors: Optional[Sequence[float]]):
        from fairseq import checkpoint_utils

        import fairseq_distattn  # noqa: F401  registers the architectures

        overrides = {"data": str(self.data_bin)}
        if factors is not None:
            overrides.update(longrope_overrides(factors, self.trained, self.target))
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(self.checkpoint)], arg_overrides=overrides)
        return models[0].eval(), task

    def __call__(self, factors) -> float:
        import torch

        model, _ = self.load(list(factors))
        total, tokens = 0.0, 0
        with torch.no_grad():
            for block in self.blocks:
                logits = model(block[None, :-1])[0]
                log_probs = model.get_normalized_probs((logits, None), log_probs=True)[0]
                total -= float(log_probs.gather(-1, block[1:, None]).sum())
                tokens += block.numel() - 1
        return math.exp(total / tokens)


def search_run(run_dir: Path, factor: int, args: argparse.Namespace) -> None:
    """One search: the run's model at ``factor`` times its training length (skipped when done)."""
    from fairseq_distattn.functional.rotary import longrope_initial_factors, rotary_dims

    setup = training_setup(run_dir)
    trained = setup["tokens_per_sample"]
    target = trained * factor
    path = longrope_file(args.out, run_dir.name, target)
    fingerprint = checkpoint_fingerprint(run_dir / "checkpoint_best.pt")
    if path.is_file():
        if json.loads(path.read_text(encoding="utf-8"))["checkpoint_sha256"] == fingerprint:
            return
        log(f"{path.name} was searched on another checkpoint than {run_dir.name}'s: again")
    started = time.time()
    fitness = ModelPerplexity(run_dir, setup["data_bin"], trained, target, args.samples)
    rotary = next(
        module.mechanism
        for module in fitness.as_trained.modules()
        if hasattr(module, "mechanism") and module.mechanism.config.name == "rope"
    )
    options = rotary.config.options
    dims = rotary_dims(rotary.config.head_dim, options.rope_fraction)
    initial = longrope_initial_factors(dims, options.rope_base, float(factor), trained)
    settings = SearchSettings.scaled(args.evo_scale)
    log(f"{run_dir.name}: LongRoPE search at {target} tokens ({settings.as_dict()})")
    result = DimMonoSearch(fitness, float(factor), settings, SEARCH_SEED).run(initial)
    record = {
        "config": run_dir.name.rsplit("-seed", 1)[0],
        "seed": int(run_dir.name.rsplit("-seed", 1)[1]),
        "train_tokens_per_sample": trained,
        "target_length": target,
        "factors": result.factors,
        "initial_factors": list(initial),
        "ppl": round(result.ppl, 3),
        "initial_ppl": round(result.initial_ppl, 3),
        "best_ppl_curve": [round(p, 3) for p in result.best_curve],
        "evaluations": result.evaluations,
        "search": {**settings.as_dict(), "evo_scale": args.evo_scale, "seed": SEARCH_SEED},
        "rated_on": f"valid.txt, {args.samples} blocks of {target} tokens",
        "checkpoint_sha256": fingerprint,
        "wall_s": round(time.time() - started, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(without_machine_paths(json.dumps(record, indent=1)) + "\n", encoding="utf-8")
    log(f"{path.name}: ppl {record['initial_ppl']} (YaRN's factors) -> {record['ppl']}, {record['wall_s']:.0f}s")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_quality_work_argument(p, DEFAULT_WORK, "benchmarks.quality.lm")
    p.add_argument("--scale", default="small", help="the lm_quality runs' scale (default: small)")
    p.add_argument("--configs", default="", help="comma-separated rope presets (default: every one with a run)")
    p.add_argument(
        "--factors",
        default=",".join(map(str, FACTORS)),
        help=f"target lengths as multiples of the training length (default: {','.join(map(str, FACTORS))})",
    )
    p.add_argument("--samples", type=at_least(1), default=SAMPLES, help=f"blocks rated (default: {SAMPLES})")
    p.add_argument(
        "--evo-scale",
        type=float,
        default=EVO_SCALE,
        help=f"the authors' evo_scale, times their counts (population 64, 40 iterations; default: {EVO_SCALE})",
    )
    add_out_argument(p, DEFAULT_OUT)
    p.add_argument("--threads", type=at_least(1), default=1, help="torch threads (default: 1)")
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    args.factor_list = comma_separated_ints(p, "--factors", args.factors, 2)
    try:
        SearchSettings.scaled(args.evo_scale)
    except ValueError as error:
        p.error(f"argument --evo-scale: {error}")
    check_quality_work(p, args.quality_work, args.scale, "benchmarks.quality.lm")
    # the rope presets of the LM grid (rotary_configs also lists translation ones)
    rotary = [name for name in rotary_configs() if name in lm_configs()]
    args.configs = set(comma_separated_names(p, "--configs", args.configs, rotary) if args.configs else rotary)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: List[Path] = trained_runs(args.quality_work / args.scale, args.configs)
    log(f"{len(runs)} trained rope models under {args.quality_work / args.scale}")
    for run_dir in runs:
        for factor in args.factor_list:
            search_run(run_dir, factor, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
