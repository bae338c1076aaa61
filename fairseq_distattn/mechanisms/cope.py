"""``cope``: contextual position encoding (Golovneva et al. 2024)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.cope import cope_attention, cope_positions
from ..registry import (
    CROSS_KIND,
    DECODER_SELF_KIND,
    DIFFERENT_SEQUENCES,
    ENCODER_SELF_KIND,
    option,
    positive_integer,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig, PositionTerm

COPE_POSITIONS = 64


@dataclass(frozen=True)
class CopeOptions:
    cope_max_positions: int = option(
        COPE_POSITIONS,
        "--cope-max-positions",
        "cope: learned position embeddings per layer (shared by its heads); a key's contextual position, the "
        "sum of the gates from it to the query, is clamped to one less (the authors' code uses the training "
        "length + 1) (default: {default})",
        convert=positive_integer("--cope-max-positions"),
        type=int,
        metavar="N",
    )


# why CoPE has no encoder form here
COPE_CAUSAL_ONLY = (
    "its positions count the gates from a key up to its query, a causal sum (the paper's models are decoders); "
    "two-sided, keys before and after a query would share one table of positions with no direction"
)


@register_attention(
    "cope",
    CopeOptions,
    op=cope_attention,
    kinds=frozenset({DECODER_SELF_KIND}),
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES, ENCODER_SELF_KIND: COPE_CAUSAL_ONLY},
    description="contextual positions: `p_ij = sum_{t=j..i} sigmoid(q_i k_t)`, learned embeddings interpolated at "
    "them (`--cope-max-positions`), `softmax((q_i k_j + q_i e[p_ij]) / sqrt(d))`; decoder only, no fused path "
    "(the positions need the whole row)",
    paper="Golovneva et al. 2024, *Contextual Position Encoding: Learning to Count What's Important*",
)
class Cope(Mechanism):
    """Golovneva et al. 2024: the table ``position_embeddings`` ``[head_dim,
    npos]`` per layer, shared by its heads, initialised to zeros, as the
    authors' code (facebookresearch/RAM) makes it. The LM preset
    ``distattn_lm_cope_gbw`` drops the position embeddings, as the paper
    does."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.position_embeddings = nn.Parameter(torch.zeros(config.head_dim, config.options.cope_max_positions))

    def extra_repr(self) -> str:
        return f"heads={self.config.num_heads}, positions={self.position_embeddings.size(1)}"

    def learned_values(self, causal):
        norms = self.position_embeddings.detach().double().cpu().norm(dim=0)
        positions = tuple(range(norms.numel()))
        shown = positions if len(positions) <= 8 else (0, 1, 2, len(positions) // 2, positions[-1])
        return [
            LearnedValues(
                "e[p] norm",
                norms,
                positions=positions,
                axis="contextual position p",
                symbol="p",
                shown=shown,
                note="norm of the learned embedding of each integer contextual position (0: never trained)",
            )
        ]

    def sentence_term(self, queries, keys, key_padding_mask, causal, query_offset):
        positions = cope_positions(
            queries["query"][:1],
            keys["key"][:1],
            self.position_embeddings.size(1),
            key_padding_mask=None if key_padding_mask is None else key_padding_mask[:1],
            causal=causal,
            query_offset=query_offset,
        )
        return PositionTerm(
            "cope-positions", "CoPE contextual positions p_ij = sum_{t=j..i} g_it", positions[0].double().cpu()
        )

    def op_arguments(self, queries, keys, options):
        return (self.position_embeddings,), {}

    def example_distribution(self, name):
        # a learned table: its zero start would leave the positions out of every logit
        return dict(std=0.5)
