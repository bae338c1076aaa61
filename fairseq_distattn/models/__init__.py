"""The fairseq side of the plugin: importing this module installs the plugin's
patches to fairseq and torch (:mod:`fairseq_distattn.patches`), registers the
models and architectures, and puts the plugin's flags into fairseq's ``--help``
and its checks after parsing."""

from .. import patches

patches.install()

from ..patches.fairseq_options import check_flags_after_parsing, show_flags_in_fairseq_help  # noqa: E402
from . import distattn_lm, distattn_transformer  # noqa: E402,F401 (registers models and architectures)
from .arguments import add_every_kind_of_flag, check_parsed_args  # noqa: E402

show_flags_in_fairseq_help(add_every_kind_of_flag)
check_flags_after_parsing(check_parsed_args)

from .hydra_config import check_hydra_configs  # noqa: E402

check_hydra_configs()
