"""Rotary position embeddings: RoPE (Su et al. 2021, *RoFormer*), xPos (Sun et
al. 2023, *A Length-Extrapolatable Transformer*) and RoPE's context-length
scaling at evaluation time (position interpolation, Chen et al. 2023; NTK-aware
base scaling; YaRN, Peng et al. 2023).

RoFormer eq. 14-15: the query at position m and the key at position n are
rotated pairwise, pair i by the angle ``m theta_i`` with
``theta_i = base^(-2i/d)``, i = 0..d/2-1 (eq. 15, base 10000), so that
``(R_m q)^T (R_n k) = q^T R_(n-m) k`` depends on the offset alone (eq. 16).
This module pairs neighbouring dimensions ``(2i, 2i+1)`` as the paper does
(eq. 14), one complex multiplication per pair (as Meta's LLaMA code does it,
several times faster than rotating two halves on CPU). GPT-NeoX and Hugging
Face's LLaMA pair dimension ``i`` with ``i + d/2`` instead: the same rotation
of the same vectors with their dimensions permuted, so a model in that layout
equals one in this layout whose query and key projections have their output
rows permuted accordingly (the tests check this). Partial rotary (GPT-NeoX's ``rotary_pct``): only the first
``d = 2 floor(fraction * head_dim / 2)`` dimensions of each head are rotated,
the rest pass through.

xPos (Sun et al. 2023 sec. 3.2 and eq. 5): RoPE with the per-pair scale
``zeta_i = (2i/d + gamma) / (1 + gamma)``, gamma = 0.4, the query at position
n multiplied by ``zeta_i^((n - c) / scale_base)`` and the key at position m by
``zeta_i^(-(m - c) / scale_base)``, so that their product decays as
``zeta_i^((n - m) / scale_base)`` with the distance for keys before the
query, whatever the centre c (``xpos_centre``). The paper counts from 0
(c = 0), where the key scale ``zeta_0^(-m / scale_base)`` leaves float32 once
``m / scale_base`` passes about 70 (float16 at about 9). A centre halves the
largest exponent a query or key carries, but it must stay FIXED over the calls
that build one sequence: a key is cached already scaled, so its scale may not
depend on how long the sequence has grown since. :func:`rotary_query_key`,
which rotates the keys a cache keeps, therefore takes a constant ``xpos_centre``
(default 0: the paper's positions; a caller that knows the longest sequence L
passes about ``(L - 1) / 2``), and :func:`rotary_attention`, which rotates every
key in each call and caches none, centres on the middle of the positions it
rotates unless given one. The authors' torchscale code (``XPOS``) instead
centres on the middle of each call's length, so its cached keys would have to
be rescaled as the sequence grows (their incremental path offsets the
positions instead). The logits are the same in exact arithmetic; only the
rounding and the range differ.

What no centre changes: the logit of a query at n with a key at m carries
``zeta_0^((n - m) / scale_base)``, and the causal mask hides future keys
(m > n) only after ``QK^T`` is formed, so a sequence of L positions forms
factors up to ``zeta_0^(-(L - 1) / scale_base)``. A scale base for which that
leaves float32 (``(L - 1) ln(1 / zeta_0) / scale_base`` above
:data:`XPOS_EXPONENT_LIMIT`, i.e. ``scale_base < (L - 1) / 69.7``) is refused
(:func:`xpos_range_problem`), as is a centre that puts a single scale beyond
it. In float16 the same products leave its range much earlier (ln 65504 =
11.1): the fused causal path, which never adds a mask to a future logit, stays
finite, and so does the weights path, which forms the logits in float32
(:func:`attention.scores`); the fused paths that add a mask (key padding, a
block of queries after cached keys) need float32 or bfloat16 there. The
blockwise causal attention the paper uses at inference is a way to run the
model, not part of the attention, and is not applied here.

Argument checks: every argument the command line's flags set is checked by one
predicate here (``*_problem``, returning a :class:`RotaryProblem` or None), which the
functional ops raise as a ValueError naming the argument and the mechanism's
flag converters and option checks raise as a SpecError naming the flag.

Context-length scaling (for a model trained on sequences of ``L`` tokens
evaluated on longer ones, ``s = --rope-scaling-factor``, typically
``L_eval / L``):

- ``linear`` (position interpolation, Chen et al. 2023 eq. 3): positions
  times ``1/s``, i.e. every ``theta_i`` divided by s;
- ``ntk`` ("NTK-aware" scaling, as in Peng et al. 2023 sec. 3.1 eq. 16):
  the base becomes ``base * s^(d/(d-2))``;
- ``yarn``: YaRN as its authors' code computes it (jquesnelle/yarn,
  ``LlamaYaRNScaledRotaryEmbedding``; Hugging Face's ``rope_type="yarn"``,
  ``_compute_yarn_parameters``, is the same arithmetic, and it is what vLLM and
  most users run). Pair i keeps its frequency (extrapolation) below the
  correction dimension of ``beta_fast = 32`` rotations over the training length
  L, is interpolated (``theta_i / s``) above that of ``beta_slow = 1``, and
  ramps linearly over the pair index between the two, the correction dimension
  of b rotations being ``d ln(L / (2 pi b)) / (2 ln base)``, floored (fast) and
  ceiled (slow) and kept within [0, d - 1]; the cos and sin of the rotation are
  multiplied by ``mscale = 0.1 ln(s) + 1``, so the rotated dimensions'
  share of each logit is multiplied by ``mscale^2`` (eq. 22's ``1/t``) and the
  dimensions that partial rotary passes through are not;
- ``yarn-paper``: the paper's formulas (Peng et al. 2023 sec. 3.2-3.4, eq.
  17-22): the ramp is continuous in the ratio ``r_i = L / lambda_i`` of the
  training length to the wavelength ``lambda_i = 2 pi / theta_i``,
  ``h(theta_i) = (1 - gamma(r_i)) theta_i / s + gamma(r_i) theta_i`` with
  ``gamma(r) = (r - alpha) / (beta - alpha)`` clipped to [0, 1], alpha = 1,
  beta = 32, and the whole logit is divided by the temperature t,
  ``sqrt(1/t) = 0.1 ln(s) + 1``. The two agree outside the ramp and differ
  within it, where the authors' rounded correction dimensions and index ramp
  give other frequencies than the continuous one.

Angles and scales are formed in float32 (float64 for float64 inputs): the
products of positions and frequencies lose their low digits in half
precision. Positions count from each sequence's first real (non-padding)
key: a left-padded sentence gets the angles it gets alone.
"""

import functools
import math
from typing import Any, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..registry import FLOAT32_MAX, SpecError, finite_number, is_integer
from .attention import attention_op
from .masking import position_tensor, sequence_positions
from .randomized_positions import map_positions
from .rotary_scaling import (
    llama3_frequencies,
    longrope_default_attention_factor,
    longrope_theta,
    longrope_uses_long_factors,
    partial_frequencies,
)
from .terms import Terms

ROPE_BASE = 10000.0
XPOS_GAMMA = 0.4
XPOS_SCALE_BASE = 512.0
SCALING_MODES = ("none", "linear", "ntk", "yarn", "yarn-paper", "llama3", "longrope")
YARN_MODES = ("yarn", "yarn-paper")
# the scalings that read the training length (--rope-original-length)
LENGTH_MODES = (*YARN_MODES, "llama3", "longrope")
# Llama 3.1's low and high frequency factors (its published rope_scaling)
LLAMA3_LOW_FREQUENCY_FACTOR, LLAMA3_HIGH_FREQUENCY_FACTOR = 1.0, 4.0
YARN_ALPHA, YARN_BETA = 1.0, 32.0  # the paper's alpha, beta: its code's beta_slow, beta_fast
# xPos's smallest per-pair scale zeta_0 = gamma / (1 + gamma) = 2/7, whose powers are the extreme factors
XPOS_ZETA_MIN = XPOS_GAMMA / (1 + XPOS_GAMMA)
# The largest |ln| of a factor that float32 holds as a normal number both ways: e^x below its largest
# value (ln 3.40e38 = 88.72) and e^-x above its smallest normal (ln 2^-126 = -87.34).
XPOS_EXPONENT_LIMIT = min(math.log(FLOAT32_MAX), 126 * math.log(2))


class RotaryProblem(NamedTuple):
    """Why one argument cannot work: ``argument`` is the functional op's name for it (the
    mechanism maps it to its flag), ``problem`` and ``allowed`` the two halves of the message."""

    argument: str
    value: Any
    problem: str
    allowed: str

    def error(self) -> ValueError:
        """The functional op's error: a ValueError naming the argument."""
        return ValueError(f"{self.argument} {self.problem}, got {self.value!r}; allowed: {self.allowed}")


# How the messages name the arguments: the functional ops' names (the default); the mechanism
# passes its flags (``{"scaling": "--rope-scaling", ...}``).
ARGUMENT_NAMES: Mapping[str, str] = {}


def _named(names: Mapping[str, str], argument: str, value=None) -> str:
    """``argument`` as ``names`` spell it, with ``value`` where given: ``scaling='none'`` or ``--rope-scaling none``."""
    name = names.get(argument, argument)
    if value is None:
        return name
    return f"{name} {value}" if name.startswith("--") else f"{name}={value!r}"


def _listed(words, last: str = "and") -> str:
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def base_problem(base) -> Optional[RotaryProblem]:
    """``base`` (theta_i = base^(-2i/d)) unless a finite positive number in float32."""
    try:
        finite_number("base", "base", positive=True)(base, None)
    except SpecError as error:
        return RotaryProblem("base", base, error.problem, error.allowed)
    return None


def fraction_problem(fraction, head_dim: Optional[int] = None) -> Optional[RotaryProblem]:
    """``fraction`` unless a share 0 < f <= 1 that rotates at least one pair of ``head_dim`` (where given)."""
    if not _is_number(fraction) or not 0 < fraction <= 1:
        return RotaryProblem("fraction", fraction, "must be a share of the head's dimensions", "a number 0 < f <= 1")
    if head_dim is not None and rotary_dims(head_dim, fraction) < 2:
        return RotaryProblem(
            "fraction",
            fraction,
            f"rotates no pair of the {head_dim} dimensions of each head",
            f"a number >= {2 / head_dim:g}",
        )
    return None


def scaling_problem(scaling) -> Optional[RotaryProblem]:
    if scaling not in SCALING_MODES:
        return RotaryProblem("scaling", scaling, "unknown choice", ", ".join(SCALING_MODES))
    return None


def scaling_factor_problem(scaling_factor) -> Optional[RotaryProblem]:
    if not _is_number(scaling_factor) or not math.isfinite(scaling_factor) or scaling_factor < 1:
        return RotaryProblem(
            "scaling_factor",
            scaling_factor,
            "must be a finite number >= 1 (the evaluation length over the training length)",
            "a number s >= 1",
        )
    return None


def original_length_problem(original_length) -> Optional[RotaryProblem]:
    if not is_integer(original_length) or original_length < 0:
        return RotaryProblem(
            "original_length", original_length, "must be a length in tokens", "an integer >= 0 (0: unset)"
        )
    return None


def scaling_combination_problem(
    scaling: str, scaling_factor: float, original_length: int, names: Mapping[str, str] = ARGUMENT_NAMES
) -> Optional[RotaryProblem]:
    """What the scaling arguments cannot do together (each valid alone)."""
    if scaling == "none" and scaling_factor != 1.0:
        return RotaryProblem(
            "scaling_factor",
            scaling_factor,
            f"scales nothing with {_named(names, 'scaling', 'none')}",
            f"1 (the default), or name a {_named(names, 'scaling')} mode",
        )
    reads_length = scaling in LENGTH_MODES
    if reads_length and original_length < 1:
        return RotaryProblem(
            "original_length",
            original_length,
            f"{_named(names, 'scaling', scaling)} scales the frequencies by the training length, which must be given",
            "the length in tokens the model was trained on (--tokens-per-sample of its training)",
        )
    if not reads_length and original_length:
        return RotaryProblem(
            "original_length",
            original_length,
            f"has no effect with {_named(names, 'scaling', scaling)}: only {_listed(LENGTH_MODES)} read it",
            f"0 (the default), or {_named(names, 'scaling')} {_listed(LENGTH_MODES, 'or')}",
        )
    return None


def frequency_factors_problem(low_frequency_factor, high_frequency_factor) -> Optional[RotaryProblem]:
    """Llama 3's band edges: numbers 0 < low < high (read by llama3 only)."""
    for argument, value in (
        ("low_frequency_factor", low_frequency_factor),
        ("high_frequency_factor", high_frequency_factor),
    ):
        if not _is_number(value) or not math.isfinite(value) or value <= 0:
            return RotaryProblem(argument, value, "must be a finite number > 0", "a number > 0")
    if high_frequency_factor <= low_frequency_factor:
        return RotaryProblem(
            "high_frequency_factor",
            high_frequency_factor,
            f"must exceed the low frequency factor {low_frequency_factor:g} (the band between them is blended)",
            f"a number > {low_frequency_factor:g}",
        )
    return None


def kept_frequencies_problem(kept_frequencies) -> Optional[RotaryProblem]:
    if not _is_number(kept_frequencies) or not 0 <= kept_frequencies <= 1:
        return RotaryProblem(
            "kept_frequencies",
            kept_frequencies,
            "must be the share of the frequencies kept, 0 <= p <= 1 (p-RoPE: the lowest ones are removed)",
            "a number 0 <= p <= 1 (1: RoPE, 0: NoPE)",
        )
    return None


def _factor_list_problem(argument: str, factors, pairs: Optional[int]) -> Optional[RotaryProblem]:
    numbers = isinstance(factors, (tuple, list)) and all(_is_number(f) and math.isfinite(f) for f in factors)
    if not numbers or not factors or not all(f > 0 for f in factors):
        return RotaryProblem(
            argument, factors, "must list LongRoPE's per-pair factors, finite numbers > 0", "a list of numbers > 0"
        )
    if pairs is not None and len(factors) != pairs:
        return RotaryProblem(
            argument,
            factors,
            f"must hold one factor per rotated pair: {pairs} (the rotated dimensions over 2), not {len(factors)}",
            f"{pairs} numbers > 0",
        )
    return None


def longrope_problem(
    scaling: str, short_factor, long_factor, attention_factor, pairs: Optional[int] = None, names=ARGUMENT_NAMES
) -> Optional[RotaryProblem]:
    """LongRoPE's arguments: with ``scaling`` longrope, both factor lists, one factor per
    rotated pair (``pairs``, where known), and an attention factor >= 0 (0: HF's default);
    without it, none of them (they would be ignored)."""
    if not _is_number(attention_factor) or not math.isfinite(attention_factor) or attention_factor < 0:
        return RotaryProblem(
            "attention_factor", attention_factor, "must be a finite number >= 0", "a number > 0, or 0 for HF's default"
        )
    if scaling != "longrope":
        for argument, value in (("short_factor", short_factor), ("long_factor", long_factor)):
            if value:
                return RotaryProblem(
                    argument,
                    value,
                    f"has no effect with {_named(names, 'scaling', scaling)}: only longrope reads it",
                    f"no factors, or {_named(names, 'scaling', 'longrope')}",
                )
        if attention_factor:
            return RotaryProblem(
                "attention_factor",
                attention_factor,
                f"has no effect with {_named(names, 'scaling', scaling)}: only longrope reads it",
                f"0 (the default), or {_named(names, 'scaling', 'longrope')}",
            )
        return None
    return _factor_list_problem("short_factor", short_factor, pairs) or _factor_list_problem(
        "long_factor", long_factor, pairs
    )


def xpos_scale_base_problem(xpos_scale_base) -> Optional[RotaryProblem]:
    """``xpos_scale_base`` unless a finite positive number in float32 (whatever the length)."""
    try:
        finite_number("xpos_scale_base", "scale_base", positive=True)(xpos_scale_base, None)
    except SpecError as error:
        return RotaryProblem("xpos_scale_base", xpos_scale_base, error.problem, error.allowed)
    return None


def xpos_exponent(distance: float, xpos_scale_base: float) -> float:
    """``|ln zeta_0^(distance / scale_base)|``: the largest |ln| of xPos's factor over ``distance`` positions."""
    return abs(distance) * math.log(1 / XPOS_ZETA_MIN) / xpos_scale_base


def smallest_xpos_scale_base(positions: int) -> float:
    """The smallest scale base (rounded up to 2 decimals) whose factors over ``positions`` positions
    stay within :data:`XPOS_EXPONENT_LIMIT`."""
    needed = xpos_exponent(max(positions - 1, 0), 1.0) / XPOS_EXPONENT_LIMIT
    return math.ceil(needed * 100) / 100


def xpos_range_problem(
    xpos_scale_base: float,
    positions: int,
    xpos_centre: float = 0.0,
    names: Mapping[str, str] = ARGUMENT_NAMES,
    positions_note: str = "",
) -> Optional[RotaryProblem]:
    """Whether xPos's factors leave float32 on sequences of ``positions`` positions (0 to
    positions - 1): the logits' ``zeta_0^((n - m) / scale_base)`` over the longest distance,
    formed for the future keys the causal mask hides too, whatever the centre, and each
    query's and key's own ``zeta_0^(+-(p - c) / scale_base)`` about ``xpos_centre`` c.
    ``positions_note`` says where the length comes from (a flag)."""
    if positions < 2:
        return None
    exponent = xpos_exponent(positions - 1, xpos_scale_base)
    if exponent > XPOS_EXPONENT_LIMIT:
        return RotaryProblem(
            "xpos_scale_base",
            xpos_scale_base,
            f"makes xPos's factor zeta_0^((n-m)/scale_base) reach e^{exponent:.4g} over the {positions} "
            f"positions{positions_note}, beyond float32's e^{XPOS_EXPONENT_LIMIT:.4g} (the causal mask hides "
            "future keys only after their logits are formed, so no centre helps)",
            f"a scale base >= {smallest_xpos_scale_base(positions):g} at this length",
        )
    reach = max(abs(xpos_centre), abs(positions - 1 - xpos_centre))
    if xpos_exponent(reach, xpos_scale_base) > XPOS_EXPONENT_LIMIT:
        return RotaryProblem(
            "xpos_centre",
            xpos_centre,
            f"lies {reach:g} positions from the farthest of the {positions} positions, so that xPos's scale of a "
            f"query or key there is e^+-{xpos_exponent(reach, xpos_scale_base):.4g}, beyond float32",
            f"a centre between 0 and {positions - 1}, such as {(positions - 1) / 2:g}",
        )
    return None


class RotaryConfiguration(NamedTuple):
    """One call's rotation arguments, hashable (the turns of a configuration are kept:
    :func:`_unpadded_turns`); ``length`` is the sequence length LongRoPE's switch reads."""

    dims: int
    base: float
    scaling: str
    scaling_factor: float
    original_length: int
    low_frequency_factor: float
    high_frequency_factor: float
    kept_frequencies: float
    short_factor: Tuple[float, ...]
    long_factor: Tuple[float, ...]
    attention_factor: float
    xpos_scale_base: Optional[float]
    xpos_centre: float

    def problem(self, head_dim: int) -> Optional[RotaryProblem]:
        """What the command line would refuse in these arguments (the same predicates)."""
        for problem in (
            base_problem(self.base),
            scaling_problem(self.scaling),
            scaling_factor_problem(self.scaling_factor),
            original_length_problem(self.original_length),
            kept_frequencies_problem(self.kept_frequencies),
        ):
            if problem is not None:
                return problem
        problem = scaling_combination_problem(self.scaling, self.scaling_factor, self.original_length)
        problem = problem or frequency_factors_problem(self.low_frequency_factor, self.high_frequency_factor)
        problem = problem or longrope_problem(
            self.scaling, self.short_factor, self.long_factor, self.attention_factor, self.dims // 2
        )
        if problem is None and self.xpos_scale_base is not None:
            problem = xpos_scale_base_problem(self.xpos_scale_base)
            if problem is None and (not _is_number(self.xpos_centre) or not math.isfinite(self.xpos_centre)):
                problem = RotaryProblem(
                    "xpos_centre", self.xpos_centre, "must be a finite number", "a position, such as 0"
                )
        return problem

    def uses_long_factors(self, length: int) -> bool:
        """LongRoPE's switch at sequence length ``length`` (False for every other scaling)."""
        return self.scaling == "longrope" and longrope_uses_long_factors(max(length, 1), self.original_length)

    def logit_factor(self) -> float:
        """What the rotated dimensions' share of each logit (the whole logit: ``yarn-paper``) is
        multiplied by: YaRN's ``1/t = (0.1 ln s + 1)^2`` (eq. 22), the square of LongRoPE's
        attention factor (HF multiplies cos and sin by it), else 1."""
        if self.scaling in YARN_MODES:
            return (0.1 * math.log(self.scaling_factor) + 1) ** 2
        if self.scaling == "longrope":
            factor = self.attention_factor or longrope_default_attention_factor(
                self.scaling_factor, self.original_length
            )
            return factor**2
        return 1.0


def check_rotary_arguments(
    head_dim: int,
    positions: int,
    *,
    base=ROPE_BASE,
    fraction=1.0,
    scaling="none",
    scaling_factor=1.0,
    original_length=0,
    low_frequency_factor=LLAMA3_LOW_FREQUENCY_FACTOR,
    high_frequency_factor=LLAMA3_HIGH_FREQUENCY_FACTOR,
    kept_frequencies=1.0,
    short_factor=(),
    long_factor=(),
    attention_factor=0.0,
    xpos_scale_base=None,
    xpos_centre=0.0,
) -> RotaryConfiguration:
    """The call's :class:`RotaryConfiguration`; raise a ValueError naming the argument for
    what the command line refuses (the same predicates), and for an xPos scale base or
    centre whose factors leave float32 on ``positions`` positions (:func:`xpos_range_problem`)."""
    fields = (
        base,
        scaling,
        scaling_factor,
        original_length,
        low_frequency_factor,
        high_frequency_factor,
        kept_frequencies,
        tuple(short_factor) if isinstance(short_factor, list) else short_factor,
        tuple(long_factor) if isinstance(long_factor, list) else long_factor,
        attention_factor,
        xpos_scale_base,
        xpos_centre,
    )
    try:  # every decoding step of every layer asks again: kept
        configuration = _configuration(head_dim, fraction, fields)
    except TypeError:  # an unhashable value: checked uncached
        configuration = _configuration.__wrapped__(head_dim, fraction, fields)
    if configuration.xpos_scale_base is not None:
        problem = xpos_range_problem(configuration.xpos_scale_base, positions, configuration.xpos_centre)
        if problem is not None:
            raise problem.error()
    return configuration


@functools.lru_cache(maxsize=256)
def _configuration(head_dim, fraction, fields: tuple) -> RotaryConfiguration:
    """The checked configuration of ``fields`` (:class:`RotaryConfiguration`'s after ``dims``),
    its numbers as Python floats and ints."""
    problem = fraction_problem(fraction, head_dim)
    if problem is not None:
        raise problem.error()
    configuration = RotaryConfiguration(rotary_dims(head_dim, fraction), *fields)
    problem = configuration.problem(head_dim)
    if problem is not None:
        raise problem.error()
    c = configuration
    return c._replace(
        base=float(c.base),
        scaling_factor=float(c.scaling_factor),
        original_length=int(c.original_length),
        low_frequency_factor=float(c.low_frequency_factor),
        high_frequency_factor=float(c.high_frequency_factor),
        kept_frequencies=float(c.kept_frequencies),
        short_factor=tuple(float(f) for f in c.short_factor),
        long_factor=tuple(float(f) for f in c.long_factor),
        attention_factor=float(c.attention_factor),
        xpos_scale_base=None if c.xpos_scale_base is None else float(c.xpos_scale_base),
        xpos_centre=0.0 if c.xpos_scale_base is None else float(c.xpos_centre),
    )


def rotary_dims(head_dim: int, fraction: float) -> int:
    """How many of a head's ``head_dim`` dimensions are rotated: the even
    number ``2 floor(fraction * head_dim / 2)`` (GPT-NeoX's partial rotary)."""
    return 2 * int(fraction * head_dim / 2 + 1e-9)


def angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other floating dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def yarn_correction_range(dims: int, base: float, original_length: int) -> Tuple[int, int]:
    """The authors' ``_yarn_find_correction_range(beta_fast, beta_slow, ...)``: the pair
    indices between which YaRN ramps from the original frequencies to interpolated ones."""

    def correction_dim(rotations: float) -> float:
        return dims * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(correction_dim(YARN_BETA))
    high = math.ceil(correction_dim(YARN_ALPHA))
    return max(low, 0), min(high, dims - 1)


def _yarn_interpolated_share(theta: Tensor, dims: int, base: float, scaling: str, original_length: int) -> Tensor:
    """Per pair, the weight of the interpolated frequency ``theta / s`` (the rest keeps ``theta``)."""
    if scaling == "yarn-paper":
        ratio = original_length * theta / (2 * math.pi)
        return 1 - ((ratio - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
    low, high = yarn_correction_range(dims, base, original_length)
    index = torch.arange(dims // 2, device=theta.device, dtype=torch.float64)
    return ((index - low) / (high - low if high != low else 0.001)).clamp(0.0, 1.0)


def longrope_initial_factors(dims: int, base: float, scale: float, original_length: int) -> Tuple[float, ...]:
    """The per-pair factors LongRoPE's search starts from, for a context-length scale
    ``scale`` over ``original_length``: ``f_i = s ramp_i + (1 - ramp_i)``, ``ramp`` YaRN's
    interpolated share over the correction range of 32 and 1 rotations (its llama settings).
    microsoft/LongRoPE at c9e56aa, ``evolution/search.py`` ``main`` (the factors "generated
    by YaRN" when no ``--init-factors`` is given: ``length_scale * (1 - mask) + mask``, the
    mask ``rope/yarn.py``'s ``inv_freq_mask``). LongRoPE's published factors are what its
    evolutionary search finds from these (``evolution/algorithms``: populations of 64 rated
    by perplexity): these are its generation 0, the search not run."""
    if not _is_number(scale) or not math.isfinite(scale) or scale < 1:
        raise ValueError(f"scale must be a finite number >= 1, got {scale!r}")
    interpolated = _yarn_interpolated_share(torch.zeros(dims // 2), dims, float(base), "yarn", original_length)
    return tuple(float(f) for f in scale * interpolated + (1 - interpolated))


def rotary_frequencies(
    dims: int,
    base: float = ROPE_BASE,
    scaling: str = "none",
    scaling_factor: float = 1.0,
    original_length: int = 0,
    *,
    low_frequency_factor: float = LLAMA3_LOW_FREQUENCY_FACTOR,
    high_frequency_factor: float = LLAMA3_HIGH_FREQUENCY_FACTOR,
    kept_frequencies: float = 1.0,
    short_factor: Tuple[float, ...] = (),
    long_factor: Tuple[float, ...] = (),
    attention_factor: float = 0.0,
    length: int = 1,
    device=None,
    dtype: torch.dtype = torch.float64,
) -> Tuple[Tensor, float]:
    """``(theta [dims/2], logit_factor)``: each pair's angle per position after
    ``scaling`` (one of :data:`SCALING_MODES`, by ``scaling_factor`` s >= 1;
    ``yarn``, ``llama3`` and ``longrope`` need ``original_length``, the training length L;
    ``llama3`` blends between its ``low_frequency_factor`` and ``high_frequency_factor``
    bands, :func:`rotary_scaling.llama3_frequencies`; ``longrope`` divides by its
    ``long_factor`` on sequences of ``length`` > L, else by its ``short_factor``,
    :func:`rotary_scaling.longrope_theta`) with only the highest ``kept_frequencies``
    share of them kept (p-RoPE, :func:`rotary_scaling.partial_frequencies`), and the
    factor the rotated share of every logit is multiplied by
    (:meth:`RotaryConfiguration.logit_factor`)."""
    if dims < 2 or dims % 2:
        raise ValueError(f"the rotated dimensions must be an even number >= 2, got {dims}")
    configuration = check_rotary_arguments(
        dims,
        length,
        base=base,
        scaling=scaling,
        scaling_factor=scaling_factor,
        original_length=original_length,
        low_frequency_factor=low_frequency_factor,
        high_frequency_factor=high_frequency_factor,
        kept_frequencies=kept_frequencies,
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=attention_factor,
    )
    return _frequencies(configuration, configuration.uses_long_factors(length), device, dtype)


def _frequencies(c: RotaryConfiguration, long_factors: bool, device, dtype) -> Tuple[Tensor, float]:
    base = c.base
    if c.scaling == "ntk":
        base = base * c.scaling_factor ** (c.dims / (c.dims - 2))
    exponents = torch.arange(0, c.dims, 2, device=device, dtype=torch.float64) / c.dims
    theta = torch.as_tensor(base, dtype=torch.float64).pow(-exponents)
    if c.scaling == "linear":
        theta = theta / c.scaling_factor
    elif c.scaling in YARN_MODES:
        interpolated = _yarn_interpolated_share(theta, c.dims, float(base), c.scaling, c.original_length)
        theta = interpolated * theta / c.scaling_factor + (1 - interpolated) * theta
    elif c.scaling == "llama3":
        theta = llama3_frequencies(
            c.dims,
            base,
            c.scaling_factor,
            c.low_frequency_factor,
            c.high_frequency_factor,
            c.original_length,
            device=device,
        )
    elif c.scaling == "longrope":
        theta = longrope_theta(c.dims, base, c.long_factor if long_factors else c.short_factor, device=device)
    if c.kept_frequencies != 1.0:
        theta = partial_frequencies(theta, c.kept_frequencies)
    return theta.to(dtype), c.logit_factor()


def xpos_zeta(dims: int, *, device=None, dtype: torch.dtype = torch.float64) -> Tensor:
    """xPos's ``zeta_i = (2i/d + gamma)/(1 + gamma)`` per rotated pair ``[dims/2]``."""
    exponents = torch.arange(0, dims, 2, device=device, dtype=torch.float64) / dims
    return ((exponents + XPOS_GAMMA) / (1 + XPOS_GAMMA)).to(dtype)


def turns(positions: Tensor, theta: Tensor, log_scale: Optional[Tensor] = None, centre: float = 0.0) -> Tensor:
    """``e^(i positions theta_j)`` per pair ``[B|1, 1, T, len(theta)]`` (complex, in the dtype of
    ``theta``), times ``exp((positions - centre) * log_scale_j)`` where given (xPos:
    ``+-log(zeta_j)/scale_base`` about a fixed ``centre``, exponentiated once rather than a rounded
    ``zeta^(1/scale_base)`` raised to the position; in the dtype of ``theta``, float32 for half inputs)."""
    places = positions.to(theta.dtype)[:, None, :, None]
    angles = places * theta
    magnitude = torch.ones_like(angles) if log_scale is None else ((places - centre) * log_scale).exp()
    return torch.polar(magnitude, angles)


def apply_turns(x: Tensor, turn: Tensor) -> Tensor:
    """``x`` ``[B, H, T, D]`` with pair ``(2j, 2j+1)`` of its first ``2 * turn.size(-1)``
    dimensions multiplied, as a complex number, by ``turn[..., j]`` (the rest pass through);
    computed in the turns' precision, returned in x's dtype."""
    half = turn.size(-1)
    whole = x.size(-1) == 2 * half
    # a decoding step rotates a few rows in every layer: no conversion, slice or copy it does not need
    head = x if whole else x[..., : 2 * half]
    precision = torch.float64 if turn.dtype == torch.complex128 else torch.float32
    if head.dtype != precision:
        head = head.to(precision)
    try:
        pairs = torch.view_as_complex(head.view(*head.shape[:-1], half, 2))
    except RuntimeError:  # view_as_complex needs whole (real, imaginary) pairs: even strides and offset
        pairs = torch.view_as_complex(head.contiguous().view(*head.shape[:-1], half, 2))
    rotated = torch.view_as_real(pairs * turn).flatten(-2)
    if rotated.dtype != x.dtype:
        rotated = rotated.to(x.dtype)
    if whole:
        return rotated
    return torch.cat((rotated, x[..., 2 * half :]), dim=-1)


def rotate(
    x: Tensor, positions: Tensor, theta: Tensor, log_scale: Optional[Tensor] = None, centre: float = 0.0
) -> Tensor:
    """``x`` ``[B, H, T, D]`` with its first ``2 * len(theta)`` dimensions rotated
    (pair ``(2i, 2i+1)`` by ``positions * theta_i``), each pair then multiplied by
    ``exp((positions - centre) * log_scale_i)`` where given (:func:`turns`); ``positions``
    ``[B or 1, T]``. Computed in :func:`angle_dtype`, returned in x's."""
    compute = angle_dtype(x.dtype)
    scale = None if log_scale is None else log_scale.to(compute)
    return apply_turns(x, turns(positions, theta.to(compute), scale, centre))


def _rotation(configuration: RotaryConfiguration, long_factors: bool, device, compute):
    """(theta, query log-scale, key log-scale) of one configuration."""
    theta, _ = _frequencies(configuration, long_factors, device, compute)
    if configuration.xpos_scale_base is None:
        return theta, None, None
    query_scale = xpos_zeta(configuration.dims, device=device, dtype=compute).log() / configuration.xpos_scale_base
    return theta, query_scale, -query_scale


@position_tensor
def _unpadded_turns(length, _, offset, side, configuration, long_factors, device, compute) -> Tensor:
    # a decoding step asks for the same turns in every layer: kept (see masking.position_tensor)
    theta, query_scale, key_scale = _rotation(configuration, long_factors, device, compute)
    positions = torch.arange(offset, offset + length, device=device)[None]
    return turns(positions, theta, query_scale if side == "query" else key_scale, configuration.xpos_centre)


def rotary_query_key(
    q: Tensor,
    k: Tensor,
    *,
    base: float = ROPE_BASE,
    fraction: float = 1.0,
    scaling: str = "none",
    scaling_factor: float = 1.0,
    original_length: int = 0,
    low_frequency_factor: float = LLAMA3_LOW_FREQUENCY_FACTOR,
    high_frequency_factor: float = LLAMA3_HIGH_FREQUENCY_FACTOR,
    kept_frequencies: float = 1.0,
    short_factor: Tuple[float, ...] = (),
    long_factor: Tuple[float, ...] = (),
    attention_factor: float = 0.0,
    xpos_scale_base: Optional[float] = None,
    xpos_centre: float = 0.0,
    key_padding_mask: Optional[Tensor] = None,
    query_offset: int = 0,
    key_offset: int = 0,
    position_map: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Queries and keys of self-attention rotated at their positions: query row i
    sits at index ``query_offset + i`` and key j at ``key_offset + j`` of the
    sequence whose padding ``key_padding_mask`` ``[B, key_offset + Tk]`` marks
    (positions count from its first real key, :func:`sequence_positions`).
    xPos with ``xpos_scale_base``, its scales centred on the constant position
    ``xpos_centre`` (0: the paper's; keys cached by one call and queried by a later one
    must have been rotated with the same centre). The logit factor of YaRN and LongRoPE
    (:meth:`RotaryConfiguration.logit_factor`) goes on the queries: on their rotated
    dimensions (``yarn`` and ``longrope``, as their code scales cos and sin) or on all of
    them (``yarn-paper``, the paper's temperature on the whole logit). LongRoPE's factor
    lists switch on the length of the call's sequence, ``max(query_offset + Tq, key_offset
    + Tk)``: HF's ``max(position_ids) + 1`` wherever the batch's longest sequence has no
    leading padding (in every fairseq batch). Arguments the command line would refuse,
    and an xPos scale base or centre whose factors leave float32 over the positions of
    this call, raise a ValueError naming the argument (:func:`check_rotary_arguments`).
    ``position_map`` ``phi`` (randomized positions, Ruoss et al. 2023's ``NOISY_ROTARY``):
    a token at position ``t`` (counted as above) is rotated by ``phi[t]`` instead, queries
    and keys by the same map, so a logit depends on ``phi[n] - phi[m]``
    (:mod:`.randomized_positions`)."""
    longest = max(query_offset + q.size(2), key_offset + k.size(2))
    # xPos's factors are checked over the positions the call turns by: a randomized map's, read
    # from the map (one host sync per call, in the training calls of a randomized xPos model only)
    mapped = position_map is not None and xpos_scale_base is not None and longest > 0
    reached = int(position_map[longest - 1]) + 1 if mapped else longest
    configuration = check_rotary_arguments(
        q.size(-1),
        reached,
        base=base,
        fraction=fraction,
        scaling=scaling,
        scaling_factor=scaling_factor,
        original_length=original_length,
        low_frequency_factor=low_frequency_factor,
        high_frequency_factor=high_frequency_factor,
        kept_frequencies=kept_frequencies,
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=attention_factor,
        xpos_scale_base=xpos_scale_base,
        xpos_centre=xpos_centre,
    )
    compute = angle_dtype(q.dtype)
    long_factors = configuration.uses_long_factors(longest)

    def turn(side: str, x: Tensor, offset: int) -> Tensor:
        if position_map is not None:
            theta, query_scale, key_scale = _rotation(configuration, long_factors, x.device, compute)
            positions = map_positions(sequence_positions(key_padding_mask, x.size(2), offset, x.device), position_map)
            return turns(positions, theta, query_scale if side == "query" else key_scale, configuration.xpos_centre)
        if key_padding_mask is None:
            return _unpadded_turns(x.size(2), 1, offset, side, configuration, long_factors, x.device, compute)
        # rows of the (cached) unpadded turns at each sentence's positions: a gather
        # instead of the sines and cosines of every [B, T] angle in every layer
        table = _unpadded_turns(longest, 1, 0, side, configuration, long_factors, x.device, compute)[0, 0]
        return table[sequence_positions(key_padding_mask, x.size(2), offset, x.device)][:, None]

    query_turn = turn("query", q, query_offset)
    # RoPE turns a key as it turns a query at the same position (xPos scales them apart):
    # a self-attention forward pass rotates both by one tensor
    same = xpos_scale_base is None and key_offset == query_offset and k.size(2) == q.size(2)
    key_turn = query_turn if same else turn("key", k, key_offset)
    q, k = apply_turns(q, query_turn), apply_turns(k, key_turn)
    logit_factor = configuration.logit_factor()
    rotated = configuration.dims
    if logit_factor != 1.0 and (scaling == "yarn-paper" or rotated == q.size(-1)):
        q = q * logit_factor
    elif logit_factor != 1.0:
        q = torch.cat([q[..., :rotated] * logit_factor, q[..., rotated:]], dim=-1)
    return q, k


def rotary_terms(
    q: Tensor,
    k: Tensor,
    *,
    base: float = ROPE_BASE,
    fraction: float = 1.0,
    scaling: str = "none",
    scaling_factor: float = 1.0,
    original_length: int = 0,
    low_frequency_factor: float = LLAMA3_LOW_FREQUENCY_FACTOR,
    high_frequency_factor: float = LLAMA3_HIGH_FREQUENCY_FACTOR,
    kept_frequencies: float = 1.0,
    short_factor: Tuple[float, ...] = (),
    long_factor: Tuple[float, ...] = (),
    attention_factor: float = 0.0,
    xpos_scale_base: Optional[float] = None,
    xpos_centre: Optional[float] = None,
    key_padding_mask: Optional[Tensor],
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """The queries and keys rotated (:func:`rotary_query_key`, at the randomized
    positions of ``position_map`` where given), nothing else."""
    if xpos_centre is None:
        xpos_centre = (max(query_offset + q.size(2), k.size(2)) - 1) / 2 if xpos_scale_base is not None else 0.0
    rotated_q, rotated_k = rotary_query_key(
        q,
        k,
        base=base,
        fraction=fraction,
        scaling=scaling,
        scaling_factor=scaling_factor,
        original_length=original_length,
        low_frequency_factor=low_frequency_factor,
        high_frequency_factor=high_frequency_factor,
        kept_frequencies=kept_frequencies,
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=attention_factor,
        xpos_scale_base=xpos_scale_base,
        xpos_centre=xpos_centre,
        key_padding_mask=key_padding_mask,
        query_offset=query_offset,
        position_map=position_map,
    )
    return Terms(query=rotated_q, key=rotated_k)


rotary_attention = attention_op(
    rotary_terms,
    "rotary_attention",
    """Self-attention ``softmax((R_m q)^T (R_n k) / sqrt(D)) v`` (RoFormer eq. 16;
    xPos with ``xpos_scale_base``; scaled by ``scaling``): q and k rotated by
    :func:`rotary_query_key`, then the plain attention (fused without weights).
    Every key is rotated in each call (none is cached), so xPos's scales are centred
    on the middle of the positions the call rotates unless ``xpos_centre`` gives a
    centre (the logits are the same either way in exact arithmetic).
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``.""",
)


__all__ = [
    "apply_turns",
    "longrope_initial_factors",
    "check_rotary_arguments",
    "rotary_attention",
    "rotary_dims",
    "rotary_frequencies",
    "rotary_query_key",
    "rotate",
    "smallest_xpos_scale_base",
    "turns",
    "xpos_range_problem",
    "xpos_zeta",
    "yarn_correction_range",
]
