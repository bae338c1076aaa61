"""The mechanism registry, after xformers' ``register_attention(name, Config)``.

A mechanism declares everything about itself in its own module file
(``fairseq_distattn/mechanisms/<name>.py``), next to its ``nn.Module``::

    @dataclass(frozen=True)
    class MyOptions:
        my_width: int = option(4, "--my-width", "my: window width (default: {default})",
                               convert=positive_integer("--my-width"), type=int, metavar="W")

    @register_attention("my-mech", MyOptions, op=my_attention,  # from ..functional.my_mech
                        kinds=SELF_ATTENTION, unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
                        description="...", paper="Authors 2024, *Title*")
    class MyMechanism(Mechanism):
        ...

and everything else derives from here: the SPEC names, the mechanisms each
attention kind allows, and the model-wide options (one instance of each options
dataclass) and their validation (:mod:`fairseq_distattn.spec`); the
command-line flags and ``--help`` (:mod:`fairseq_distattn.models.arguments`), the generated docs
(:mod:`fairseq_distattn.tools.docs`), and the lists of the tests and
benchmarks, which run every mechanism's module on drawn inputs
(:mod:`fairseq_distattn.tools.examples`). The attention kinds
are one table here too (:class:`AttentionKind`). The execution paths a
mechanism takes are not declared: they follow from the terms its op returns
(:mod:`fairseq_distattn.functional.terms`), and the docs' words for them are
read from its example terms (:mod:`fairseq_distattn.tools.path_profile`).
docs/adding-a-mechanism.md walks through a whole example. No fairseq imports.
"""

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

# The attention kinds by key: what a mechanism declares it supports (``kinds=SELF_ATTENTION``);
# everything else about a kind is in its AttentionKind below.
ENCODER_SELF_KIND = "encoder-self"
DECODER_SELF_KIND = "decoder-self"
CROSS_KIND = "cross"
SELF_ATTENTION = frozenset({ENCODER_SELF_KIND, DECODER_SELF_KIND})
ALL_KINDS = frozenset({ENCODER_SELF_KIND, DECODER_SELF_KIND, CROSS_KIND})
# why a mechanism that needs query and key positions on one axis has no cross-attention form
DIFFERENT_SEQUENCES = "queries and keys come from different sequences"

# What an option is to a trained model (OptionFlag.role):
# - part of it: its parameters depend on the value (a table size, which parameters exist, their
#   sharing); a checkpoint is resumed and averaged only with the value it was trained with, and
#   --model-overrides may not change it;
TRAINED = "trained"
# - part of it, but parameter-free: resuming and averaging keep the trained value, while
#   --model-overrides may change it to evaluate the trained model another way;
EVALUATION = "evaluation"
# - not part of it: how the same function is computed (memory, kernels); never compared.
RUNTIME = "runtime"
OPTION_ROLES = (TRAINED, EVALUATION, RUNTIME)

# The largest finite float32: the dtype in which (at least) the logits are formed.
FLOAT32_MAX = 3.4028234663852886e38


class SpecError(ValueError):
    """A bad flag value; ``str()`` is the one-line message."""

    def __init__(self, flag: str, value, problem: str, allowed: str):
        super().__init__(f"argument {flag}: invalid value {str(value)!r}: {problem}; allowed: {allowed}")
        self.flag, self.value, self.problem, self.allowed = flag, value, problem, allowed

    def with_note(self, note: str) -> "SpecError":
        """The same error with ``note`` appended to its problem."""
        return SpecError(self.flag, self.value, f"{self.problem} ({note})", self.allowed)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class OptionContext:
    """What a value check may need beyond the value: ``max_positions`` is the
    longest sequence the model accepts (None: unknown), set by the flag(s)
    ``positions_flag`` (named in messages)."""

    max_positions: Optional[int] = None
    positions_flag: str = "--max-source-positions/--max-target-positions"


@dataclass(frozen=True)
class OptionFlag:
    """The command-line side of one option field."""

    flag: str
    help: str
    arg_default: Any  # the parsed attribute's value when the flag is absent
    convert: Callable[[Any, OptionContext], Any]  # parsed value -> field value; raises SpecError
    argparse: Mapping[str, Any]
    # which of the mechanisms that declare the options class this option configures (None: all of them)
    applies_to: Optional[Callable[[str], bool]] = None
    # (attribute, value) of another option without which this one configures nothing (None: no such option)
    only_with: Optional[Tuple[str, Any]] = None
    role: str = TRAINED  # TRAINED, EVALUATION or RUNTIME (above)
    # what a checkpoint that does not record this option was trained with: its default, unless
    # the option came with a new default after models had been trained the old way
    unrecorded: Any = None
    has_unrecorded: bool = False

    @property
    def attr(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def unrecorded_value(self) -> Any:
        return self.unrecorded if self.has_unrecorded else self.arg_default


OPTION_METADATA = "distattn_flag"


def option(
    default,
    flag: str,
    help: str,
    *,
    convert: Optional[Callable[[Any, OptionContext], Any]] = None,
    arg_default=dataclasses.MISSING,
    applies_to: Optional[Callable[[str], bool]] = None,
    only_with: Optional[Tuple[str, Any]] = None,
    role: str = TRAINED,
    unrecorded=dataclasses.MISSING,
    **argparse_kwargs,
) -> Any:
    """A field of a mechanism's options dataclass with its flag: ``help`` may name
    ``{default}`` (the flag's default); ``convert(value, context)`` validates the
    parsed value (raising :class:`SpecError`) and returns the field's value;
    ``arg_default`` is what fairseq's namespace holds when the flag is absent
    (default: ``default``); ``applies_to(name)`` narrows the mechanisms that
    declare the options class to those the option configures, and
    ``only_with=(attribute, value)`` names another option's value without which
    it configures nothing (fairseq-train warns when a flag is given and no layer
    uses one of those mechanisms, or the other option has another value);
    ``role`` says what the option is to a trained model (``TRAINED``: its
    parameters depend on it; ``EVALUATION``: parameter-free, so
    ``--model-overrides`` may change it; ``RUNTIME``: not part of the model);
    ``unrecorded`` is what a checkpoint saved before the option existed was
    trained with, where that is not ``default`` (an option that changed a
    default keeps the old behaviour for old checkpoints);
    the rest goes to ``argparse.add_argument``."""
    if role not in OPTION_ROLES:
        raise ValueError(f"{flag}: role must be one of {', '.join(OPTION_ROLES)}, got {role!r}")
    arg_default = default if arg_default is dataclasses.MISSING else arg_default
    flag_info = OptionFlag(
        flag,
        help.format(default=arg_default),
        arg_default,
        convert or (lambda value, context: value),
        dict(argparse_kwargs),
        applies_to,
        only_with,
        role,
        None if unrecorded is dataclasses.MISSING else unrecorded,
        unrecorded is not dataclasses.MISSING,
    )
    return dataclasses.field(default=default, metadata={OPTION_METADATA: flag_info})


def option_flag(field: dataclasses.Field) -> OptionFlag:
    return field.metadata[OPTION_METADATA]


def is_integer(value) -> bool:
    """An int that is not a bool (argparse and omegaconf give both)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_integer(flag: str) -> Callable[[Any, OptionContext], int]:
    def convert(value, context):
        if not is_integer(value) or value <= 0:
            raise SpecError(flag, value, "must be a positive integer", "an integer >= 1")
        return value

    return convert


def finite_number(flag: str, name: str, positive: bool) -> Callable[[Any, OptionContext], float]:
    """A finite number in float32 (a value that is inf there, such as 1e39, would
    turn products on the logits into inf or NaN), > 0 or >= 0."""

    def convert(value, context):
        low_ok = (lambda v: v > 0) if positive else (lambda v: v >= 0)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not low_ok(value)
            or value > FLOAT32_MAX
        ):
            what = "positive" if positive else "non-negative"
            bound = "0 <" if positive else "0 <="
            raise SpecError(
                flag, value, f"must be a finite {what} number", f"a number {bound} {name} <= {FLOAT32_MAX:.4g}"
            )
        return float(value)

    return convert


def one_of(flag: str, names: Tuple[str, ...]) -> Callable[[Any, OptionContext], str]:
    def convert(value, context):
        if value not in names:
            raise SpecError(flag, value, "unknown choice", ", ".join(names))
        return value

    return convert


# --------------------------------------------------------------------------- mechanisms


# "Authors YEAR, *Title*": the listing order is the papers' (year, then name)
PAPER_PATTERN = re.compile(r"(?P<authors>.+) (?P<year>[12][0-9]{3}), \*(?P<title>.+)\*")


@dataclass(frozen=True)
class ArithmeticRevision:
    """One version of what a mechanism computes from the same parameters. Checkpoints
    record the revision of each mechanism they use (``distattn_revisions``), so that
    one saved by an earlier revision is converted exactly or refused, never run as
    another model (patches/checkpoint_upgrade.py)."""

    number: int
    since: str  # the plugin revision (git) that introduced it
    arithmetic: str  # what it computes, as a message names it
    # options that every checkpoint saved once this revision existed records: a checkpoint that
    # records neither a revision nor any of these may be from before it
    recorded_after: Tuple[str, ...] = ()
    # how a checkpoint of the previous revision converts exactly, where it does: the order of each
    # head's query and key projection rows, from (head_dim, the mechanism's options)
    query_key_rows_from_previous: Optional[Callable[[int, Any], List[int]]] = None


@dataclass(frozen=True)
class MechanismInfo:
    """One registered SPEC name and what it declares."""

    name: str
    module: type  # the nn.Module (a fairseq_distattn.mechanisms.Mechanism)
    options: Optional[type]  # its options dataclass (shared by names of one family), or None
    # the functional op (functional.attention.attention_op) whose terms the module adds, on what its
    # op_arguments supplies (mechanisms.base); the paths it takes follow from those terms (functional.terms)
    op: Callable[..., Any]
    kinds: FrozenSet[str]  # the attention kinds it applies to
    unsupported: Mapping[str, str]  # kind -> why it does not apply there
    row_wise: bool  # every query row depends on that row's queries alone (recomputable in row blocks)
    extra_queries: Tuple[str, ...]  # extra per-head query projections of the attention module
    extra_keys: Tuple[str, ...]  # extra per-head key projections (cached like fairseq's prev_key)
    # per-position inputs the mechanism makes itself from the layer's key-side input (Mechanism.inputs_from_layer:
    # FoX's forget gates), cached like the keys
    layer_inputs: Tuple[str, ...]
    description: str  # the mechanism table's "mechanism" column
    paper: str  # "Authors YEAR, *Title*"
    # its papers' models keep the sinusoidal position embeddings beside it (the LM preset and the
    # translation benchmark derived from it keep them too); else it replaces them
    keeps_position_embeddings: bool = False
    # its papers name the layers it goes in (the window's first three decoder layers): no LM preset
    # nor translation configuration is derived with it in every layer; the papers' own ones stand
    papers_place_it: bool = False
    # what it has computed, oldest first (empty: one revision since it was registered)
    revisions: Tuple[ArithmeticRevision, ...] = ()

    @property
    def family(self) -> str:
        """The name before its first "-": the names one options dataclass serves (``window``)."""
        return self.name.split("-")[0]

    @property
    def causal_only(self) -> bool:
        """Whether it is defined for causal attention only (no encoder self-attention form)."""
        return ENCODER_SELF_KIND not in self.kinds

    @property
    def revision(self) -> int:
        """The arithmetic revision the code computes now."""
        return self.revisions[-1].number if self.revisions else 1

    @property
    def year(self) -> int:
        return int(PAPER_PATTERN.fullmatch(self.paper)["year"])

    def option_fields(self) -> Tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options) if self.options is not None else ()

    def default_options(self):
        """Its options at their defaults (None without an options class)."""
        return None if self.options is None else self.options()

    def own_options(self, options):
        """Its own options dataclass, the instance the model-wide
        :class:`~fairseq_distattn.spec.AttentionOptions` holds (None without an options class)."""
        return None if self.options is None else options.of(self.options)


REGISTRY: Dict[str, MechanismInfo] = {}


def register_attention(
    name: str,
    options: Optional[type] = None,
    *,
    op: Callable[..., Any],
    description: str,
    paper: str,
    kinds: FrozenSet[str] = ALL_KINDS,
    unsupported: Optional[Mapping[str, str]] = None,
    row_wise: bool = True,
    extra_queries: Tuple[str, ...] = (),
    extra_keys: Tuple[str, ...] = (),
    layer_inputs: Tuple[str, ...] = (),
    keeps_position_embeddings: bool = False,
    papers_place_it: bool = False,
    revisions: Tuple[ArithmeticRevision, ...] = (),
):
    """Class decorator registering a mechanism module under the SPEC ``name``
    (a class may be registered under several names, each with its own
    declarations). Every kind it does not support needs a reason; ``paper``
    is ``"Authors YEAR, *Title*"``; ``op`` is made by
    :func:`~fairseq_distattn.functional.attention.attention_op` (it has ``terms``)."""
    unsupported = dict(unsupported or {})

    def decorate(cls):
        if name in REGISTRY or name == "vanilla":
            raise ValueError(f"mechanism {name!r} is registered twice")
        _check_declarations(name, op, paper, kinds, unsupported, revisions)
        if options is not None:
            _check_options(name, options)
        REGISTRY[name] = MechanismInfo(
            name=name,
            module=cls,
            options=options,
            op=op,
            kinds=frozenset(kinds),
            unsupported=unsupported,
            row_wise=row_wise,
            extra_queries=tuple(extra_queries),
            extra_keys=tuple(extra_keys),
            layer_inputs=tuple(layer_inputs),
            description=description,
            paper=paper,
            keeps_position_embeddings=keeps_position_embeddings,
            papers_place_it=papers_place_it,
            revisions=tuple(revisions),
        )
        for callback in _REGISTRATION_CALLBACKS:
            callback(REGISTRY[name])
        return cls

    return decorate


def _check_declarations(name, op, paper, kinds, unsupported, revisions) -> None:
    """A registration's declarations as :func:`register_attention` asks for them."""
    if not set(kinds) <= ALL_KINDS or set(unsupported) != ALL_KINDS - set(kinds):
        raise ValueError(
            f"{name}: give a reason for exactly the kinds it does not support, {sorted(ALL_KINDS - set(kinds))}"
        )
    if [revision.number for revision in revisions] != list(range(1, len(revisions) + 1)):
        raise ValueError(f"{name}: revisions must be numbered 1, 2, ... oldest first")
    if PAPER_PATTERN.fullmatch(paper) is None:
        raise ValueError(f"{name}: paper must read 'Authors YEAR, *Title*', got {paper!r}")
    if not callable(op) or not callable(getattr(op, "terms", None)):
        raise TypeError(f"{name}: op must be callable, made by functional.attention.attention_op")


def _check_options(name, options: type) -> None:
    """An options dataclass whose every field is a flag (:func:`option`) that no other
    registered mechanism declares (fairseq's one argument namespace holds every mechanism's flags)."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"{name}: options must be a dataclass")
    for field in dataclasses.fields(options):
        if OPTION_METADATA not in field.metadata:
            raise ValueError(f"{name}: option {field.name} has no flag (use registry.option)")
        for other in REGISTRY.values():
            if other.options is None or other.options is options:
                continue
            if any(
                field.name == f.name or option_flag(field).flag == option_flag(f).flag for f in other.option_fields()
            ):
                raise ValueError(f"{name}: option {field.name} is also declared by {other.name}")


_REGISTRATION_CALLBACKS: List[Callable[[MechanismInfo], None]] = []


def on_register(callback: Callable[[MechanismInfo], None]) -> None:
    """Call ``callback`` with every registered mechanism, in listing order, and with each
    one registered from now on: what derives from the registry on a floor above it (the
    LM presets, fairseq architectures registered once per process) sees a mechanism
    registered after that floor was imported too."""
    for info in registered():
        callback(info)
    _REGISTRATION_CALLBACKS.append(callback)


def registered() -> Tuple[MechanismInfo, ...]:
    """Every registered mechanism in listing order, the papers' (year, then name)
    (after discovery: ``import fairseq_distattn.mechanisms``)."""
    return tuple(sorted(REGISTRY.values(), key=lambda info: (info.year, info.name)))


def option_classes() -> Tuple[type, ...]:
    """The options dataclasses of the registered mechanisms, in listing order, each once."""
    classes = []
    for info in registered():
        if info.options is not None and info.options not in classes:
            classes.append(info.options)
    return tuple(classes)


# --------------------------------------------------------------------------- attention kinds


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind, everything the package says of it: its key (what mechanisms
    declare, and the file-name form), SPEC flag, names, causality, the config attribute
    holding its layer count, and whether the language model has it."""

    key: str
    flag: str
    description: str  # "encoder self-attention"
    label: str  # "encoder self": a table column's name
    causal: bool
    layers_attr: str  # the model config's number of layers of this kind
    in_language_model: bool
    # The stack of this kind that AttentionOptions.check_kind checks: the longest sequence its layers
    # attend over and the flag that sets it (None: unknown). Not part of the kind's identity.
    max_positions: Optional[int] = dataclasses.field(default=None, compare=False)
    positions_flag: str = dataclasses.field(default="", compare=False)
    # the per-head width of that stack's attention (None: unknown)
    head_dim: Optional[int] = dataclasses.field(default=None, compare=False)
    # Whether the model is new (fairseq-train's flags) rather than rebuilt from a checkpoint: checks
    # added after checkpoints were trained refuse only new models, so that those checkpoints still load.
    new_model: bool = dataclasses.field(default=True, compare=False)

    @property
    def attr(self) -> str:
        """The parsed arguments' attribute of its SPEC flag (``encoder_self_attention``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def allowed(self) -> FrozenSet[str]:
        """ "vanilla" and the mechanisms that declare this kind."""
        return frozenset({"vanilla", *(info.name for info in registered() if self.key in info.kinds)})

    @property
    def layers_to_keep_attr(self) -> str:
        """The model config's attribute of fairseq's pruning of this kind's stack
        (``encoder_layers_to_keep``: the layers LayerDrop's inference keeps)."""
        return self.layers_attr + "_to_keep"

    @property
    def layers_to_keep_flag(self) -> str:
        return "--" + self.layers_to_keep_attr.replace("_", "-")

    def disallowed_reason(self, mechanism: str) -> str:
        return REGISTRY[mechanism].unsupported[self.key]


ENCODER_SELF = AttentionKind(
    ENCODER_SELF_KIND,
    "--encoder-self-attention",
    "encoder self-attention",
    "encoder self",
    causal=False,
    layers_attr="encoder_layers",
    in_language_model=False,
)
DECODER_SELF = AttentionKind(
    DECODER_SELF_KIND,
    "--decoder-self-attention",
    "decoder self-attention",
    "decoder self",
    causal=True,
    layers_attr="decoder_layers",
    in_language_model=True,
)
CROSS = AttentionKind(
    CROSS_KIND,
    "--cross-attention",
    "encoder-decoder cross-attention",
    "cross",
    causal=False,
    layers_attr="decoder_layers",
    in_language_model=False,
)
KINDS = (ENCODER_SELF, DECODER_SELF, CROSS)
