"""Why is window-preset's training pass 60-137x vanilla's on an H100 (memory section,
L >= 512) when it is 2.5x on one CPU thread? Times vanilla, the window's cost floor and
the preset at one length, then profiles the preset's pass: top ops by device and host time.

Part of how benchmarks/results/speed/gpu-nvidia-h100-recompute/ was made (see its README),
once that folder's profile_window.py. From the repository root:
``PYTHONPATH=. python benchmarks/gpu/sessions/h100-recompute-profile-window.py [DEVICE] [L]``.
"""

import sys
import time

import torch
from fairseq.data import Dictionary
from torch.profiler import ProfilerActivity, profile

import benchmarks.speed.configs as C
from benchmarks.speed.memory import _forward_backward
from benchmarks.speed.train import to_device

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
L = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
print("deterministic", torch.are_deterministic_algorithms_enabled(), "L", L, flush=True)
d = Dictionary()
for i in range(1000):
    d.add_symbol(f"w{i}")
g = torch.Generator().manual_seed(0)


def batch(n):
    src = torch.randint(4, len(d), (2, n), generator=g)
    tgt = torch.randint(4, len(d), (2, n), generator=g)
    src[:, -1] = tgt[:, -1] = d.eos()
    prev = torch.cat([tgt.new_full((2, 1), d.eos()), tgt[:, :-1]], 1)
    net = {"src_tokens": src, "src_lengths": torch.full((2,), n), "prev_output_tokens": prev}
    return to_device(
        {"id": torch.arange(2), "nsentences": 2, "ntokens": 2 * n, "net_input": net, "target": tgt}, device
    )


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


scale = C.SCALES["paper"]
configs = {c.key: c for c in [C.MT_BASELINE, *C.MT_PRESETS, *C.MT_FLOORS]}
built = {}
for key in ("transformer", "window-floor", "window-preset"):
    built[key] = C.build(configs[key], scale, d, device, max_positions=4096)
    _forward_backward(built[key], batch(128))
    sync()
    for n in (256, L):
        s = batch(n)
        _forward_backward(built[key], s)
        sync()
        t = time.perf_counter()
        for _ in range(2):
            _forward_backward(built[key], s)
        sync()
        print(f"{key} L={n}: {(time.perf_counter() - t) / 2 * 1000:.1f} ms per pass", flush=True)
s = batch(L)
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
with profile(activities=acts) as prof:
    _forward_backward(built["window-preset"], s)
    sync()
ka = prof.key_averages()
print(
    ka.table(
        sort_by="self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total",
        row_limit=22,
        max_name_column_width=60,
    )
)
if device.type == "cuda":
    print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
