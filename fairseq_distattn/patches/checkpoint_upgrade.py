"""Rebuild a checkpoint saved by an earlier version of the plugin as the model it was.

fairseq builds a loaded model from the configuration stored in the checkpoint, and
the plugin's architecture functions fill every option the checkpoint does not record
with today's default. Where an option came with a new default after models had been
trained the old way (``--kerple-per-layer``: r1, r2 were per layer up to revision
f2ecd07, shared by a stack's layers since), that would rebuild an old checkpoint as
another model, and its per-layer parameters would load into one shared pair without
a word. fairseq's own ``_upgrade_state_dict`` runs on every checkpoint that
``load_checkpoint_to_cpu`` reads (``fairseq-generate``, ``-interactive``,
``-validate``, ``-eval-lm``, hub loading, ``fairseq-train``'s resume); wrapped here,
it also writes each such option's ``unrecorded`` value into the configuration of a
checkpoint that lacks it, before the model is built.

It also keeps a checkpoint's arithmetic: a model records the revision of what each of
its mechanisms computes (:class:`~fairseq_distattn.registry.ArithmeticRevision`, the
``distattn_revisions`` attribute of its configuration). A checkpoint of an earlier
revision is converted exactly where the revision declares how (rope and xpos paired
dimension i with i + d/2 up to 5a4b114 and neighbouring dimensions since: a
permutation of the query and key projection rows), or refused in one line; one
saved before revisions were recorded is read from the options it records, and
refused, naming the override that says which it is, where those cannot tell.
"""

import logging
from typing import Dict, Iterable, List, Optional

import torch

from ..checkpoint_configuration import model_config, model_name
from ..registry import REGISTRY, option_flag
from ..spec import AttentionOptions, exit_with_error, option_fields, parse_spec, specs_name
from ..trained_configuration import PLUGIN_MODELS, attention_kinds, trained_settings

logger = logging.getLogger(__name__)


class CheckpointRefused(ValueError):
    """A checkpoint this plugin cannot build as the model it was trained as (one line)."""


# attribute -> value for the options whose checkpoints from before them were trained with another value
CHANGED_DEFAULTS = {
    option_flag(field).attr: option_flag(field).unrecorded_value
    for field in option_fields()
    if option_flag(field).has_unrecorded
}


def record_unrecorded_options(config) -> None:
    """Write into a plugin model's ``config`` what it was trained with for each option it does not record."""
    if config is None or model_name(config) not in PLUGIN_MODELS:
        return
    for attr, value in CHANGED_DEFAULTS.items():
        if getattr(config, attr, None) is None:
            _set(config, attr, value)


def _set(config, attr: str, value) -> None:
    from omegaconf import DictConfig, open_dict

    if isinstance(config, DictConfig):
        with open_dict(config):
            config[attr] = value
    else:
        setattr(config, attr, value)


def upgrade_plugin_checkpoints():
    """Wrap fairseq's ``checkpoint_utils._upgrade_state_dict`` with :func:`record_unrecorded_options`."""
    from fairseq import checkpoint_utils

    fairseq_upgrade = checkpoint_utils._upgrade_state_dict
    if getattr(fairseq_upgrade, "records_unrecorded_options", False):
        return

    def upgrade_state_dict(state):
        state = fairseq_upgrade(state)
        try:
            upgrade_plugin_state(state)
        except CheckpointRefused as error:
            exit_with_error(str(error))
        return state

    upgrade_state_dict.records_unrecorded_options = True
    checkpoint_utils._upgrade_state_dict = upgrade_state_dict


def upgrade_plugin_state(state) -> None:
    """What loading does to a checkpoint read by fairseq (``state``, with any
    ``--model-overrides`` applied to its configuration): the options it does not record
    filled with what it was trained with, and its arithmetic made today's; raise
    :class:`CheckpointRefused` where it cannot be."""
    record_unrecorded_options(model_config(state))
    check_arithmetic(state)


# --------------------------------------------------------------------------- arithmetic revisions

REVISIONS_ATTR = "distattn_revisions"  # "rope:2,alibi:1": each used mechanism's arithmetic revision
# each attention kind's layers in the state dict, and its head count and width attributes
_STACKS = {"encoder self-attention": "encoder", "decoder self-attention": "decoder"}


def used_mechanisms(config, model: str) -> List[str]:
    settings = trained_settings(config, model)
    return sorted(specs_name(settings[kind.flag] for kind in attention_kinds(model)) - {"vanilla"})


def arithmetic_record(config, model: str) -> str:
    """What ``config``'s mechanisms compute with today's code, as a checkpoint records it."""
    return revisions_of(used_mechanisms(config, model))


def revisions_of(mechanisms: Iterable[str]) -> str:
    """What ``mechanisms`` (sorted, vanilla left out) compute with today's code, as a checkpoint records it."""
    return ",".join(f"{name}:{REGISTRY[name].revision}" for name in mechanisms)


def parse_record(text) -> Dict[str, int]:
    record = {}
    for item in str(text or "").split(","):
        name, _, number = item.strip().partition(":")
        if name:
            if name not in REGISTRY or not number.isdigit() or not 1 <= int(number) <= REGISTRY[name].revision:
                raise CheckpointRefused(
                    f"{REVISIONS_ATTR} {text!r}: {item.strip()!r} names no revision of a mechanism; "
                    "allowed: NAME:N items, N from 1 to the mechanism's revision"
                )
            record[name] = int(number)
    return record


def record_arithmetic(config, mechanisms: Iterable[str]) -> None:
    """Write into a model configuration built now what its ``mechanisms`` (those its layers
    use, sorted: ``ModelAttentionPlans.mechanisms``) compute, unless it records it already (a
    checkpoint's, which :func:`check_arithmetic` has made current)."""
    if getattr(config, REVISIONS_ATTR, None) is None:
        _set(config, REVISIONS_ATTR, revisions_of(mechanisms))


def inferred_revision(config, info) -> Optional[int]:
    """The revision of a checkpoint that records none: the newest whose later options it
    records (None: it could be from before any of them)."""
    for revision in reversed(info.revisions):
        if any(getattr(config, attr, None) is not None for attr in revision.recorded_after):
            return revision.number
    return None


def check_arithmetic(state) -> None:
    """Convert a checkpoint whose mechanisms computed an earlier revision, exactly, or raise
    :class:`CheckpointRefused`; then record today's revisions in its configuration."""
    config = model_config(state)
    if config is None or model_name(config) not in PLUGIN_MODELS:
        return
    model = model_name(config)
    recorded_text = getattr(config, REVISIONS_ATTR, None)
    recorded = parse_record(recorded_text)
    for name in used_mechanisms(config, model):
        info = REGISTRY[name]
        if info.revision == 1:
            continue
        revision = recorded.get(name) or inferred_revision(config, info)
        if revision is None:
            raise CheckpointRefused(_ambiguous(info))
        for step in info.revisions[revision:]:
            if step.query_key_rows_from_previous is None:
                raise CheckpointRefused(
                    f"this checkpoint's {name} computes {info.revisions[step.number - 2].arithmetic} (revision "
                    f"{step.number - 1}), which this plugin no longer computes ({step.arithmetic} since {step.since})"
                    f" and cannot convert; evaluate it with the plugin at revision {step.since}^"
                )
            _reorder_query_key_rows(state["model"], config, model, name, info, step.query_key_rows_from_previous)
            logger.info(f"converted {name} from revision {step.number - 1} to {step.number} ({step.arithmetic})")
    _set(config, REVISIONS_ATTR, arithmetic_record(config, model))


def _ambiguous(info) -> str:
    history = "; ".join(f"revision {r.number}, {r.arithmetic}, from plugin revision {r.since}" for r in info.revisions)
    return (
        f"this checkpoint records no arithmetic revision of {info.name} and no option that tells which it was "
        f"trained with ({history}): name it with --model-overrides \"{{'{REVISIONS_ATTR}': '{info.name}:N'}}\" "
        "(an earlier revision is converted exactly)"
    )


def _reorder_query_key_rows(weights, config, model: str, name: str, info, rows_of) -> None:
    options = AttentionOptions.from_args(config).for_mechanism(name)
    for kind in attention_kinds(model):
        stack = _STACKS.get(kind.description)
        spec, num_layers = getattr(config, kind.attr, None), getattr(config, kind.layers_attr, None)
        if stack is None or spec in (None, "vanilla") or num_layers is None:
            continue
        heads, width = getattr(config, f"{stack}_attention_heads"), getattr(config, f"{stack}_embed_dim")
        head_dim = width // heads
        order = torch.tensor(
            [head * head_dim + row for head in range(heads) for row in rows_of(head_dim, options)], dtype=torch.long
        )
        for layer, layer_name in enumerate(parse_spec(kind, spec, num_layers)):
            if layer_name != name:
                continue
            for projection in ("q_proj", "k_proj"):
                for parameter in ("weight", "bias"):
                    key = f"{stack}.layers.{layer}.self_attn.{projection}.{parameter}"
                    if key in weights:
                        weights[key] = weights[key][order]


__all__ = [
    "CHANGED_DEFAULTS",
    "CheckpointRefused",
    "REVISIONS_ATTR",
    "arithmetic_record",
    "check_arithmetic",
    "record_arithmetic",
    "record_unrecorded_options",
    "upgrade_plugin_checkpoints",
    "upgrade_plugin_state",
]
