from . import distattn_lm, distattn_transformer  # noqa: F401 (registers models and architectures)
from .arguments import check_flags_after_parsing, show_flags_in_fairseq_help

show_flags_in_fairseq_help()
check_flags_after_parsing()
