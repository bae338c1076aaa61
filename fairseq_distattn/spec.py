"""Per-layer attention SPECs and the model-wide options (:class:`AttentionOptions`, one
instance of each options dataclass): parsing and validation, no fairseq imports.

A SPEC is a comma-separated list of ``MECH[@LAYERS]``: ``LAYERS`` is ``i`` or
``i-j`` (0-based, inclusive); no ``@`` means every layer; layers not named are
vanilla. Example: ``window-aw@0-2,rpr@3``.

Invalid input is reported the way argparse reports a bad flag: one line on
stderr naming the flag, the bad value and what is allowed, exit status 2.
"""

import contextlib
import dataclasses
import os
import re
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from . import mechanisms as _mechanisms  # noqa: F401 (discovers and registers every mechanism module)
from .registry import (
    KINDS,
    REGISTRY,
    RUNTIME,
    AttentionKind,
    OptionContext,
    SpecError,
    is_integer,
    one_of,
    option,
    option_classes,
    option_flag,
    registered,
)

# "vanilla" (fairseq's own attention) and every registered mechanism, in listing order
MECHANISMS = ("vanilla", *(info.name for info in registered()))


def exit_on_spec_error(error: SpecError):
    """Report like argparse: one line on stderr, exit status 2."""
    exit_with_error(str(error))


class RefusedConfiguration(ValueError):
    """A refusal inside a library call (:func:`library_call`: the hub's ``from_pretrained``),
    which the caller can catch; ``str()`` is the one line a command line would print. On a
    command line (fairseq's CLIs, ``fairseq-hydra-train``, which turns any ``Exception`` into
    a traceback and status 1) the same refusal is ``SystemExit(2)`` after the line on stderr."""


# True inside a library call (library_call): a refusal raises RefusedConfiguration instead of exiting
_IN_LIBRARY_CALL: ContextVar[bool] = ContextVar("distattn_in_library_call", default=False)


@contextlib.contextmanager
def library_call():
    """Refusals inside raise :class:`RefusedConfiguration` and write nothing to stderr (the
    hub's ``from_pretrained``: the caller decides what to show)."""
    token = _IN_LIBRARY_CALL.set(True)
    try:
        yield
    finally:
        _IN_LIBRARY_CALL.reset(token)


def exit_with_error(message: str):
    """``PROG: error: MESSAGE`` on stderr and exit status 2, as argparse reports a bad command
    line; in a :func:`library_call`, :class:`RefusedConfiguration` instead."""
    if _IN_LIBRARY_CALL.get():
        raise RefusedConfiguration(message)
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def _ordered(names) -> str:
    return ", ".join(m for m in MECHANISMS if m in names)


def accepted_by(kinds) -> List[str]:
    """The mechanisms, in listing order, that every one of ``kinds`` (registry kind names) accepts."""
    by_key = {kind.key: kind for kind in KINDS}
    unknown = [key for key in kinds if key not in by_key]
    if unknown:
        raise ValueError(f"unknown attention kind(s) {', '.join(unknown)}; kinds: {', '.join(by_key)}")
    return [name for name in MECHANISMS if all(name in by_key[key].allowed for key in kinds)]


def option_users(field: dataclasses.Field) -> Tuple[str, ...]:
    """The mechanisms an option configures, in listing order: those registered
    with its options class, narrowed by the option's ``applies_to``; none for
    the attention module's own options, which every layer has."""
    flag = option_flag(field)
    return tuple(
        info.name
        for info in registered()
        if field in info.option_fields() and (flag.applies_to is None or flag.applies_to(info.name))
    )


def specs_name(specs: Iterable[Optional[str]]) -> FrozenSet[str]:
    """The mechanisms some item of these SPECs names (validated SPECs: every item covers a layer)."""
    return frozenset(item.partition("@")[0].strip() for spec in specs if spec for item in spec.split(","))


def unused_options(values: Mapping[str, Any], specs: Mapping[str, Optional[str]]) -> List[Tuple[str, Any, str]]:
    """``(flag, value, why it changes nothing)`` for each mechanism option in
    ``values`` (attribute -> parsed value; an absent one is at its default)
    that differs from its default while none of the mechanisms it configures
    is named by ``specs`` (flag -> SPEC), or while the option it needs
    (``only_with``) has another value: most likely a mistake."""
    used = specs_name(specs.values())
    named = ", ".join(f"{flag} {spec}" for flag, spec in specs.items() if spec and spec != "vanilla")
    named = named or "every layer is vanilla"
    defaults = {option_flag(field).attr: option_flag(field).arg_default for field in option_fields()}
    found = []
    for field in option_fields():
        flag, users = option_flag(field), option_users(field)
        value = values.get(flag.attr, flag.arg_default)
        if value == flag.arg_default or not users:
            continue
        if not used & set(users):
            found.append((flag.flag, value, f"it configures {', '.join(users)}, which no layer uses ({named})"))
        elif flag.only_with is not None:
            attr, needed = flag.only_with
            given = values.get(attr, defaults[attr])
            if given != needed:
                other = "--" + attr.replace("_", "-")
                found.append((flag.flag, value, f"it is used only with {other} {needed}, not {other} {given}"))
    return found


# Only ASCII digits: int() would also take "+1", "1_0" and other scripts' digits.
LAYERS_PATTERN = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)


def _parse_layers(kind: AttentionKind, spec: str, item: str, text: str, num_layers: int) -> range:
    grammar = f"a layer i or range i-j with 0 <= i <= j <= {num_layers - 1}"
    if not text:
        raise SpecError(
            kind.flag, spec, f"{item!r} has an empty layer list after '@'", grammar + " (or no '@' for every layer)"
        )
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
                kind.flag,
                spec,
                f"{name} does not apply to {kind.description} ({kind.disallowed_reason(name)})",
                _ordered(kind.allowed),
            )
        covered = _parse_layers(kind, spec, item, layer_text.strip(), num_layers) if at else range(num_layers)
        for layer in covered:
            if owner[layer] is not None:
                raise SpecError(
                    kind.flag,
                    spec,
                    f"{owner[layer]!r} and {item!r} both set layer {layer}",
                    "non-overlapping layer ranges",
                )
            owner[layer] = item
            layers[layer] = name
    return layers


def kept_layers(flag: str, layers_to_keep, num_layers: int) -> Tuple[int, ...]:
    """The trained layers that fairseq's pruning keeps of a stack of ``num_layers``
    (``layers_to_keep``, the value of ``flag``: ``--encoder-layers-to-keep`` or
    ``--decoder-layers-to-keep``, LayerDrop's use at inference), sorted: fairseq builds
    that many layers and renames the kept layers' parameters 0, 1, ... in this order.
    Every layer where ``layers_to_keep`` is empty."""
    if layers_to_keep in (None, ""):
        return tuple(range(num_layers))
    allowed = f"distinct layer indices from 0 to {num_layers - 1}, comma-separated (the trained model's layers)"
    # text from --model-overrides and the LM's parser; a list from TransformerConfig's (fairseq-train)
    listed = not isinstance(layers_to_keep, str) and hasattr(layers_to_keep, "__iter__")
    items = [str(item) for item in layers_to_keep] if listed else str(layers_to_keep).split(",")
    if not all(item.strip().isdigit() for item in items):
        raise SpecError(flag, layers_to_keep, "not a comma-separated list of layer indices", allowed)
    kept = sorted(int(item) for item in items)
    if len(set(kept)) != len(kept):
        raise SpecError(
            flag, layers_to_keep, "names a layer twice (fairseq would build it twice but load it once)", allowed
        )
    if kept[-1] >= num_layers:
        raise SpecError(
            flag, layers_to_keep, f"layer {kept[-1]} is not one of the model's {num_layers} layers", allowed
        )
    return tuple(kept)


def pruned_spec(kind: AttentionKind, spec: Optional[str], num_layers: int, layers_to_keep=None) -> List[str]:
    """The mechanism of every layer a stack of ``num_layers`` trained layers builds, after
    fairseq's pruning to ``layers_to_keep`` (:func:`kept_layers`): each kept layer keeps its
    trained layer's mechanism, as it keeps that layer's parameters."""
    layers = parse_spec(kind, spec, num_layers)
    return [layers[index] for index in kept_layers(kind.layers_to_keep_flag, layers_to_keep, num_layers)]


def check_no_pruning_in_training(kind: AttentionKind, layers_to_keep) -> None:
    """Raise :class:`SpecError` for ``--encoder-layers-to-keep``/``--decoder-layers-to-keep``
    on a new model: fairseq prunes a trained model at inference; a model trained pruned saves
    the kept count as its layer count beside the list, which no fairseq command loads again
    (and fairseq's translation ``build_model`` fails on the list its parser makes)."""
    if layers_to_keep not in (None, "") and not (hasattr(layers_to_keep, "__len__") and len(layers_to_keep) == 0):
        raise SpecError(
            kind.layers_to_keep_flag,
            layers_to_keep,
            "pruning applies to a trained model at inference; fairseq-train builds every layer",
            f"no pruning in fairseq-train (train with LayerDrop, --{kind.layers_attr.split('_')[0]}-layerdrop P, "
            f"then evaluate with --model-overrides \"{{'{kind.layers_to_keep_attr}': '0,2'}}\")",
        )


def _recompute_length(value, context):
    if not is_integer(value) or value < 0:
        raise SpecError(
            "--attention-recompute-length",
            value,
            "must be a non-negative integer",
            "an integer >= 0 (0: never recompute)",
        )
    return value


def _randomized_positions(value, context):
    flag = "--randomized-positions"
    if not is_integer(value) or value < 0:
        raise SpecError(flag, value, "must be a non-negative integer", "an integer >= 0 (0: off)")
    if value and context.max_positions and value < context.max_positions:
        raise SpecError(
            flag,
            value,
            f"smaller than the longest sequence the model accepts ({context.positions_flag} "
            f"{context.max_positions}): a sorted sample of T distinct positions of [0, N) needs N >= T",
            f"0 (off) or an integer >= {context.max_positions}",
        )
    return value


@dataclass(frozen=True)
class AttentionModuleOptions:
    """Options of the attention module itself, whatever its mechanism."""

    # key length from which a training forward recomputes attention in query
    # chunks during backward instead of keeping [B, H, Tq, Tk] tensors (0: never)
    attention_recompute_length: int = option(
        256,
        "--attention-recompute-length",
        "from this key length on, training keeps no [B, H, Tq, Tk] attention tensor for backward: "
        "it recomputes the mechanism in blocks of query rows instead (activation checkpointing: less memory, "
        "one more attention forward per layer; the mechanism table says which mechanisms and paths are "
        "recomputed); 0 = never (default: {default}). With --attention-dropout > 0 the recomputed blocks "
        "draw their own dropout masks (a block and its recomputation share one, so the gradients are "
        "exact), so one --seed gives a different, equally valid run for each value of this flag; 0 draws "
        "one mask per layer, as fairseq does",
        convert=_recompute_length,
        type=int,
        metavar="N",
        role=RUNTIME,
    )
    attention_flex: str = option(
        "auto",
        "--attention-flex",
        "on CUDA, mechanisms that declare a flex_attention path (the mechanism table) can run their "
        "full-sequence calls without weights or attention dropout through compiled "
        "torch.nn.attention.flex_attention. auto: for keys from --attention-recompute-length on (where it "
        "keeps no [B, H, Tq, Tk] tensor; shorter keys take the eager path, which trained faster on an H100); "
        "always: at every length; never: always the eager/SDPA path, to compare or where torch.compile "
        "cannot build the kernel (default: {default}); CPU is never affected. A trained model takes it at "
        "generation time as --model-overrides \"{{'attention_flex': 'never'}}\"",
        convert=one_of("--attention-flex", ("auto", "always", "never")),
        metavar="auto|always|never",
        role=RUNTIME,
    )
    randomized_positions: int = option(
        0,
        "--randomized-positions",
        "randomized positional encodings (Ruoss et al. 2023): in training only, each attention layer whose "
        "mechanism reads positions draws, per batch, a sorted sample without replacement from [0, N) and uses it "
        "for the positions 0..T-1 (rope, xpos (its scales centred on the middle of [0, N)) and fire: the "
        "positions; alibi, kerple, sandwich, t5-bias, transformer-xl and rpr (its bucket of the distance "
        "clipped at K): sorted distances r_1 < ... < r_(T-1) of [1, N), an offset j-i read as sign(j-i) "
        "r_|j-i|, as the authors' NOISY_RELATIVE), and fairseq's sinusoidal position embeddings embed such a "
        "sample of [0, N); evaluation and decoding use 0..T-1 (the authors randomize at test time too: "
        "--randomized-positions-at-evaluation). "
        "Refused with learned position embeddings. N must be at least the "
        "longest sequence the model accepts; 0 = off (default: {default})",
        convert=_randomized_positions,
        type=int,
        metavar="N",
        # a training setting, as dropout is: evaluation and decoding compute the same function whatever N
        role=RUNTIME,
    )
    randomized_positions_at_evaluation: bool = option(
        False,
        "--randomized-positions-at-evaluation",
        "with --randomized-positions N: evaluation's full-sequence calls (fairseq-eval-lm, fairseq-validate, "
        "validation in training, scoring a whole sequence by teacher forcing) draw their positions from [0, N) as "
        "training does, as Ruoss et al.'s code evaluates (google-deepmind/randomized_positional_encodings draws in "
        "every call); without it they use 0..T-1. Incremental decoding (fairseq-generate, fairseq-interactive) "
        "cannot draw, a step not knowing the sequence's final length, and is refused with it",
        action="store_true",
        # how evaluation computes, as --retain-dropout is for dropout: any command may change it
        role=RUNTIME,
    )


def model_option_classes() -> Tuple[type, ...]:
    """The options dataclasses of the model-wide :class:`AttentionOptions`, in listing order:
    each registered mechanism's (once), then the attention module's."""
    return (*option_classes(), AttentionModuleOptions)


def option_fields() -> Tuple[dataclasses.Field, ...]:
    """Every option field across the options dataclasses, in listing order: the flat list the
    command line offers (each field is one flag), and the one place that flattens them."""
    return tuple(field for options_class in model_option_classes() for field in dataclasses.fields(options_class))


def _read_options(options_class: type, args, context: OptionContext):
    """An ``options_class`` instance from parsed flags, each field converted once (an absent
    flag takes its default); a bad value raises :class:`SpecError`."""
    values = {}
    for field in dataclasses.fields(options_class):
        flag = option_flag(field)
        values[field.name] = flag.convert(getattr(args, flag.attr, flag.arg_default), context)
    return options_class(**values)


class AttentionOptions:
    """The options of every layer's attention, validated once per model: one instance of each
    registered mechanism's options dataclass and of :class:`AttentionModuleOptions`, each
    mechanism reading only its own (:meth:`for_mechanism`). ``AttentionOptions(*given)`` holds
    the instances given and every other class at its defaults
    (``AttentionOptions(KerpleOptions(kerple_kernel="log"))``); :meth:`from_args` reads them
    from parsed flags. Immutable, compared by value."""

    __slots__ = ("_by_class",)

    def __init__(self, *given):
        by_class = {options_class: options_class() for options_class in model_option_classes()}
        for options in given:
            if type(options) not in by_class:
                raise TypeError(
                    f"{type(options).__name__} is the options dataclass of no registered mechanism "
                    "nor of the attention module"
                )
            by_class[type(options)] = options
        object.__setattr__(self, "_by_class", by_class)

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def of(self, options_class: type):
        """The ``options_class`` instance it holds."""
        return self._by_class[options_class]

    def for_mechanism(self, name: str):
        """The options dataclass of the registered mechanism ``name`` (None without an options class)."""
        return REGISTRY[name].own_options(self)

    @property
    def module(self) -> AttentionModuleOptions:
        """The attention module's own options, whatever its mechanism."""
        return self.of(AttentionModuleOptions)

    def __eq__(self, other):
        return isinstance(other, AttentionOptions) and self._by_class == other._by_class

    def __hash__(self):
        return hash(tuple(self._by_class.values()))

    def __reduce__(self):
        # copy, deepcopy and pickle rebuild it through __init__ (its __setattr__ refuses them)
        return (AttentionOptions, tuple(self._by_class.values()))

    def __repr__(self):
        return f"AttentionOptions({', '.join(map(repr, self._by_class.values()))})"

    @classmethod
    def from_args(
        cls, args, max_positions: Optional[int] = None, positions_flag: Optional[str] = None
    ) -> "AttentionOptions":
        """Options from parsed flags (absent flags take the defaults). ``max_positions``:
        the longest sequence the model accepts, which bounds ``--max-relative-position``
        (no distance beyond it ever occurs), set by ``positions_flag`` (named in
        messages). A bad value raises :class:`SpecError`."""
        context = (
            OptionContext(max_positions) if positions_flag is None else OptionContext(max_positions, positions_flag)
        )
        options = cls(*(_read_options(options_class, args, context) for options_class in model_option_classes()))
        for info in registered():
            info.module.check_options(info.own_options(options))
        return options

    def check_kind(
        self,
        kind: AttentionKind,
        layers: List[str],
        max_positions: Optional[int] = None,
        positions_flag: str = "",
        new_model: bool = True,
        head_dim: Optional[int] = None,
    ):
        """Raise SpecError where an option cannot work for the mechanisms ``layers`` use in ``kind``.
        ``max_positions``: the longest sequence this stack attends over (None: unknown), set by
        ``positions_flag``; ``new_model``: False where the model is rebuilt from a checkpoint; ``head_dim``:
        the per-head width of its attention (None: unknown). Mechanisms read them as ``kind.max_positions``,
        ``kind.positions_flag``, ``kind.new_model`` and ``kind.head_dim``."""
        kind = dataclasses.replace(
            kind, max_positions=max_positions, positions_flag=positions_flag, new_model=new_model, head_dim=head_dim
        )
        for name in dict.fromkeys(layers):
            if name != "vanilla":
                info = REGISTRY[name]
                info.module.check_options(info.own_options(self), kind, layers)
