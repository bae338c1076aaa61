"""Training throughput: target tokens per second of forward + backward +
optimizer step on identical real batches, vanilla fairseq vs each candidate,
measured in interleaved pairs (see :func:`benchmarks.speed.timing.run_paired`)."""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Sequence

import torch

from .configs import Built, Config, Scale, attention_layout, build, describe
from .timing import PairedResult, profile_min, run_paired, timed


def to_device(sample, device):
    """Recursively move a fairseq batch to ``device``."""
    if torch.is_tensor(sample):
        return sample.to(device)
    if isinstance(sample, dict):
        return {key: to_device(value, device) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        return type(sample)(to_device(value, device) for value in sample)
    return sample


def fairseq_adam(parameters, lr: float = 1e-4):
    """The optimizer ``fairseq-train --optimizer adam --adam-betas '(0.9, 0.98)'``
    builds: fairseq's own Adam on CPU, FusedAdam on CUDA when apex provides it."""
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    cfg = FairseqAdamConfig(lr=[lr], adam_betas="(0.9, 0.98)", adam_eps=1e-8)
    return FairseqAdam(cfg, [p for p in parameters if p.requires_grad])


class TrainStep:
    """One fairseq-style update: criterion forward, backward, Adam step.

    fairseq's Adam with its translation-recipe betas, the same learning rate
    for every model. Gradients are freed after each step.
    """

    def __init__(self, built: Built, lr: float = 1e-4):
        self.built = built
        self.optimizer = fairseq_adam(built.model.parameters(), lr)

    def __call__(self, sample) -> float:
        model, criterion = self.built.model, self.built.criterion
        model.train()
        loss, _sample_size, _logging = criterion(model, sample)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()  # sets .grad to None
        return float(sample["ntokens"])


def build_all(configs: Sequence[Config], scale: Scale, dictionary, device, seed: int, log) -> Dict[str, Built]:
    built = {}
    for config in configs:
        built[config.key] = build(config, scale, dictionary, device, seed=seed)
        log(f"  built {config.key}: {built[config.key].parameters:,} parameters; {attention_layout(built[config.key])}")
    return built


class TrainingRun(NamedTuple):
    """What :func:`run_training` measured (``results``: per config key, serialised) and the
    steps it timed, kept to profile a missed target."""

    results: Dict[str, dict]
    steps: Dict[str, TrainStep]

    def models(self) -> Dict[str, Built]:
        return {key: step.built for key, step in self.steps.items()}


def run_training(
    configs: Sequence[Config],
    scale: Scale,
    dictionary,
    batches: List[dict],
    device,
    repeats: int,
    warmup: int,
    seed: int,
    log: Callable[[str], None],
) -> TrainingRun:
    """Every config's training throughput (tokens/s) and its ratio to the baseline's."""
    baseline = next(c for c in configs if c.is_baseline)
    candidates = [c for c in configs if not c.is_baseline]
    built = build_all(configs, scale, dictionary, device, seed, log)
    batches = [to_device(b, device) for b in batches]
    steps = {key: TrainStep(b) for key, b in built.items()}

    def measure(key: str) -> float:
        torch.manual_seed(seed)  # identical dropout draws for every model
        step = steps[key]
        work, seconds = timed(lambda: sum(step(b) for b in batches), device)
        return work / seconds

    log(
        f"  timing {len(configs)} models on {len(batches)} batch(es), {repeats} interleaved rounds "
        f"after {warmup} warm-up"
    )
    paired = run_paired(baseline.key, [c.key for c in candidates], measure, repeats, warmup, log)
    tokens = sum(float(x["ntokens"]) for x in batches)
    results = {c.key: training_record(c, built[c.key], paired[c.key], tokens) for c in configs}
    return TrainingRun(results, steps)


def training_record(config: Config, built: Built, paired: PairedResult, tokens: float) -> dict:
    """One config's serialised result: what was built, and its paired measurement
    (:func:`benchmarks.speed.timing.run_paired`) of ``tokens`` target tokens a round."""
    return {
        **describe(built),
        "arch": config.arch,
        "flags": list(config.flags),
        "parameters": built.parameters,
        "tokens_per_measurement": tokens,
        "throughput": paired.throughput.as_dict(),
        **paired.record(),
    }


def profile_training(step: TrainStep, sample, device, runs: int = 2) -> dict:
    """torch.profiler over one training step (``runs`` times, per-op minimum;
    see :func:`benchmarks.speed.timing.profile_min`). ``step`` is already warm."""
    sample = to_device(sample, device)
    return profile_min(lambda: step(sample), device, runs)
