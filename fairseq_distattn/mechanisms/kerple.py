"""``kerple``: kernelized relative positional embedding (Chi et al. 2022)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.kerple import KERPLE_KERNELS, constrained, kerple_attention, kerple_bias
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    SELF_ATTENTION,
    one_of,
    option,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig, PositionTerm


@dataclass(frozen=True)
class KerpleOptions:
    kerple_kernel: str = option(
        "log",
        "--kerple-kernel",
        "kerple: the kernel of the distance, 'log' -r1 log(1 + r2 |i-j|) or 'power' -r1 |i-j|^r2 (0 < r2 <= 2), "
        "r1 and r2 learned per head, clamped to >= 0.01 as the authors' code does (default: {default}, the "
        "paper's best)",
        convert=one_of("--kerple-kernel", KERPLE_KERNELS),
        choices=KERPLE_KERNELS,
        metavar="KERNEL",
    )
    kerple_per_layer: bool = option(
        False,
        "--kerple-per-layer",
        "kerple: r1 and r2 per layer instead of one pair per head shared by the kerple layers of each stack, "
        "which is what the authors' code builds (one ParallelKerpleLog module handed to every layer) and the "
        "paper's Figure 1 describes",
        action="store_true",
        # checkpoints saved before the option existed (plugin revision f2ecd07 and earlier) hold r1, r2 per layer
        unrecorded=True,
    )


# what r1 and r2 are in each kernel, and their initial values in the authors' code: uniform in (0, 2) for the
# logarithmic kernel's scale and the power kernel's exponent, uniform in (0, 1) for the other
SYMBOLS = {
    "log": (
        "r1: the bias's scale, -r1 log(1 + r2 |i-j|)",
        "r2: the rate in the logarithm (larger: the bias turns logarithmic at shorter distances)",
    ),
    "power": ("r1: the bias's scale, -r1 |i-j|^r2", "r2: the exponent (1: ALiBi's line, learned slope)"),
}
INITIAL_RANGE = {"log": (2.0, 1.0), "power": (1.0, 2.0)}
R2_NAMES = {"log": "rate", "power": "exponent"}


@register_attention(
    "kerple",
    KerpleOptions,
    op=kerple_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # the fused path keeps only the [H, Tq, Tk] bias, the flex path only its table
    description="learned per-head kernel of the distance on the logits: `-r1 log(1 + r2 abs(i-j))` "
    "(`--kerple-kernel log`) or `-r1 abs(i-j)^r2` (`power`), r1, r2 > 0 (r2 <= 2 for power), one pair per "
    "head shared by the layers of each stack as in the authors' code, or per layer (`--kerple-per-layer`)",
    paper="Chi, Fan, Ramadge and Rudnicky 2022, *KERPLE: Kernelized Relative Positional Embedding for Length "
    "Extrapolation*",
)
class Kerple(Mechanism):
    """Chi et al. 2022: ``r1``, ``r2`` ``[H]`` (``scale``, and ``rate`` or
    ``exponent``). One pair serves every ``kerple`` layer of a stack, as in the
    authors' code (chijames/KERPLE, ``megatron/model/gpt2_model.py`` builds one
    ``ParallelKerpleLog``/``ParallelKerplePower`` before the layer loop and hands
    it to every layer; the paper's Figure 1 shares the parameters across layers):
    the first such layer makes it, the others hold the same parameters, which
    ``named_parameters`` lists once and a checkpoint stores under each layer's
    name, as t5-bias's table. ``--kerple-per-layer`` gives each layer its own
    (what this plugin built before that option existed; such checkpoints load
    as per-layer). Initialised and projected onto the constraints as in the
    authors' gpt-neox code (``megatron/mpu/layers.py``): uniform
    in (0, 2) and (0, 1)
    (the logarithmic kernel's r1, r2; the power kernel's r2, r1), and their
    data clamped to >= 0.01 (the power's r2 to <= 2) at each training forward,
    so that a step that leaves the bounds is undone before the next one uses
    them. The op clamps the values it is given too, so evaluation and a
    checkpoint saved right after such a step see the same kernel. The LM
    preset ``distattn_lm_kerple_gbw`` drops the position embeddings, as the
    paper does."""

    random_positions = "distances"  # --randomized-positions: its table read at sign(d) r_|d|

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.kernel = config.options.kerple_kernel
        self.shared_across_layers = not config.options.kerple_per_layer and config.stack is not None

        def make_parameters():
            r1_range, r2_range = INITIAL_RANGE[self.kernel]
            return (
                nn.Parameter(torch.rand(config.num_heads) * r1_range),
                nn.Parameter(torch.rand(config.num_heads) * r2_range),
            )

        if self.shared_across_layers:
            scale, r2 = config.stack.shared(f"kerple:{self.kernel}x{config.num_heads}", make_parameters)
        else:
            scale, r2 = make_parameters()
        self.scale = scale
        # r2 is a rate inside the logarithm and an exponent of the power: named by what it is, so a
        # checkpoint of one kernel does not load into the other
        setattr(self, R2_NAMES[self.kernel], r2)
        self.project_onto_constraints()

    @property
    def r2(self) -> nn.Parameter:
        return getattr(self, R2_NAMES[self.kernel])

    def extra_repr(self) -> str:
        sharing = "shared across the stack" if self.shared_across_layers else "per layer"
        return f"kernel={self.kernel}, heads={self.config.num_heads}, {sharing}"

    @torch.no_grad()
    def project_onto_constraints(self) -> None:
        # on .data, as the authors' code: a projection, not part of the graph, so neither the
        # autograd version counter nor a recomputation in backward sees it
        r1, r2 = constrained(self.scale.data, self.r2.data, self.kernel)
        self.scale.data.copy_(r1)
        self.r2.data.copy_(r2)

    def learned_values(self, causal):
        r1, r2 = constrained(self.scale.detach().double().cpu(), self.r2.detach().double().cpu(), self.kernel)
        note1, note2 = SYMBOLS[self.kernel]
        return [
            LearnedValues("r1 (scale) per head", r1, note=note1),
            LearnedValues(f"r2 ({R2_NAMES[self.kernel]}) per head", r2, note=note2),
        ]

    def position_term(self, tgt_len, src_len, causal):
        bias = kerple_bias(
            self.scale.detach().double().cpu(), self.r2.detach().double().cpu(), self.kernel, tgt_len, src_len
        )
        equation = "-r1 log(1 + r2 |i-j|)" if self.kernel == "log" else "-r1 |i-j|^r2"
        return PositionTerm(f"kerple-{self.kernel}-bias", f"KERPLE {self.kernel} kernel {equation}", bias)

    def op_arguments(self, queries, keys, options):
        return (self.scale, self.r2), {"kernel": self.kernel}

    def example_distribution(self, name):
        # r1 and r2 well inside their constraints (the uniform start may be near the 0.01 clamp)
        return dict(mean=1.0, std=0.25) if name == "scale" else dict(mean=0.8, std=0.2)

    overrides_terms_because = "r1, r2 go back into their constraints before each training call (the authors' step)"

    def terms(self, queries, keys, options, cache=None):
        if self.training:
            self.project_onto_constraints()
        return super().terms(queries, keys, options, cache)
