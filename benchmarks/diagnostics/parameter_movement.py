"""How far each mechanism's parameters moved in training: ``python -m benchmarks.diagnostics.parameter_movement CKPT``.

A quality run that beats (or trails) vanilla says little if the mechanism's
own parameters never left their initial values. This rebuilds the model as
fairseq-train initialised it (the checkpoint's arguments, the same seed set
the same way before ``task.build_model``) and reports, for every mechanism
parameter (DA's w and v, window pointer and local projections, rpr tables,
QVI's W and gate), the relative distance ``||theta - theta_0|| / ||theta_0||``
(the absolute distance where ``theta_0`` is zero, as DA's w and v start),
grouped by attention kind and parameter over layers.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

PROG = "python -m benchmarks.diagnostics.parameter_movement"
# parameters that exist only because of a mechanism: the mechanism module's own
# and its extra projections (vanilla q/k/v/out projections are not counted)
MECHANISM_PARAMETER = re.compile(r"\.(mechanism|extra_query_proj|extra_key_proj)\.")
# A window pointer's key bias adds q . b to every score of the boundary
# softmax over keys (eqs. 7-8), which the softmax ignores: like fairseq's own
# k_proj bias it gets no gradient, so it is left out rather than reported as
# "did not move". (AW's local key bias does move: M weights its scores per key.)
SHIFT_INVARIANT = re.compile(r"\.extra_key_proj\.(left|right)_key\.bias$")
LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.(.*)$")
KINDS = {
    ("encoder", "self_attn"): "encoder self",
    ("decoder", "self_attn"): "decoder self",
    ("decoder", "encoder_attn"): "cross",
}


class MovementError(Exception):
    """A checkpoint or data directory that cannot be used; its message is the whole error line."""


def initial_state(cfg, data_dir: Optional[str] = None) -> Dict[str, object]:
    """The model's parameters as fairseq-train built them before the first update."""
    import numpy as np
    from fairseq import tasks, utils

    if data_dir is not None:
        cfg.task.data = data_dir
    # fairseq_cli/train.py: seeds, then setup_task (reads dictionaries only), then build_model
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as error:  # the dictionaries: moved with the data, or --data is not a data-bin
        raise MovementError(f"cannot set up the checkpoint's task (--data {cfg.task.data}): {error}") from error
    model = task.build_model(cfg.model)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def movement(checkpoint: Path, data_dir: Optional[str] = None) -> Dict[str, Dict[str, float]]:
    """``{"<kind> <parameter>": {"layers", "relative_change" (mean over layers), "min", "max", ...}}``."""
    import torch
    from fairseq import checkpoint_utils

    import fairseq_distattn.models  # noqa: F401  (registers the models, allow-lists checkpoint objects)
    from fairseq_distattn.tools.check import failure_reason

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    except Exception as error:  # every reason a file cannot be read is reported alike
        raise MovementError(f"cannot read {checkpoint}: {failure_reason(error)}") from error
    trained = state["model"]
    initial = initial_state(state["cfg"], data_dir)
    groups: Dict[str, List[float]] = {}
    values: Dict[str, List[torch.Tensor]] = {}
    starts_at_zero: Dict[str, bool] = {}
    for name, theta in trained.items():
        match = LAYER.match(name)
        if not MECHANISM_PARAMETER.search(name) or SHIFT_INVARIANT.search(name) or match is None:
            continue
        stack, _, attention, parameter = match.groups()
        key = f"{KINDS[(stack, attention)]} {parameter}"
        theta, theta_0 = theta.double(), initial[name].double()
        start = theta_0.norm().item()
        change = (theta - theta_0).norm().item()
        groups.setdefault(key, []).append(change / start if start > 0 else change)
        starts_at_zero[key] = starts_at_zero.get(key, True) and start == 0
        values.setdefault(key, []).append(theta.flatten())
    result = {}
    for key, changes in groups.items():
        entry = {
            "layers": len(changes),
            "relative_change": sum(changes) / len(changes),
            "min": min(changes),
            "max": max(changes),
            "measure": "absolute" if starts_at_zero[key] else "relative",
        }
        if key.endswith(("distance_weight", "sharpness")):  # per-head scalars: show them
            flat = torch.cat(values[key])
            entry.update(value_min=flat.min().item(), value_max=flat.max().item())
        result[key] = entry
    return result


def summary(result: Dict[str, Dict[str, float]]) -> str:
    """One line per group, for logs and the quality report."""
    lines = []
    for key, entry in sorted(result.items()):
        line = (
            f"{key}: {entry['measure']} change {entry['relative_change']:.3g} "
            f"(layers {entry['layers']}, min {entry['min']:.3g}, max {entry['max']:.3g})"
        )
        if "value_min" in entry:
            line += f", values in [{entry['value_min']:.3g}, {entry['value_max']:.3g}]"
        lines.append(line)
    return "\n".join(lines) if lines else "no mechanism parameters (a vanilla model)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", default=None, help="data-bin directory with the dictionaries (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of one line per parameter group")
    args = p.parse_args(argv)
    if not args.checkpoint.is_file():
        p.error(f"argument checkpoint: no such file: {args.checkpoint}")
    if args.data is not None and not Path(args.data).is_dir():
        p.error(f"argument --data: no such directory: {args.data}")
    try:
        result = movement(args.checkpoint, args.data)
    except MovementError as error:
        p.exit(1, f"{p.prog}: error: {error}\n")
    print(json.dumps(result, indent=1) if args.json else summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
