"""``log-distance``: the toy's registration and module."""

from dataclasses import dataclass

import torch
from torch import nn

from fairseq_distattn.mechanisms.base import Mechanism, MechanismConfig, PositionTerm
from fairseq_distattn.registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    SELF_ATTENTION,
    SpecError,
    option,
    register_attention,
)

from .functional import log_distance_attention, log_distance_bias


def _positive(value, context):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise SpecError("--log-distance-init", value, "must be a positive number", "a number > 0")
    return float(value)


@dataclass(frozen=True)
class LogDistanceOptions:
    log_distance_init: float = option(
        0.5,
        "--log-distance-init",
        "log-distance: the slopes' initial value (default: {default})",
        convert=_positive,
        type=float,
        metavar="S",
    )


@register_attention(
    "log-distance",
    LogDistanceOptions,
    op=log_distance_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    description="learned per-head slope on the log of the distance",
    paper="Nobody and Toy 2099, *A Toy Mechanism*",
)
class LogDistance(Mechanism):
    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.slopes = nn.Parameter(torch.full((config.num_heads,), config.options.log_distance_init))

    def position_term(self, tgt_len, src_len, causal):
        bias = log_distance_bias(self.slopes.detach().double().cpu(), tgt_len, src_len)
        return PositionTerm("log-distance-bias", "log-distance bias -s_h log(1 + |i-j|)", bias)

    def op_arguments(self, queries, keys, options):
        return (self.slopes,), {}
