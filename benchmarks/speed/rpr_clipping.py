"""Relative positions: does a clipping distance beyond the sentence cost anything?

``python -m benchmarks.speed.rpr_clipping`` times one training step (forward,
backward, Adam) of the ``distattn_rpr_wmt_en_de`` preset on batches of
L = 64-token sentences with ``--max-relative-position`` 16 and 1024,
interleaved, and prints the throughput ratio k=1024 / k=16 against its target
(>= 0.95). With k beyond the sentence no distance is clipped, so the model
has 2L - 1 distinct relative embeddings instead of 2k + 1: the same result as
k = L - 1, and the extra work is only the larger bucket products, not
anything that grows with k. The attention op alone (``relative_position_attention``
forward + backward) is timed too, for information. Never asserts timing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..common import at_least, machine_description
from .configs import MT, SCALES, Config, build
from .ops import _call
from .timing import now, run_paired
from .train import TrainStep

TARGET = 0.95
SHORT_K, LONG_K = 16, 1024


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed.rpr_clipping", description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=64, help="sentence length L, source and target (default: 64)")
    p.add_argument("--sentences", type=int, default=16, help="sentences per training batch (default: 16)")
    p.add_argument("--scale", choices=sorted(SCALES), default="small", help="model widths (configs.py)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default: 7)")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per measurement (default: 0.2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=at_least(1), default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def measure_repeatedly(step, device, min_time: float) -> float:
    """Calls per second of ``step()``, repeated for at least ``min_time`` seconds."""
    start, count = now(), 0
    while count == 0 or now() - start < min_time:
        step()
        count += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (now() - start)


def paired_ratio(steps, device, args) -> dict:
    paired = run_paired(
        f"k={SHORT_K}",
        [f"k={LONG_K}"],
        lambda name: measure_repeatedly(steps[name], device, args.min_time),
        args.repeats,
    )
    return paired[f"k={LONG_K}"].ratio.as_dict()


def training_steps(args, device):
    """One training step per k on one batch of random tokens, all sentences L long."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for index in range(1000):
        dictionary.add_symbol(f"w{index}")
    generator = torch.Generator().manual_seed(0)
    shape = (args.sentences, args.length)
    source = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=generator)
    target = torch.randint(dictionary.nspecial, len(dictionary), shape, generator=generator)
    previous = torch.cat([torch.full((args.sentences, 1), dictionary.eos()), target[:, :-1]], dim=1)
    sample = {
        "id": torch.arange(args.sentences),
        "nsentences": args.sentences,
        "ntokens": target.numel(),
        "net_input": {
            "src_tokens": source.to(device),
            "src_lengths": torch.full((args.sentences,), args.length).to(device),
            "prev_output_tokens": previous.to(device),
        },
        "target": target.to(device),
    }
    steps = {}
    for clipping in (SHORT_K, LONG_K):
        config = Config(f"k={clipping}", MT, "distattn_rpr_wmt_en_de", ("--max-relative-position", str(clipping)))
        step = TrainStep(build(config, SCALES[args.scale], dictionary, device))
        steps[config.key] = lambda step=step: step(sample)
    return steps


def op_steps(args, device):
    from fairseq_distattn import functional

    generator = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=generator).to(device).requires_grad_()

    heads, head_dim = 8, 64
    q, k, v = (leaf(args.sentences, heads, args.length, head_dim) for _ in range(3))
    grad_out = torch.randn(args.sentences, heads, args.length, head_dim, generator=generator).to(device)
    steps = {}
    for clipping in (SHORT_K, LONG_K):
        tables = [leaf(2 * clipping + 1, head_dim) for _ in range(2)]
        leaves = [q, k, v, *tables]
        call = lambda t=tables, c=clipping: functional.relative_position_attention(q, k, v, t[0], t[1], c)[0]  # noqa: E731
        steps[f"k={clipping}"] = lambda leaves=leaves, call=call: _call(call, leaves, "fwd+bwd", grad_out)
    return steps


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    train = paired_ratio(training_steps(args, device), device, args)
    op = paired_ratio(op_steps(args, device), device, args)
    verdict = "PASS" if train["median"] >= TARGET else "MISS"
    print(
        f"distattn_rpr_wmt_en_de training step ({args.scale}), {args.sentences} x {args.length} tokens, {device}: "
        f"throughput k={LONG_K} / k={SHORT_K} = {train['median']:.3f} (target >= {TARGET}) {verdict}"
    )
    print(f"relative_position_attention fwd+bwd alone (information): k={LONG_K} / k={SHORT_K} = {op['median']:.3f}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "train_ratio": train,
                    "op_ratio": op,
                    "target": TARGET,
                    "verdict": verdict,
                    "length": args.length,
                    "sentences": args.sentences,
                    "scale": args.scale,
                    "machine": machine_description(device),
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
