"""The fairseq side of the plugin: importing this module registers the models
and architectures and installs the plugin's hooks into fairseq and torch."""

from ..quiet_warnings import silence_known_fairseq_warnings

# before fairseq composes its hydra configuration (the plugin is imported while the
# command line is parsed), so that its known start-up warnings stay off stderr
silence_known_fairseq_warnings()

from ..checkpoint_loading import allow_fairseq_checkpoints  # noqa: E402

allow_fairseq_checkpoints()

from ..checkpoint_guards import guard_checkpoints  # noqa: E402

guard_checkpoints()

from ..torchrun_on_cpu import allow_torchrun_on_cpu  # noqa: E402
from . import distattn_lm, distattn_transformer  # noqa: E402,F401 (registers models and architectures)
from .arguments import check_flags_after_parsing, show_flags_in_fairseq_help  # noqa: E402

show_flags_in_fairseq_help()
check_flags_after_parsing()
allow_torchrun_on_cpu()
