"""fairseq-distattn: distance-aware attention for fairseq (``--user-dir fairseq_distattn``)."""
from .checkpoint_loading import allow_fairseq_checkpoints

allow_fairseq_checkpoints()

from . import models  # noqa: E402,F401 (registers models and architectures)
