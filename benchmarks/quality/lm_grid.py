"""What the LM harness (``benchmarks.quality.lm``) trains, and on what.

The configurations (fairseq's ``transformer_lm`` architectures, each followed by
the plugin's presets that extend it, read from the registered architectures, and
the variants trained beside a preset), the model scales, the WikiText-2 data, and
where runs and results go. The harness, its report and the harnesses that read its
runs (``lm_extrapolation``, ``lm_finetune``, ``methods``) take these from here.
"""

from __future__ import annotations

import argparse
import collections
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from ..common import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "lm_quality"
DEFAULT_WORK = REPO_ROOT / "work" / "lm_quality"
SHIPPED_DATA = REPO_ROOT / "data" / "wikitext-2"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "wikitext-2"
# the longest sample (eval tokens + context) a model accepts; see the module docstring
MAX_POSITIONS = 2048

# Model size and budget. tiny: a smoke test; small: one CPU thread; base: a GPU.
SCALES = {
    "tiny": dict(layers=2, dim=16, ffn=32, heads=2, updates=6, max_tokens=512, tokens_per_sample=64),
    "small": dict(layers=3, dim=256, ffn=1024, heads=4, updates=600, max_tokens=2048, tokens_per_sample=64),
    "base": dict(layers=6, dim=512, ffn=2048, heads=8, updates=20000, max_tokens=8192, tokens_per_sample=64),
}


@dataclass(frozen=True)
class LMConfig:
    """One model of the grid: an ``--arch`` and the fairseq architecture it is compared with."""

    name: str
    baseline: str
    note: str
    # a variant of a preset: its --arch and the flags that make it the variant
    arch: str = ""
    flags: Tuple[str, ...] = ()

    def arch_args(self) -> List[str]:
        return ["--arch", self.arch or self.name, *self.flags]


# variants of a preset that the grid trains beside it: (name, preset, flags, what it is)
# --randomized-positions of the randomized rows (Ruoss et al. 2023): the smallest N the models take, their
# positions (MAX_POSITIONS), so that training draws cover every position evaluation reads and no more
RANDOMIZED_N = "2048"
VARIANTS = (
    (
        "distattn_lm_kerple_gbw+per-layer",
        "distattn_lm_kerple_gbw",
        ("--kerple-per-layer",),
        "the preset with r1, r2 per layer (the plugin's kerple up to revision f2ecd07) instead of the authors' "
        "one pair per head shared by the layers",
    ),
    *(
        (
            f"distattn_lm_rope_gbw+p-rope-{kept}",
            "distattn_lm_rope_gbw",
            ("--rope-kept-frequencies", kept),
            f"p-RoPE (Barbero et al. 2025): rope with only the highest {kept} of its frequencies, trained so",
        )
        for kept in ("0.25", "0.75")
    ),
    (
        "distattn_lm_llama4_gbw+interval-3",
        "distattn_lm_llama4_gbw",
        ("--llama4-nope-interval", "3", "--llama4-floor-scale", "64"),
        "Llama 4's interleaving with a NoPE layer in the 3 layers (every 3rd: layer 2), its temperature's floor "
        "scale at the training length (64 tokens: Llama 4's 8192 leaves the factor 1 at every length evaluated)",
    ),
    *(
        (
            f"{preset}+randomized",
            preset,
            ("--randomized-positions", RANDOMIZED_N, "--randomized-positions-at-evaluation"),
            f"{what} with randomized positions (Ruoss et al. 2023, --randomized-positions {RANDOMIZED_N}), drawn in "
            "evaluation too, as the authors' code does (--randomized-positions-at-evaluation)",
        )
        for preset, what in (
            ("distattn_lm_gbw", "sinusoidal positions"),
            ("distattn_lm_rope_gbw", "rope"),
            ("distattn_lm_alibi_gbw", "alibi"),
        )
    ),
)


# flags a preset trains with in the grid, and why: as registered, llama4-temperature's floor scale (Llama 4's
# 8192 positions) leaves its query factor 1 at every length evaluated (up to MAX_POSITIONS), which would make
# the preset NoPE's; at the training length the factor grows beyond it, as Llama 4's does beyond its 8192
PRESET_FLAGS = {
    "distattn_lm_llama4_temperature_gbw": (
        ("--llama4-floor-scale", "64"),
        "its temperature's floor scale at the training length (64 tokens: Llama 4's 8192 leaves the factor 1 "
        "at every length evaluated)",
    ),
}


# presets that are another preset changed in one way, and that preset: the LM extrapolation report reads
# each against it (a variant's is its preset, a scaling's row its rope model)
PRESET_REFERENCES = {
    "distattn_lm_llama4_gbw": "distattn_lm_rope_gbw",  # rope, with NoPE in every K-th layer
    "distattn_lm_llama4_temperature_gbw": "distattn_lm_nope_gbw",  # NoPE, with Llama 4's query temperature
}


@functools.lru_cache(maxsize=None)
def lm_configs() -> Dict[str, LMConfig]:
    """fairseq's LM architectures that the plugin's presets extend, each followed by the
    presets, read from the registered architectures (so a new preset joins the grid)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_INV_REGISTRY

    import fairseq_distattn  # noqa: F401  registers the architectures
    from fairseq_distattn.models.arguments import ARCHITECTURES
    from fairseq_distattn.models.distattn_lm import transformer_lm_architecture

    presets = [name for name in ARCH_MODEL_INV_REGISTRY["distattn_lm"] if name in ARCHITECTURES]
    configs: Dict[str, LMConfig] = {}
    for preset in presets:
        fairseq_architecture, specs = ARCHITECTURES[preset]
        # the shortest fairseq name of that function (transformer_lm_gbw, not transformer_lm_baevski_gbw);
        # --arch transformer_lm is registered as a no-op (its dataclass's defaults), which distattn_lm copies
        baseline = min(
            (
                name
                for name in ARCH_MODEL_INV_REGISTRY["transformer_lm"]
                if ARCH_CONFIG_REGISTRY[name] is fairseq_architecture
            ),
            key=len,
            default="transformer_lm" if fairseq_architecture is transformer_lm_architecture else None,
        )
        if baseline is None:
            raise RuntimeError(f"no fairseq transformer_lm architecture matches the defaults of --arch {preset}")
        configs.setdefault(baseline, LMConfig(baseline, baseline, f"fairseq {baseline}, sinusoidal positions"))
        mechanism = specs.get("decoder_self_attention", "vanilla")
        positions = "no position embeddings" if _drops_positions(preset) else "sinusoidal positions"
        flags, why = PRESET_FLAGS.get(preset, ((), ""))
        note = f"{mechanism} self-attention on {baseline}'s defaults, {positions}" + (f"; {why}" if why else "")
        configs[preset] = LMConfig(preset, baseline, note, flags=flags)
    for name, preset, flags, note in VARIANTS:
        if preset in configs:
            configs[name] = LMConfig(name, configs[preset].baseline, note, preset, flags)
    # baselines first, then mechanism presets, then the plugin's vanilla presets (a check against the baseline);
    # the baseline most presets extend first
    family = collections.Counter(c.baseline for c in configs.values())
    rank = {
        name: (name != c.baseline, "vanilla self-attention" in c.note, -family[c.baseline])
        for name, c in configs.items()
    }
    return {name: configs[name] for name in sorted(configs, key=lambda name: rank[name])}


def _drops_positions(arch: str) -> bool:
    """Whether ``--arch`` defaults to no position embeddings (its registered defaults, applied to no flags)."""
    return bool(_architecture_arguments(arch)["no_token_positional_embeddings"])


def draws_at_evaluation(name: str) -> bool:
    """Whether configuration ``name``'s model draws its positions in evaluation too
    (``--randomized-positions-at-evaluation``, from its flags or its --arch's defaults): two
    evaluations of one of its checkpoints then score two draws, not one number (fairseq-eval-lm
    does not seed torch). A name the grid no longer has: False (its results keep every check)."""
    config = lm_configs().get(name)
    if config is None:
        return False
    arguments = _architecture_arguments(config.arch or config.name)
    return "--randomized-positions-at-evaluation" in config.flags or bool(
        arguments.get("randomized_positions_at_evaluation")
    )


def _architecture_arguments(arch: str, **given) -> Dict[str, object]:
    """The arguments ``--arch`` sets on ``given`` (its registered defaults, applied to no flags)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(**given)
    ARCH_CONFIG_REGISTRY[arch](args)
    return vars(args)


@functools.lru_cache(maxsize=None)
def same_models(scale: str) -> Dict[str, str]:
    """The configurations that are, at ``scale``, the model of a configuration before them in the
    grid, each with that configuration: the same flags, and the same arguments from their --arch
    at the scale's depth. A preset whose SPEC follows the depth can be another preset's model:
    distattn_lm_llama4_gbw at 3 layers is distattn_lm_rope_gbw, Llama 4's period of 4 putting no
    NoPE layer in them (that depth's Llama 4 row is distattn_lm_llama4_gbw+interval-3)."""
    depth = {"decoder_layers": SCALES[scale]["layers"]}
    models: List[Tuple[Tuple[str, ...], Dict[str, object], str]] = []
    repeats: Dict[str, str] = {}
    for name, config in lm_configs().items():
        arguments = _architecture_arguments(config.arch or config.name, **depth)
        earlier = next((other for flags, args, other in models if (flags, args) == (config.flags, arguments)), None)
        if earlier is None:
            models.append((config.flags, arguments, name))
        else:
            repeats[name] = earlier
    return repeats


def same_models_of_runs(runs: Iterable[Dict]) -> Tuple[Optional[str], Dict[str, str]]:
    """The scale of ``runs`` (run records) where they share one, and :func:`same_models` at it (else {})."""
    scales = {run.get("scale") for run in runs}
    if len(scales) != 1 or None in scales:
        return None, {}
    [scale] = scales
    return scale, same_models(scale)


def same_model_text(name: str, scale: str) -> str:
    """Why ``name`` is not trained at ``scale`` (it is in :func:`same_models`)."""
    return (
        f"{name}, which at scale {scale} ({SCALES[scale]['layers']} layers) is {same_models(scale)[name]}'s model "
        "(the same flags and architecture arguments)"
    )


def default_data() -> Path:
    """../shared/data/wikitext-2 when present, else the sample the repository ships."""
    return SHARED_DATA if (SHARED_DATA / "valid.txt").is_file() else SHIPPED_DATA
