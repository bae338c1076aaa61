"""What defines a trained model's attention, read off a model configuration or a checkpoint.

A mechanism without parameters (``alibi``, ``distance-mask``) leaves no key in a
checkpoint's state dict, so fairseq's strict loading cannot notice a checkpoint
built into another mechanism, and a changed table size only shows up as a
``size mismatch`` traceback. Wherever a checkpoint meets a configuration
(``fairseq-train`` resuming, ``--model-overrides``, averaging, ``check``) the
plugin compares these settings instead:

- the registered model (``distattn_transformer``, ``distattn_lm``, or fairseq's own);
- each attention kind's mechanism per layer, as a canonical SPEC;
- the absolute position embeddings (they and the mechanisms share one job);
- of the plugin's models, each attention kind's geometry: the head count and width of
  the stacks it attends in (``--encoder/--decoder-attention-heads``,
  ``--encoder/--decoder-embed-dim``; a language model's decoder only). ALiBi's slopes,
  the rotation's pairs and every per-head table depend on the head count, while the
  projections have the same shapes for any head count;
- every option of a mechanism some layer uses (``only_with`` honoured), except the
  ``RUNTIME`` ones, which change how the same function is computed, not the function.

``EVALUATION`` options are parameter-free: resuming and averaging keep them, but
``--model-overrides`` may change them on a trained model.
"""

import difflib
from argparse import Namespace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .registry import EVALUATION, KINDS, RUNTIME, AttentionKind, SpecError, option_flag
from .spec import option_fields, option_users, parse_spec, specs_name, unused_options

LANGUAGE_MODELS = ("distattn_lm",)
PLUGIN_MODELS = ("distattn_transformer", "distattn_lm")
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


def geometry_attributes(model: str) -> Tuple[str, ...]:
    """The attributes a plugin model's attention geometry is read from: fairseq's
    ``TransformerConfig.from_namespace`` builds ``encoder.attention_heads`` /
    ``encoder.embed_dim`` (encoder self-attention, and cross-attention's keys and values)
    and ``decoder.attention_heads`` / ``decoder.embed_dim`` (decoder self- and
    cross-attention) from them; ``transformer_lm``, a decoder only, reads the decoder's.
    Empty for fairseq's own models, whose checks stay fairseq's."""
    if model not in PLUGIN_MODELS:
        return ()
    sides = ("decoder",) if model in LANGUAGE_MODELS else ("encoder", "decoder")
    return tuple(f"{side}_{name}" for side in sides for name in ("attention_heads", "embed_dim"))


def geometry_flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def trained_settings(config, model: str, defaults: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Flag -> value of everything that defines the attention of the model ``config``
    (an ``argparse.Namespace`` or omegaconf node) builds; ``model`` is its registered
    model name. A fairseq model of the plugin's kind (``transformer``) reads as vanilla
    everywhere, so a plugin checkpoint and a fairseq command compare too. ``defaults``:
    attribute -> value for a geometry attribute ``config`` lacks (the architecture's
    default, which fairseq would build it with); one neither has is left out."""
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
    for attr in geometry_attributes(model):
        value = getattr(config, attr, None)
        if value is None:
            value = (defaults or {}).get(attr)
        if value is not None:
            settings[geometry_flag(attr)] = value
    used = specs_name(specs.values())
    for field in option_fields():
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
_DEFAULTS = {option_flag(field).attr: option_flag(field).arg_default for field in option_fields()}


# attribute -> what a checkpoint saved before the option existed was trained with
UNRECORDED = {option_flag(field).attr: option_flag(field).unrecorded_value for field in option_fields()}


def option_value(config, attr: str):
    """An option's value in ``config``; a checkpoint from before the option existed ran with
    its ``unrecorded`` value (its default, unless the option changed a default)."""
    value = getattr(config, attr, None)
    if value is None:
        return UNRECORDED[attr]
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
        option_flag(field).flag for field in option_fields() if option_flag(field).role in (EVALUATION, RUNTIME)
    )


def _evaluation_flags() -> frozenset:
    return frozenset(option_flag(field).flag for field in option_fields() if option_flag(field).role == EVALUATION)


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
        "overrides of the parameter-free options " + ", ".join(overridable_flags()) + ", and of fairseq's own options "
        "but the attention's head counts and widths",
    )


def plugin_override_keys() -> frozenset:
    """The ``--model-overrides`` keys of the plugin's own namespace: each attention kind's
    SPEC and every option of every registered mechanism and of the attention module."""
    return frozenset([kind.attr for kind in KINDS] + [option_flag(field).attr for field in option_fields()])


def check_override_keys(overrides: Optional[Mapping[str, Any]], known, candidates) -> None:
    """Raise :class:`SpecError` (flag ``--model-overrides``) for a key of ``overrides`` that
    is not in ``known`` (every key fairseq or the plugin has) but close to one of
    ``candidates`` (the plugin's options and the model's configuration): fairseq sets an
    unknown key on the configuration, where nothing reads it, so a misspelt ``'rope_bse'``
    would evaluate the model as if it had not been given. A key close to none passes, as
    fairseq lets it."""
    for key in overrides or {}:
        if not isinstance(key, str) or key in known:
            continue
        close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.8)
        if close:
            raise SpecError(
                "--model-overrides",
                dict(overrides),
                f"unknown override {key!r}; did you mean {close[0]!r}? (fairseq ignores a key no option has, so "
                "the model would run as if it were not given)",
                f"{close[0]!r}, or any other key of the checkpoint's configuration or of the plugin's options",
            )


def check_unused_overrides(before, after, overrides: Optional[Mapping[str, Any]], model: str) -> None:
    """Raise :class:`SpecError` (flag ``--model-overrides``) where ``overrides`` changes a
    mechanism option that configures no layer of the model ``after`` (the configuration
    with the overrides applied; ``before`` without them), or whose own condition option
    has another value (:func:`~fairseq_distattn.spec.unused_options`, which fairseq-train
    warns with): ``'rope_scaling'`` given to a kerple checkpoint would change nothing."""
    specs = {kind.flag: getattr(after, kind.attr, None) or "vanilla" for kind in attention_kinds(model)}
    attrs = [option_flag(field).attr for field in option_fields()]
    values = {attr: getattr(after, attr, None) for attr in attrs if getattr(after, attr, None) is not None}
    for flag, value, reason in unused_options(values, specs):
        attr = flag[2:].replace("-", "_")
        if attr not in (overrides or {}) or option_value(before, attr) == option_value(after, attr):
            continue  # not overridden, or overridden with the checkpoint's own value
        raise SpecError(
            "--model-overrides",
            dict(overrides),
            f"{attr!r}: {value!r} changes nothing in this checkpoint: {reason}",
            "overrides of the options of the mechanisms the checkpoint uses (python -m fairseq_distattn.check "
            "CHECKPOINT lists them), and of fairseq's own options",
        )


def check_layer_count_overrides(before, after, overrides: Optional[Mapping[str, Any]], model: str) -> None:
    """Raise :class:`SpecError` (flag ``--model-overrides``) where ``overrides`` changes a
    stack's layer count (``'decoder_layers': 2`` on a 3-layer model): fairseq would build
    fewer layers than the checkpoint holds and fail to load its parameters. Evaluating a
    subset of the trained layers is fairseq's pruning, ``*_layers_to_keep``."""
    for attr in dict.fromkeys(kind.layers_attr for kind in attention_kinds(model)):
        trained, asked = getattr(before, attr, None), getattr(after, attr, None)
        if attr not in (overrides or {}) or trained is None or asked == trained:
            continue
        raise SpecError(
            "--model-overrides",
            dict(overrides),
            f"{attr!r}: {asked!r} changes the number of trained layers ({trained}), whose parameters the "
            "checkpoint holds",
            f"{attr + '_to_keep'!r} with the trained layers to evaluate (fairseq's pruning of a LayerDrop-trained "
            f"model, e.g. '0,2'); each kept layer keeps its trained mechanism and parameters",
        )


# ------------------------------------------------ a checkpoint's configuration
#
# What a checkpoint says its model was trained as: its model configuration, the registered model
# of its ``--arch`` and its settings (read by the loading hooks in ``patches``, by ``tools.check``
# and by the scripts). Only here is fairseq imported: its registries of models and architectures.


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


def architecture_defaults(config) -> dict:
    """attribute -> value of each attention-geometry attribute (:func:`geometry_attributes`)
    that ``config`` lacks, as fairseq builds the model then: its ``--arch`` function fills
    an absent attribute (``getattr(args, "decoder_attention_heads", 8)``, some from another:
    the decoder's width defaults to the encoder's), so it runs on the attributes present."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    attrs = geometry_attributes(model_name(config))
    missing = [attr for attr in attrs if getattr(config, attr, None) is None]
    arch = getattr(config, "arch", None) or getattr(config, "_name", None)
    if not missing or arch not in ARCH_CONFIG_REGISTRY:
        return {}
    both_sides = [f"{side}_{name}" for side in ("encoder", "decoder") for name in ("attention_heads", "embed_dim")]
    args = Namespace(**{attr: getattr(config, attr) for attr in both_sides if getattr(config, attr, None) is not None})
    try:
        ARCH_CONFIG_REGISTRY[arch](args)
    except Exception:  # an architecture that needs more of its configuration: nothing to fall back on
        return {}
    return {attr: getattr(args, attr, None) for attr in missing}


def settings_of(config):
    """:func:`trained_settings` of a model configuration (an attention-geometry attribute it
    lacks: its architecture's default)."""
    return trained_settings(config, model_name(config), architecture_defaults(config))
