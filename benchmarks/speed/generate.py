"""Beam-5 generation throughput with fairseq's SequenceGenerator, in-process.

Translation models translate a fixed batch of real source sentences; language
models continue real sentence beginnings (``prefix_tokens``). ``min_len`` is
set to the maximum length so that every hypothesis of every model runs the
same number of decoder steps: untrained models emit EOS at random, and
equal work is what makes the ratio a speed ratio.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Sequence

import torch

from .configs import Built, Config, Scale, build, describe
from .timing import PairedResult, profile_min, run_paired, timed
from .train import to_device


def make_generator(model, dictionary, beam: int, length: int):
    from fairseq.sequence_generator import SequenceGenerator

    return SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length, min_len=length)


class GenerationRun(NamedTuple):
    """What :func:`run_generation` measured (``results``: per config key, serialised) and
    what it searched with, kept to profile a missed target."""

    results: Dict[str, dict]
    models: Dict[str, Built]
    sample: dict
    length: int
    prefix_tokens: Optional[torch.Tensor]


def run_generation(
    configs: Sequence[Config],
    scale: Scale,
    dictionary,
    sample: dict,
    device,
    repeats: int,
    warmup: int,
    seed: int,
    log: Callable[[str], None],
    beam: int = 5,
    prefix_tokens=None,
    new_tokens: int = 0,
) -> GenerationRun:
    """``sample``: a translation batch, or for language models a batch whose
    ``src_tokens`` are the prompts (then ``prefix_tokens`` = the prompts and
    ``new_tokens`` tokens are generated after them)."""
    baseline = next(c for c in configs if c.is_baseline)
    candidates = [c for c in configs if not c.is_baseline]
    sample = to_device(sample, device)
    if prefix_tokens is not None:
        prefix_tokens = prefix_tokens.to(device)
        length = prefix_tokens.size(1) + new_tokens
    else:
        length = scale.gen_max_len
    built = {c.key: build(c, scale, dictionary, device, seed=seed) for c in configs}
    generators = {}
    for key, b in built.items():
        b.model.eval()
        generators[key] = make_generator(b.model, dictionary, beam, length)
    sentences = sample["net_input"]["src_tokens"].size(0)
    tokens_out: Dict[str, float] = {}

    def measure(key: str) -> float:
        generator = generators[key]

        def run():
            with torch.no_grad():
                hypos = generator.generate([built[key].model], sample, prefix_tokens=prefix_tokens)
            tokens_out[key] = float(sum(len(h[0]["tokens"]) for h in hypos))
            return sentences

        work, seconds = timed(run, device)
        return work / seconds

    log(f"  beam {beam}, {sentences} sentences, {length} tokens each, {len(configs)} models, {repeats} rounds")
    paired = run_paired(baseline.key, [c.key for c in candidates], measure, repeats, warmup, log)
    results = {
        key: generation_record(built[key], paired[key], sentences, beam, tokens_out[key] / sentences) for key in built
    }
    return GenerationRun(results, built, sample, length, prefix_tokens)


def generation_record(
    built: Built, paired: PairedResult, sentences: int, beam: int, tokens_per_sentence: float
) -> dict:
    """One config's serialised result: what was built, and its paired measurement
    (:func:`benchmarks.speed.timing.run_paired`) in sentences and in tokens a second."""
    sentences_per_s = paired.throughput.as_dict()
    return {
        **describe(built),
        "sentences": sentences,
        "beam": beam,
        "tokens_per_sentence": tokens_per_sentence,
        "sentences_per_s": sentences_per_s,
        "tokens_per_s": {k: (v * tokens_per_sentence if k != "n" else v) for k, v in sentences_per_s.items()},
        **paired.record(),
    }


def profile_generation(
    built, dictionary, sample, device, beam: int, length: int, prefix_tokens=None, runs: int = 1
) -> dict:
    """torch.profiler over one beam search (``runs`` times, per-op minimum; see
    :func:`benchmarks.speed.timing.profile_min`). The model is already warm from the
    timed searches; the profiler's per-op overhead makes a profiled search
    several times slower than a timed one, hence one run by default."""
    sample = to_device(sample, device)
    if prefix_tokens is not None:
        prefix_tokens = prefix_tokens.to(device)
    generator = make_generator(built.model, dictionary, beam, length)
    built.model.eval()

    def search():
        with torch.no_grad():
            generator.generate([built.model], sample, prefix_tokens=prefix_tokens)

    return profile_min(search, device, runs)
