"""Let ``torchrun --nproc_per_node N fairseq-train ...`` train on CPU.

fairseq 0.12 reads torchrun's ``RANK``/``WORLD_SIZE`` environment in
``_infer_torch_distributed_launch_init``, which also picks the rank's GPU as
``rank % torch.cuda.device_count()``: a ZeroDivisionError on a machine
without one. This wraps it so that, with no GPU, the device id is 0 (unused
on CPU) and everything else is fairseq's own.
"""

import torch
from fairseq.distributed import utils as distributed_utils


def allow_torchrun_on_cpu():
    fairseq_infer = distributed_utils._infer_torch_distributed_launch_init
    if getattr(fairseq_infer, "allows_cpu", False):
        return

    def infer(cfg):
        if torch.cuda.device_count() > 0:
            return fairseq_infer(cfg)
        real_device_count = torch.cuda.device_count
        torch.cuda.device_count = lambda: 1  # rank % 1 == 0: device id 0, never used on CPU
        try:
            return fairseq_infer(cfg)
        finally:
            torch.cuda.device_count = real_device_count

    infer.allows_cpu = True
    distributed_utils._infer_torch_distributed_launch_init = infer
