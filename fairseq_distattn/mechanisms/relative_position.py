"""``rpr``: relative position representations (Shaw, Uszkoreit, Vaswani 2018)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.relative_position import relative_position_attention
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    SELF_ATTENTION,
    SpecError,
    option,
    positive_integer,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig


def _clipping_distance(value, context):
    value = positive_integer("--max-relative-position")(value, context)
    if context.max_positions is not None and value > context.max_positions:
        raise SpecError(
            "--max-relative-position",
            value,
            f"larger than the longest sequence the model accepts ({context.max_positions} positions, "
            f"{context.positions_flag}), so no distance ever reaches it",
            f"an integer 1 <= K <= {context.max_positions}",
        )
    return value


@dataclass(frozen=True)
class RelativePositionOptions:
    # bounded by the longest sequence the model accepts (no distance beyond it ever occurs)
    max_relative_position: int = option(
        16,
        "--max-relative-position",
        "rpr: relative distances are clipped to [-K, K] (Shaw et al.'s clipping distance k; default: {default})",
        convert=_clipping_distance,
        type=int,
        metavar="K",
    )
    relative_values: bool = option(
        True,
        "--no-relative-values",
        "rpr: relative key embeddings only (Shaw eq. 4), no value embeddings (eq. 3)",
        arg_default=False,
        convert=lambda no_values, context: not no_values,
        action="store_true",
    )


@register_attention(
    "rpr",
    RelativePositionOptions,
    op=relative_position_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # keys only, eq. 4's second term is an additive bias; eq. 3's value term needs the weights,
    # except in flex, where it is rebuilt from the log-sum-exp
    description="relative position representations (clipped at `--max-relative-position`)",
    paper="Shaw, Uszkoreit and Vaswani 2018, *Self-Attention with Relative Position Representations*",
)
class RelativePosition(Mechanism):
    """Shaw et al. 2018: [2k+1, D] key (and value) tables shared across heads."""

    # --randomized-positions: the offset d reads the bucket of clip(sign(d) r_|d|, -k, k), an extension
    # (Ruoss et al. randomize Transformer-XL's relative encoding, not Shaw et al.'s)
    random_positions = "distances"

    @classmethod
    def check_options(cls, options, kind=None, layers=()):
        # Each stack against its own longest sequence: an encoder of --max-source-positions 4 never
        # sees a distance beyond 3, whatever --max-target-positions allows the decoder.
        if kind is None:
            return
        limit, k = kind.max_positions, options.max_relative_position
        if kind.new_model and limit is not None and k > limit:
            source = f" ({kind.positions_flag} {limit})" if kind.positions_flag else ""
            raise SpecError(
                "--max-relative-position",
                k,
                f"{kind.flag} uses rpr, and its sequences are at most {limit} positions long{source}, "
                "so no distance ever reaches it",
                f"an integer 1 <= K <= {limit}" + (f", or a larger {kind.positions_flag}" if source else ""),
            )

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        buckets = 2 * config.options.max_relative_position + 1
        self.relative_keys = nn.Parameter(torch.empty(buckets, config.head_dim))
        nn.init.xavier_uniform_(self.relative_keys)
        if config.options.relative_values:
            self.relative_values = nn.Parameter(torch.empty(buckets, config.head_dim))
            nn.init.xavier_uniform_(self.relative_values)
        else:
            self.register_parameter("relative_values", None)

    def extra_repr(self) -> str:
        options = self.config.options
        return f"k={options.max_relative_position}, relative_values={options.relative_values}"

    def learned_values(self, causal):
        k = self.config.options.max_relative_position
        distances = tuple(range(-k, k + 1))
        # rows j - i > 0 of a causal layer are never used (they keep their initial values)
        shown = (-k, 0) if causal else (-k, 0, k)
        tables = [("key", self.relative_keys, "relative keys a^K (eq. 4)")]
        tables.append(("value", self.relative_values, "relative values a^V (eq. 3)"))
        return [
            LearnedValues(
                f"{name} table row norms",
                table.detach().double().norm(dim=-1).cpu(),
                positions=distances,
                axis="relative distance j - i (clipped at +-k)",
                shown=shown,
                note=f"{note}: L2 norm of each row",
            )
            for name, table, note in tables
            if table is not None
        ]

    def op_arguments(self, queries, keys, options):
        return (self.relative_keys, self.relative_values, self.config.options.max_relative_position), {}
