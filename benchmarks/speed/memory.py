"""Peak memory of one forward + backward pass at fixed sequence lengths.

CUDA: ``torch.cuda.max_memory_allocated`` above what was allocated before the
pass (parameters). CPU: torch's profiler with ``profile_memory=True`` records
every allocation and free of torch's CPU allocator; the peak of their running
sum over the pass is the same quantity (tracemalloc cannot see torch's
allocations, and the process RSS also counts freed-but-cached pages).

Gradients are freed before the measured pass, so the peak includes the
gradient buffers (a mechanism's extra parameters cost memory too), the
activations saved for backward and the temporaries.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import torch

from .configs import Config, Scale, build, describe
from .timing import timed
from .train import to_device

TIMED_PASSES = 3  # the same pass, unprofiled: what the memory costs in time


def _forward_backward(built, sample):
    model, criterion = built.model, built.criterion
    model.train()
    loss, _, _ = criterion(model, sample)
    loss.backward()


def _cpu_peak_bytes(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    changes = sorted(
        (e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    running = peak = 0
    for _, nbytes in changes:
        running += nbytes
        peak = max(peak, running)
    return peak


def peak_bytes(built, sample, device) -> int:
    device = torch.device(device)
    built.model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        _forward_backward(built, sample)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        peak = _cpu_peak_bytes(lambda: _forward_backward(built, sample))
    built.model.zero_grad(set_to_none=True)
    return int(peak)


def pass_seconds(built, sample, device, seed: int) -> float:
    """Median time of the measured forward + backward pass, without the profiler."""
    seconds = []
    for _ in range(TIMED_PASSES):
        torch.manual_seed(seed)
        built.model.zero_grad(set_to_none=True)
        seconds.append(timed(lambda: _forward_backward(built, sample) or 0, device)[1])
    built.model.zero_grad(set_to_none=True)
    return sorted(seconds)[len(seconds) // 2]


def run_memory(
    configs: Sequence[Config],
    scale: Scale,
    dictionary,
    make_batch: Callable[[str, int], dict],
    device,
    seed: int,
    log: Callable[[str], None],
) -> Dict[str, dict]:
    """``make_batch(task, length)`` returns a batch of ``scale.memory_rows``
    sequences of ``length`` tokens. One model at a time, each length once
    after an unmeasured warm-up pass at the smallest length."""
    lengths = list(scale.memory_lengths)
    results: Dict[str, dict] = {}
    for config in configs:
        built = build(config, scale, dictionary, device, seed=seed, max_positions=max(2048, 2 * max(lengths)))
        warm = to_device(make_batch(config.task, lengths[0]), device)
        torch.manual_seed(seed)
        _forward_backward(built, warm)
        peaks, seconds = {}, {}
        for length in lengths:
            sample = to_device(make_batch(config.task, length), device)
            torch.manual_seed(seed)
            peaks[length] = peak_bytes(built, sample, device)
            seconds[length] = pass_seconds(built, sample, device, seed)
        log(f"  {config.key}: " + ", ".join(f"L={n} {peaks[n] / 2**20:.1f} MiB {seconds[n]:.2f} s" for n in lengths))
        results[config.key] = {
            **describe(built),
            "rows": scale.memory_rows,
            "peak_bytes": {str(n): peaks[n] for n in lengths},
            "pass_seconds": {str(n): seconds[n] for n in lengths},
        }
        del built
    for task in ("translation", "lm"):
        base = next((r for r in results.values() if r["task"] == task and r["kind"] == "baseline"), None)
        for r in results.values():
            if r["task"] == task and base is not None:
                r["ratio"] = {n: r["peak_bytes"][n] / base["peak_bytes"][n] for n in r["peak_bytes"]}
                r["time_ratio"] = {n: r["pass_seconds"][n] / base["pass_seconds"][n] for n in r["pass_seconds"]}
    return results
