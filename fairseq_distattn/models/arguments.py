"""Command-line flags and architecture registration shared by both models."""
from fairseq.models import register_model_architecture

from ..spec import CROSS, DECODER_SELF, DISTANCE_MASK_DIRECTIONS, ENCODER_SELF, MECHANISMS, MechanismOptions, SpecError, exit_on_spec_error

SPEC_HELP = (
    "comma-separated MECH[@LAYERS]: MECH one of " + ", ".join(MECHANISMS)
    + "; LAYERS i or i-j (0-based, inclusive); no @ = every layer; layers not named are vanilla"
)


def add_distattn_args(parser, kinds):
    group = parser.add_argument_group("distance-aware attention (fairseq_distattn)")
    for kind in kinds:
        group.add_argument(kind.flag, type=str, metavar="SPEC",
                           help=f"mechanism per layer of {kind.description} (default: vanilla); {SPEC_HELP}")
    defaults = MechanismOptions()
    group.add_argument("--max-relative-position", type=int, metavar="K",
                       help=f"rpr clipping distance k (default: {defaults.max_relative_position})")
    group.add_argument("--no-relative-values", action="store_true",
                       help="rpr: relative key embeddings only (Shaw eq. 4), no value embeddings (eq. 3)")
    group.add_argument("--window-segment-size", type=int, metavar="B",
                       help=f"window-*-seg: segment size b (default: {defaults.window_segment_size})")
    group.add_argument("--distance-mask-alpha", type=float, metavar="ALPHA",
                       help=f"distance-mask: weight of -|i-j| on the logits (default: {defaults.distance_mask_alpha})")
    group.add_argument("--distance-mask-direction", type=str, metavar="DIR",
                       help="distance-mask: directional mask, one of " + ", ".join(DISTANCE_MASK_DIRECTIONS) + " (default: none)")


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


__all__ = ["add_distattn_args", "set_distattn_defaults", "register_architecture", "build_or_exit", "ENCODER_SELF", "DECODER_SELF", "CROSS"]
