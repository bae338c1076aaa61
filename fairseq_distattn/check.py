"""Tell what a fairseq checkpoint needs: ``python -m fairseq_distattn.check CHECKPOINT``.

Run without ``--user-dir fairseq_distattn``, every fairseq command fails on a
plugin checkpoint with torch's ``UnpicklingError`` and its advice to pass
``weights_only=False``, which would let the file run code. fairseq cannot say
more, because it never imports the plugin. This tool loads the checkpoint the
safe way (``weights_only=True`` with the plugin's allow-list of fairseq's
config classes), then says which model it holds, whether it needs the plugin,
the ``--user-dir`` to pass, and its attention per layer.

Exit status: 0 when the checkpoint loads, 1 when it does not (one line on
stderr says why), 2 for a bad command line.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from .checkpoint_loading import allow_fairseq_checkpoints
from .registry import option_flag
from .spec import MechanismOptions

PLUGIN_DIR = Path(__file__).resolve().parent
PLUGIN_MODELS = ("distattn_transformer", "distattn_lm")
COMMANDS = "fairseq-generate, fairseq-interactive, fairseq-validate, fairseq-eval-lm and fairseq-train (to resume)"


def model_config(state):
    """The model's configuration (an ``argparse.Namespace`` or omegaconf node) of a checkpoint."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        return cfg["model"]
    return state.get("args")


def model_name(config) -> str:
    """The registered model name (``distattn_transformer``, ``transformer``, ...) of an ``--arch``."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = getattr(config, "arch", None) or getattr(config, "_name", None)
    return ARCH_MODEL_NAME_REGISTRY.get(arch, arch)


def attention_summary(config):
    """Lines naming the mechanism of every layer of each attention kind."""
    from .spec import CROSS, DECODER_SELF, ENCODER_SELF, parse_spec

    lines = []
    kinds = [(ENCODER_SELF, "encoder_layers"), (DECODER_SELF, "decoder_layers"), (CROSS, "decoder_layers")]
    for kind, layers_attr in kinds:
        spec, num_layers = getattr(config, kind.flag[2:].replace("-", "_"), None), getattr(config, layers_attr, None)
        if spec is None or num_layers is None or (kind is not DECODER_SELF and model_name(config) == "distattn_lm"):
            continue
        layers = parse_spec(kind, spec, num_layers)
        lines.append(f"  {kind.description}: " + ", ".join(f"{i}={mechanism}" for i, mechanism in enumerate(layers)))
    # every mechanism option the registry declares (a checkpoint keeps the ones it was trained with)
    options = [option_flag(field).attr for field in dataclasses.fields(MechanismOptions)]
    lines.append(
        "  options: " + ", ".join(f"{name}={getattr(config, name)}" for name in options if hasattr(config, name))
    )
    return lines


def describe(path: Path) -> str:
    allow_fairseq_checkpoints()  # the allow-list fairseq's commands get from --user-dir
    state = torch.load(path, map_location="cpu", weights_only=True)
    config = model_config(state)
    if config is None:
        raise ValueError("it holds no fairseq model configuration (no 'cfg' or 'args'): not a fairseq checkpoint")
    name = model_name(config)
    arch = getattr(config, "arch", None) or name
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates", "?")
    lines = [f"{path}: fairseq model {name} (--arch {arch}), {updates} updates"]
    if name in PLUGIN_MODELS:
        lines.append(f"needs the plugin: pass --user-dir {PLUGIN_DIR} to {COMMANDS}")
        lines.extend(attention_summary(config))
    else:
        lines.append(
            "not a fairseq_distattn model; fairseq 0.12 still cannot load it under torch >= 2.6 on its own "
            f"(weights_only loading): pass --user-dir {PLUGIN_DIR}, which allow-lists fairseq's config classes"
        )
    return "\n".join(lines)


def failure_reason(error: Exception) -> str:
    """One line. torch's weights-only refusal opens with advice to load with
    weights_only=False, which we must not repeat; what it found is on the line
    that names the WeightsUnpickler (or the next one): a global outside the
    allow-list (a checkpoint holding code or foreign classes), or bytes that
    are no pickle at all (not a checkpoint, or a damaged one)."""
    text = str(error)
    marker = "WeightsUnpickler error:"
    if marker in text:
        after = [line.strip() for line in text.split(marker, 1)[1].splitlines()]
        finding = next((line for line in after if line), "").split(". Please")[0].strip()
        if finding.startswith("Unsupported global"):
            # keep torch's finding, not its advice to allow-list whatever the file names
            return (
                f"it holds an object outside the allow-list of fairseq's config classes ({finding}); "
                "do not load it with weights_only=False unless you trust its source"
            )
        return f"it is not a PyTorch checkpoint, or it is damaged (torch's unpickler: {finding or 'no detail'})"
    if isinstance(error, EOFError):
        return "it ends before a checkpoint does: empty or cut short (EOFError)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_distattn.check",
        description="Say whether a fairseq checkpoint needs --user-dir fairseq_distattn, and what model it holds.",
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by fairseq-train")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"argument checkpoint: no such file: {args.checkpoint}")
    try:
        print(describe(args.checkpoint))
    except Exception as error:  # any reason a checkpoint cannot be read is reported the same way
        sys.stderr.write(f"{parser.prog}: error: cannot read {args.checkpoint}: {failure_reason(error)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
