"""``fire``: functional interpolation for relative positions (Li et al. 2024)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.fire import FIRE_INITIAL_C, FIRE_INITIAL_THRESHOLD, FIRE_MLP_WIDTH, fire_attention, fire_bias
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    EVALUATION,
    SELF_ATTENTION,
    finite_number,
    option,
    positive_integer,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig, PositionTerm


@dataclass(frozen=True)
class FireOptions:
    fire_mlp_width: int = option(
        FIRE_MLP_WIDTH,
        "--fire-mlp-width",
        "fire: hidden units of the MLP f from the normalised distance to a bias per head (default: {default}, "
        "the paper's)",
        convert=positive_integer("--fire-mlp-width"),
        type=int,
        metavar="W",
    )
    fire_threshold: float = option(
        FIRE_INITIAL_THRESHOLD,
        "--fire-threshold",
        "fire: L0, the threshold L's initial value: L = |m L0| with m learned (initially 1), and the distances "
        "of a query before position L are normalised by psi(L) (default: {default:g}, the paper's); at "
        "evaluation --model-overrides may change it, scaling the learned L",
        convert=finite_number("--fire-threshold", "L0", positive=True),
        role=EVALUATION,
        type=float,
        metavar="L0",
    )
    fire_shared_layers: bool = option(
        False,
        "--fire-shared-layers",
        "fire: one f, c and L for all the fire layers of a stack (the paper's layer-shared variant) instead of "
        "one per layer",
        action="store_true",
    )


class FireFunction(nn.Module):
    """f_theta, c and L's multiplier, as the paper's listing makes them: Linear(1, W),
    ReLU, Linear(W, H) with torch's default initialisation, c = 0.1, m = 1."""

    def __init__(self, num_heads: int, width: int):
        super().__init__()
        self.hidden = nn.Linear(1, width)
        self.output = nn.Linear(width, num_heads)
        self.c = nn.Parameter(torch.tensor(FIRE_INITIAL_C))
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))

    def arguments(self, initial_threshold: float):
        """The op's tensors: c, L = |m L0|, and the MLP's weights."""
        threshold = (self.threshold_multiplier * initial_threshold).abs()
        return (
            self.c,
            threshold,
            self.hidden.weight[:, 0],
            self.hidden.bias,
            self.output.weight,
            self.output.bias,
        )


@register_attention(
    "fire",
    FireOptions,
    op=fire_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    description="learned MLP of the distance normalised by the query's position, `f(psi(i-j) / psi(max(L, i)))`, "
    "`psi(x) = log(c x + 1)`, c and L learned (`--fire-mlp-width`, `--fire-threshold`), per layer or shared "
    "(`--fire-shared-layers`)",
    paper="Li et al. 2024, *Functional Interpolation for Relative Positions Improves Long Context Transformers*",
)
class Fire(Mechanism):
    """Li et al. 2024: f, c and L per layer, or one per stack with
    ``--fire-shared-layers`` (made by the first fire layer, held by the others
    as T5's shared table is). The normaliser depends on the query's position,
    so decoding passes it (``query_offset``) and left-padded sentences count
    from their first real token. The LM preset ``distattn_lm_fire_gbw`` drops
    the position embeddings, as the paper does."""

    random_positions = "positions"  # --randomized-positions: the bias at the sampled p_i, p_j

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options = config.options
        self.initial_threshold = options.fire_threshold
        self.shared_across_layers = options.fire_shared_layers and config.stack is not None

        def make():
            return FireFunction(config.num_heads, options.fire_mlp_width)

        if self.shared_across_layers:
            self.function = config.stack.shared(f"fire:{config.num_heads}x{options.fire_mlp_width}", make)
        else:
            self.function = make()

    def extra_repr(self) -> str:
        sharing = "shared across the stack" if self.shared_across_layers else "per layer"
        return f"heads={self.config.num_heads}, L0={self.initial_threshold:g}, {sharing}"

    def _arguments(self):
        return self.function.arguments(self.initial_threshold)

    def learned_values(self, causal):
        c, threshold = (value.detach().double().cpu().reshape(1) for value in self._arguments()[:2])
        return [
            LearnedValues("c", c, note="c: psi(x) = log(c x + 1), the distances' log scale"),
            LearnedValues("L", threshold, note="L: a query before position L normalises by psi(L)"),
        ]

    def position_term(self, tgt_len, src_len, causal):
        with torch.no_grad():
            arguments = [value.detach().double().cpu() for value in self._arguments()]
            bias = fire_bias(*arguments, tgt_len, src_len)[0]
        return PositionTerm("fire-bias", "FIRE bias f(psi(i-j) / psi(max(L, i)))", bias)

    def op_arguments(self, queries, keys, options):
        return tuple(self._arguments()), {}

    def example_distribution(self, name):
        # c near its start; L = |m L0| around 3, inside the examples' lengths, so that some queries
        # normalise by psi(L) and others by their own position; f's output O(1) whatever its width
        return {
            "function.c": dict(mean=FIRE_INITIAL_C, std=0.02),
            "function.threshold_multiplier": dict(mean=3.0 / self.initial_threshold, std=0.5 / self.initial_threshold),
            "function.output.weight": dict(std=self.function.hidden.out_features**-0.5),
        }.get(name, {})
