"""What defines a trained model's attention, read off a model configuration (no fairseq imports).

A mechanism without parameters (``alibi``, ``distance-mask``) leaves no key in a
checkpoint's state dict, so fairseq's strict loading cannot notice a checkpoint
built into another mechanism, and a changed table size only shows up as a
``size mismatch`` traceback. Wherever a checkpoint meets a configuration
(``fairseq-train`` resuming, ``--model-overrides``, averaging, ``check``) the
plugin compares these settings instead:

- the registered model (``distattn_transformer``, ``distattn_lm``, or fairseq's own);
- each attention kind's mechanism per layer, as a canonical SPEC;
- the absolute position embeddings (they and the mechanisms share one job);
- every option of a mechanism some layer uses (``only_with`` honoured), except the
  ``RUNTIME`` ones, which change how the same function is computed, not the function.

``EVALUATION`` options are parameter-free: resuming and averaging keep them, but
``--model-overrides`` may change them on a trained model.
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .registry import EVALUATION, KINDS, RUNTIME, AttentionKind, SpecError, option_flag
from .spec import OPTION_CLASSES, MechanismOptions, _option_fields, option_users, parse_spec, specs_name

LANGUAGE_MODELS = ("distattn_lm",)
MODEL = "model"  # the setting naming the registered model


def canonical_spec(layers: List[str]) -> str:
    """The shortest SPEC for a per-layer list: ``alibi`` for every layer, ``vanilla`` for none,
    else its non-vanilla runs (``window-aw@0-2,rpr@3``)."""
    if len(set(layers)) == 1:
        return layers[0]
    runs, start = [], 0
    for index in range(1, len(layers) + 1):
        if index == len(layers) or layers[index] != layers[start]:
            if layers[start] != "vanilla":
                span = f"{start}" if index - 1 == start else f"{start}-{index - 1}"
                runs.append(f"{layers[start]}@{span}")
            start = index
    return ",".join(runs)


def attention_kinds(model: str) -> Tuple[AttentionKind, ...]:
    """The attention kinds of a registered model (a language model is a decoder only)."""
    return tuple(kind for kind in KINDS if kind.in_language_model or model not in LANGUAGE_MODELS)


def _position_settings(config, model: str) -> Dict[str, Any]:
    settings = {"--no-token-positional-embeddings": bool(getattr(config, "no_token_positional_embeddings", False))}
    if model not in LANGUAGE_MODELS:
        settings["--encoder-learned-pos"] = bool(getattr(config, "encoder_learned_pos", False))
    settings["--decoder-learned-pos"] = bool(getattr(config, "decoder_learned_pos", False))
    return settings


def trained_settings(config, model: str) -> Dict[str, Any]:
    """Flag -> value of everything that defines the attention of the model ``config``
    (an ``argparse.Namespace`` or omegaconf node) builds; ``model`` is its registered
    model name. A fairseq model of the plugin's kind (``transformer``) reads as vanilla
    everywhere, so a plugin checkpoint and a fairseq command compare too."""
    settings: Dict[str, Any] = {MODEL: model}
    specs = {}
    for kind in attention_kinds(model):
        spec, num_layers = getattr(config, kind.attr, None), getattr(config, kind.layers_attr, None)
        if spec in (None, "vanilla") or num_layers is None:
            specs[kind.flag] = "vanilla"
        else:
            specs[kind.flag] = canonical_spec(parse_spec(kind, spec, num_layers))
    settings.update(specs)
    settings.update(_position_settings(config, model))
    used = specs_name(specs.values())
    for field in _option_fields():
        flag = option_flag(field)
        if flag.role == RUNTIME or not used & set(option_users(field)):
            continue
        if flag.only_with is not None:
            attr, needed = flag.only_with
            if option_value(config, attr) != needed:
                continue
        settings[flag.flag] = option_value(config, flag.attr)
    return settings


# attribute -> the value fairseq's namespace holds when the flag is absent, of every option
_DEFAULTS = {option_flag(field).attr: option_flag(field).arg_default for field in dataclasses.fields(MechanismOptions)}


def option_value(config, attr: str):
    """An option's value in ``config``; a checkpoint from before the option existed ran with its default."""
    value = getattr(config, attr, None)
    if value is None:
        return _DEFAULTS[attr]
    if isinstance(_DEFAULTS[attr], float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)  # 1 and 1.0 are the same alpha
    return value


NOT_SET = "not set"


def differences(first: Mapping[str, Any], second: Mapping[str, Any]) -> List[Tuple[str, Any, Any]]:
    """``(setting, value in first, value in second)`` for each setting that differs, in
    ``first``'s order (settings only one side has: ``NOT_SET`` on the other)."""
    names = [*first, *(name for name in second if name not in first)]
    return [
        (name, first.get(name, NOT_SET), second.get(name, NOT_SET))
        for name in names
        if first.get(name, NOT_SET) != second.get(name, NOT_SET)
    ]


def describe_differences(found: List[Tuple[str, Any, Any]], second: str) -> str:
    """``--encoder-self-attention alibi (this command: vanilla), ...``: the first side's
    values, with ``second`` naming the other side in parentheses."""
    return ", ".join(f"{name} {shown(a)} ({second}: {shown(b)})" for name, a, b in named(found))


def named(found: List[Tuple[str, Any, Any]]) -> List[Tuple[str, Any, Any]]:
    """The differences worth naming: an option only one side has comes with a mechanism
    only one side uses, which is named already."""
    return [(name, a, b) for name, a, b in found if NOT_SET not in (a, b)] or found


def shown(value) -> str:
    """A setting's value as a user types it (switches as on/off)."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


def overridable_flags() -> Tuple[str, ...]:
    """The plugin's options that ``--model-overrides`` may change on a trained model:
    parameter-free (``EVALUATION``) or not part of the model (``RUNTIME``)."""
    return tuple(
        option_flag(field).flag
        for options_class in OPTION_CLASSES
        for field in dataclasses.fields(options_class)
        if option_flag(field).role in (EVALUATION, RUNTIME)
    )


def _evaluation_flags() -> frozenset:
    return frozenset(option_flag(field).flag for field in _option_fields() if option_flag(field).role == EVALUATION)


def check_overrides(
    before: Mapping[str, Any], after: Mapping[str, Any], overrides: Optional[Mapping[str, Any]]
) -> None:
    """Raise :class:`SpecError` (flag ``--model-overrides``) where ``overrides`` changed
    anything of the trained model but its parameter-free options."""
    changed = [found for found in differences(before, after) if found[0] not in _evaluation_flags()]
    if not changed:
        return
    listed = ", ".join(f"{name} {shown(a)} -> {shown(b)}" for name, a, b in named(changed))
    raise SpecError(
        "--model-overrides",
        dict(overrides or {}),
        f"it changes what the checkpoint was trained as ({listed}); its parameters were trained for the "
        "checkpoint's own values",
        "overrides of the parameter-free options " + ", ".join(overridable_flags()) + ", and of fairseq's own options",
    )
