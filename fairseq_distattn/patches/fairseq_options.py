"""fairseq's ``options.add_model_args`` and ``options.parse_args_and_arch``, wrapped:
the plugin's flags in every ``--help``, and the plugin's checks on every parsed
command line. The models floor gives both functions (this floor imports no model)."""

from typing import Callable

from fairseq import options


def show_flags_in_fairseq_help(add_flags: Callable) -> None:
    """fairseq's CLIs answer ``--help`` before they add any model's flags, so no
    model flag would ever be listed. ``add_flags(parser)`` adds ours to the
    training parser's model configuration (fairseq builds that parser after
    importing ``--user-dir``); with suppressed defaults they are invisible to other
    architectures."""
    fairseq_add_model_args = options.add_model_args
    if getattr(fairseq_add_model_args, "adds_distattn_flags", False):
        return

    def add_model_args(parser):
        group = fairseq_add_model_args(parser)
        add_flags(parser)
        return group

    add_model_args.adds_distattn_flags = True
    options.add_model_args = add_model_args


def check_flags_after_parsing(check: Callable) -> None:
    """Wrap fairseq's ``options.parse_args_and_arch`` with ``check(args)``.

    fairseq-train imports ``--user-dir`` while it builds its parser, before it
    calls ``parse_args_and_arch``, so the wrapper is in place for that call."""
    fairseq_parse = options.parse_args_and_arch
    if getattr(fairseq_parse, "checks_distattn_flags", False):
        return

    def parse_args_and_arch(*args, **kwargs):
        parsed = fairseq_parse(*args, **kwargs)
        check(parsed[0] if isinstance(parsed, tuple) else parsed)
        return parsed

    parse_args_and_arch.checks_distattn_flags = True
    options.parse_args_and_arch = parse_args_and_arch
