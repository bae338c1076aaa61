"""What is compared: fairseq's vanilla models, the plugin's paper presets and
one model per mechanism, at a chosen scale, and how each is built in-process.

Scales only shrink widths (embedding, FFN and head counts; the head dimension
and the number of layers stay those of the paper architecture, so a preset
such as ``window@0-2`` still covers the same share of the layers), and the
same flags go to the vanilla baseline and to every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import size_flags

MT, LM = "translation", "language_modeling"

# (flags shrinking the translation architecture, flags shrinking the LM architecture)
_SMALL_MT = size_flags(dim=256, ffn=1024, heads=4)
_SMALL_LM = size_flags(dim=256, ffn=2048, heads=8, sides=("decoder",))
_TINY_MT = size_flags(dim=32, ffn=64, heads=2, layers=3)
_TINY_LM = size_flags(dim=32, ffn=64, heads=2, layers=3, sides=("decoder",))


@dataclass(frozen=True)
class Scale:
    """Model flags and workload sizes of one benchmark scale."""

    name: str
    description: str
    mt_flags: Tuple[str, ...]
    lm_flags: Tuple[str, ...]
    # translation data / training
    mt_lines: int
    mt_vocab: int
    max_tokens: int
    train_batches: int
    # generation
    gen_sentences: int
    gen_max_len: int
    lm_prompt_len: int
    # language modelling data / training
    lm_lines: int
    lm_vocab: int
    tokens_per_sample: int
    lm_rows: int
    # memory
    memory_lengths: Tuple[int, ...]
    memory_rows: int
    # attention-op microbenchmarks: batch, heads, head dim, lengths
    op_batch: int
    op_heads: int
    op_head_dim: int
    op_lengths: Tuple[int, ...]
    op_min_time: float = 0.05  # seconds of repeated calls per op measurement
    # the plugin's models' --attention-flex (fairseq's own models have no such flag): a run's
    # setting, given by replacing it (benchmarks.speed.run's --attention-flex)
    attention_flex: str = "auto"


SCALES: Dict[str, Scale] = {
    "paper": Scale(
        "paper",
        "the presets' own dimensions (transformer_wmt_en_de: 512/2048, 8 heads, 6+6 layers; "
        "transformer_lm_gbw: 512/4096, 16 heads, 12 layers)",
        (),
        (),
        mt_lines=13000,
        mt_vocab=32000,
        max_tokens=4096,
        train_batches=3,
        gen_sentences=16,
        gen_max_len=50,
        lm_prompt_len=8,
        lm_lines=1000,
        lm_vocab=32000,
        tokens_per_sample=256,
        lm_rows=8,
        memory_lengths=(128, 256, 512, 1024, 2048),
        memory_rows=2,
        op_batch=2,
        op_heads=8,
        op_head_dim=64,
        op_lengths=(64, 128, 256, 512, 1024),
    ),
    "small": Scale(
        "small",
        "widths halved for vanilla and presets alike (translation 256/1024, 4 heads, 6+6 layers; "
        "LM 256/2048, 8 heads, 12 layers); head dimension and layer counts as in the paper architectures",
        tuple(_SMALL_MT),
        tuple(_SMALL_LM),
        mt_lines=6000,
        mt_vocab=8000,
        max_tokens=1024,
        train_batches=1,
        gen_sentences=8,
        gen_max_len=32,
        lm_prompt_len=8,
        lm_lines=1000,
        lm_vocab=8000,
        tokens_per_sample=128,
        lm_rows=8,
        memory_lengths=(128, 256, 512, 1024),
        memory_rows=1,
        op_batch=1,
        op_heads=8,
        op_head_dim=64,
        op_lengths=(64, 128, 256, 512, 1024),
    ),
    "tiny": Scale(
        "tiny",
        "CI smoke size (--quick): 32-wide, 2 heads, 3 layers; numbers are not meaningful",
        tuple(_TINY_MT),
        tuple(_TINY_LM),
        mt_lines=300,
        mt_vocab=500,
        max_tokens=256,
        train_batches=1,
        gen_sentences=2,
        gen_max_len=6,
        lm_prompt_len=3,
        lm_lines=200,
        lm_vocab=500,
        tokens_per_sample=32,
        lm_rows=2,
        memory_lengths=(16, 32, 64),
        memory_rows=1,
        op_batch=1,
        op_heads=2,
        op_head_dim=16,
        op_lengths=(16, 32, 64),
        op_min_time=0.01,
    ),
}


@dataclass(frozen=True)
class Config:
    """One model to benchmark."""

    key: str  # unique id used in tables and results.json
    task: str  # MT or LM
    arch: str  # fairseq --arch
    flags: Tuple[str, ...] = ()
    kind: str = "mechanism"  # baseline | preset | mechanism | floor
    note: str = ""
    floor_of: str = ""  # floors: the key of the preset whose cost floor this is (floor.py)

    @property
    def is_baseline(self) -> bool:
        return self.kind == "baseline"


MT_BASELINE = Config(
    "transformer", MT, "transformer_wmt_en_de", kind="baseline", note="fairseq `transformer` (transformer_wmt_en_de)"
)
LM_BASELINE = Config(
    "transformer_lm", LM, "transformer_lm_gbw", kind="baseline", note="fairseq `transformer_lm` (transformer_lm_gbw)"
)

MT_PRESETS = [
    Config("rpr-preset", MT, "distattn_rpr_wmt_en_de", kind="preset", note="distattn_rpr_wmt_en_de"),
    Config("da-preset", MT, "distattn_da_wmt_en_de", kind="preset", note="distattn_da_wmt_en_de"),
    Config("window-preset", MT, "distattn_window_wmt_en_de", kind="preset", note="distattn_window_wmt_en_de"),
    Config("rope-preset", MT, "distattn_rope_wmt_en_de", kind="preset", note="distattn_rope_wmt_en_de"),
]
LM_PRESETS = [
    Config("lm-rpr-preset", LM, "distattn_lm_rpr_gbw", kind="preset", note="distattn_lm_rpr_gbw"),
    Config("lm-da-preset", LM, "distattn_lm_da_gbw", kind="preset", note="distattn_lm_da_gbw"),
    Config("lm-window-preset", LM, "distattn_lm_window_gbw", kind="preset", note="distattn_lm_window_gbw"),
    Config("lm-rope-preset", LM, "distattn_lm_rope_gbw", kind="preset", note="distattn_lm_rope_gbw"),
    Config("lm-xpos-preset", LM, "distattn_lm_xpos_gbw", kind="preset", note="distattn_lm_xpos_gbw"),
]
# Cost floors, not models (floor.py): fairseq's own model plus the
# window's tensor work in stock ops, without the plugin. The translation floor
# is trained and decodes (window-preset's targets are relative to it); the LM
# floor only decodes.
MT_FLOORS = [
    Config(
        "window-floor",
        MT,
        "transformer_wmt_en_de",
        kind="floor",
        floor_of="window-preset",
        note="cost floor of distattn_window_wmt_en_de: fairseq `transformer` + window tensor work, not a model",
    ),
]
LM_FLOORS = [
    Config(
        "lm-window-floor",
        LM,
        "transformer_lm_gbw",
        kind="floor",
        floor_of="lm-window-preset",
        note="cost floor of distattn_lm_window_gbw: fairseq `transformer_lm` + MW window tensor work, not a model",
    ),
]

# Cost floors of the mechanisms that form their own weights (mechanism_floor.py): fairseq's own
# `transformer` computing the mechanism's attention in stock ops where its row places it; trained only.
FLOORED_MECHANISMS = ("stick-breaking", "path", "dape")
MECHANISM_FLOORS = [
    Config(
        f"{mechanism}-floor",
        MT,
        "transformer_wmt_en_de",
        kind="floor",
        floor_of=mechanism,
        note=f"cost floor of {mechanism}: fairseq `transformer` computing {mechanism}'s attention in stock ops",
    )
    for mechanism in FLOORED_MECHANISMS
]


def mechanism_config(mechanism: str) -> Config:
    """``distattn_transformer_wmt_en_de`` with ``mechanism`` in every layer of
    every attention kind that allows it (the rest stays vanilla)."""
    from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF

    flags: List[str] = []
    where = []
    for kind, label in ((ENCODER_SELF, "enc"), (DECODER_SELF, "dec"), (CROSS, "cross")):
        if mechanism in kind.allowed:
            flags += [kind.flag, mechanism]
            where.append(label)
    return Config(
        f"{mechanism}",
        MT,
        "distattn_transformer_wmt_en_de",
        tuple(flags),
        kind="mechanism",
        note=f"{mechanism} in {'+'.join(where)}, all layers",
    )


def mt_mechanism_configs() -> List[Config]:
    from fairseq_distattn.spec import MECHANISMS

    return [mechanism_config(m) for m in MECHANISMS if m != "vanilla"]


def translation_configs(include_mechanisms: bool = True) -> List[Config]:
    mechanisms = [*mt_mechanism_configs(), *MECHANISM_FLOORS] if include_mechanisms else []
    return [MT_BASELINE, *MT_PRESETS, *MT_FLOORS, *mechanisms]


def translation_generation_configs() -> List[Config]:
    return [MT_BASELINE, *MT_PRESETS, *MT_FLOORS]


def lm_configs() -> List[Config]:
    return [LM_BASELINE, *LM_PRESETS]


def lm_generation_configs() -> List[Config]:
    return [*lm_configs(), *LM_FLOORS]


def flex_config_keys() -> List[str]:
    """The candidates some of whose layers may take the flex path (``--configs flex``):
    every mechanism whose terms allow one, and every preset that uses such a mechanism."""
    import fairseq_distattn.mechanisms  # noqa: F401 (registers the mechanisms)
    from fairseq_distattn.functional.paths import Path
    from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF, REGISTRY
    from fairseq_distattn.spec import specs_name
    from fairseq_distattn.tools.path_profile import may_take

    def uses_flex(config: Config) -> bool:
        args = parse_args(config, SCALES["tiny"])
        names = specs_name(getattr(args, kind.attr, None) for kind in (ENCODER_SELF, DECODER_SELF, CROSS))
        return any(may_take(REGISTRY[name], Path.FLEX) for name in names if name in REGISTRY)

    candidates = [*MT_PRESETS, *LM_PRESETS, *mt_mechanism_configs()]
    return [config.key for config in candidates if uses_flex(config)]


def select(configs: Sequence[Config], only: Optional[Sequence[str]]) -> List[Config]:
    """The baseline plus the configs named in ``only`` and their cost floors (all if None)."""
    if not only:
        return list(configs)
    return [c for c in configs if c.is_baseline or c.key in only or c.floor_of in only]


# --------------------------------------------------------------------------- building


def common_flags(config: Config, scale: Scale, max_positions: int) -> List[str]:
    flags = list(scale.mt_flags if config.task == MT else scale.lm_flags)
    if config.kind in ("preset", "mechanism"):
        flags += ["--attention-flex", scale.attention_flex]
    if config.task == MT:
        flags += [
            "--max-source-positions",
            str(max_positions),
            "--max-target-positions",
            str(max_positions),
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            "0.1",
        ]
    else:
        flags += [
            "--tokens-per-sample",
            str(max_positions),
            "--max-target-positions",
            str(max_positions),
            "--criterion",
            "cross_entropy",
        ]
    return flags


def parse_args(config: Config, scale: Scale, max_positions: int = 2048):
    from fairseq import options

    import fairseq_distattn.models  # noqa: F401 (registers the plugin's models)

    parser = options.get_training_parser()
    argv = [
        "data",
        "--task",
        config.task,
        "--arch",
        config.arch,
        *common_flags(config, scale, max_positions),
        *config.flags,
    ]
    return options.parse_args_and_arch(parser, argv)


@dataclass
class Built:
    config: Config
    model: object
    criterion: object
    task: object
    args: object
    parameters: int = 0
    extra: Dict[str, object] = field(default_factory=dict)


def build(config: Config, scale: Scale, dictionary, device, seed: int = 1, max_positions: int = 2048) -> Built:
    """Model, criterion and task of ``config``, on ``device``, seeded."""
    import torch
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.translation import TranslationTask

    args = parse_args(config, scale, max_positions)
    torch.manual_seed(seed)
    if config.task == MT:
        task = TranslationTask(args, dictionary, dictionary)
    else:
        task = LanguageModelingTask(args, dictionary)
    model = task.build_model(args).to(device)
    if config.kind == "floor":  # after the fairseq model drew its parameters: the same ones as vanilla's
        from .floor import add_floor_work
        from .mechanism_floor import add_mechanism_floor

        if config.floor_of in FLOORED_MECHANISMS:
            add_mechanism_floor(model, config.floor_of)
        else:
            add_floor_work(model, "translation" if config.task == MT else "language_modeling")
    criterion = task.build_criterion(args).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    return Built(config, model, criterion, task, args, parameters)


def attention_layout(built: Built) -> str:
    """Human-readable mechanism per layer (from the plugin's plans), or 'vanilla'."""
    if built.config.kind == "floor":
        from .floor import describe_floor
        from .mechanism_floor import describe_mechanism_floor

        if built.config.floor_of in FLOORED_MECHANISMS:
            return describe_mechanism_floor(built.config.floor_of)
        return describe_floor("translation" if built.config.task == MT else "language_modeling")
    parts = []
    encoder = getattr(built.model, "encoder", None)
    decoder = getattr(built.model, "decoder", None)
    for label, module, attr in (
        ("enc", encoder, "self_attention"),
        ("dec", decoder, "self_attention"),
        ("cross", decoder, "cross_attention"),
    ):
        plans = getattr(module, "layer_plans", None)
        if not plans:
            continue
        names = [getattr(plan, attr) for plan in plans]
        if label == "cross" and getattr(built.args, "task", None) == LM:
            continue
        parts.append(f"{label} {_compress(names)}")
    return "; ".join(parts) if parts else "vanilla"


def describe(built: Built) -> dict:
    """The fields every section records about a model, in results.json."""
    config = built.config
    return {
        "key": config.key,
        "kind": config.kind,
        "note": config.note,
        "task": "lm" if config.task == LM else "translation",
        "attention": attention_layout(built),
        **({"floor_of": config.floor_of} if config.floor_of else {}),
    }


def _compress(names: Sequence[str]) -> str:
    """['rpr','rpr','vanilla'] -> 'rpr@0-1'; all vanilla -> 'vanilla'."""
    runs, start = [], 0
    for i in range(1, len(names) + 1):
        if i == len(names) or names[i] != names[start]:
            runs.append((names[start], start, i - 1))
            start = i
    shown = [f"{n}@{a}" + (f"-{b}" if b > a else "") for n, a, b in runs if n != "vanilla"]
    if not shown:
        return "vanilla"
    if len(runs) == 1:
        return runs[0][0]
    return ",".join(shown)
