"""``stick-breaking``: stick-breaking attention (Tan et al. 2025)."""

from dataclasses import dataclass

from ..functional.stick_breaking import stick_breaking_attention
from ..registry import CROSS_KIND, DECODER_SELF_KIND, ENCODER_SELF_KIND, EVALUATION, option, register_attention
from .base import Mechanism

CAUSAL_ONLY = (
    "a query breaks its stick from its nearest earlier key backwards, an order only causal attention has "
    "(the authors define no bidirectional form)"
)


@dataclass(frozen=True)
class StickBreakingOptions:
    stick_breaking_attend_current: bool = option(
        False,
        "--stick-breaking-attend-current",
        "stick-breaking: a query's own key breaks its stick too (the authors' attend_current; default: earlier "
        "keys only, as their model runs)",
        action="store_true",
        role=EVALUATION,
    )
    stick_breaking_remainder: bool = option(
        True,
        "--stick-breaking-no-remainder",
        "stick-breaking: leave out the stick the keys leave over (rem_i v_i on the query's own value, which the "
        "authors' model adds to the kernel's output)",
        arg_default=False,
        convert=lambda no_remainder, context: not no_remainder,
        action="store_true",
        role=EVALUATION,
    )


@register_attention(
    "stick-breaking",
    StickBreakingOptions,
    op=stick_breaking_attention,
    kinds=frozenset({DECODER_SELF_KIND}),
    unsupported={ENCODER_SELF_KIND: CAUSAL_ONLY, CROSS_KIND: CAUSAL_ONLY},
    description="stick-breaking attention in place of softmax: `A_ij = sigmoid(z_ij) prod_{j<l<i} (1 - "
    "sigmoid(z_il))`, nearest earlier key first, the stick left over on the query's own value; no parameters",
    paper="Tan et al. 2024, *Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth Study*",
)
class StickBreaking(Mechanism):
    """Tan et al. 2025, as their model runs it (shawntan/stickbreaking-attention 3147a38:
    ``sb_attn`` with ``attend_current=False``, the remaining stick ``rem`` times the
    query's own value added to the output, ``o + rem[..., None] * v``)."""

    def op_arguments(self, queries, keys, options):
        options = self.config.options
        return (options.stick_breaking_attend_current, options.stick_breaking_remainder), {}
