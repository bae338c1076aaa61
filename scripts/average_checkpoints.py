#!/usr/bin/env python3
"""Average the parameters of fairseq checkpoints (fairseq's scripts/average_checkpoints.py,
which the fairseq wheel does not ship, for fairseq-distattn models).

  # the last 5 epoch checkpoints (checkpointN.pt) of a directory
  python scripts/average_checkpoints.py --inputs checkpoints/dw --num-epoch-checkpoints 5 \\
      --output checkpoints/dw/averaged.pt
  # the last 20 update checkpoints (checkpoint_E_U.pt, from --save-interval-updates)
  python scripts/average_checkpoints.py --inputs checkpoints/big --num-update-checkpoints 20 \\
      --output checkpoints/big/averaged.pt
  # an explicit list
  python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

The output holds the element-wise mean of every model tensor (floating tensors are
summed in float64 and cast back to their dtype; integer buffers are floor-divided),
with the configuration and training state of the newest input. The optimizer state
is dropped (it does not belong to the average; --keep-optimizer-state keeps the
newest input's).

Checkpoints are loaded with torch's weights-only unpickler (the default from torch
2.6): importing fairseq_distattn.models allow-lists the few plain classes fairseq pickles
into a checkpoint, so no arbitrary code from a checkpoint file runs.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

import fairseq_distattn.models  # noqa: E402,F401  (registers the safe globals for fairseq checkpoints)
from fairseq_distattn.trained_settings import differences, model_config, settings_of, shown  # noqa: E402

EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_RE = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


def load_checkpoint(path: Path):
    kwargs = {"map_location": "cpu"}
    if hasattr(torch.serialization, "add_safe_globals"):
        kwargs["weights_only"] = True  # also on torch 2.4/2.5, whose default is False
    try:
        return torch.load(str(path), **kwargs)
    except Exception as error:  # noqa: BLE001 - report which file and why
        raise SystemExit(f"average_checkpoints: cannot load {path}: {error}")


def last_checkpoints(directory: Path, n: int, by: str = "epoch", upper_bound: Optional[int] = None) -> List[Path]:
    """The ``n`` checkpoints with the highest epoch (checkpointN.pt) or update
    (checkpoint_E_U.pt) number in ``directory``, oldest first."""
    directory = Path(directory)
    pattern = EPOCH_RE if by == "epoch" else UPDATE_RE
    found = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match:
            number = int(match.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, path))
    if len(found) < n:
        kind = "checkpointN.pt" if by == "epoch" else "checkpoint_E_U.pt"
        raise SystemExit(f"average_checkpoints: found {len(found)} {kind} files in {directory}, need {n}")
    found.sort()
    return [path for _, path in found[-n:]]


def trained_as(state) -> dict:
    """``--arch`` and what defines the model's attention (the trained configuration)."""
    config = model_config(state)
    if config is None:
        return {}
    return {"--arch": getattr(config, "arch", None) or getattr(config, "_name", None), **settings_of(config)}


def check_same_model(first_path: Path, first: dict, path: Path, state) -> None:
    """Refuse to average checkpoints of different models: one whose mechanism has no
    parameters (alibi) has the same parameter names as a vanilla one, and their average
    would be labelled as whichever came last."""
    found = differences(first, trained_as(state))
    if found:
        name, a, b = found[0]
        raise SystemExit(
            f"average_checkpoints: error: {path} is another model than {first_path}: {name} {shown(b)} "
            f"there, {shown(a)} in {first_path}; average only checkpoints of one training run"
        )


def average_states(paths: Sequence[Path], keep_optimizer_state: bool = False):
    if not paths:
        raise SystemExit("average_checkpoints: no checkpoints to average")
    sums = collections.OrderedDict()
    dtypes = {}
    keys = None
    newest = None
    first = None
    for path in paths:
        state = load_checkpoint(path)
        if "model" not in state:
            raise SystemExit(f"average_checkpoints: {path} has no 'model' entry (not a fairseq checkpoint?)")
        if first is None:
            first = trained_as(state)
        else:
            check_same_model(paths[0], first, path, state)
        model = state["model"]
        if keys is None:
            keys = list(model.keys())
        elif list(model.keys()) != keys:
            raise SystemExit(
                f"average_checkpoints: {path} has different parameters than {paths[0]}: "
                f"{sorted(set(model) ^ set(keys))[:10]}"
            )
        for key in keys:
            tensor = model[key]
            if key in sums and tuple(tensor.shape) != tuple(sums[key].shape):
                raise SystemExit(
                    f"average_checkpoints: {key} has shape {tuple(tensor.shape)} in {path} "
                    f"but {tuple(sums[key].shape)} before"
                )
            if tensor.is_floating_point():
                value = tensor.detach().to(torch.float64)
            else:
                value = tensor.detach().clone()
            dtypes.setdefault(key, tensor.dtype)
            if key in sums:
                sums[key] += value
            else:
                sums[key] = value.clone()
        newest = state
    averaged = collections.OrderedDict()
    for key, total in sums.items():
        if total.is_floating_point():
            averaged[key] = (total / len(paths)).to(dtypes[key])
        else:
            averaged[key] = torch.div(total, len(paths), rounding_mode="floor").to(dtypes[key])
    newest["model"] = averaged
    if not keep_optimizer_state:
        newest.pop("last_optimizer_state", None)
    newest.setdefault("extra_state", {})
    if isinstance(newest["extra_state"], dict):
        newest["extra_state"]["averaged_checkpoints"] = [str(p) for p in paths]
    return newest


def write_average(paths: Sequence[Path], output: Path, keep_optimizer_state: bool = False) -> Path:
    state = average_states(paths, keep_optimizer_state)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    torch.save(state, str(tmp))
    os.replace(tmp, output)
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--inputs", nargs="+", required=True, help="checkpoint files, or one directory with --num-*-checkpoints"
    )
    parser.add_argument("--output", required=True, help="averaged checkpoint to write")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, help="the last N checkpointN.pt of the directory")
    group.add_argument("--num-update-checkpoints", type=int, help="the last N checkpoint_E_U.pt of the directory")
    parser.add_argument(
        "--checkpoint-upper-bound", type=int, help="ignore checkpoints after this epoch / update number"
    )
    parser.add_argument("--keep-optimizer-state", action="store_true")
    args = parser.parse_args(argv)

    if args.num_epoch_checkpoints or args.num_update_checkpoints:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            parser.error("--num-*-checkpoints needs --inputs to be one directory")
        by = "epoch" if args.num_epoch_checkpoints else "update"
        n = args.num_epoch_checkpoints or args.num_update_checkpoints
        paths = last_checkpoints(Path(args.inputs[0]), n, by=by, upper_bound=args.checkpoint_upper_bound)
    else:
        if args.checkpoint_upper_bound is not None:
            parser.error("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
        paths = [Path(p) for p in args.inputs]
        for path in paths:
            if not path.is_file():
                parser.error(f"{path} is not a file")
    print(f"averaging {len(paths)} checkpoints:", file=sys.stderr)
    for path in paths:
        print(f"  {path}", file=sys.stderr)
    write_average(paths, Path(args.output), args.keep_optimizer_state)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
