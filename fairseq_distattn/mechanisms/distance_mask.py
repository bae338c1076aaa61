"""``distance-mask``: distance-based self-attention (Im & Cho 2017)."""

from dataclasses import dataclass
from typing import Optional

from ..functional.distance_mask import DIRECTIONS, distance_mask_attention
from ..functional.masking import relative_distance
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    EVALUATION,
    SELF_ATTENTION,
    SpecError,
    finite_number,
    option,
    register_attention,
)
from .base import Mechanism, PositionTerm

# the flag's names of the functional API's directions (None: "none")
DISTANCE_MASK_DIRECTIONS = tuple(direction or "none" for direction in DIRECTIONS)


def _direction(value, context):
    direction = "none" if value is None else value
    if direction not in DISTANCE_MASK_DIRECTIONS:
        raise SpecError(
            "--distance-mask-direction", direction, "unknown direction", ", ".join(DISTANCE_MASK_DIRECTIONS)
        )
    return None if direction == "none" else direction


@dataclass(frozen=True)
class DistanceMaskOptions:
    # alpha multiplies float32 (or half) logits: a value that is inf there
    # (1e39 is finite in Python) turns 0 * alpha on the diagonal into NaN
    distance_mask_alpha: float = option(
        1.0,
        "--distance-mask-alpha",
        "distance-mask: weight alpha of the -alpha |i-j| added to the attention logits (default: {default})",
        convert=finite_number("--distance-mask-alpha", "ALPHA", positive=False),
        type=float,
        metavar="ALPHA",
        role=EVALUATION,
    )
    distance_mask_direction: Optional[str] = option(
        None,
        "--distance-mask-direction",
        "distance-mask: directional mask, one of " + ", ".join(DISTANCE_MASK_DIRECTIONS) + " (default: none)",
        arg_default="none",
        convert=_direction,
        type=str,
        metavar="DIR",
        role=EVALUATION,
    )


@register_attention(
    "distance-mask",
    DistanceMaskOptions,
    op=distance_mask_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # the fused path keeps only the [Tq, Tk] bias, the flex path only its table
    keeps_position_embeddings=True,  # a locality prior added to a model that has its positions
    description="fixed `-alpha * abs(i-j)` distance mask, optionally directional",
    paper="Im and Cho 2017, *Distance-based Self-Attention Network for Natural Language Inference*",
)
class DistanceMask(Mechanism):
    """Im & Cho 2017: fixed -alpha |i-j| bias, optional directional mask."""

    @classmethod
    def check_options(cls, options, kind=None, layers=()):
        # A backward mask hides every past key; with the decoder's causal mask nothing is left.
        if kind is not None and kind.causal and options.distance_mask_direction == "backward":
            raise SpecError(
                "--distance-mask-direction",
                "backward",
                f"{kind.flag} uses distance-mask, and a backward mask leaves a causal query no key",
                "none, forward",
            )

    def position_term(self, tgt_len, src_len, causal):
        distance = relative_distance(tgt_len, src_len, 0, "cpu").abs().double()
        return PositionTerm(
            "distance-mask", "distance mask -alpha |i-j|", -self.config.options.distance_mask_alpha * distance[None]
        )

    def extra_repr(self) -> str:
        options = self.config.options
        return f"alpha={options.distance_mask_alpha}, direction={options.distance_mask_direction or 'none'}"

    def op_arguments(self, queries, keys, options):
        options = self.config.options
        return (options.distance_mask_alpha,), {"direction": options.distance_mask_direction}
