"""Per-layer attention SPECs: parsing and validation, no fairseq imports.

A SPEC is a comma-separated list of ``MECH[@LAYERS]``: ``LAYERS`` is ``i`` or
``i-j`` (0-based, inclusive); no ``@`` means every layer; layers not named are
vanilla. Example: ``window-aw@0-2,rpr@3``.

Invalid input is reported the way argparse reports a bad flag: one line on
stderr naming the flag, the bad value and what is allowed, exit status 2.
"""
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import FrozenSet, List, Optional

# the ablations' names live with their math (pure torch, no fairseq imports)
from .functional.distance_aware import DA_ADJUSTINGS, DA_MAPPINGS
from .functional.query_value_interaction import QVI_INTERACTIONS

MECHANISMS = (
    "vanilla",
    "rpr",
    "da",
    "window-mw",
    "window-aw",
    "window-mw-seg",
    "window-aw-seg",
    "qvi",
    "distance-mask",
)
DISTANCE_MASK_DIRECTIONS = ("none", "forward", "backward")


@dataclass(frozen=True)
class AttentionKind:
    flag: str
    description: str
    causal: bool
    allowed: FrozenSet[str]
    disallowed_reason: str = ""


ENCODER_SELF = AttentionKind(
    flag="--encoder-self-attention",
    description="encoder self-attention",
    causal=False,
    allowed=frozenset(MECHANISMS),
)
DECODER_SELF = AttentionKind(
    flag="--decoder-self-attention",
    description="decoder self-attention",
    causal=True,
    allowed=frozenset(MECHANISMS) - {"window-mw-seg", "window-aw-seg"},
    # Nguyen et al. sec. 5.2: the decoder cannot point to unfinished segments.
    disallowed_reason="segments are undefined for keys that are still being generated",
)
CROSS = AttentionKind(
    flag="--cross-attention",
    description="encoder-decoder cross-attention",
    causal=False,
    allowed=frozenset({"vanilla", "window-mw", "window-aw", "window-mw-seg", "window-aw-seg"}),
    # rpr/da/distance-mask need query and key positions on one axis; QVI's
    # eq. 7 would mix every target query (including future ones) into each value.
    disallowed_reason="queries and keys come from different sequences",
)


# The largest finite float32: the dtype in which (at least) the logits are formed.
FLOAT32_MAX = 3.4028234663852886e38


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SpecError(ValueError):
    """A bad flag value; ``str()`` is the one-line message."""

    def __init__(self, flag: str, value, problem: str, allowed: str):
        super().__init__(f"argument {flag}: invalid value {str(value)!r}: {problem}; allowed: {allowed}")
        self.flag, self.value, self.problem, self.allowed = flag, value, problem, allowed

    def with_note(self, note: str) -> "SpecError":
        """The same error with ``note`` appended to its problem."""
        return SpecError(self.flag, self.value, f"{self.problem} ({note})", self.allowed)


def exit_on_spec_error(error: SpecError):
    """Report like argparse: one line on stderr, exit status 2."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
    sys.stderr.write(f"{prog}: error: {error}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def _ordered(names) -> str:
    return ", ".join(m for m in MECHANISMS if m in names)


# Only ASCII digits: int() would also take "+1", "1_0" and other scripts' digits.
LAYERS_PATTERN = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)


def _parse_layers(kind: AttentionKind, spec: str, item: str, text: str, num_layers: int) -> range:
    grammar = f"a layer i or range i-j with 0 <= i <= j <= {num_layers - 1}"
    if not text:
        raise SpecError(kind.flag, spec, f"{item!r} has an empty layer list after '@'", grammar + " (or no '@' for every layer)")
    match = LAYERS_PATTERN.fullmatch(text)
    if match is None:
        raise SpecError(kind.flag, spec, f"{item!r} has layers {text!r}, which is not a number or range", grammar)
    first = int(match.group(1))
    last = first if match.group(2) is None else int(match.group(2))
    if first > last:
        raise SpecError(kind.flag, spec, f"{item!r} has an invalid layer range {text!r}", grammar)
    if last >= num_layers:
        raise SpecError(kind.flag, spec, f"{item!r} names layers outside the model's {num_layers} layers", grammar)
    return range(first, last + 1)


def parse_spec(kind: AttentionKind, spec: Optional[str], num_layers: int) -> List[str]:
    """Mechanism name for every layer ``0..num_layers-1`` of this attention kind."""
    layers = ["vanilla"] * num_layers
    owner: List[Optional[str]] = [None] * num_layers
    if spec is None:
        return layers
    grammar = f"MECH[@i|@i-j],... with MECH one of {_ordered(MECHANISMS)}"
    for raw_item in spec.split(","):
        item = raw_item.strip()
        if not item:
            # an empty value (an unset shell variable) or a stray comma must not mean "vanilla"
            raise SpecError(kind.flag, spec, "empty item", grammar)
        name, at, layer_text = item.partition("@")
        name = name.strip()
        if name not in MECHANISMS:
            raise SpecError(kind.flag, spec, f"unknown mechanism {name!r}", grammar)
        if name not in kind.allowed:
            raise SpecError(
                kind.flag, spec,
                f"{name} does not apply to {kind.description} ({kind.disallowed_reason})",
                _ordered(kind.allowed),
            )
        covered = _parse_layers(kind, spec, item, layer_text.strip(), num_layers) if at else range(num_layers)
        for layer in covered:
            if owner[layer] is not None:
                raise SpecError(kind.flag, spec, f"{owner[layer]!r} and {item!r} both set layer {layer}", "non-overlapping layer ranges")
            owner[layer] = item
            layers[layer] = name
    return layers


@dataclass(frozen=True)
class MechanismOptions:
    """Hyperparameters shared by every layer; validated once per model."""

    max_relative_position: int = 16
    relative_values: bool = True
    window_segment_size: int = 5
    distance_mask_alpha: float = 1.0
    distance_mask_direction: Optional[str] = None
    # key length from which a training forward recomputes attention in query
    # chunks during backward instead of keeping [B, H, Tq, Tk] tensors (0: never)
    attention_recompute_length: int = 256
    # the papers' ablations; the defaults are the papers' own choices
    da_mapping: str = "learnable-sigmoid"  # Wu et al. 2021 sec. 4.3
    da_adjusting: str = "early-multiply"  # Wu et al. 2021 sec. 4.4
    # T of the clip mapping min(x, T); the paper gives no value: Shaw et al.'s clipping distance k
    da_clip_threshold: float = 16.0
    qvi_interaction: str = "gated"  # Wu et al. (QVI) sec. 4.3

    @classmethod
    def from_args(cls, args, max_positions: Optional[int] = None) -> "MechanismOptions":
        """Options from parsed flags (absent flags take the defaults above).
        ``max_positions``: the longest sequence the model accepts, which bounds
        ``--max-relative-position`` (no distance beyond it ever occurs)."""
        positive = {
            "--max-relative-position": getattr(args, "max_relative_position", cls.max_relative_position),
            "--window-segment-size": getattr(args, "window_segment_size", cls.window_segment_size),
        }
        for flag, value in positive.items():
            if not _is_integer(value) or value <= 0:
                raise SpecError(flag, value, "must be a positive integer", "an integer >= 1")
        max_distance = positive["--max-relative-position"]
        if max_positions is not None and max_distance > max_positions:
            raise SpecError(
                "--max-relative-position", max_distance,
                f"larger than the longest sequence the model accepts ({max_positions} positions, "
                "--max-source-positions/--max-target-positions), so no distance ever reaches it",
                f"an integer 1 <= K <= {max_positions}",
            )
        recompute_length = getattr(args, "attention_recompute_length", cls.attention_recompute_length)
        if not _is_integer(recompute_length) or recompute_length < 0:
            raise SpecError("--attention-recompute-length", recompute_length, "must be a non-negative integer", "an integer >= 0 (0: never recompute)")
        alpha = getattr(args, "distance_mask_alpha", cls.distance_mask_alpha)
        # alpha multiplies float32 (or half) logits: a value that is inf there
        # (1e39 is finite in Python) turns 0 * alpha on the diagonal into NaN
        if not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or not 0 <= alpha <= FLOAT32_MAX:
            raise SpecError("--distance-mask-alpha", alpha, "must be a finite non-negative number", f"a number 0 <= ALPHA <= {FLOAT32_MAX:.4g}")
        direction = getattr(args, "distance_mask_direction", None)
        direction = "none" if direction is None else direction
        if direction not in DISTANCE_MASK_DIRECTIONS:
            raise SpecError("--distance-mask-direction", direction, "unknown direction", ", ".join(DISTANCE_MASK_DIRECTIONS))
        choices = {}
        for flag, names in (("--da-mapping", DA_MAPPINGS), ("--da-adjusting", DA_ADJUSTINGS),
                            ("--qvi-interaction", QVI_INTERACTIONS)):
            attr = flag[2:].replace("-", "_")
            choices[attr] = getattr(args, attr, getattr(cls, attr))
            if choices[attr] not in names:
                raise SpecError(flag, choices[attr], "unknown choice", ", ".join(names))
        clip_threshold = getattr(args, "da_clip_threshold", cls.da_clip_threshold)
        # T bounds float32 (or half) coefficients: it must be finite there
        if (isinstance(clip_threshold, bool) or not isinstance(clip_threshold, (int, float))
                or not math.isfinite(clip_threshold) or not 0 < clip_threshold <= FLOAT32_MAX):
            raise SpecError("--da-clip-threshold", clip_threshold, "must be a finite positive number",
                            f"a number 0 < T <= {FLOAT32_MAX:.4g}")
        return cls(
            max_relative_position=max_distance,
            relative_values=not getattr(args, "no_relative_values", False),
            window_segment_size=positive["--window-segment-size"],
            distance_mask_alpha=float(alpha),
            distance_mask_direction=None if direction == "none" else direction,
            attention_recompute_length=recompute_length,
            da_clip_threshold=float(clip_threshold),
            **choices,
        )

    def check_kind(self, kind: AttentionKind, layers: List[str]):
        # A backward mask hides every past key; with the decoder's causal mask nothing is left.
        if kind.causal and "distance-mask" in layers and self.distance_mask_direction == "backward":
            raise SpecError(
                "--distance-mask-direction", "backward",
                f"{kind.flag} uses distance-mask, and a backward mask leaves a causal query no key",
                "none, forward",
            )
