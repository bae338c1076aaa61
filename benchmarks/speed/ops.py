"""Attention-op microbenchmarks: every registered mechanism's functional op
(called by its module as the model calls it, on drawn parameters and inputs at
the default options: ``fairseq_distattn.tools.examples``) and
the plugin's softmax attention (``vanilla``) against
``torch.nn.functional.scaled_dot_product_attention`` on the same
``[B, H, L, D]`` inputs, at several lengths L, forward only and forward +
backward, with the fitted exponent of cost against L (log-log least squares).

Self-attention shapes (Tq = Tk = L), no padding, not causal, no dropout; the
window ops include computing their soft mask, as the layer does. Each timing
repeats the op until at least ``min_time`` seconds have passed and reports
seconds per call.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence, Tuple

import torch
import torch.nn.functional as F

from .timing import Summary, fit_exponent, now, run_paired, synchronize

BASELINE = "sdpa"
MODES = ("fwd", "fwd+bwd")


def _op_table(flex: str = "auto") -> Dict[str, Callable]:
    """name -> make(B, H, L, D, device, seed) returning (leaves, fn); fn() -> output tensor: the
    baseline, the plugin's softmax attention (vanilla), and every registered mechanism's op, called
    by its module (its example call) at the default options; ``flex``: the ops' own argument."""
    from fairseq_distattn import functional
    from fairseq_distattn.registry import registered
    from fairseq_distattn.tools.examples import ExampleDraw, example_call

    def draw_of(B, H, L, D, device, seed):
        return ExampleDraw(B, H, L, L, D, seed=seed, dtype=torch.float32, device=device, requires_grad=True)

    def sdpa(B, H, L, D, device, seed):
        draw = draw_of(B, H, L, D, device, seed)
        q, k, v = draw.query(), draw.key(), draw.key()
        return draw.leaves, lambda: F.scaled_dot_product_attention(q, k, v)

    def softmax(B, H, L, D, device, seed):
        draw = draw_of(B, H, L, D, device, seed)
        q, k, v = draw.query(), draw.key(), draw.key()
        return draw.leaves, lambda: functional.softmax_attention(q, k, v, flex=flex)[0]

    def mechanism(info):
        def make(B, H, L, D, device, seed):
            draw = draw_of(B, H, L, D, device, seed)
            call = example_call(info, draw)
            return draw.leaves, lambda: call(flex=flex)[0]

        return make

    return {BASELINE: sdpa, "vanilla": softmax, **{info.name: mechanism(info) for info in registered()}}


def _call(fn: Callable, leaves: Sequence[torch.Tensor], mode: str, grad_out: torch.Tensor):
    if mode == "fwd":
        with torch.no_grad():
            fn()
        return
    for leaf in leaves:
        leaf.grad = None
    fn().backward(grad_out)


def run_ops(
    batch: int,
    heads: int,
    head_dim: int,
    lengths: Sequence[int],
    device,
    repeats: int,
    warmup: int,
    seed: int,
    log: Callable[[str], None],
    modes: Sequence[str] = MODES,
    min_time: float = 0.05,
    only: Sequence[str] = (),
    flex: str = "auto",
) -> Dict[str, dict]:
    table = _op_table(flex)
    names = [n for n in table if n == BASELINE or not only or any(o in n for o in only)]
    per_call: Dict[Tuple[str, str], Dict[int, dict]] = {(n, m): {} for n in names for m in modes}
    ratios: Dict[Tuple[str, str], Dict[int, dict]] = {(n, m): {} for n in names for m in modes}
    for mode in modes:
        for length in lengths:
            made = {name: table[name](batch, heads, length, head_dim, device, seed) for name in names}
            grad_out = torch.randn(batch, heads, length, head_dim, generator=torch.Generator().manual_seed(seed)).to(
                device
            )
            measure = _calls_per_second(made, mode, grad_out, device, min_time)
            paired = run_paired(BASELINE, [n for n in names if n != BASELINE], measure, repeats, warmup)
            for name in names:
                r = paired[name]
                per_call[(name, mode)][length] = Summary.of([1.0 / x for x in r.throughputs]).as_dict()
                if r.ratios:
                    # throughput ratio op/sdpa -> cost ratio sdpa-normalised: cost(op)/cost(sdpa)
                    ratios[(name, mode)][length] = Summary.of([1.0 / x for x in r.ratios]).as_dict()
            log(f"  {mode} L={length}: sdpa {per_call[(BASELINE, mode)][length]['median'] * 1e3:.2f} ms/call")
    return _op_results(per_call, ratios, lengths)


def _calls_per_second(made: Dict[str, tuple], mode: str, grad_out, device, min_time: float) -> Callable[[str], float]:
    """A meter of one op's calls per second at one mode and length: each op's inner repeat
    count is calibrated once, so that a measurement lasts about ``min_time`` seconds."""
    calls: Dict[str, int] = {}

    def measure(name: str) -> float:
        leaves, fn = made[name]
        if name not in calls:
            synchronize(device)
            start = now()
            _call(fn, leaves, mode, grad_out)
            synchronize(device)
            once = max(now() - start, 1e-6)
            calls[name] = max(1, int(min_time / once))
        n = calls[name]
        synchronize(device)
        start = now()
        for _ in range(n):
            _call(fn, leaves, mode, grad_out)
        synchronize(device)
        return n / (now() - start)

    return measure


def _op_results(
    per_call: Dict[Tuple[str, str], Dict[int, dict]],
    ratios: Dict[Tuple[str, str], Dict[int, dict]],
    lengths: Sequence[int],
) -> Dict[str, dict]:
    """Each op and mode's seconds per call and cost relative to sdpa per length, with the
    exponent of its cost against length over all lengths and over the last two."""
    results = {}
    for (name, mode), by_length in per_call.items():
        medians = [by_length[n]["median"] for n in lengths]
        tail = fit_exponent(lengths[-2:], medians[-2:]) if len(lengths) >= 2 else float("nan")
        results[f"{name} [{mode}]"] = {
            "op": name,
            "mode": mode,
            "seconds_per_call": {str(n): by_length[n] for n in lengths},
            "cost_vs_sdpa": {str(n): ratios[(name, mode)][n] for n in lengths} if ratios[(name, mode)] else None,
            "exponent": fit_exponent(lengths, medians),
            "tail_exponent": tail,
        }
    return results
