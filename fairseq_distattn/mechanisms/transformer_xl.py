"""``transformer-xl``: Transformer-XL's relative attention (Dai et al. 2019, sec. 3.3)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.transformer_xl import relative_position_scores, transformer_xl_attention
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    SELF_ATTENTION,
    option,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig, PositionTerm

# the authors' init_std: every weight of the model, u and v included, starts N(0, 0.02)
INIT_STD = 0.02


@dataclass(frozen=True)
class TransformerXLOptions:
    transformer_xl_per_layer_biases: bool = option(
        False,
        "--transformer-xl-per-layer-biases",
        "transformer-xl: a u and v per layer (untied, as the authors' TensorFlow scripts for WikiText-103 and "
        "One Billion Word set) instead of one pair per stack shared by its layers (their PyTorch code)",
        action="store_true",
    )


@register_attention(
    "transformer-xl",
    TransformerXLOptions,
    op=transformer_xl_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    description="relative attention `q_i k_j + q_i W_R R_{i-j} + u k_j + v W_R R_{i-j}`: sinusoids R of the "
    "distance, learned W_R per layer, global u, v per head (`--transformer-xl-per-layer-biases`); the "
    "segment recurrence is a training scheme, not included",
    paper="Dai et al. 2019, *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context*",
)
class TransformerXL(Mechanism):
    """Dai et al. 2019: ``W_R`` (``relative_projection``, model width to every
    head's width, no bias) per layer; ``u`` (``content_bias``) and ``v``
    (``position_bias``) ``[H, D]`` shared by the stack's transformer-xl layers
    as in the authors' PyTorch code (the first layer makes them), or per layer;
    all initialised N(0, 0.02), the authors' ``init_std``. The sinusoids are
    the model's width (heads x head size). The LM preset
    ``distattn_lm_transformer_xl_gbw`` drops the absolute position embeddings,
    as the paper does."""

    random_positions = "distances"  # --randomized-positions: R at sign(i - j) r_|i - j|

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        heads, head_dim = config.num_heads, config.head_dim
        width = heads * head_dim
        self.relative_projection = nn.Linear(width + width % 2, width, bias=False)
        nn.init.normal_(self.relative_projection.weight, std=INIT_STD)
        self.shared_across_layers = not config.options.transformer_xl_per_layer_biases and config.stack is not None

        def make_bias():
            bias = nn.Parameter(torch.empty(heads, head_dim))
            nn.init.normal_(bias, std=INIT_STD)
            return bias

        if self.shared_across_layers:
            self.content_bias = config.stack.shared(f"transformer-xl:u:{heads}x{head_dim}", make_bias)
            self.position_bias = config.stack.shared(f"transformer-xl:v:{heads}x{head_dim}", make_bias)
        else:
            self.content_bias, self.position_bias = make_bias(), make_bias()

    def extra_repr(self) -> str:
        sharing = "shared across the stack" if self.shared_across_layers else "per layer"
        return f"heads={self.config.num_heads}, u and v {sharing}"

    def learned_values(self, causal):
        return [
            LearnedValues(
                "u norm per head",
                self.content_bias.detach().double().cpu().norm(dim=-1),
                note="|u|: the query-free content term u k_j",
            ),
            LearnedValues(
                "v norm per head",
                self.position_bias.detach().double().cpu().norm(dim=-1),
                note="|v|: the query-free position term v W_R R_{i-j}",
            ),
        ]

    def position_term(self, tgt_len, src_len, causal):
        # term (d), v W_R R_{i-j}, is the only one without the query: the position term of the mechanism
        with torch.no_grad():
            heads, head_dim = self.config.num_heads, self.config.head_dim
            query = torch.zeros(1, heads, tgt_len, head_dim, dtype=torch.float64)
            weight = self.relative_projection.weight.detach().double().cpu()
            bias = self.position_bias.detach().double().cpu()
            scores = relative_position_scores(query, weight, bias, src_len, 0, head_dim**-0.5)[0]
        return PositionTerm("transformer-xl-v-term", "Transformer-XL term (d) v W_R R_{i-j} / sqrt(d)", scores)

    def op_arguments(self, queries, keys, options):
        return (self.relative_projection.weight, self.content_bias, self.position_bias), {}

    def example_distribution(self, name):
        # larger than the N(0, 0.02) start, whose position terms would be lost beside q k
        return dict(std=0.5)
