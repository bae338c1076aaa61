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
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import torch

from ..registry import REGISTRY, option_flag
from ..spec import AttentionOptions, SpecError, exit_with_error, option_fields, parse_spec, specs_name
from ..trained_settings import PLUGIN_MODELS, attention_kinds, model_config, model_name, trained_settings

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
            set_config_value(config, attr, value)


def set_config_value(config, attr: str, value) -> None:
    """Set ``attr`` on a model configuration: an ``argparse.Namespace`` or a (struct) omegaconf node."""
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
        except SpecError as error:  # a stored SPEC or option no flag would accept (a damaged or edited checkpoint)
            exit_with_error(corrupt_configuration(error))
        return state

    upgrade_state_dict.records_unrecorded_options = True
    checkpoint_utils._upgrade_state_dict = upgrade_state_dict


def corrupt_configuration(error: SpecError) -> str:
    """One line for a checkpoint whose recorded attention configuration no flag would accept."""
    return (
        f"the checkpoint records an attention configuration this plugin cannot build ({error}); "
        "python -m fairseq_distattn.check CHECKPOINT shows what it records"
    )


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


def record_items(text) -> List[Tuple[str, int]]:
    """The ``NAME:N`` items of a ``distattn_revisions`` record, in order; raise
    :class:`CheckpointRefused` for one that names no revision of a mechanism."""
    items = []
    for item in str(text or "").split(","):
        name, _, number = item.strip().partition(":")
        if name:
            if name not in REGISTRY or not number.isdigit() or not 1 <= int(number) <= REGISTRY[name].revision:
                raise CheckpointRefused(
                    f"{REVISIONS_ATTR} {text!r}: {item.strip()!r} names no revision of a mechanism; "
                    "allowed: NAME:N items, N from 1 to the mechanism's revision"
                )
            items.append((name, int(number)))
    return items


def parse_record(text) -> Dict[str, int]:
    return dict(record_items(text))


def record_arithmetic(config, mechanisms: Iterable[str]) -> None:
    """Write into a model configuration built now what its ``mechanisms`` (those its layers
    use, sorted: ``ModelAttentionPlans.mechanisms``) compute, unless it records it already (a
    checkpoint's, which :func:`check_arithmetic` has made current)."""
    if getattr(config, REVISIONS_ATTR, None) is None:
        set_config_value(config, REVISIONS_ATTR, revisions_of(mechanisms))


def inferred_revision(config, info) -> Optional[int]:
    """The revision of a checkpoint that records none: the newest whose later options it
    records (None: it could be from before any of them)."""
    for revision in reversed(info.revisions):
        if any(getattr(config, attr, None) is not None for attr in revision.recorded_after):
            return revision.number
    return None


@dataclass(frozen=True)
class Conversion:
    """One mechanism of a checkpoint that loading converts from an earlier arithmetic revision."""

    mechanism: str
    revision: int  # the checkpoint's
    current: int  # today's

    def __str__(self) -> str:
        info = REGISTRY[self.mechanism]
        return (
            f"{self.mechanism} from revision {self.revision} ({info.revisions[self.revision - 1].arithmetic}) to "
            f"{self.current} ({info.revisions[self.current - 1].arithmetic})"
        )


def pending_conversions(config) -> List[Conversion]:
    """What loading a plugin checkpoint whose model configuration is ``config`` (with any
    ``--model-overrides``) converts; raise :class:`CheckpointRefused` where a mechanism's
    revision is unknown or cannot be converted."""
    if config is None or model_name(config) not in PLUGIN_MODELS:
        return []
    recorded = parse_record(getattr(config, REVISIONS_ATTR, None))
    found = []
    for name in used_mechanisms(config, model_name(config)):
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
        if revision < info.revision:
            found.append(Conversion(name, revision, info.revision))
    return found


def check_arithmetic(state) -> None:
    """Convert a checkpoint whose mechanisms computed an earlier revision, exactly, or raise
    :class:`CheckpointRefused`; then record today's revisions in its configuration."""
    config = model_config(state)
    if config is None or model_name(config) not in PLUGIN_MODELS:
        return
    model = model_name(config)
    for conversion in pending_conversions(config):
        info = REGISTRY[conversion.mechanism]
        for step in info.revisions[conversion.revision : conversion.current]:
            rows_of = step.query_key_rows_from_previous
            _reorder_query_key_rows(state["model"], config, model, conversion.mechanism, info, rows_of)
            logger.info(
                f"converted {conversion.mechanism} from revision {step.number - 1} to {step.number} ({step.arithmetic})"
            )
    set_config_value(config, REVISIONS_ATTR, arithmetic_record(config, model))


def check_revision_override(config, overrides) -> None:
    """Raise :class:`SpecError` (flag ``--model-overrides``) where ``overrides`` names a
    ``distattn_revisions`` that contradicts the checkpoint whose model configuration is
    ``config`` (before the overrides): the override exists to say which revision a checkpoint
    that records none was trained with, so it may name only a mechanism the checkpoint uses,
    each once, and not another revision than the one the checkpoint records."""
    if REVISIONS_ATTR not in (overrides or {}):
        return
    text = overrides[REVISIONS_ATTR]

    def refuse(problem: str):
        raise SpecError(
            "--model-overrides",
            dict(overrides),
            f"{REVISIONS_ATTR!r}: {text!r} {problem}",
            "the revision of a mechanism the checkpoint uses whose revision it does not record (the override "
            "loading asks for); python -m fairseq_distattn.check CHECKPOINT shows what it records",
        )

    try:
        items = record_items(text)
    except CheckpointRefused as error:
        refuse(f"is no record of revisions ({error})")
    used = used_mechanisms(config, model_name(config))
    recorded = parse_record(getattr(config, REVISIONS_ATTR, None))
    names = [name for name, _ in items]
    for name, number in items:
        if names.count(name) > 1:
            refuse(f"names {name} more than once")
        if name not in used:
            refuse(f"names {name}, which no layer of this checkpoint uses (it uses {', '.join(used) or 'none'})")
        if name in recorded and recorded[name] != number:
            refuse(f"contradicts the checkpoint, which records {name}:{recorded[name]}")
        inferred = None if name in recorded else inferred_revision(config, REGISTRY[name])
        if inferred is not None and inferred != number:
            refuse(
                f"contradicts the checkpoint, which records no revision but options that tell it was saved "
                f"with {name}:{inferred}"
            )


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
    "check_revision_override",
    "corrupt_configuration",
    "Conversion",
    "pending_conversions",
    "record_arithmetic",
    "record_unrecorded_options",
    "set_config_value",
    "upgrade_plugin_checkpoints",
    "upgrade_plugin_state",
]
