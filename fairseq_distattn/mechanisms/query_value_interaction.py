"""``qvi``: query-value interaction (Wu, Wu, Qi, Huang 2020), with the paper's ablation as an option."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.query_value_interaction import QVI_INTERACTIONS, query_aware_values, query_value_interaction_attention
from ..functional.terms import Terms
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    SELF_ATTENTION,
    one_of,
    option,
    register_attention,
)
from .base import Mechanism, MechanismConfig


@dataclass(frozen=True)
class QueryValueInteractionOptions:
    qvi_interaction: str = option(
        "gated",
        "--qvi-interaction",
        "qvi: the value function g(Q, V) (Wu et al. QVI sec. 4.3), with Q^ of eq. 7: gated (eq. 8-9), "
        "values-only V, interactions-only Q^*VW, summation Q^*VW + V (default: {default}, the paper's)",
        convert=one_of("--qvi-interaction", QVI_INTERACTIONS),
        type=str,
        choices=QVI_INTERACTIONS,
    )


@register_attention(
    # eq. 7 would mix every target query (including future ones) into each value of a cross-attention
    "qvi",
    QueryValueInteractionOptions,
    op=query_value_interaction_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    row_wise=False,  # eq. 7 mixes every query into each value: no row-wise blocks
    keeps_position_embeddings=True,  # it changes the values, not what positions the logits see
    # eq. 7's mix of the values over the queries is plain attention whose weights are never needed
    description="query-value interaction (query-aware values)",
    paper="Wu, Wu, Qi and Huang 2020, *Improving Attention Mechanism with Query-Value Interaction*",
)
class QueryValueInteraction(Mechanism):
    """Wu et al. QVI (self-attention only). W starts as the identity and the
    gate at beta = 0.5, an even mix of values and query-aware values.

    In incremental decoding, eq. 7 for a new value needs every earlier query
    and g(Q, V) of an old value never changes (it only sees queries at or
    before its position), so both are cached, batch-first.

    The sec. 4.3 variants (``--qvi-interaction``) hold only the parameters
    their g uses: W for interactions-only and summation, none for values-only."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        heads, dim = config.num_heads, config.head_dim
        self.interaction = config.options.qvi_interaction
        gated = self.interaction == "gated"
        projects = self.interaction != "values-only"
        self.value_projection = nn.Parameter(torch.eye(dim).repeat(heads, 1, 1)) if projects else None
        self.gate_weight = nn.Parameter(torch.zeros(heads, 2 * dim)) if gated else None
        self.gate_bias = nn.Parameter(torch.zeros(heads)) if gated else None

    def extra_repr(self) -> str:
        # only an ablation is named: the paper's gated g (eq. 8-9) goes without saying
        interaction = "" if self.interaction == "gated" else f", interaction={self.interaction}"
        return f"heads={self.config.num_heads}, head_dim={self.config.head_dim}{interaction}"

    def op_arguments(self, queries, keys, options):
        return (self.value_projection, self.gate_weight, self.gate_bias), {"interaction": self.interaction}

    def example_distribution(self, name):
        # W around its identity start, and a gate away from its even start, so that g mixes unevenly
        if name == "value_projection":
            return dict(mean=torch.eye(self.config.head_dim), std=0.2)
        return dict(std=0.3)

    overrides_terms_because = (
        "a decoding step's eq. 7 mixes the values with every query so far, which the op is not given: "
        "the layer caches the queries and the query-aware values it made"
    )

    def terms(self, queries, keys, options, cache=None):
        if cache is None or self.interaction == "values-only":  # g_1 = V depends on no query: nothing to cache
            return super().terms(queries, keys, options, cache)
        query, query_offset = queries["query"], options.query_offset
        seen_queries = cache.get("prev_qvi_query")
        all_queries = query if seen_queries is None else torch.cat([seen_queries, query], dim=2)
        new_values = query_aware_values(
            all_queries,
            keys["value"][:, :, query_offset:],
            self.value_projection,
            self.gate_weight,
            self.gate_bias,
            causal=options.causal,
            value_offset=query_offset,
            interaction=self.interaction,
        )
        seen_values = cache.get("prev_qvi_value")
        values = new_values if seen_values is None else torch.cat([seen_values, new_values], dim=2)
        cache["prev_qvi_query"] = all_queries
        cache["prev_qvi_value"] = values
        return Terms(value=values)
