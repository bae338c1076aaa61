"""Every change the plugin makes to fairseq and torch, one module each, installed
together by :func:`install` (which :mod:`fairseq_distattn.models` calls):

- :mod:`.quiet_warnings`: the start-up warnings every fairseq 0.12 command prints;
- :mod:`.checkpoint_loading`: torch>=2.6 loads fairseq checkpoints weights-only;
- :mod:`.checkpoint_guards`: a checkpoint keeps the attention it was trained with
  (resume, ``--model-overrides``);
- :mod:`.checkpoint_upgrade`: a checkpoint of an earlier plugin version is rebuilt as
  the model it was (options whose default changed since);
- :mod:`.torchrun_on_cpu`: ``torchrun`` launches ``fairseq-train`` without a GPU;
- :mod:`.fairseq_options`: the plugin's flags in fairseq's ``--help`` and its checks
  after parsing (installed by :mod:`fairseq_distattn.models`, which gives the flags
  and the checks);
- :mod:`.lm_decoder`: fairseq's LM built with the plugin's decoder.

Nothing here is imported until :func:`install` runs: the warning filters go in
before the modules that import fairseq do.
"""


def install() -> None:
    from .quiet_warnings import silence_known_fairseq_warnings

    # before fairseq composes its hydra configuration (the plugin is imported while the
    # command line is parsed), so that its known start-up warnings stay off stderr
    silence_known_fairseq_warnings()

    from .checkpoint_guards import guard_checkpoints
    from .checkpoint_loading import allow_fairseq_checkpoints
    from .checkpoint_upgrade import upgrade_plugin_checkpoints
    from .torchrun_on_cpu import allow_torchrun_on_cpu

    allow_fairseq_checkpoints()
    guard_checkpoints()
    upgrade_plugin_checkpoints()
    allow_torchrun_on_cpu()
