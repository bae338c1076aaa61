"""Command-line flags and architecture registration shared by both models."""
import argparse

from fairseq import options
from fairseq.models import register_model_architecture

from ..spec import CROSS, DECODER_SELF, DISTANCE_MASK_DIRECTIONS, ENCODER_SELF, MECHANISMS, MechanismOptions, SpecError, exit_on_spec_error


def spec_help(kind):
    allowed = ", ".join(m for m in MECHANISMS if m in kind.allowed)
    return (f"mechanism per layer of {kind.description} (default: vanilla): comma-separated MECH[@LAYERS], "
            f"MECH one of {allowed}; LAYERS i or i-j (0-based, inclusive); no @ = every layer; "
            "layers not named are vanilla")


HELP_TITLE = "distance-aware attention (fairseq_distattn)"


def add_distattn_args(container, kinds):
    """Add the plugin's flags to a parser (in a group of their own) or to the
    model-specific argument group fairseq hands a model's ``add_args``.

    Defaults are suppressed, as in fairseq's model group: a flag the user did
    not give is absent, so architectures can supply their own defaults."""
    if isinstance(container, argparse.ArgumentParser):
        container = container.add_argument_group(HELP_TITLE, argument_default=argparse.SUPPRESS)

    def add(flag, **kwargs):
        if flag not in container._option_string_actions:  # already added for --help
            container.add_argument(flag, **kwargs)

    for kind in kinds:
        add(kind.flag, type=str, metavar="SPEC", help=spec_help(kind))
    defaults = MechanismOptions()
    add("--max-relative-position", type=int, metavar="K",
        help=f"rpr clipping distance k (default: {defaults.max_relative_position})")
    add("--no-relative-values", action="store_true",
        help="rpr: relative key embeddings only (Shaw eq. 4), no value embeddings (eq. 3)")
    add("--window-segment-size", type=int, metavar="B",
        help=f"window-*-seg: segment size b (default: {defaults.window_segment_size})")
    add("--distance-mask-alpha", type=float, metavar="ALPHA",
        help=f"distance-mask: weight of -|i-j| on the logits (default: {defaults.distance_mask_alpha})")
    add("--distance-mask-direction", type=str, metavar="DIR",
        help="distance-mask: directional mask, one of " + ", ".join(DISTANCE_MASK_DIRECTIONS) + " (default: none)")
    add("--attention-recompute-length", type=int, metavar="N",
        help="from this key length on, training keeps no [B, H, Tq, Tk] attention tensor for backward: "
             "it recomputes the mechanism in query chunks instead (less memory, one more attention "
             f"forward per layer); 0 = never (default: {defaults.attention_recompute_length})")


def show_flags_in_fairseq_help():
    """fairseq's CLIs answer ``--help`` before they add any model's flags, so no
    model flag would ever be listed. Add ours to the training parser's model
    configuration (fairseq builds that parser after importing ``--user-dir``);
    with suppressed defaults they are invisible to other architectures."""
    fairseq_add_model_args = options.add_model_args
    if getattr(fairseq_add_model_args, "adds_distattn_flags", False):
        return

    def add_model_args(parser):
        group = fairseq_add_model_args(parser)
        add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))
        return group

    add_model_args.adds_distattn_flags = True
    options.add_model_args = add_model_args


def set_distattn_defaults(args, encoder_self=None, decoder_self=None, cross=None):
    """Architecture defaults: a flag the user gave always wins."""
    for flag_attr, spec in (("encoder_self_attention", encoder_self), ("decoder_self_attention", decoder_self), ("cross_attention", cross)):
        setattr(args, flag_attr, getattr(args, flag_attr, None) or spec or "vanilla")
    defaults = MechanismOptions()
    args.max_relative_position = getattr(args, "max_relative_position", defaults.max_relative_position)
    args.no_relative_values = getattr(args, "no_relative_values", False)
    args.window_segment_size = getattr(args, "window_segment_size", defaults.window_segment_size)
    args.distance_mask_alpha = getattr(args, "distance_mask_alpha", defaults.distance_mask_alpha)
    args.distance_mask_direction = getattr(args, "distance_mask_direction", "none")
    args.attention_recompute_length = getattr(args, "attention_recompute_length", defaults.attention_recompute_length)


def register_architecture(model_name, name, fairseq_architecture, no_absolute_positions=False,
                          encoder_self=None, decoder_self=None, cross=None):
    """Register ``name``: fairseq's architecture defaults plus attention defaults
    (architectures only set defaults; a flag the user gives always wins)."""

    def set_defaults(args):
        if no_absolute_positions:
            args.no_token_positional_embeddings = getattr(args, "no_token_positional_embeddings", True)
        set_distattn_defaults(args, encoder_self, decoder_self, cross)
        fairseq_architecture(args)

    set_defaults.__name__ = name
    register_model_architecture(model_name, name)(set_defaults)
    return set_defaults


def build_or_exit(build):
    """Run a model build; a bad flag value exits like argparse (status 2, one line)."""
    try:
        return build()
    except SpecError as error:
        exit_on_spec_error(error)


__all__ = ["add_distattn_args", "show_flags_in_fairseq_help", "set_distattn_defaults", "register_architecture", "build_or_exit", "ENCODER_SELF", "DECODER_SELF", "CROSS"]
