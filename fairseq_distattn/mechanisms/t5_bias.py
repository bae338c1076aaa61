"""``t5-bias``: T5's bucketed relative attention bias (Raffel et al. 2020)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.t5_bias import MAX_DISTANCE, NUM_BUCKETS, t5_bias_attention, t5_relative_bias
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    EVALUATION,
    SELF_ATTENTION,
    SpecError,
    option,
    positive_integer,
    register_attention,
)
from .base import Mechanism, MechanismConfig, PositionTerm


def _buckets(value, context):
    if isinstance(value, bool) or not isinstance(value, int) or value < 4:
        # the encoder's buckets are split by direction, and each half into exact and log-spaced ones
        raise SpecError(
            "--t5-bias-buckets",
            value,
            "must be an integer >= 4 (half per direction in the encoder, each half exact then log-spaced)",
            "an integer >= 4",
        )
    return value


@dataclass(frozen=True)
class T5BiasOptions:
    t5_bias_buckets: int = option(
        NUM_BUCKETS,
        "--t5-bias-buckets",
        "t5-bias: relative position buckets per head, half of them per direction in the encoder (so an even "
        "number where the encoder uses t5-bias) (default: {default}, T5's)",
        convert=_buckets,
        type=int,
        metavar="N",
    )
    t5_bias_max_distance: int = option(
        MAX_DISTANCE,
        "--t5-bias-max-distance",
        "t5-bias: distance from which every relative position shares the last bucket; the buckets between half "
        "of them and it are log-spaced (default: {default}, T5's)",
        convert=positive_integer("--t5-bias-max-distance"),
        type=int,
        metavar="M",
        role=EVALUATION,
    )
    t5_bias_per_layer: bool = option(
        False,
        "--t5-bias-per-layer",
        "t5-bias: a bias table per layer instead of T5's one table shared by the layers of each stack "
        "(encoder self-attention, decoder self-attention)",
        action="store_true",
    )


@register_attention(
    "t5-bias",
    T5BiasOptions,
    op=t5_bias_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # the fused path keeps only the [H, Tq, Tk] bias, the flex path only its table
    description="learned per-head scalar bias per relative position bucket (`--t5-bias-buckets`, exact then "
    "log-spaced up to `--t5-bias-max-distance`; bidirectional in the encoder, unidirectional in the "
    "decoder), one table per stack as in T5 or per layer (`--t5-bias-per-layer`)",
    paper="Raffel et al. 2020, *Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer*",
)
class T5Bias(Mechanism):
    """Raffel et al. 2020: a ``[buckets, H]`` table. As in T5 one table serves
    every ``t5-bias`` layer of a stack (the first such layer makes it; the
    others hold the same parameter, which ``named_parameters`` lists once and
    a checkpoint stores under each layer's name); ``--t5-bias-per-layer``
    gives each layer its own. Initialised N(0, d_model^-1/2), as T5's
    implementations do."""

    random_positions = "distances"  # --randomized-positions: its table read at sign(d) r_|d|

    @classmethod
    def check_options(cls, options, kind=None, layers=()):
        if options.t5_bias_max_distance <= options.t5_bias_buckets // 2:
            raise SpecError(
                "--t5-bias-max-distance",
                options.t5_bias_max_distance,
                f"must be larger than half of --t5-bias-buckets ({options.t5_bias_buckets}), "
                "where the log-spaced buckets start",
                f"an integer > {options.t5_bias_buckets // 2}",
            )
        if kind is None:
            return
        # T5's _relative_position_bucket halves the buckets where they are bidirectional
        # (num_buckets //= 2, one half per direction): of an odd count the last is never used.
        # The decoder's causal buckets use every one, so an odd count is fine there.
        buckets = options.t5_bias_buckets
        if kind.new_model and not kind.causal and buckets % 2:
            raise SpecError(
                "--t5-bias-buckets",
                buckets,
                f"{kind.flag} uses t5-bias, whose bidirectional buckets are split into two halves of "
                f"{buckets} // 2 = {buckets // 2} (T5's num_buckets //= 2), so bucket {buckets - 1} would never "
                "be used",
                f"an even integer >= 4 here ({buckets - 1} or {buckets + 1}); an odd one only where t5-bias "
                "is in the decoder alone, whose causal buckets use every one",
            )

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options = config.options
        self.max_distance = options.t5_bias_max_distance
        self.shared_across_layers = not options.t5_bias_per_layer and config.stack is not None

        def make_table():
            table = nn.Parameter(torch.empty(options.t5_bias_buckets, config.num_heads))
            nn.init.normal_(table, std=(config.num_heads * config.head_dim) ** -0.5)
            return table

        if self.shared_across_layers:
            key = f"t5-bias:{options.t5_bias_buckets}x{config.num_heads}"
            self.relative_attention_bias = config.stack.shared(key, make_table)
        else:
            self.relative_attention_bias = make_table()

    def extra_repr(self) -> str:
        sharing = "shared across the stack" if self.shared_across_layers else "per layer"
        return (
            f"buckets={self.relative_attention_bias.size(0)}, max_distance={self.max_distance}, "
            f"heads={self.config.num_heads}, {sharing}"
        )

    def position_term(self, tgt_len, src_len, causal):
        table = self.relative_attention_bias.detach().double().cpu()
        bias = t5_relative_bias(table, tgt_len, src_len, self.max_distance, not causal)
        return PositionTerm("t5-bias", "T5 relative attention bias b_h(bucket(j - i))", bias)

    def op_arguments(self, queries, keys, options):
        # T5: bidirectional buckets in the encoder, unidirectional in the (causal) decoder
        table = self.relative_attention_bias
        if not options.causal and table.size(0) % 2:
            # an encoder trained with an odd count before --t5-bias-buckets refused one: T5's buckets never
            # read its last row, which the op refuses to be handed; the rows before it give the same bias
            table = table[:-1]
        return (table,), {"max_distance": self.max_distance, "bidirectional": not options.causal}
