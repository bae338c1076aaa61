"""fairseq-distattn: distance-aware attention for fairseq (``--user-dir fairseq_distattn``)."""
from .quiet_warnings import silence_known_fairseq_warnings

# before fairseq composes its hydra configuration (the plugin is imported while the
# command line is parsed), so that its known start-up warnings stay off stderr
silence_known_fairseq_warnings()

from .checkpoint_loading import allow_fairseq_checkpoints  # noqa: E402

allow_fairseq_checkpoints()

from . import models  # noqa: E402,F401 (registers models and architectures)
from .torchrun_on_cpu import allow_torchrun_on_cpu  # noqa: E402

allow_torchrun_on_cpu()
