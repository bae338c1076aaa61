"""Keep a checkpoint's attention what it was trained as, wherever fairseq loads one.

fairseq's strict state-dict loading is its only check that a checkpoint fits the
model it is loaded into. A parameter-free mechanism (``alibi``,
``distance-mask``) has no key to mismatch, so resuming an ``alibi`` run with the
attention flags left out trained on as vanilla, and a changed table size
(``--max-relative-position``) ended in a ``size mismatch`` traceback. These
hooks compare :func:`~fairseq_distattn.trained_settings.trained_settings`
instead, for every mechanism the registry holds:

- ``fairseq-train`` resuming (``Trainer.load_checkpoint``, on every rank: each
  reads the checkpoint's configuration itself, memory-mapped, before fairseq's
  rank 0 loads and broadcasts it): any difference stops the run with one line
  naming both sides, unless it is a deliberate fine-tune (the optimizer is reset,
  as ``--finetune-from-model`` does, and the checkpoint lies outside
  ``--save-dir``), which is logged instead; a checkpoint that loading converts from an
  earlier arithmetic revision resumes only with ``--reset-optimizer``;
- ``--model-overrides`` (``fairseq-generate``, ``-interactive``, ``-validate``,
  ``-eval-lm``, hub loading): an override may change only the parameter-free
  (``EVALUATION``) and ``RUNTIME`` options (not a mechanism, nor the head count or
  width the attention was trained with); a key close to an option's name but no
  option's (``'rope_bse'``), which fairseq would ignore, a mechanism option that
  configures no layer of the checkpoint (``'rope_scaling'`` for ``kerple``), a changed
  layer count (``*_layers_to_keep`` prunes instead) and a ``distattn_revisions`` that
  contradicts the checkpoint's record are refused;
- the hub's ``from_pretrained``: the same refusals reach the caller as an exception it
  can catch (:class:`~fairseq_distattn.spec.RefusedConfiguration`), with nothing on stderr.
"""

import copy
import dataclasses
import functools
import logging
from argparse import Namespace
from pathlib import Path

from ..spec import SpecError, exit_on_spec_error, exit_with_error, library_call
from ..trained_settings import (
    PLUGIN_MODELS,
    check_layer_count_overrides,
    check_override_keys,
    check_overrides,
    check_unused_overrides,
    describe_differences,
    differences,
    model_config,
    model_name,
    plugin_override_keys,
    settings_of,
)
from .checkpoint_loading import read_checkpoint
from .checkpoint_upgrade import CheckpointRefused, check_revision_override, corrupt_configuration, pending_conversions

logger = logging.getLogger(__name__)


def _keys(node) -> list:
    """The option names of a configuration group (omegaconf node, ``Namespace`` or dict)."""
    if isinstance(node, Namespace):
        return list(vars(node))
    if hasattr(node, "keys"):
        return [key for key in node.keys() if isinstance(key, str)]
    return []


@functools.lru_cache(maxsize=1)
def fairseq_option_names() -> frozenset:
    """Every option name fairseq's registered dataclasses declare: its configuration groups
    (common, dataset, generation, ...), every task's, model's, criterion's, optimizer's, ..."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models import MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    classes = [field.type for field in dataclasses.fields(FairseqConfig)]
    classes += [*MODEL_DATACLASS_REGISTRY.values(), *TASK_DATACLASS_REGISTRY.values()]
    classes += [cls for registry in REGISTRIES.values() for cls in registry["dataclass_registry"].values()]
    names = {field.name for field in dataclasses.fields(FairseqConfig)}
    for cls in classes:
        if dataclasses.is_dataclass(cls):
            names.update(field.name for field in dataclasses.fields(cls))
    return frozenset(names)


def configuration_keys(cfg) -> set:
    """The group names of a checkpoint's whole configuration and the option names in each
    (read before fairseq applies overrides: it sets every key on a ``Namespace`` group)."""
    keys = set()
    for group in _keys(cfg):
        keys.add(group)
        keys.update(_keys(cfg.get(group) if hasattr(cfg, "get") else getattr(cfg, group, None)))
    return keys


def check_model_overrides(before_model, after_model, overrides, cfg_keys=()) -> None:
    """Raise SpecError where ``overrides`` (``--model-overrides``) would not evaluate the
    checkpoint as asked: a key no option has but close to one (misspelt), an override that
    changes what it was trained as, or one of an option that configures none of its layers.
    ``before_model``/``after_model``: the model's configuration without and with the
    overrides; ``cfg_keys``: :func:`configuration_keys` of the checkpoint's whole
    configuration, where it is at hand (its groups' keys are fairseq's options too)."""
    model_keys = _keys(before_model)
    known = {*model_keys, *cfg_keys, *plugin_override_keys(), *fairseq_option_names()}
    check_override_keys(overrides, known, {*plugin_override_keys(), *model_keys})
    check_revision_override(before_model, overrides)
    check_overrides(settings_of(before_model), settings_of(after_model), overrides)
    check_unused_overrides(before_model, after_model, overrides, model_name(after_model))
    check_layer_count_overrides(before_model, after_model, overrides, model_name(after_model))


def check_resume(filename, cfg, reset_optimizer: bool) -> None:
    """Exit (one line, status 2) when the checkpoint ``filename`` was trained with another
    attention configuration than ``cfg.model``, unless this is a deliberate fine-tune."""
    stored, requested = model_config(read_checkpoint(filename)), cfg.model
    if stored is None or not {model_name(stored), model_name(requested)} & set(PLUGIN_MODELS):
        return  # fairseq's own models on both sides: fairseq's own checks
    try:
        check_resumed_arithmetic(filename, stored, reset_optimizer)
        found = differences(settings_of(stored), settings_of(requested))
    except SpecError as error:
        exit_with_error(f"{filename}: {corrupt_configuration(error)}")
    if not found:
        return
    described = describe_differences(found, "this command")
    save_dir = Path(cfg.checkpoint.save_dir).resolve()
    if reset_optimizer and Path(filename).resolve().parent != save_dir:
        logger.warning(f"fine-tuning {filename} into another configuration: {described}")
        return
    exit_with_error(
        f"{filename} was trained as another model than this command builds: {described}. Resume with the "
        f"checkpoint's own flags (python -m fairseq_distattn.check {filename} lists them); to fine-tune it into "
        f"this configuration on purpose, pass --finetune-from-model {filename} and a new --save-dir"
    )


def check_resumed_arithmetic(filename, stored, reset_optimizer: bool) -> None:
    """Exit (one line, status 2) when loading converts the checkpoint ``filename`` (model
    configuration ``stored``) from an earlier arithmetic revision and the optimizer state would
    be resumed: Adam's moments belong to the unconverted rows of the query and key projections."""
    try:
        conversions = pending_conversions(stored)
    except CheckpointRefused as error:
        exit_with_error(str(error))
    if conversions and not reset_optimizer:
        exit_with_error(
            f"{filename} is converted on loading ({'; '.join(map(str, conversions))}), and its optimizer state "
            "holds the moments of the unconverted query and key rows: resume it with --reset-optimizer"
        )


def _load_failure(filename, error: Exception) -> str:
    """One line for fairseq's "Cannot load model parameters", from torch's error behind it."""
    cause = error.__cause__ or error.__context__
    details = [line.strip() for line in str(cause or "").splitlines()[1:] if line.strip()]
    detail = details[0] if details else str(cause or error)
    if len(detail) > 300:
        detail = detail[:297] + "..."
    return (
        f"cannot load the parameters of {filename} into the model this command builds ({detail}); "
        f"python -m fairseq_distattn.check {filename} lists what it was trained as"
    )


def guard_resuming():
    """Wrap ``Trainer.load_checkpoint`` with :func:`check_resume`."""
    from fairseq.file_io import PathManager
    from fairseq.trainer import Trainer

    fairseq_load = Trainer.load_checkpoint
    if getattr(fairseq_load, "checks_trained_settings", False):
        return

    def load_checkpoint(self, filename, reset_optimizer=False, *args, **kwargs):
        if PathManager.isfile(filename):
            check_resume(filename, self.cfg, reset_optimizer)
        try:
            return fairseq_load(self, filename, reset_optimizer, *args, **kwargs)
        except Exception as error:
            if not str(error).startswith("Cannot load model parameters"):
                raise
            exit_with_error(_load_failure(filename, error))

    load_checkpoint.checks_trained_settings = True
    Trainer.load_checkpoint = load_checkpoint


def guard_model_overrides():
    """Wrap the ``overwrite_args_by_name`` that ``checkpoint_utils.load_checkpoint_to_cpu``
    applies ``--model-overrides`` (and the hub's keyword arguments) with, so that an
    override that changes what the checkpoint was trained as is refused."""
    from fairseq import checkpoint_utils

    fairseq_overwrite = checkpoint_utils.overwrite_args_by_name
    if getattr(fairseq_overwrite, "checks_trained_settings", False):
        return

    def overwrite_args_by_name(cfg, overrides):
        model = cfg.get("model") if overrides else None
        if model is None or model_name(model) not in PLUGIN_MODELS:
            return fairseq_overwrite(cfg, overrides)
        before, cfg_keys = copy.deepcopy(model), configuration_keys(cfg)  # fairseq sets them on cfg's nodes
        result = fairseq_overwrite(cfg, overrides)
        try:
            check_model_overrides(before, cfg["model"], overrides, cfg_keys)
        except SpecError as error:
            exit_on_spec_error(error)
        return result

    overwrite_args_by_name.checks_trained_settings = True
    checkpoint_utils.overwrite_args_by_name = overwrite_args_by_name


def guard_hub_loading():
    """Wrap ``hub_utils.from_pretrained`` (every model's ``from_pretrained``) so that a refusal
    inside it reaches the caller as a :class:`~fairseq_distattn.spec.RefusedConfiguration` it can
    catch, not as a line on stderr: a library call is not a command line."""
    from fairseq import hub_utils

    fairseq_from_pretrained = hub_utils.from_pretrained
    if getattr(fairseq_from_pretrained, "raises_catchable_errors", False):
        return

    @functools.wraps(fairseq_from_pretrained)
    def from_pretrained(*args, **kwargs):
        with library_call():
            return fairseq_from_pretrained(*args, **kwargs)

    from_pretrained.raises_catchable_errors = True
    hub_utils.from_pretrained = from_pretrained


def guard_checkpoints():
    guard_resuming()
    guard_model_overrides()
    guard_hub_loading()


__all__ = [
    "PLUGIN_MODELS",
    "guard_checkpoints",
    "check_model_overrides",
    "check_resume",
    "configuration_keys",
    "model_config",
    "model_name",
    "read_checkpoint",
    "settings_of",
]
