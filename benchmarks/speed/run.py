"""The speed benchmark: ``python -m benchmarks.run`` (this module; ``python -m
benchmarks`` and ``python benchmarks/run.py`` run it too).

Writes ``results.md`` (also printed to stdout), ``results.json``,
``benchmark.png``, ``summary.md`` and, when a training or generation target is
missed, ``profiles.md`` into ``--out`` (default ``benchmarks/results/speed/``).
Progress goes to stderr. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import shlex
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from ..common import REPO_ROOT, load_average, machine_description
from . import configs as C
from .timing import set_clock

# The sections' modules, and .targets and .report below them, load torch and the plugin's
# registry: they are imported where a run needs them, so --help and a bad flag answer at once.
if TYPE_CHECKING:
    import torch

    from .data import LanguageModelData, TranslationData
    from .generate import GenerationRun

SECTIONS = ("train", "generate", "memory", "ops")
TASKS = ("translation", "lm")
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "speed"


# --------------------------------------------------------------------------- arguments


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark fairseq-distattn against vanilla fairseq: training tokens/s, beam-5 generation, "
        "peak memory and attention-op microbenchmarks. Reports targets (PASS/MISS); never asserts timing.",
    )
    # --help lists the flags in the order these add them
    _add_size_and_place_arguments(p)
    _add_round_arguments(p)
    _add_selection_arguments(p)
    _add_clock_arguments(p)
    _add_data_arguments(p)
    _add_section_arguments(p)
    return _resolve_defaults(p.parse_args(argv), p)


def _add_size_and_place_arguments(p: argparse.ArgumentParser) -> None:
    """How large a run, on which device, into which folder."""
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a CI smoke run (scale tiny, 2 rounds): checks the harness, not the speed",
    )
    p.add_argument(
        "--scale",
        choices=sorted(C.SCALES),
        default=None,
        help="model widths and workload sizes (default: small; tiny with --quick). "
        "paper = the presets' own dimensions (for a GPU)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default: {DEFAULT_OUT})")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available; default)")


def _add_round_arguments(p: argparse.ArgumentParser) -> None:
    """How many interleaved rounds each comparison takes."""
    p.add_argument(
        "--repeats", type=int, default=None, help="interleaved rounds per comparison (default: 5; 2 with --quick)"
    )
    p.add_argument(
        "--train-repeats",
        type=int,
        default=None,
        help="interleaved rounds of the train section (default: 15; 2 with --quick): one training step per "
        "sample varies by about 5%% between steps on a quiet CPU, so the median of 5 ratios cannot tell a "
        "3%% target apart",
    )
    p.add_argument("--warmup", type=int, default=1, help="discarded warm-up measurements per model (default: 1)")


def _add_selection_arguments(p: argparse.ArgumentParser) -> None:
    """Which sections, tasks and candidates run."""
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)"
    )
    p.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="comma-separated subset of translation,lm for the model sections (default: both)",
    )
    p.add_argument(
        "--configs",
        default="",
        help="comma-separated candidate keys to run (e.g. rpr-preset,qvi); `flex` stands for every candidate "
        "some of whose layers may take the flex path; vanilla and the cost floors of the named candidates always run "
        "(default: all)",
    )
    p.add_argument(
        "--no-mechanisms", action="store_true", help="training: only the presets, not one model per mechanism"
    )


def _add_clock_arguments(p: argparse.ArgumentParser) -> None:
    """What a measurement's time is: threads and clock."""
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: 1 on CPU, so numbers do not depend on what else runs)",
    )
    p.add_argument(
        "--clock",
        choices=("auto", "wall", "cpu"),
        default="auto",
        help="timing clock: wall (perf_counter) or cpu (process CPU time, immune to other processes "
        "taking the core); auto = cpu on CPU with one thread, else wall (default)",
    )


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The text the models see, and the seed of its sample and of their weights."""
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-root", type=Path, default=None, help="shared data folder (default: <repo>/../shared/data)")
    p.add_argument(
        "--mt-data",
        default="auto",
        choices=("auto", "wmt-news", "multi30k"),
        help="translation text (default: auto = WMT news test sets if ../shared/data has them, else Multi30k)",
    )
    p.add_argument(
        "--lm-data",
        default="auto",
        choices=("auto", "lm1b", "wikitext", "multi30k"),
        help="LM text (default: auto = the One Billion Word style sample, else WikiText-2, else Multi30k)",
    )


def _add_section_arguments(p: argparse.ArgumentParser) -> None:
    """Options of single sections, and the plugin models' flex path."""
    p.add_argument("--op-modes", default="fwd,fwd+bwd", help="ops section: fwd, fwd+bwd or both (default: both)")
    p.add_argument(
        "--no-profile", action="store_true", help="do not profile the training and generation targets that miss"
    )
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--attention-flex",
        choices=("auto", "always", "never"),
        default="auto",
        help="the plugin models' --attention-flex: auto: the flex_attention path where it applies (CUDA, keys "
        "from --attention-recompute-length on); always: at every length; never: without it, also in the ops "
        "section, to measure what it gains (default: auto)",
    )


def _resolve_defaults(args: argparse.Namespace, p: argparse.ArgumentParser) -> argparse.Namespace:
    """The defaults that depend on --quick, the comma-separated lists split and checked, `flex` expanded."""
    args.scale = args.scale or ("tiny" if args.quick else "small")
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.train_repeats = args.train_repeats or (2 if args.quick else 15)
    args.sections = _choices(args.sections, SECTIONS, "--sections", p)
    args.tasks = _choices(args.tasks, TASKS, "--tasks", p)
    args.op_modes = _choices(args.op_modes, ("fwd", "fwd+bwd"), "--op-modes", p)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "flex" in args.configs:
        at = args.configs.index("flex")
        args.configs[at : at + 1] = [key for key in C.flex_config_keys() if key not in args.configs]
    if args.repeats < 1 or args.train_repeats < 1 or args.warmup < 0:
        p.error("--repeats and --train-repeats must be >= 1 and --warmup >= 0")
    return args


def _choices(text: str, allowed: Sequence[str], flag: str, parser) -> List[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in chosen if s not in allowed]
    if bad or not chosen:
        parser.error(f"{flag}: invalid value {text!r}; allowed: comma-separated subset of {','.join(allowed)}")
    return chosen


def log(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _quiet() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq.tasks", "fairseq.tasks.text_to_speech", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # fairseq's vanilla MultiheadAttention passes a float future mask with a
    # bool padding mask; torch warns about it on every call
    warnings.filterwarnings("ignore", message=".*mismatched key_padding_mask and attn_mask.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.profiler")


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return _run(parse_args(argv), argv)


def ops_flex(attention_flex: str) -> str:
    """The functional ops' ``flex`` in the ops section: never keeps them off it too (on CUDA;
    CPU never takes it); the others leave them their default."""
    return "never" if attention_flex == "never" else "auto"


# --------------------------------------------------------------------------- the run


@dataclass
class Candidates:
    """The configurations of each comparison, after --configs. A comparison none of whose
    candidates was asked for is left empty and skipped: vanilla alone compares nothing."""

    mt_train: List[C.Config]
    mt_presets: List[C.Config]  # the translation memory section
    mt_generation: List[C.Config]
    lm: List[C.Config]  # LM training and memory
    lm_generation: List[C.Config]

    @classmethod
    def chosen(cls, args: argparse.Namespace) -> "Candidates":
        def compared(configs: Sequence[C.Config]) -> List[C.Config]:
            selected = C.select(configs, args.configs)
            return selected if len(selected) > 1 else []

        return cls(
            mt_train=compared(C.translation_configs(include_mechanisms=not args.no_mechanisms)),
            mt_presets=compared([C.MT_BASELINE, *C.MT_PRESETS]),
            mt_generation=compared(C.translation_generation_configs()),
            lm=compared(C.lm_configs()),
            lm_generation=compared(C.lm_generation_configs()),
        )

    def need_translation_data(self, sections: Sequence[str]) -> bool:
        return bool(
            ("train" in sections and self.mt_train)
            or ("generate" in sections and self.mt_generation)
            or ("memory" in sections and self.mt_presets)
        )

    def need_lm_data(self, sections: Sequence[str]) -> bool:
        return bool(
            (("train" in sections or "memory" in sections) and self.lm)
            or ("generate" in sections and self.lm_generation)
        )


def _candidate_keys() -> set:
    """Every key --configs may name."""
    return {c.key for c in [*C.translation_configs(), *C.lm_generation_configs()]}


@dataclass
class Session:
    """What the sections of one run share: its flags, sizes and device, the candidates, the
    data they run on, and the results they fill in."""

    args: argparse.Namespace
    scale: C.Scale
    device: "torch.device"
    candidates: Candidates
    results: Dict[str, object]
    mt: Optional["TranslationData"] = None
    lm: Optional["LanguageModelData"] = None

    @property
    def meta(self) -> Dict[str, object]:
        return self.results["meta"]


def _run(args: argparse.Namespace, argv: Optional[Sequence[str]]) -> int:
    started = time.perf_counter()
    device, threads, clock = _set_up_process(args)
    # the models' own option decides where flex runs
    scale = dataclasses.replace(C.SCALES[args.scale], attention_flex=args.attention_flex)
    machine = machine_description(device)
    results: Dict[str, object] = {"meta": _run_meta(args, argv, scale, clock), "machine": machine}
    log(
        f"device {device}, {threads} thread(s), {clock} clock, scale {scale.name}, sections {','.join(args.sections)}, "
        f"tasks {','.join(args.tasks)}, {args.repeats} rounds; {machine['cpu']}"
    )
    known = _candidate_keys()
    unknown = [key for key in args.configs if key not in known]
    if unknown:
        log(f"error: unknown --configs {','.join(unknown)}; known: {','.join(sorted(known))}")
        return 2
    session = Session(args, scale, device, Candidates.chosen(args), results)
    _load_data(session)
    # in this order whatever the order of --sections
    for section, measure in (
        ("train", _measure_training),
        ("generate", _measure_generation),
        ("memory", _measure_memory),
        ("ops", _measure_ops),
    ):
        if section in args.sections:
            measure(session)
    return finish(args, results, started)


def _set_up_process(args: argparse.Namespace) -> Tuple["torch.device", int, str]:
    """Logging, torch's threads, the timing clock and the seed; registers the plugin's models.
    Returns the device, the thread count and the clock's name."""
    logging.basicConfig(level=logging.WARNING)
    _quiet()
    import torch

    device = _device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else torch.get_num_threads())
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (in-process callers)
        pass
    clock = args.clock if args.clock != "auto" else ("cpu" if device.type == "cpu" and threads == 1 else "wall")
    set_clock(clock)
    torch.manual_seed(args.seed)
    import fairseq_distattn.models  # noqa: F401 (registers the plugin's models)

    _quiet()  # fairseq's import reconfigures logging
    return device, threads, clock


def recorded_argv(argv: Sequence[str]) -> List[str]:
    """``argv`` without ``--out``: where the files were written is no part of what was
    measured, and a scratch folder's path would name a directory of this machine in
    results that are committed elsewhere."""
    kept: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return kept


def _run_meta(args: argparse.Namespace, argv: Optional[Sequence[str]], scale: C.Scale, clock: str) -> dict:
    command = "python -m benchmarks.run " + " ".join(
        shlex.quote(a) for a in recorded_argv(argv if argv is not None else sys.argv[1:])
    )
    return {
        "command": command.strip(),
        "scale": scale.name,
        "scale_description": scale.description,
        "repeats": args.repeats,
        "train_repeats": args.train_repeats,
        "warmup": args.warmup,
        "sections": args.sections,
        "tasks": args.tasks,
        "seed": args.seed,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "clock": clock,
        "attention_flex": args.attention_flex,
    }


def _load_data(s: Session) -> None:
    """The translation and LM text, each only when a comparison that will run needs it."""
    args, scale = s.args, s.scale
    if "translation" in args.tasks and s.candidates.need_translation_data(args.sections):
        from .data import translation_data

        s.mt = translation_data(
            scale.mt_lines,
            scale.mt_vocab,
            scale.max_tokens,
            scale.train_batches,
            scale.gen_sentences,
            source=args.mt_data,
            data_root=args.data_root,
            seed=args.seed,
        )
        s.meta["translation_data"] = (
            f"{s.mt.description}: {len(s.mt.source_tokens)} sentence pairs, Moses-tokenised, "
            f"joint dictionary of {len(s.mt.dictionary)} types"
        )
        log(f"translation data: {s.meta['translation_data']}")
    if "lm" in args.tasks and s.candidates.need_lm_data(args.sections):
        from .data import language_model_data

        s.lm = language_model_data(
            scale.lm_lines,
            scale.lm_vocab,
            scale.tokens_per_sample,
            scale.lm_rows,
            scale.train_batches,
            scale.gen_sentences,
            scale.lm_prompt_len,
            source=args.lm_data,
            data_root=args.data_root,
        )
        s.meta["lm_data"] = f"{s.lm.description}: {len(s.lm.stream)} tokens, dictionary of {len(s.lm.dictionary)} types"
        log(f"LM data: {s.meta['lm_data']}")


# --------------------------------------------------------------------------- sections


def _measure_training(s: Session) -> None:
    s.results["train"] = {}
    tasks = []
    if s.mt is not None and s.candidates.mt_train:
        tasks.append(("translation", s.candidates.mt_train, s.mt.dictionary, s.mt.train_batches))
        s.meta["train_note"] = (
            f"{len(s.mt.train_batches)} real batch(es) of at most {s.scale.max_tokens} tokens "
            f"(fairseq --max-tokens), label-smoothed cross-entropy 0.1, fairseq's Adam."
        )
    if s.lm is not None and s.candidates.lm:
        tasks.append(("lm", s.candidates.lm, s.lm.dictionary, s.lm.train_batches))
    for task, configs, dictionary, batches in tasks:
        _train_task(s, task, configs, dictionary, batches)
        # Each task is timed without the other's models (and optimizer states)
        # resident, as a user trains one model: with the translation models
        # alive, lm-da measured 0.89-0.90 in two runs, 0.98 without them.
        gc.collect()


def _train_task(s: Session, task: str, configs: List[C.Config], dictionary, batches: list) -> None:
    """One task's training comparison, then a profile of each target it missed. The models
    built for it are dropped on return."""
    from .train import profile_training, run_training

    args = s.args
    log(f"train/{task}: {len(configs)} models")
    measured = run_training(
        configs, s.scale, dictionary, batches, s.device, args.train_repeats, args.warmup, args.seed, log
    )
    s.results["train"][task] = measured.results
    if args.no_profile:
        return

    def profile_step(task: str, key: str) -> dict:
        log(f"profiling one training step: {key}")
        return profile_training(measured.steps[key], batches[0], s.device)

    profiles = _profile_misses(s.results, "train", {task: measured.models()}, profile_step)
    s.results.setdefault("profiles", {}).update(profiles)


def _measure_generation(s: Session) -> None:
    # task -> (what run_generation measured and built, its dictionary)
    measured: Dict[str, Tuple[GenerationRun, object]] = {}
    if s.mt is not None and s.candidates.mt_generation:
        measured["translation"] = (_generate_translation(s), s.mt.dictionary)
    if s.lm is not None and s.candidates.lm_generation:
        measured["lm"] = (_generate_lm(s), s.lm.dictionary)
    s.results["generate"] = {task: run.results for task, (run, _) in measured.items()}
    if not s.args.no_profile:
        s.results["generation_profiles"] = _profile_generation_misses(s, measured)


def _generate_translation(s: Session) -> GenerationRun:
    from .generate import run_generation

    args, configs = s.args, s.candidates.mt_generation
    log(f"generate/translation: {len(configs)} models")
    measured = run_generation(
        configs,
        s.scale,
        s.mt.dictionary,
        s.mt.generation_batch,
        s.device,
        args.repeats,
        args.warmup,
        args.seed,
        log,
        beam=args.beam,
    )
    s.meta["generate_note"] = (
        f"fairseq SequenceGenerator, beam {args.beam}, {s.scale.gen_sentences} real source "
        f"sentences of median length, exactly {s.scale.gen_max_len} target tokens each "
        f"(min_len = max_len), untrained weights, incremental decoding."
    )
    return measured


def _generate_lm(s: Session) -> GenerationRun:
    import torch

    from .generate import run_generation

    args, configs, prompts = s.args, s.candidates.lm_generation, s.lm.prompts
    log(f"generate/lm: {len(configs)} models")
    sample = {
        "id": torch.arange(len(prompts)),
        "net_input": {"src_tokens": prompts, "src_lengths": torch.full((len(prompts),), prompts.size(1))},
    }
    new_tokens = max(1, s.scale.gen_max_len - prompts.size(1))
    measured = run_generation(
        configs,
        s.scale,
        s.lm.dictionary,
        sample,
        s.device,
        args.repeats,
        args.warmup,
        args.seed,
        log,
        beam=args.beam,
        prefix_tokens=prompts,
        new_tokens=new_tokens,
    )
    s.meta["generate_lm_note"] = (
        f"fairseq SequenceGenerator, beam {args.beam}, {len(prompts)} real sentence "
        f"beginnings of {prompts.size(1)} tokens as prefix_tokens, {new_tokens} more "
        f"tokens each (min_len = max_len)."
    )
    return measured


def _profile_generation_misses(s: Session, measured: Dict[str, Tuple[GenerationRun, object]]) -> Dict[str, dict]:
    from .generate import profile_generation

    def profile_search(task: str, key: str) -> dict:
        run, dictionary = measured[task]
        log(f"profiling one beam search: {key}")
        return profile_generation(
            run.models[key], dictionary, run.sample, s.device, s.args.beam, run.length, run.prefix_tokens
        )

    models = {task: run.models for task, (run, _) in measured.items()}
    return _profile_misses(s.results, "generate", models, profile_search)


def _measure_memory(s: Session) -> None:
    from .memory import run_memory

    scale, mt, lm = s.scale, s.mt, s.lm

    def make_batch(task: str, length: int):
        if task == C.MT:
            return mt.long_batch(length, scale.memory_rows)
        return lm.block_batch(length, scale.memory_rows)

    compared = []  # (configs, dictionary) of each task
    if mt is not None and s.candidates.mt_presets:
        compared.append((s.candidates.mt_presets, mt.dictionary))
    if lm is not None and s.candidates.lm:
        compared.append((s.candidates.lm, lm.dictionary))
    models = sum(len(configs) for configs, _ in compared)
    log(f"memory: {models} models at L={','.join(map(str, scale.memory_lengths))}")
    memory: Dict[str, object] = {}
    for configs, dictionary in compared:
        memory.update(run_memory(configs, scale, dictionary, make_batch, s.device, s.args.seed, log))
    s.results["memory"] = memory
    how = (
        "torch.cuda.max_memory_allocated"
        if s.device.type == "cuda"
        else "torch.profiler(profile_memory=True): peak of the running sum of torch CPU allocations and frees"
    )
    s.meta["memory_note"] = (
        f"One forward + backward pass in training mode on {scale.memory_rows} sequence(s) of "
        f"L real tokens (translation: source and target both L). Peak above the memory held "
        f"before the pass (parameters), gradients included; {how}."
    )


def _measure_ops(s: Session) -> None:
    from .ops import run_ops

    args, scale = s.args, s.scale
    log(f"ops: B={scale.op_batch} H={scale.op_heads} D={scale.op_head_dim} L={','.join(map(str, scale.op_lengths))}")
    s.results["ops"] = run_ops(
        scale.op_batch,
        scale.op_heads,
        scale.op_head_dim,
        scale.op_lengths,
        s.device,
        args.repeats,
        args.warmup,
        args.seed,
        log,
        modes=args.op_modes,
        min_time=scale.op_min_time,
        only=args.configs,
        flex=ops_flex(args.attention_flex),
    )
    s.meta["ops_note"] = (
        f"q, k, v [B={scale.op_batch}, H={scale.op_heads}, L, D={scale.op_head_dim}] float32, "
        f"self-attention, no mask, no dropout; median ms per call over {args.repeats} interleaved "
        f"rounds; 'x sdpa' = cost relative to F.scaled_dot_product_attention in the same round; "
        f"exponent = log-log least-squares slope of cost vs L (target <= 2.05)."
    )


def _profile_misses(
    results: dict, section: str, models_by_task: Dict[str, dict], profile: Callable[[str, str], dict]
) -> Dict[str, dict]:
    """Profile every candidate whose ``section`` target is missed, and its
    task's vanilla baseline once: {candidate: {"baseline_key", "baseline", "candidate"}}."""
    from .targets import evaluate_targets

    baselines: Dict[str, dict] = {}
    profiles: Dict[str, dict] = {}
    for row in evaluate_targets(results):
        if row.section != section or row.status != "MISS":
            continue
        for task, models in models_by_task.items():
            if row.candidate not in models:
                continue
            base_key = next(k for k, b in models.items() if b.config.is_baseline)
            if base_key not in baselines:
                baselines[base_key] = profile(task, base_key)
            profiles[row.candidate] = {
                "baseline_key": base_key,
                "baseline": baselines[base_key],
                "candidate": profile(task, row.candidate),
            }
    return profiles


# --------------------------------------------------------------------------- outputs


def finish(args, results: dict, started: float) -> int:
    from .report import write_reports

    meta = results["meta"]
    results["machine"]["load_average_end"] = load_average()
    meta["wall_seconds"] = time.perf_counter() - started
    out: Path = args.out
    markdown = write_reports(results, out)
    sys.stdout.write(markdown)
    sys.stdout.flush()
    log(
        f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'benchmark.png'} ({meta['plot_backend']}) "
        f"in {meta['wall_seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
