"""``da``: distance-aware attention (Wu, Wu, Huang 2021), with the paper's ablations as options."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional.distance_aware import DA_ADJUSTINGS, DA_MAPPINGS, distance_aware_attention, distance_coefficients
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    EVALUATION,
    SELF_ATTENTION,
    finite_number,
    one_of,
    option,
    register_attention,
)
from .base import LearnedValues, Mechanism, MechanismConfig, PositionTerm


@dataclass(frozen=True)
class DistanceAwareOptions:
    # the papers' ablations (examples/ablations/README.md); the defaults are the paper's own choices
    da_mapping: str = option(
        "learnable-sigmoid",
        "--da-mapping",
        "da: the map f of the weighted distance x = w|i-j| (Wu et al. 2021 sec. 4.3): learnable-sigmoid "
        "(1+e^v)/(1+e^(v-x)) (eq. 5), sigmoid 1/(1+e^-x), exponent e^x, linear kx+b, clip min(x, T) "
        "(default: {default}, the paper's)",
        convert=one_of("--da-mapping", DA_MAPPINGS),
        type=str,
        choices=DA_MAPPINGS,
    )  # Wu et al. 2021 sec. 4.3
    da_adjusting: str = option(
        "early-multiply",
        "--da-adjusting",
        "da: how f adjusts the attention (Wu et al. 2021 sec. 4.4), with S = QK^T/sqrt(d): early-multiply "
        "softmax(ReLU(QK^T) f/sqrt(d)) (eq. 6), early-add softmax(S + f), late-multiply softmax(S) f, "
        "late-add softmax(S) + f (default: {default}, the paper's)",
        convert=one_of("--da-adjusting", DA_ADJUSTINGS),
        type=str,
        choices=DA_ADJUSTINGS,
        role=EVALUATION,
    )  # sec. 4.4
    # T of the clip mapping min(x, T); the paper gives no value: Shaw et al.'s clipping distance k.
    # T bounds float32 (or half) coefficients: it must be finite there
    da_clip_threshold: float = option(
        16.0,
        "--da-clip-threshold",
        "da with --da-mapping clip: the threshold T of min(x, T) (default: {default:g})",
        convert=finite_number("--da-clip-threshold", "T", positive=True),
        only_with=("da_mapping", "clip"),
        type=float,
        metavar="T",
        role=EVALUATION,
    )


# eq. 6's ReLU(QK^T) f is a score modification, which SDPA's additive mask cannot be


@register_attention(
    "da",
    DistanceAwareOptions,
    op=distance_aware_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    # early-add is an additive bias, eq. 6 a score modification: both a table read by j - i; the late
    # adjustments change the weights, which only the eager path forms
    description="distance-aware attention: learned per-head re-scaling of the attention by the real distance",
    paper="Wu, Wu and Huang 2021, *DA-Transformer: Distance-aware Transformer*",
)
class DistanceAware(Mechanism):
    """Wu et al. 2021: per-head w and v. Both start at 0, where f = 1 for every
    distance, so training starts from ReLU attention and learns each head's
    preference for short or long distances (the paper gives no initialisation).

    The sec. 4.3-4.4 ablations (``--da-mapping``, ``--da-adjusting``) hold only
    the parameters their f uses: v for the learnable sigmoid, k and b for the
    linear map (starting at k = b = 1, so f = 1 at w = 0 as for eq. 5), none
    besides w for sigmoid, exponent and clip."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options, heads = config.options, config.num_heads
        self.mapping, self.adjusting = options.da_mapping, options.da_adjusting
        self.clip_threshold = options.da_clip_threshold if self.mapping == "clip" else None
        self.distance_weight = nn.Parameter(torch.zeros(heads))
        self.sharpness = nn.Parameter(torch.zeros(heads)) if self.mapping == "learnable-sigmoid" else None
        linear = self.mapping == "linear"
        self.linear_slope = nn.Parameter(torch.ones(heads)) if linear else None
        self.linear_intercept = nn.Parameter(torch.ones(heads)) if linear else None

    def extra_repr(self) -> str:
        # only the ablations are named: the paper's choices (eq. 5, eq. 6) go without saying
        parts = [f"heads={self.config.num_heads}"]
        if self.mapping != "learnable-sigmoid":
            parts.append(f"mapping={self.mapping}" + (f", T={self.clip_threshold:g}" if self.mapping == "clip" else ""))
        if self.adjusting != "early-multiply":
            parts.append(f"adjusting={self.adjusting}")
        return ", ".join(parts)

    def _mapping_arguments(self):
        return dict(
            mapping=self.mapping,
            linear_slope=self.linear_slope,
            linear_intercept=self.linear_intercept,
            clip_threshold=self.clip_threshold,
        )

    def coefficients(self, tgt_len: int, src_len: int, query_offset: int = 0) -> Tensor:
        """This layer's f(w_h |i-j|) per head, ``[H, Tq, Tk]``."""
        return distance_coefficients(
            self.distance_weight, self.sharpness, tgt_len, src_len, query_offset, **self._mapping_arguments()
        )

    # each per-head parameter by attribute, with the paper's symbol and what it means
    PARAMETERS = {
        "distance_weight": ("w", "w: w > 0, the head prefers long distances; w < 0, short ones (Figs. 6-7)"),
        "sharpness": ("v", "v (eq. 5): larger v, a higher upper bound 1 + e^v and a steeper curve"),
        "linear_slope": ("k", "k: slope of the linear mapping f(x) = k x + b (sec. 4.3)"),
        "linear_intercept": ("b", "b: intercept of the linear mapping f(x) = k x + b (sec. 4.3)"),
    }

    def learned_values(self, causal):
        return [
            LearnedValues(f"{symbol} per head", getattr(self, name).detach().double().cpu(), note=note)
            for name, (symbol, note) in self.PARAMETERS.items()
            if getattr(self, name) is not None
        ]

    def position_term(self, tgt_len, src_len, causal):
        with torch.no_grad():
            values = self.coefficients(tgt_len, src_len).double().cpu()
        return PositionTerm("da-coefficients", "DA coefficients f(w |i-j|) (eq. 5 or its sec. 4.3 mapping)", values)

    def op_arguments(self, queries, keys, options):
        return (self.distance_weight, self.sharpness), {"adjusting": self.adjusting, **self._mapping_arguments()}

    # the parameters' start, w = v = 0 (and k = b = 1), is f = 1 at every distance: values that weigh them
    EXAMPLE_DISTRIBUTIONS = {
        "distance_weight": dict(std=0.5),
        "sharpness": dict(mean=1.0),
        "linear_slope": dict(mean=1.0, std=0.1),
        "linear_intercept": dict(mean=1.0, std=0.1),
    }

    def example_distribution(self, name):
        return self.EXAMPLE_DISTRIBUTIONS[name]
