"""Keep a checkpoint's attention what it was trained as, wherever fairseq loads one.

fairseq's strict state-dict loading is its only check that a checkpoint fits the
model it is loaded into. A parameter-free mechanism (``alibi``,
``distance-mask``) has no key to mismatch, so resuming an ``alibi`` run with the
attention flags left out trained on as vanilla, and a changed table size
(``--max-relative-position``) ended in a ``size mismatch`` traceback. These
hooks compare :func:`~fairseq_distattn.trained_configuration.trained_settings`
instead, for every mechanism the registry holds:

- ``fairseq-train`` resuming (``Trainer.load_checkpoint``, on every rank: each
  reads the checkpoint's configuration itself, memory-mapped, before fairseq's
  rank 0 loads and broadcasts it): any difference stops the run with one line
  naming both sides, unless it is a deliberate fine-tune (the optimizer is reset,
  as ``--finetune-from-model`` does, and the checkpoint lies outside
  ``--save-dir``), which is logged instead;
- ``--model-overrides`` (``fairseq-generate``, ``-interactive``, ``-validate``,
  ``-eval-lm``, hub loading): an override may change only the parameter-free
  (``EVALUATION``) and ``RUNTIME`` options.
"""

import logging
from pathlib import Path

import torch

from ..spec import SpecError, exit_on_spec_error, exit_with_error
from ..trained_configuration import check_overrides, describe_differences, differences, trained_settings
from .checkpoint_loading import allow_fairseq_checkpoints

logger = logging.getLogger(__name__)

PLUGIN_MODELS = ("distattn_transformer", "distattn_lm")


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


def settings_of(config):
    """:func:`trained_settings` of a model configuration."""
    return trained_settings(config, model_name(config))


def read_checkpoint(path) -> dict:
    """A checkpoint's state, weights-only; memory-mapped where the file allows it, so that
    reading its configuration does not read its tensors."""
    allow_fairseq_checkpoints()
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(str(path), map_location="cpu", weights_only=True)


def check_resume(filename, cfg, reset_optimizer: bool) -> None:
    """Exit (one line, status 2) when the checkpoint ``filename`` was trained with another
    attention configuration than ``cfg.model``, unless this is a deliberate fine-tune."""
    stored, requested = model_config(read_checkpoint(filename)), cfg.model
    if stored is None or not {model_name(stored), model_name(requested)} & set(PLUGIN_MODELS):
        return  # fairseq's own models on both sides: fairseq's own checks
    found = differences(settings_of(stored), settings_of(requested))
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
    if getattr(fairseq_load, "checks_trained_configuration", False):
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

    load_checkpoint.checks_trained_configuration = True
    Trainer.load_checkpoint = load_checkpoint


def guard_model_overrides():
    """Wrap the ``overwrite_args_by_name`` that ``checkpoint_utils.load_checkpoint_to_cpu``
    applies ``--model-overrides`` (and the hub's keyword arguments) with, so that an
    override that changes what the checkpoint was trained as is refused."""
    from fairseq import checkpoint_utils

    fairseq_overwrite = checkpoint_utils.overwrite_args_by_name
    if getattr(fairseq_overwrite, "checks_trained_configuration", False):
        return

    def overwrite_args_by_name(cfg, overrides):
        model = cfg.get("model") if overrides else None
        if model is None or model_name(model) not in PLUGIN_MODELS:
            return fairseq_overwrite(cfg, overrides)
        before = settings_of(model)
        result = fairseq_overwrite(cfg, overrides)
        try:
            check_overrides(before, settings_of(cfg["model"]), overrides)
        except SpecError as error:
            exit_on_spec_error(error)
        return result

    overwrite_args_by_name.checks_trained_configuration = True
    checkpoint_utils.overwrite_args_by_name = overwrite_args_by_name


def guard_checkpoints():
    guard_resuming()
    guard_model_overrides()


__all__ = ["guard_checkpoints", "check_resume", "model_config", "model_name", "read_checkpoint", "settings_of"]
