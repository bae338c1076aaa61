"""Command-line flags and architecture registration shared by both models."""

import argparse
import logging
import math

import torch
from fairseq.models import register_model_architecture

from ..registry import CROSS, DECODER_SELF, ENCODER_SELF, is_integer, option_flag
from ..spec import KINDS, MECHANISMS, SpecError, exit_on_spec_error, option_fields, unused_options

logger = logging.getLogger(__name__)


def spec_help(kind):
    allowed = ", ".join(m for m in MECHANISMS if m in kind.allowed)
    return (
        f"mechanism per layer of {kind.description} (default: vanilla): comma-separated MECH[@LAYERS], "
        f"MECH one of {allowed}; LAYERS i or i-j (0-based, inclusive); no @ = every layer; "
        "layers not named are vanilla"
    )


HELP_TITLE = "distance-aware attention (fairseq_distattn)"


def add_distattn_args(container, kinds):
    """Add the plugin's flags to a parser (in a group of their own) or to the
    model-specific argument group fairseq hands a model's ``add_args``.

    Defaults are suppressed, as in fairseq's model group: a flag the user did
    not give is absent, so architectures can supply their own defaults."""
    if isinstance(container, argparse.ArgumentParser):
        container = container.add_argument_group(HELP_TITLE, argument_default=argparse.SUPPRESS)

    def add(flag, **kwargs):
        if flag not in container._option_string_actions:  # already added for --help
            container.add_argument(flag, **kwargs)

    for kind in kinds:
        add(kind.flag, type=str, metavar="SPEC", help=spec_help(kind))
    # every option of every registered mechanism (and of the attention module), as it declares it
    for flag in OPTION_FLAGS:
        add(flag.flag, help=flag.help, **flag.argparse)


def add_every_kind_of_flag(parser) -> None:
    """The flags of both models (what fairseq's ``--help`` lists, see
    :mod:`fairseq_distattn.patches.fairseq_options`)."""
    add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))


SPEC_ATTRIBUTES = {kind.attr: kind for kind in KINDS}
# the command-line side of every option field, across the options dataclasses
OPTION_FLAGS = tuple(option_flag(field) for field in option_fields())
# attribute -> default of every option flag (the SPEC flags default to "vanilla")
OPTION_DEFAULTS = {flag.attr: flag.arg_default for flag in OPTION_FLAGS}


def set_distattn_defaults(args, encoder_self=None, decoder_self=None, cross=None):
    """Architecture defaults: a flag the user gave always wins (an empty one
    too, which the SPEC check then refuses)."""
    if getattr(args, "no_cross_attention", False):
        cross = None  # a preset's cross-attention default has nothing to apply to
    for flag_attr, spec in zip(SPEC_ATTRIBUTES, (encoder_self, decoder_self, cross)):
        if getattr(args, flag_attr, None) is None:
            setattr(args, flag_attr, spec or "vanilla")
    for attr, default in OPTION_DEFAULTS.items():
        setattr(args, attr, getattr(args, attr, default))


# --arch name -> (fairseq architecture function it extends, its SPEC defaults by attribute)
ARCHITECTURES = {}


def register_architecture(
    model_name,
    name,
    fairseq_architecture,
    no_absolute_positions=False,
    encoder_self=None,
    decoder_self=None,
    cross=None,
):
    """Register ``name``: fairseq's architecture defaults plus attention defaults
    (architectures only set defaults; a flag the user gives always wins). A SPEC
    default may be a function of the parsed ``args``, called after fairseq's
    defaults (so it reads the layer counts) where the flag was not given: a SPEC
    that follows ``--decoder-layers``; it returns None where it cannot be formed (a
    bad value of a flag it reads, which the checks then refuse), leaving vanilla.
    ``ARCHITECTURES`` holds its value on fairseq's defaults alone."""
    given = dict(zip(SPEC_ATTRIBUTES, (encoder_self, decoder_self, cross)))
    follows_args = any(callable(spec) for spec in given.values())
    on_defaults = argparse.Namespace()
    if follows_args:
        fairseq_architecture(on_defaults)
    specs = {attr: spec(on_defaults) if callable(spec) else spec for attr, spec in given.items() if spec}
    ARCHITECTURES[name] = (fairseq_architecture, specs)

    def set_defaults(args):
        if no_absolute_positions:
            args.no_token_positional_embeddings = getattr(args, "no_token_positional_embeddings", True)
        if follows_args:
            fairseq_architecture(args)  # the layer counts a SPEC function reads (it sets defaults only)
        resolved = [
            spec(args) if callable(spec) and getattr(args, attr, None) is None else spec for attr, spec in given.items()
        ]
        set_distattn_defaults(args, *(None if callable(spec) else spec for spec in resolved))
        fairseq_architecture(args)

    set_defaults.__name__ = name
    register_model_architecture(model_name, name)(set_defaults)
    return set_defaults


def with_preset_note(error: SpecError, args) -> SpecError:
    """Say so when the refused SPEC is the ``--arch`` preset's own default (the
    user may never have typed it, e.g. window presets with fewer layers)."""
    arch = getattr(args, "arch", None)
    preset_specs = ARCHITECTURES.get(arch, (None, {}))[1]
    attr = error.flag[2:].replace("-", "_")
    if attr in preset_specs and preset_specs[attr] == error.value:
        return error.with_note(f"{error.value!r} is the default of --arch {arch}; give {error.flag} to override it")
    return error


def build_or_exit(build, args):
    """Run a model build (or check); a bad flag value exits like argparse
    (status 2, one line)."""
    try:
        return build()
    except SpecError as error:
        exit_on_spec_error(with_preset_note(error, args))


def plugin_flags_given(args):
    """``(flag, value)`` of each plugin flag on ``args`` whose value differs
    from its default (absent flags were not given: their defaults are suppressed)."""
    for attr, default in {**dict.fromkeys(SPEC_ATTRIBUTES, "vanilla"), **OPTION_DEFAULTS}.items():
        value = getattr(args, attr, default)
        if value != default:
            yield "--" + attr.replace("_", "-"), value


def plugin_architecture_for(fairseq_arch: str) -> str:
    """The plugin architecture with vanilla attention that extends ``fairseq_arch``, if any."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    for name, (fairseq_architecture, specs) in ARCHITECTURES.items():
        if not specs and ARCH_CONFIG_REGISTRY.get(fairseq_arch) is fairseq_architecture:
            return f"--arch {name}"
    return (
        "--arch distattn_transformer (translation) or --arch distattn_lm (language modelling), or one of their presets"
    )


def _divisors(n: int) -> str:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return ", ".join(str(d) for d in sorted({*small, *(n // d for d in small)}))


def check_attention_heads(args, sides=("encoder", "decoder")):
    """``--{side}-embed-dim`` and ``--{side}-attention-heads`` that fairseq's
    ``MultiheadAttention`` can split (it asserts that the heads divide the width,
    divides by their number, and scales by ``head_dim ** -0.5``, so a head needs
    at least one dimension); raise SpecError otherwise. Values absent from
    ``args`` are not checked."""
    for side in sides:
        dim_flag, heads_flag = f"--{side}-embed-dim", f"--{side}-attention-heads"
        dim = getattr(args, f"{side}_embed_dim", None)
        heads = getattr(args, f"{side}_attention_heads", None)
        if dim is not None and (not is_integer(dim) or dim < 1):
            raise SpecError(
                dim_flag,
                dim,
                "must be a positive integer (the model's width, which the attention heads split)",
                "an integer >= 1",
            )
        if dim is None or heads is None:
            continue
        if not is_integer(heads) or heads < 1 or dim % heads:
            raise SpecError(
                heads_flag,
                heads,
                f"must be a positive number that divides {dim_flag} {dim} (each head attends in "
                f"{dim_flag} / {heads_flag} dimensions)",
                f"a divisor of {dim}: {_divisors(dim)}",
            )


# fairseq's tasks by what their samples hold (class names: a task that subclasses one is one too)
LANGUAGE_MODELING_TASKS = frozenset({"LanguageModelingTask", "MultilingualLanguageModelingTask", "DummyLMTask"})
TRANSLATION_TASKS = frozenset({"TranslationTask", "TranslationMultiSimpleEpochTask", "DummyMTTask"})


def _task_is(args, names) -> bool:
    from fairseq.tasks import TASK_REGISTRY

    task = TASK_REGISTRY.get(getattr(args, "task", None))
    return task is not None and any(cls.__name__ in names for cls in task.__mro__)


def blocks_exceed_positions(positions, block, sample_break_mode) -> bool:
    """Whether fairseq's ``language_modeling`` task skips all its full blocks: with
    ``--sample-break-mode none`` it cuts the text into blocks of ``--tokens-per-sample``
    tokens (``block``; the last one shorter), and fairseq-train and fairseq-eval-lm skip
    every block longer than the model's ``max_positions()`` (``positions``, its
    ``max_target_positions``), fairseq-eval-lm with one warning and none in its result."""
    return sample_break_mode in (None, "none") and is_integer(positions) and is_integer(block) and positions < block


def check_blocks_fit_the_model(model_args, task):
    """Raise SpecError where a language model built from a checkpoint (``model_args``, its
    configuration with any ``--model-overrides``) accepts fewer positions than the blocks
    the command's ``task`` scores (:func:`blocks_exceed_positions`): fairseq-eval-lm past the
    training length with the checkpoint's ``max_target_positions`` would score only the
    last, shorter block and print a perplexity as if that were the set. fairseq-eval-lm
    has already taken ``--context-window`` off the task's ``--tokens-per-sample``."""
    task_args = getattr(task, "args", None)
    if task_args is None or not any(cls.__name__ == "LanguageModelingTask" for cls in type(task).__mro__):
        return
    positions, block = getattr(model_args, "max_target_positions", None), getattr(task_args, "tokens_per_sample", None)
    if not blocks_exceed_positions(positions, block, getattr(task_args, "sample_break_mode", None)):
        return
    learned = getattr(model_args, "decoder_learned_pos", False) and not getattr(
        model_args, "no_token_positional_embeddings", False
    )
    fits = f"--tokens-per-sample {positions} or less (plus any --context-window)"
    raise SpecError(
        "--tokens-per-sample",
        block,
        f"blocks of {block} tokens to score (--tokens-per-sample less --context-window) are longer than the "
        f"checkpoint's max_target_positions {positions}: fairseq skips every block longer than the model's "
        "positions, with one warning, and would score only the last, shorter one",
        fits + " (its learned position embeddings have no more positions)"
        if learned
        else f"--model-overrides \"{{'max_target_positions': {block}}}\" (with the other overrides) to score "
        f"every token, or {fits}",
    )


def check_model_and_task(args, model):
    """Raise SpecError where ``--task`` cannot train the plugin model ``model``
    (fairseq would fail with an AttributeError or TypeError once training starts),
    or where a language model's positions are shorter than every training block
    (fairseq would skip every block and fail on an empty batch list)."""
    from fairseq.models import FairseqEncoderDecoderModel, FairseqLanguageModel

    arch, task = args.arch, args.task
    if issubclass(model, FairseqEncoderDecoderModel) and _task_is(args, LANGUAGE_MODELING_TASKS):
        raise SpecError(
            "--arch",
            arch,
            f"an encoder-decoder translation model, which --task {task} cannot train (its samples have "
            "no source sentence to encode)",
            f"--arch distattn_lm (or one of its presets) for --task {task}, or a translation task "
            "(--task translation) for this model",
        )
    if issubclass(model, FairseqLanguageModel) and _task_is(args, TRANSLATION_TASKS):
        raise SpecError(
            "--arch",
            arch,
            f"a decoder-only language model, which --task {task} cannot train (its samples are pairs of "
            "source and target sentences)",
            f"--arch distattn_transformer (or one of its presets) for --task {task}, or --task "
            "language_modeling for this model",
        )
    positions, block = getattr(args, "max_target_positions", None), getattr(args, "tokens_per_sample", None)
    if (
        issubclass(model, FairseqLanguageModel)
        and _task_is(args, {"LanguageModelingTask"})
        and blocks_exceed_positions(positions, block, getattr(args, "sample_break_mode", None))
    ):
        raise SpecError(
            "--max-target-positions",
            positions,
            f"shorter than --tokens-per-sample {block}: with --sample-break-mode none every training block "
            f"but the last has {block} tokens, and fairseq skips every block longer than the model accepts, "
            "so no training data is left",
            f"an integer >= {block}, or leave it out (it defaults to --tokens-per-sample)",
        )


def check_training_precision(args):
    """Raise SpecError for a training precision that fairseq cannot run on this
    machine, which it would find only once the model is built: ``--fp16`` keeps
    its flattened float32 master weights on the current CUDA device, and
    ``--bf16`` implies ``--tpu``, which needs torch_xla."""
    import fairseq.utils

    fp16_needs_cuda = (
        getattr(args, "fp16", False)
        and not getattr(args, "memory_efficient_fp16", False)
        and not getattr(args, "fp16_no_flatten_grads", False)
        and not getattr(args, "amp", False)
        and getattr(args, "ddp_backend", None) != "fully_sharded"
    )
    if fp16_needs_cuda and not torch.cuda.is_available():
        raise SpecError(
            "--fp16",
            True,
            "fairseq's --fp16 keeps a float32 copy of the weights on the current CUDA device, and CUDA is "
            "not available here",
            "float32 (no --fp16) without CUDA; --memory-efficient-fp16 and --fp16 --fp16-no-flatten-grads "
            "keep no such copy and also run on CPU",
        )
    if getattr(args, "tpu", False) and getattr(fairseq.utils, "xm", None) is None:
        if getattr(args, "memory_efficient_bf16", False):
            flag, problem = "--memory-efficient-bf16", "implies --bf16, which in fairseq 0.12 implies --tpu"
        elif getattr(args, "bf16", False):
            flag, problem = "--bf16", "fairseq 0.12's --bf16 implies --tpu (bfloat16 training is for TPUs)"
        else:
            flag, problem = "--tpu", "TPU training"
        raise SpecError(
            flag,
            True,
            f"{problem}, which needs torch_xla, and torch_xla is not installed",
            "float32 (leave it out), or on CUDA --fp16 or --amp",
        )


def check_evaluation_args(args):
    """fairseq-eval-lm's ``--context-window`` against ``--tokens-per-sample``:
    each scored block has ``tokens_per_sample - context_window`` new tokens, so a
    window that is not smaller leaves no block (fairseq then fails deep in its
    data code, with a ZeroDivisionError or a negative block size)."""
    window, block = getattr(args, "context_window", None), getattr(args, "tokens_per_sample", None)
    if is_integer(window) and is_integer(block) and window > 0 and window >= block:
        raise SpecError(
            "--context-window",
            window,
            f"not smaller than --tokens-per-sample {block}: fairseq-eval-lm scores blocks of --tokens-per-sample "
            "minus --context-window new tokens, each after that much context, so none would be left",
            f"an integer 0 <= C < {block} (--tokens-per-sample / 2 is common), or a larger --tokens-per-sample",
        )


def check_parsed_args(args):
    """Validate the plugin's flags as soon as fairseq-train has parsed them:
    before any data is loaded or directory written, and also when ``--arch``
    names a model that is not the plugin's, which would silently ignore them.
    Also the flags fairseq itself would reject only with a traceback later on:
    fairseq-eval-lm's context window, an impossible training precision, and,
    for the plugin's models, a task that cannot train them."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    build_or_exit(lambda: check_evaluation_args(args), args)
    arch = getattr(args, "arch", None)
    model = ARCH_MODEL_REGISTRY.get(arch)
    if model is None:
        return
    if hasattr(model, "check_attention_args"):
        build_or_exit(lambda: check_model_and_task(args, model), args)
        build_or_exit(lambda: model.check_attention_args(args), args)
        build_or_exit(lambda: check_training_precision(args), args)
        warn_about_unused_options(args)
        return
    for flag, value in plugin_flags_given(args):
        exit_on_spec_error(
            SpecError(
                flag,
                value,
                f"--arch {arch} builds fairseq's own {model.__name__}, which has no distance-aware attention",
                f"this flag with {plugin_architecture_for(arch)}",
            )
        )
    build_or_exit(lambda: check_training_precision(args), args)


def warn_about_unused_options(args):
    """A mechanism option given a value while no layer uses a mechanism it
    configures, or while the option it needs has another value, changes
    nothing (``--max-relative-position 8`` with ``da`` layers only,
    ``--da-clip-threshold`` without ``--da-mapping clip``): say so once per
    flag when fairseq-train starts. A warning, not an error: scripts that
    sweep one set of flags over several mechanisms stay valid, and a
    checkpoint's saved flags are not rechecked."""
    specs = {kind.flag: getattr(args, attr, None) for attr, kind in SPEC_ATTRIBUTES.items()}
    for flag, value, reason in unused_options(vars(args), specs):
        logger.warning(f"{flag} {value} has no effect: {reason}")


__all__ = [
    "add_distattn_args",
    "add_every_kind_of_flag",
    "check_parsed_args",
    "set_distattn_defaults",
    "register_architecture",
    "build_or_exit",
    "check_attention_heads",
    "ENCODER_SELF",
    "DECODER_SELF",
    "CROSS",
]
