"""``fairseq-hydra-train``: a YAML ``model:`` section trains what ``fairseq-train`` would.

The plugin's models are registered the legacy way (``add_args`` and architectures, no
dataclass), so fairseq's hydra entry point hands their ``build_model`` the ``model:``
section as a bare ``DictConfig``: fairseq accepts any key there and checks none, and
fairseq's ``TransformerConfig.from_namespace`` keeps only its own fields of a
``DictConfig`` (``vars()`` of one is omegaconf's internals), so every plugin option was
dropped and every layer built vanilla, with exit status 0.

``fairseq_cli.train.main`` imports ``common.user_dir`` (this plugin) and then calls
``add_defaults(cfg)``. The plugin wraps that call: a ``model:`` section that names one of
its architectures is read as ``fairseq-train`` reads the same flags (each key through the
model's own argparse parser, so types, choices and unknown keys are refused as argparse
refuses them: one line, exit status 2), flattened with the other sections into the
namespace ``fairseq-train`` builds, given its architecture's defaults, checked by
:func:`~fairseq_distattn.models.arguments.check_parsed_args` (the flag checks and
integrity guards of ``fairseq-train``), and put in place of the section: training, the
layer summary and the checkpoint then follow the ``fairseq-train`` path. A ``model:``
section of another legacy architecture that holds a plugin option is refused (its model
would ignore it); fairseq's dataclass models (``transformer``, ``transformer_lm``) refuse
unknown keys themselves.
"""

import argparse
import sys

from ..spec import SpecError, exit_on_spec_error, exit_with_error
from .arguments import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    OPTION_DEFAULTS,
    SPEC_ATTRIBUTES,
    add_distattn_args,
    check_parsed_args,
    plugin_architecture_for,
)

# keys of a section that are not options (the registry name, hydra's own)
_NOT_OPTIONS = frozenset({"_name"})


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad value as the plugin does (one line, exit status 2)."""

    def error(self, message):
        exit_with_error(message)


def _model_parser(model_cls) -> argparse.ArgumentParser:
    """The model's flags as fairseq-train's model group holds them (defaults suppressed),
    with every plugin flag, as fairseq-train's parser has them for every model."""
    parser = _OneLineParser(prog="fairseq-hydra-train", argument_default=argparse.SUPPRESS, allow_abbrev=False)
    model_cls.add_args(parser)
    add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))
    return parser


def _command_line(parser, section: dict, arch: str):
    """The ``fairseq-train`` flags that say what ``section`` (model keys -> values) says;
    a key that is no option of the model is refused in one line."""
    actions = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in actions:
            actions[action.dest] = action
    argv = []
    for key, value in section.items():
        if key in _NOT_OPTIONS:
            continue
        action = actions.get(key)
        if action is None:
            exit_with_error(
                f"model.{key}: not an option of --arch {arch} (fairseq-hydra-train would keep it in the "
                f"configuration and build the model without it); its options are the model flags of "
                f"'fairseq-train --arch {arch} --help', with _ for -"
            )
        flag = max(action.option_strings, key=len)
        if value is None:
            continue  # absent, as a flag not given
        if action.nargs == 0:  # store_true / store_false
            if not isinstance(value, bool):
                exit_with_error(f"argument {flag} (model.{key}): invalid value {value!r}: allowed: true or false")
            if value != action.const:
                continue  # the flag's default
            argv.append(flag)
        elif isinstance(value, (list, tuple)) and action.nargs not in (None, "?"):
            argv += [flag, *(str(v) for v in value)]
        else:  # a list for a flag that takes one string (fairseq parses "[0.1, 0.2]" itself)
            argv.append(f"{flag}={value}")
    return argv


# the sections of fairseq's configuration whose options fairseq-train's parser holds, and
# of those the registries, whose name is a flag of its own (--task, --optimizer, ...)
TRAINING_SECTIONS = (
    "common",
    "distributed_training",
    "dataset",
    "optimization",
    "checkpoint",
    "ema",
    "task",
    "criterion",
    "optimizer",
    "lr_scheduler",
    "bpe",
    "tokenizer",
    "scoring",
)
REGISTRY_SECTIONS = frozenset({"task", "criterion", "optimizer", "lr_scheduler", "bpe", "tokenizer", "scoring"})


def _flat(cfg) -> dict:
    """The other sections of ``cfg`` as fairseq-train's flat namespace holds them: each
    section's options, and a registry's name under its flag's name."""
    from omegaconf import DictConfig, OmegaConf

    flat = {}
    for name in TRAINING_SECTIONS:
        section = cfg.get(name)
        if name in REGISTRY_SECTIONS:
            flat[name] = section if section is None or isinstance(section, str) else getattr(section, "_name", None)
        if isinstance(section, DictConfig):
            values = OmegaConf.to_container(section, resolve=True, enum_to_str=True)
        elif isinstance(section, argparse.Namespace):
            values = dict(vars(section))
        else:
            continue
        values.pop("_name", None)
        flat.update({key: value for key, value in values.items() if key not in flat})
    return flat


def model_namespace(cfg, model_cls, arch: str) -> argparse.Namespace:
    """The namespace ``fairseq-train`` would build for the flags ``cfg.model`` says,
    with the other sections of ``cfg``, before its architecture's defaults."""
    from omegaconf import OmegaConf

    section = OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True)
    parser = _model_parser(model_cls)
    parsed = parser.parse_args(_command_line(parser, section, arch))
    return argparse.Namespace(**{**_flat(cfg), **vars(parsed), "arch": arch, "_name": arch})


def _plugin_keys(section) -> list:
    plugin_attrs = {*SPEC_ATTRIBUTES, *OPTION_DEFAULTS}
    return [key for key in section if key in plugin_attrs]


def check_hydra_config(cfg) -> None:
    """Turn a hydra ``model:`` section of a plugin architecture into the namespace
    ``fairseq-train`` builds (checked as it checks it), or refuse plugin options given to
    another legacy architecture. A section that is already a namespace (fairseq-train's)
    or that fairseq's own dataclass validates is left as it is."""
    from fairseq.dataclass.utils import _set_legacy_defaults, omegaconf_no_object_check
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY
    from omegaconf import DictConfig, open_dict

    section = cfg.get("model") if isinstance(cfg, DictConfig) else None
    if not isinstance(section, DictConfig):
        return
    arch = section.get("_name")
    model_cls = ARCH_MODEL_REGISTRY.get(arch)
    if model_cls is None:
        return  # fairseq reports a model it does not know
    if not hasattr(model_cls, "check_attention_args"):
        if arch in MODEL_DATACLASS_REGISTRY:
            return  # fairseq merged the section into the model's dataclass, which refuses unknown keys
        for key in _plugin_keys(section):
            exit_on_spec_error(
                SpecError(
                    f"model.{key}",
                    section.get(key),
                    f"--arch {arch} builds fairseq's own {model_cls.__name__}, which has no distance-aware attention",
                    f"this option with {plugin_architecture_for(arch).replace('--arch ', 'model._name: ')}",
                )
            )
        return
    args = model_namespace(cfg, model_cls, arch)
    ARCH_CONFIG_REGISTRY[arch](args)  # as fairseq-train's parse_args_and_arch
    check_parsed_args(args)
    _set_legacy_defaults(args, model_cls)  # as fairseq-train's convert_namespace_to_omegaconf
    with omegaconf_no_object_check(), open_dict(cfg):
        cfg.model = args


def check_hydra_configs() -> None:
    """Wrap ``add_defaults`` as ``fairseq_cli.train.main`` calls it, right after it has
    imported ``common.user_dir`` (the plugin), with :func:`check_hydra_config`.

    ``fairseq-hydra-train`` imports ``fairseq_cli.train`` before the plugin; a program
    that imports the plugin first and ``fairseq_cli.train`` later is not covered."""
    train = sys.modules.get("fairseq_cli.train")
    if train is None or getattr(train.add_defaults, "checks_distattn_hydra_config", False):
        return
    fairseq_add_defaults = train.add_defaults

    def add_defaults(cfg):
        fairseq_add_defaults(cfg)
        check_hydra_config(cfg)

    add_defaults.checks_distattn_hydra_config = True
    train.add_defaults = add_defaults
