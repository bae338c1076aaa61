"""Attention-op microbenchmarks: each functional op of the plugin against
``torch.nn.functional.scaled_dot_product_attention`` on the same
``[B, H, L, D]`` inputs, at several lengths L, forward only and forward +
backward, with the fitted exponent of cost against L (log-log least squares).

Self-attention shapes (Tq = Tk = L), no padding, not causal, no dropout; the
window ops include computing their soft mask (``window_mask``), as the layer
does. Each timing repeats the op until at least ``min_time`` seconds have
passed and reports seconds per call.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence, Tuple

import torch
import torch.nn.functional as F

from .common import Summary, fit_exponent, now, run_paired, synchronize

BASELINE = "sdpa"
MAX_RELATIVE_POSITION = 16
SEGMENT_SIZE = 5
MODES = ("fwd", "fwd+bwd")


def _op_table() -> Dict[str, Callable]:
    """name -> make(B, H, L, D, device, generator) returning (leaves, fn); fn() -> output tensor."""
    import fairseq_distattn.functional as DF

    def tensors(n, shape, device, generator, scale=1.0):
        return [(torch.randn(*shape, generator=generator) * scale).to(device).requires_grad_() for _ in range(n)]

    def sdpa(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        return [q, k, v], lambda: F.scaled_dot_product_attention(q, k, v)

    def softmax(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        return [q, k, v], lambda: DF.softmax_attention(q, k, v)[0]

    def rpr(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        rk, rv = tensors(2, (2 * MAX_RELATIVE_POSITION + 1, D), device, g, 0.1)
        return [q, k, v, rk, rv], lambda: DF.relative_position_attention(q, k, v, rk, rv, MAX_RELATIVE_POSITION)[0]

    def da(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        w, s = tensors(2, (H,), device, g, 0.1)
        return [q, k, v, w, s], lambda: DF.distance_aware_attention(q, k, v, w, s)[0]

    def window(additive: bool, segment: int):
        def make(B, H, L, D, device, g):
            q, k, v, ql, kl, qr, kr = tensors(7, (B, H, L, D), device, g)
            leaves = [q, k, v, ql, kl, qr, kr]
            if additive:
                qg, kg = tensors(2, (B, H, L, D), device, g)
                leaves += [qg, kg]

            def fn():
                mask = DF.window_mask(ql, kl, qr, kr, segment)
                if additive:
                    return DF.additive_window_attention(q, k, qg, kg, v, mask)[0]
                return DF.multiplicative_window_attention(q, k, v, mask)[0]

            return leaves, fn

        return make

    def distance_mask(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        return [q, k, v], lambda: DF.distance_mask_attention(q, k, v, 1.0)[0]

    def qvi(B, H, L, D, device, g):
        q, k, v = tensors(3, (B, H, L, D), device, g)
        w = (torch.eye(D).repeat(H, 1, 1) + 0.01 * torch.randn(H, D, D, generator=g)).to(device).requires_grad_()
        u, h = tensors(1, (H, 2 * D), device, g, 0.1)[0], tensors(1, (H,), device, g, 0.1)[0]
        return [q, k, v, w, u, h], lambda: DF.query_value_interaction_attention(q, k, v, w, u, h)[0]

    return {
        BASELINE: sdpa,
        "softmax_attention": softmax,
        "relative_position_attention": rpr,
        "distance_aware_attention": da,
        "window-mw (window_mask + multiplicative_window_attention)": window(False, 0),
        "window-aw (window_mask + additive_window_attention)": window(True, 0),
        "window-mw-seg (b=5)": window(False, SEGMENT_SIZE),
        "window-aw-seg (b=5)": window(True, SEGMENT_SIZE),
        "distance_mask_attention": distance_mask,
        "query_value_interaction_attention": qvi,
    }


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
) -> Dict[str, dict]:
    table = _op_table()
    names = [n for n in table if n == BASELINE or not only or any(o in n for o in only)]
    per_call: Dict[Tuple[str, str], Dict[int, dict]] = {(n, m): {} for n in names for m in modes}
    ratios: Dict[Tuple[str, str], Dict[int, dict]] = {(n, m): {} for n in names for m in modes}
    for mode in modes:
        for length in lengths:
            made = {}
            for name in names:
                generator = torch.Generator().manual_seed(seed)
                made[name] = table[name](batch, heads, length, head_dim, device, generator)
            grad_out = torch.randn(batch, heads, length, head_dim, generator=torch.Generator().manual_seed(seed)).to(
                device
            )
            calls: Dict[str, int] = {}

            def measure(name: str) -> float:
                leaves, fn = made[name]
                if name not in calls:  # calibrate the inner repeat count once
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
                return n / (now() - start)  # calls per second

            paired = run_paired(BASELINE, [n for n in names if n != BASELINE], measure, repeats, warmup)
            for name in names:
                r = paired[name]
                per_call[(name, mode)][length] = Summary.of([1.0 / x for x in r.throughputs]).as_dict()
                if r.ratios:
                    # throughput ratio op/sdpa -> cost ratio sdpa-normalised: cost(op)/cost(sdpa)
                    ratios[(name, mode)][length] = Summary.of([1.0 / x for x in r.ratios]).as_dict()
            log(f"  {mode} L={length}: sdpa {per_call[(BASELINE, mode)][length]['median'] * 1e3:.2f} ms/call")
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
