"""Peak memory (the memory section's CPU measure) and time of one training pass at one length.

Part of how benchmarks/results/speed/gpu-nvidia-h100-recompute/ was made (see its README),
once that folder's peak_cpu.py. From the repository root:
``PYTHONPATH=. python benchmarks/gpu/sessions/h100-recompute-peak-cpu.py L CONFIGS [SCALE]``.
"""

import sys
import time

import torch
from fairseq.data import Dictionary

import benchmarks.speed.configs as C
from benchmarks.speed.memory import _forward_backward, peak_bytes

torch.set_num_threads(1)
L = int(sys.argv[1])
keys = sys.argv[2].split(",")
scale = C.SCALES[sys.argv[3] if len(sys.argv) > 3 else "paper"]
d = Dictionary()
for i in range(1000):
    d.add_symbol(f"w{i}")
g = torch.Generator().manual_seed(0)
src = torch.randint(4, len(d), (2, L), generator=g)
tgt = torch.randint(4, len(d), (2, L), generator=g)
src[:, -1] = tgt[:, -1] = d.eos()
prev = torch.cat([tgt.new_full((2, 1), d.eos()), tgt[:, :-1]], 1)
sample = {
    "id": torch.arange(2),
    "nsentences": 2,
    "ntokens": 2 * L,
    "target": tgt,
    "net_input": {"src_tokens": src, "src_lengths": torch.full((2,), L), "prev_output_tokens": prev},
}
configs = {c.key: c for c in [C.MT_BASELINE, *C.MT_PRESETS]}
for key in keys:
    built = C.build(configs[key], scale, d, "cpu", max_positions=4096)
    torch.manual_seed(1)
    peak = peak_bytes(built, sample, "cpu")
    t = time.process_time()
    _forward_backward(built, sample)
    t = time.process_time() - t
    print(f"{key} L={L}: peak {peak / 2**20:.1f} MiB, pass {t:.1f} s", flush=True)
