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
import ast
import copy
import sys
from pathlib import Path

from ..patches.checkpoint_guards import PLUGIN_MODELS, check_model_overrides, configuration_keys
from ..patches.checkpoint_loading import read_checkpoint
from ..patches.checkpoint_upgrade import CheckpointRefused, pending_conversions, upgrade_plugin_state
from ..registry import EVALUATION, RUNTIME, TRAINED, SpecError, option_flag
from ..spec import option_fields
from ..trained_settings import MODEL, attention_kinds, model_config, model_name, option_value, settings_of, shown

PLUGIN_DIR = Path(__file__).resolve().parents[1]  # the package: what --user-dir names
COMMANDS = "fairseq-generate, fairseq-interactive, fairseq-validate, fairseq-eval-lm and fairseq-train (to resume)"


def layer_lines(config):
    """Lines naming the mechanism of every layer of each attention kind, the absolute
    positions and every option it runs with, by what they are to the trained model."""
    from ..spec import kept_layers, pruned_spec

    lines = []
    for kind in attention_kinds(model_name(config)):
        spec, num_layers = getattr(config, kind.attr, None), getattr(config, kind.layers_attr, None)
        if num_layers is None:
            continue
        layers_to_keep = getattr(config, kind.layers_to_keep_attr, None)
        layers = pruned_spec(kind, spec or "vanilla", num_layers, layers_to_keep)
        pruning = ""
        if layers_to_keep:
            kept = kept_layers(kind.layers_to_keep_flag, layers_to_keep, num_layers)
            pruning = f", pruned to trained layers {','.join(map(str, kept))} of {num_layers}"
        listed = ", ".join(f"{i}={mechanism}" for i, mechanism in enumerate(layers))
        lines.append(f"  {kind.description}{pruning}: {listed}")
    settings = settings_of(config)
    positions = "none" if settings["--no-token-positional-embeddings"] else None
    sides = [side for side in ("encoder", "decoder") if f"--{side}-learned-pos" in settings]
    lines.append(
        "  absolute positions: "
        + ", ".join(
            f"{side} {positions or ('learned' if settings[f'--{side}-learned-pos'] else 'sinusoidal')}"
            for side in sides
        )
    )
    by_role = {TRAINED: [], EVALUATION: [], RUNTIME: []}
    for field in option_fields():
        flag = option_flag(field)
        if flag.role == RUNTIME:
            by_role[RUNTIME].append(f"{flag.flag} {shown(option_value(config, flag.attr))}")
        elif flag.flag in settings:
            by_role[flag.role].append(f"{flag.flag} {shown(settings[flag.flag])}")
    for role, heading in ROLE_HEADINGS.items():
        lines.append(f"  {heading}: " + (", ".join(by_role[role]) or "none"))
    lines.append("  its flags: " + " ".join(resume_flags(config, settings)))
    return lines


ROLE_HEADINGS = {
    TRAINED: "trained options (its parameters depend on them; resuming and averaging keep them, "
    "--model-overrides may not change them)",
    EVALUATION: "parameter-free options (resuming and averaging keep them; --model-overrides may change them "
    "to evaluate it another way)",
    RUNTIME: "runtime options (how it is computed, not what; any command may change them)",
}


def resume_flags(config, settings):
    """The plugin's flags (and --arch) that build this model again, for a resume."""
    flags = ["--arch", str(getattr(config, "arch", None) or settings[MODEL])]
    for name, value in settings.items():
        if name == MODEL or value is False:
            continue
        flags += [name] if value is True else [name, shown(value)]
    return flags


def apply_overrides(config, overrides, cfg_keys=()):
    """The model configuration ``--model-overrides`` would give, refused as fairseq's
    commands refuse it (:func:`~fairseq_distattn.patches.checkpoint_guards.check_model_overrides`;
    ``cfg_keys``: the option names of the checkpoint's whole configuration)."""
    changed = argparse.Namespace(**{**vars(config), **overrides})
    check_model_overrides(config, changed, overrides, cfg_keys)
    return changed


class NotLoadable(Exception):
    """A checkpoint that fairseq's commands would refuse to build (one line)."""


def loaded_config(state, config):
    """The configuration a fairseq command builds the plugin model of checkpoint ``state``
    from, its configuration being ``config`` (with any overrides): upgraded as loading
    upgrades it (:func:`~fairseq_distattn.patches.checkpoint_upgrade.upgrade_plugin_state`),
    completed by its ``--arch`` function, and checked by the model's own
    ``check_attention_args``, as building checks it; raises CheckpointRefused or SpecError
    where they refuse it. ``state`` is not changed."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY

    config = argparse.Namespace(**(dict(config) if isinstance(config, dict) else vars(copy.deepcopy(config))))
    upgrade_plugin_state({"args": config, "model": {}})
    arch = getattr(config, "arch", None)
    if arch in ARCH_CONFIG_REGISTRY:
        ARCH_CONFIG_REGISTRY[arch](config)
    MODEL_REGISTRY[model_name(config)].check_attention_args(config, new_model=False)
    return config


def conversion_lines(config):
    """What loading converts of the arithmetic (an older revision named by the checkpoint or by
    ``--model-overrides``), and what that asks of a resume."""
    conversions = pending_conversions(config)
    if not conversions:
        return []
    return [
        "  converted on loading: " + "; ".join(map(str, conversions)) + " (its query and key projection rows "
        "permuted); fairseq-train resumes it only with --reset-optimizer, its Adam moments being those of the "
        "unconverted rows"
    ]


def builds(state, config) -> bool:
    try:
        loaded_config(state, config)
    except (CheckpointRefused, SpecError):
        return False
    return True


def describe(path: Path, overrides=None) -> str:
    """What the checkpoint at ``path`` holds; raises NotLoadable where fairseq's commands would
    refuse to build it, and SpecError where they would refuse ``overrides``."""
    state = read_checkpoint(path)
    config = model_config(state)
    if config is None:
        raise ValueError("it holds no fairseq model configuration (no 'cfg' or 'args'): not a fairseq checkpoint")
    name = model_name(config)
    arch = getattr(config, "arch", None) or name
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates", "?")
    lines = [f"{path}: fairseq model {name} (--arch {arch}), {updates} updates"]
    if name in PLUGIN_MODELS:
        recorded = config
        if overrides:
            config = apply_overrides(config, overrides, configuration_keys(state.get("cfg") or {}))
            lines[0] += f", with --model-overrides {overrides}"
        try:
            loaded_config(state, config)
        except (CheckpointRefused, SpecError) as error:
            if config is recorded or not builds(state, recorded):
                raise NotLoadable(f"fairseq's commands refuse to build its model: {error}")
            raise  # the overrides' doing: a bad command line
        lines.append(f"needs the plugin: pass --user-dir {PLUGIN_DIR} to {COMMANDS}")
        lines.extend(layer_lines(config))
        lines.extend(conversion_lines(config))
    else:
        lines.append(
            "not a fairseq_distattn model; fairseq 0.12 still cannot load it under torch >= 2.6 on its own "
            f"(weights_only loading): pass --user-dir {PLUGIN_DIR}, which allow-lists fairseq's config classes"
        )
    return "\n".join(lines)


# words of torch's advice around its finding: how to load the file anyway, which we never repeat
TORCH_ADVICE = ("weights_only", "Re-running", "trusted source", "two options", "Alternatively", "file an issue")


def torch_finding(text: str) -> str:
    """What torch's weights-only unpickler found, without its advice: the text after
    ``WeightsUnpickler error:`` where it names one, else its first line that is no advice
    (a blocked module's global: "Trying to load unsupported GLOBAL posix.system whose module
    posix is blocked."), cut before any "Please use ... add_safe_globals" or "Check the
    documentation" that follows."""
    marker = "WeightsUnpickler error:"
    lines = text.split(marker, 1)[1].splitlines() if marker in text else text.splitlines()[1:]
    found = [line.strip() for line in lines if line.strip() and not any(a in line for a in TORCH_ADVICE)]
    finding = found[0] if found else ""
    for advice in (". Please", "Check the documentation"):
        finding = finding.split(advice)[0]
    return finding.strip().rstrip(".")


def failure_reason(error: Exception) -> str:
    """One line. torch's weights-only refusal opens with advice to load with
    weights_only=False, which we must not repeat; we name what it found
    (:func:`torch_finding`): a global outside the allow-list (a checkpoint holding
    code or foreign classes: refused, whatever its source), or bytes that are no
    pickle at all (not a checkpoint, or a damaged one)."""
    text = str(error)
    if text.startswith("Weights only load failed"):
        finding = torch_finding(text)
        if "GLOBAL" in finding:
            return (
                f"it holds an object outside the allow-list of fairseq's config classes ({finding}); refused: "
                "a fairseq checkpoint holds no code, and unpickling one that does would run it"
            )
        return f"it is not a PyTorch checkpoint, or it is damaged (torch's unpickler: {finding or 'no detail'})"
    if isinstance(error, EOFError):
        return "it ends before a checkpoint does: empty or cut short (EOFError)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _overrides(text: str) -> dict:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as error:
        raise argparse.ArgumentTypeError(f"not a Python dict literal: {error}")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a dict")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_distattn.check",
        description="Say whether a fairseq checkpoint needs --user-dir fairseq_distattn, and what model it holds.",
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by fairseq-train")
    parser.add_argument(
        "--model-overrides",
        type=_overrides,
        default={},
        metavar="DICT",
        help="show the model as fairseq-generate --model-overrides DICT would run it (refused as it refuses it)",
    )
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"argument checkpoint: no such file: {args.checkpoint}")
    try:
        print(describe(args.checkpoint, args.model_overrides))
    except (SpecError, CheckpointRefused) as error:
        parser.error(str(error))
    except NotLoadable as error:
        sys.stderr.write(f"{parser.prog}: error: {args.checkpoint}: {error}\n")
        return 1
    except Exception as error:  # any reason a checkpoint cannot be read is reported the same way
        sys.stderr.write(f"{parser.prog}: error: cannot read {args.checkpoint}: {failure_reason(error)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
