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
"""

import dataclasses

from ..registry import option_flag
from ..spec import MechanismOptions
from .checkpoint_guards import PLUGIN_MODELS, model_config, model_name

# attribute -> value for the options whose checkpoints from before them were trained with another value
CHANGED_DEFAULTS = {
    option_flag(field).attr: option_flag(field).unrecorded_value
    for field in dataclasses.fields(MechanismOptions)
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
        record_unrecorded_options(model_config(state))
        return state

    upgrade_state_dict.records_unrecorded_options = True
    checkpoint_utils._upgrade_state_dict = upgrade_state_dict


__all__ = ["CHANGED_DEFAULTS", "record_unrecorded_options", "upgrade_plugin_checkpoints"]
