"""``rope`` and ``xpos``: rotary position embeddings (Su et al. 2021) and their
length-extrapolatable form (Sun et al. 2023), with RoPE's context-length
scaling at evaluation time."""

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ..functional.rotary import (
    LENGTH_MODES,
    LLAMA3_HIGH_FREQUENCY_FACTOR,
    LLAMA3_LOW_FREQUENCY_FACTOR,
    ROPE_BASE,
    SCALING_MODES,
    XPOS_SCALE_BASE,
    base_problem,
    fraction_problem,
    frequency_factors_problem,
    kept_frequencies_problem,
    longrope_initial_factors,
    longrope_problem,
    original_length_problem,
    rotary_attention,
    rotary_dims,
    rotary_query_key,
    scaling_combination_problem,
    scaling_factor_problem,
    scaling_problem,
    xpos_range_problem,
    xpos_scale_base_problem,
)
from ..functional.terms import PLAIN
from ..registry import (
    CROSS_KIND,
    DIFFERENT_SEQUENCES,
    ENCODER_SELF_KIND,
    EVALUATION,
    SELF_ATTENTION,
    ArithmeticRevision,
    SpecError,
    option,
    register_attention,
)
from .base import Mechanism, MechanismConfig, PositionTerm

# The flag of each argument of the functional op that an option sets: the options are checked by the
# functional module's predicates (functional/rotary.py, ``*_problem``), which the op raises as ValueErrors
# naming its arguments and these raise as SpecErrors naming the flags.
ROTARY_FLAGS = {
    "base": "--rope-base",
    "fraction": "--rope-fraction",
    "scaling": "--rope-scaling",
    "scaling_factor": "--rope-scaling-factor",
    "original_length": "--rope-original-length",
    "low_frequency_factor": "--rope-low-frequency-factor",
    "high_frequency_factor": "--rope-high-frequency-factor",
    "kept_frequencies": "--rope-kept-frequencies",
    "short_factor": "--rope-short-factor",
    "long_factor": "--rope-long-factor",
    "attention_factor": "--rope-attention-factor",
    "xpos_scale_base": "--xpos-scale-base",
}


def refuse(problem) -> None:
    """Raise the functional predicate's ``problem`` (if any) as a SpecError naming its flag."""
    if problem is not None:
        raise SpecError(ROTARY_FLAGS[problem.argument], problem.value, problem.problem, problem.allowed)


def _checked(problem_of, kind):
    """A flag converter: the value, as ``kind``, unless the functional predicate ``problem_of`` refuses it."""

    def convert(value, context):
        refuse(problem_of(value))
        return kind(value)

    return convert


def _factor_list(flag: str):
    """A flag converter: LongRoPE's comma-separated factors as a tuple of floats (empty: none)."""

    def convert(value, context) -> Tuple[float, ...]:
        if isinstance(value, str):
            words = [word.strip() for word in value.split(",")] if value.strip() else []
            try:
                return tuple(float(word) for word in words)
            except ValueError:
                raise SpecError(flag, value, "must list numbers separated by commas", "e.g. 1.0,1.5,2.0") from None
        return tuple(value)

    return convert


@dataclass(frozen=True)
class RotaryOptions:
    rope_base: float = option(
        ROPE_BASE,
        "--rope-base",
        "rope, xpos: the rotation frequencies' base, theta_i = base^(-2i/d) (default: {default:g}, RoFormer's)",
        convert=_checked(base_problem, float),
        type=float,
        metavar="B",
        role=EVALUATION,
    )
    rope_fraction: float = option(
        1.0,
        "--rope-fraction",
        "rope, xpos: share of each head's dimensions that is rotated, the first 2*floor(f*d/2) of them (GPT-NeoX's "
        "partial rotary, e.g. 0.25); the rest pass through (default: {default:g}). Pairs are the paper's neighbouring "
        "dimensions (2i, 2i+1); GPT-NeoX's rotate-half layout (i with i + d/2) is the same rotation on permuted "
        "projection rows",
        convert=_checked(fraction_problem, float),
        type=float,
        metavar="F",
        role=EVALUATION,
    )
    rope_scaling: str = option(
        "none",
        "--rope-scaling",
        "rope, xpos: context-length scaling of the frequencies, for evaluation beyond the training length "
        "(a trained model takes it as --model-overrides): linear (position interpolation, Chen et al. 2023), ntk "
        "(base * s^(d/(d-2))), yarn (Peng et al. 2023 as the authors' code and Hugging Face's rope_type='yarn' "
        "compute it: interpolation ramped over the pair index between the correction dimensions of 32 and 1 "
        "rotations over --rope-original-length, and the rotated dimensions' share of each logit times "
        "(0.1 ln s + 1)^2), yarn-paper (the paper's formulas: the ramp continuous in the wavelength, the whole "
        "logit times (0.1 ln s + 1)^2), llama3 (Llama 3.1's, as Hugging Face's rope_type='llama3' and "
        "torchtune's Llama3ScaledRoPE compute it: wavelengths above --rope-original-length / "
        "--rope-low-frequency-factor divided by s, below it / --rope-high-frequency-factor kept, blended "
        "between), longrope (LongRoPE as Hugging Face's rope_type='longrope' runs it for Phi-3: each pair's "
        "frequency divided by its --rope-long-factor on sequences longer than --rope-original-length, else by "
        "its --rope-short-factor, the rotated share of each logit times the square of "
        "--rope-attention-factor; a decoding cache is recomputed once when the sequence crosses the switch, as "
        "Phi-3's generate() does) (default: {default})",
        convert=_checked(scaling_problem, str),
        choices=SCALING_MODES,
        role=EVALUATION,
    )
    rope_scaling_factor: float = option(
        1.0,
        "--rope-scaling-factor",
        "rope, xpos: the scaling factor s of --rope-scaling, the evaluation length over the training length "
        "(default: {default:g})",
        convert=_checked(scaling_factor_problem, float),
        type=float,
        metavar="S",
        role=EVALUATION,
    )
    rope_original_length: int = option(
        0,
        "--rope-original-length",
        "rope, xpos: the training length L in tokens, which --rope-scaling yarn, yarn-paper and llama3 scale "
        "the frequencies by and at which longrope switches to its long factors (Hugging Face's "
        "original_max_position_embeddings); nothing else reads it (default: {default}, unset)",
        convert=_checked(original_length_problem, int),
        type=int,
        metavar="L",
        role=EVALUATION,
    )
    rope_low_frequency_factor: float = option(
        LLAMA3_LOW_FREQUENCY_FACTOR,
        "--rope-low-frequency-factor",
        "rope, xpos: --rope-scaling llama3's low_freq_factor: wavelengths beyond L / this are divided by s "
        "(default: {default:g}, Llama 3.1's)",
        convert=lambda value, context: float(value),
        type=float,
        metavar="F",
        role=EVALUATION,
    )
    rope_high_frequency_factor: float = option(
        LLAMA3_HIGH_FREQUENCY_FACTOR,
        "--rope-high-frequency-factor",
        "rope, xpos: --rope-scaling llama3's high_freq_factor: wavelengths below L / this keep their frequency "
        "(default: {default:g}, Llama 3.1's)",
        convert=lambda value, context: float(value),
        type=float,
        metavar="F",
        role=EVALUATION,
    )
    rope_kept_frequencies: float = option(
        1.0,
        "--rope-kept-frequencies",
        "rope, xpos: p-RoPE (Barbero et al. 2025), the share p of the rotation frequencies kept, the highest; "
        "the lowest are removed (those pairs are not rotated), as Google DeepMind's gemma rope_proportion "
        "counts them, int(p d/2) of the d/2 pairs (default: {default:g}, every frequency: RoPE; 0: NoPE)",
        convert=_checked(kept_frequencies_problem, float),
        type=float,
        metavar="P",
        role=EVALUATION,
    )
    rope_short_factor: Tuple[float, ...] = option(
        (),
        "--rope-short-factor",
        "rope, xpos: --rope-scaling longrope's short_factor, one number per rotated pair, comma-separated: "
        "each pair's frequency is divided by its factor on sequences up to --rope-original-length",
        convert=_factor_list("--rope-short-factor"),
        arg_default="",
        only_with=("rope_scaling", "longrope"),
        type=str,
        metavar="F1,F2,...",
        role=EVALUATION,
    )
    rope_long_factor: Tuple[float, ...] = option(
        (),
        "--rope-long-factor",
        "rope, xpos: --rope-scaling longrope's long_factor (as --rope-short-factor), read on sequences longer "
        "than --rope-original-length",
        convert=_factor_list("--rope-long-factor"),
        arg_default="",
        only_with=("rope_scaling", "longrope"),
        type=str,
        metavar="F1,F2,...",
        role=EVALUATION,
    )
    rope_attention_factor: float = option(
        0.0,
        "--rope-attention-factor",
        "rope, xpos: --rope-scaling longrope's attention_factor, which Hugging Face multiplies cos and sin by "
        "(default: {default:g}: its default, sqrt(1 + ln s / ln L) for s = --rope-scaling-factor > 1, else 1)",
        convert=lambda value, context: float(value),
        only_with=("rope_scaling", "longrope"),
        type=float,
        metavar="A",
        role=EVALUATION,
    )
    xpos_scale_base: float = option(
        XPOS_SCALE_BASE,
        "--xpos-scale-base",
        "xpos: the scale base of zeta_i^(n/scale_base) (default: {default:g}, the paper's)",
        convert=_checked(xpos_scale_base_problem, float),
        applies_to=lambda name: name == "xpos",
        type=float,
        metavar="B",
        role=EVALUATION,
    )


def _op_arguments(options, xpos: bool):
    return dict(
        base=options.rope_base,
        fraction=options.rope_fraction,
        scaling=options.rope_scaling,
        scaling_factor=options.rope_scaling_factor,
        original_length=options.rope_original_length,
        low_frequency_factor=options.rope_low_frequency_factor,
        high_frequency_factor=options.rope_high_frequency_factor,
        kept_frequencies=options.rope_kept_frequencies,
        short_factor=options.rope_short_factor,
        long_factor=options.rope_long_factor,
        attention_factor=options.rope_attention_factor,
        xpos_scale_base=options.xpos_scale_base if xpos else None,
    )


def check_rotated_pairs(fraction: float, head_dim: int) -> None:
    refuse(fraction_problem(fraction, head_dim))


def xpos_module_centre(max_positions: Optional[int]) -> float:
    """Where a model's xPos layer centres its scales: the middle of the longest sequence its
    stack attends over, as torchscale and x-transformers centre theirs, so each scale stays
    half as far from 1 as the paper's, counted from 0 (which is where it stays when the
    length is unknown). It is one constant for every call, because keys are cached already
    scaled; in exact arithmetic the logits are the same whatever the centre."""
    return (max_positions - 1) / 2 if max_positions else 0.0


def _neighbour_pairs_from_halves(head_dim: int, options) -> List[int]:
    """Each head's projection row order that turns the rotate-half layout (dimension i
    paired with i + d/2) into neighbouring pairs (2i, 2i+1): the same rotation, exactly."""
    dims = rotary_dims(head_dim, options.rope_fraction)
    return [i // 2 + (dims // 2 if i % 2 else 0) for i in range(dims)] + list(range(dims, head_dim))


ROTARY_REVISIONS = (
    ArithmeticRevision(1, "f2fbfbc", "rotate-half pairs (dimension i with i + d/2)"),
    ArithmeticRevision(
        2,
        "696e4c2",
        "neighbouring pairs (2i, 2i+1)",
        # added at 22cfa14, two and a half hours after 696e4c2: a checkpoint holding it pairs neighbours
        recorded_after=("kerple_kernel",),
        query_key_rows_from_previous=_neighbour_pairs_from_halves,
    ),
)

# why xPos is for causal attention only
XPOS_CAUSAL_ONLY = (
    "its scale zeta^((n-m)/scale_base) decays with the distance only to keys before the query; a bidirectional "
    "encoder would weight keys after it exponentially up (the paper uses it in causal language models)"
)


@register_attention(
    "xpos",
    RotaryOptions,
    op=rotary_attention,
    revisions=ROTARY_REVISIONS,
    kinds=SELF_ATTENTION - {ENCODER_SELF_KIND},
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES, ENCODER_SELF_KIND: XPOS_CAUSAL_ONLY},
    description="RoPE with a per-pair exponential decay: queries times `zeta_i^(n/scale_base)`, keys times its "
    "inverse, `zeta_i = (2i/d + 0.4)/1.4` (`--xpos-scale-base`); decoder only",
    paper="Sun et al. 2023, *A Length-Extrapolatable Transformer*",
)
@register_attention(
    "rope",
    RotaryOptions,
    op=rotary_attention,
    revisions=ROTARY_REVISIONS,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    description="queries and keys rotated pairwise by position times `base^(-2i/d)` (`--rope-base`, "
    "`--rope-fraction` of each head), then the plain fused attention; context-length scaling at evaluation "
    "(`--rope-scaling linear|ntk|yarn|llama3|longrope`), p-RoPE (`--rope-kept-frequencies`); positions count from each "
    "sentence's first real token",
    paper="Su et al. 2021, *RoFormer: Enhanced Transformer with Rotary Position Embedding*",
)
class Rotary(Mechanism):
    """RoPE (and xPos): nothing learned, nothing saved in checkpoints. The
    rotation is applied where the attention module hands over a layer's new
    projections (:meth:`encode_positions`), so each key is cached already
    rotated at its own position and a decoding step rotates only its own
    query and key; the attention itself is the plain one. ``--randomized-positions``
    rotates the training calls by sampled positions (Ruoss et al. 2023's
    ``NOISY_ROTARY``), xPos's scales at the same positions: its centre is then the
    middle of ``[0, N)``, the positions its layers turn by (:func:`xpos_module_centre`
    of the stack's reach)."""

    random_positions = "positions"

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options = config.options
        self.xpos = config.name == "xpos"
        check_rotated_pairs(options.rope_fraction, config.head_dim)
        self.arguments = _op_arguments(options, self.xpos)
        if self.xpos:
            stack = config.stack
            self.arguments["xpos_centre"] = xpos_module_centre(stack.max_positions if stack else None)
        if options.rope_scaling == "longrope":
            # the keys cached below LongRoPE's switch are rotated with its short factors (and the layers
            # above read hidden states made with them): the decoder recomputes its cache there
            self.cache_recompute_length = options.rope_original_length

    @classmethod
    def check_options(cls, options, kind=None, layers=()):
        refuse(
            scaling_combination_problem(
                options.rope_scaling, options.rope_scaling_factor, options.rope_original_length, ROTARY_FLAGS
            )
        )
        refuse(frequency_factors_problem(options.rope_low_frequency_factor, options.rope_high_frequency_factor))
        pairs = rotary_dims(kind.head_dim, options.rope_fraction) // 2 if kind is not None and kind.head_dim else None
        refuse(
            longrope_problem(
                options.rope_scaling,
                options.rope_short_factor,
                options.rope_long_factor,
                options.rope_attention_factor,
                pairs,
                ROTARY_FLAGS,
            )
        )
        if kind is None:
            return
        if kind.head_dim:
            check_rotated_pairs(options.rope_fraction, kind.head_dim)
        if "xpos" in layers and kind.max_positions:
            # every model, trained or loaded (--model-overrides): beyond the bound its logits are inf or NaN
            source = f" ({kind.positions_flag} {kind.max_positions})" if kind.positions_flag else ""
            refuse(
                xpos_range_problem(
                    options.xpos_scale_base,
                    kind.max_positions,
                    xpos_module_centre(kind.max_positions),
                    ROTARY_FLAGS,
                    positions_note=f" of the longest sequence {kind.flag} attends over{source}",
                )
            )

    @classmethod
    def example_options(cls, options, src_len, head_dim):
        if options.rope_scaling == "none":
            return options
        # a scaling that scales: by 2 where the options leave it at 1; yarn's training length from half the
        # keys where unset (the other scalings refuse one, as their flags do); longrope's factors where none
        # are given: 1 (short) and its search's starting point (long), one per rotated pair
        reads_length = options.rope_scaling in LENGTH_MODES
        scale = max(options.rope_scaling_factor, 2.0)
        original = (options.rope_original_length or max(1, src_len // 2)) if reads_length else 0
        options = dataclasses.replace(options, rope_scaling_factor=scale, rope_original_length=original)
        if options.rope_scaling != "longrope" or options.rope_long_factor:
            return options
        dims = rotary_dims(head_dim, options.rope_fraction)
        return dataclasses.replace(
            options,
            rope_short_factor=(1.0,) * (dims // 2),
            rope_long_factor=longrope_initial_factors(dims, options.rope_base, scale, original),
        )

    def extra_repr(self) -> str:
        rotated = rotary_dims(self.config.head_dim, self.arguments["fraction"])
        text = f"base={self.arguments['base']:g}, rotated {rotated} of {self.config.head_dim} dims per head"
        if self.arguments["scaling"] != "none":
            text += f", {self.arguments['scaling']} scaling x{self.arguments['scaling_factor']:g}"
        if self.arguments["scaling"] == "longrope":
            text += f", long factors beyond {self.arguments['original_length']} positions"
        if self.arguments["kept_frequencies"] != 1.0:
            text += f", p-RoPE keeping {self.arguments['kept_frequencies']:g} of the frequencies"
        if self.xpos:
            text += f", xpos scale_base={self.arguments['xpos_scale_base']:g}"
        return text

    def encode_positions(self, queries, keys, key_padding_mask, query_offset, *, position_map=None):
        query, key = rotary_query_key(
            queries["query"],
            keys["key"],
            key_padding_mask=key_padding_mask,
            query_offset=query_offset,
            key_offset=query_offset,
            position_map=position_map,
            **self.arguments,
        )
        return {**queries, "query": query}, {**keys, "key": key}

    def position_term(self, tgt_len, src_len, causal):
        # The logit a query and key that are the same all-ones vector get at each offset (over sqrt(d)):
        # RoPE's sum_i cos((n-m) theta_i), the content-free part of its relative term, per layer (the heads agree).
        ones = torch.ones(1, 1, max(tgt_len, src_len), self.config.head_dim, dtype=torch.float64)
        query, key = rotary_query_key(ones[:, :, :tgt_len], ones[:, :, :src_len], **self.arguments)
        logits = query @ key.transpose(-1, -2) / math.sqrt(self.config.head_dim)
        return PositionTerm(f"{self.config.name}-logit", f"{self.config.name} logit of equal all-ones q, k", logits[0])

    overrides_terms_because = (
        "queries and keys arrive rotated (encode_positions, so that keys are cached rotated): "
        "the op's rotation is done, and nothing is left to add"
    )

    def op_arguments(self, queries, keys, options):
        return (), dict(self.arguments)

    def terms(self, queries, keys, options, cache=None):
        return PLAIN
