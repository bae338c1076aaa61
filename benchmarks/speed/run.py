"""The speed benchmark: ``python -m benchmarks.run`` (this module; ``python -m
benchmarks`` and ``python benchmarks/run.py`` run it too).

Writes ``results.md`` (also printed to stdout), ``results.json``,
``benchmark.png``, ``summary.md`` and, when a training or generation target is
missed, ``profiles.md`` into ``--out`` (default ``benchmarks/results/speed/``).
Progress goes to stderr. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..common import REPO_ROOT, load_average, machine_description
from . import configs as C
from .timing import set_clock

SECTIONS = ("train", "generate", "memory", "ops")
TASKS = ("translation", "lm")
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "speed"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark fairseq-distattn against vanilla fairseq: training tokens/s, beam-5 generation, "
        "peak memory and attention-op microbenchmarks. Reports targets (PASS/MISS); never asserts timing.",
    )
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
        "some of whose layers may take the flex path; vanilla always runs (default: all)",
    )
    p.add_argument(
        "--no-mechanisms", action="store_true", help="training: only the presets, not one model per mechanism"
    )
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
    args = p.parse_args(argv)
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
    args = parse_args(argv)
    # the models' own option decides where flex runs
    with C.attention_flex(args.attention_flex):
        return _run(args, argv)


def ops_flex(attention_flex: str) -> str:
    """The functional ops' ``flex`` in the ops section: never keeps them off it too (on CUDA;
    CPU never takes it); the others leave them their default."""
    return "never" if attention_flex == "never" else "auto"


def _run(args: argparse.Namespace, argv: Optional[Sequence[str]]) -> int:
    started = time.perf_counter()
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
    scale = C.SCALES[args.scale]
    command = "python -m benchmarks.run " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    machine = machine_description(device)
    meta: Dict[str, object] = {
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
    results: Dict[str, object] = {"meta": meta, "machine": machine}
    log(
        f"device {device}, {threads} thread(s), {clock} clock, scale {scale.name}, sections {','.join(args.sections)}, "
        f"tasks {','.join(args.tasks)}, {args.repeats} rounds; {machine['cpu']}"
    )

    mt_train_configs = C.select(C.translation_configs(include_mechanisms=not args.no_mechanisms), args.configs)
    mt_preset_configs = C.select([C.MT_BASELINE, *C.MT_PRESETS], args.configs)
    mt_generation_configs = C.select(C.translation_generation_configs(), args.configs)
    lm_configs = C.select(C.lm_configs(), args.configs)
    lm_generation_configs = C.select(C.lm_generation_configs(), args.configs)
    if args.configs:
        known = {c.key for c in [*C.translation_configs(), *C.lm_generation_configs()]}
        unknown = [c for c in args.configs if c not in known]
        if unknown:
            log(f"error: unknown --configs {','.join(unknown)}; known: {','.join(sorted(known))}")
            return 2
    # a comparison none of whose candidates was asked for is skipped
    run_mt_train = len(mt_train_configs) > 1
    run_mt_presets = len(mt_preset_configs) > 1
    run_mt_generation = len(mt_generation_configs) > 1
    run_lm = len(lm_configs) > 1
    run_lm_generation = len(lm_generation_configs) > 1

    model_sections = [s for s in args.sections if s != "ops"]
    need_mt = "translation" in args.tasks and (
        ("train" in model_sections and run_mt_train)
        or ("generate" in model_sections and run_mt_generation)
        or ("memory" in model_sections and run_mt_presets)
    )
    need_lm = "lm" in args.tasks and (
        (("train" in model_sections or "memory" in model_sections) and run_lm)
        or ("generate" in model_sections and run_lm_generation)
    )
    mt = lm = None
    if need_mt:
        from .data import translation_data

        mt = translation_data(
            scale.mt_lines,
            scale.mt_vocab,
            scale.max_tokens,
            scale.train_batches,
            scale.gen_sentences,
            source=args.mt_data,
            data_root=args.data_root,
            seed=args.seed,
        )
        meta["translation_data"] = (
            f"{mt.description}: {len(mt.source_tokens)} sentence pairs, Moses-tokenised, "
            f"joint dictionary of {len(mt.dictionary)} types"
        )
        log(f"translation data: {meta['translation_data']}")
    if need_lm:
        from .data import language_model_data

        lm = language_model_data(
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
        meta["lm_data"] = f"{lm.description}: {len(lm.stream)} tokens, dictionary of {len(lm.dictionary)} types"
        log(f"LM data: {meta['lm_data']}")

    if "train" in args.sections:
        import gc

        from .train import profile_training, run_training

        train: Dict[str, object] = {}
        results["train"] = train
        tasks = []
        if mt is not None and run_mt_train:
            tasks.append(("translation", mt_train_configs, mt.dictionary, mt.train_batches))
            meta["train_note"] = (
                f"{len(mt.train_batches)} real batch(es) of at most {scale.max_tokens} tokens "
                f"(fairseq --max-tokens), label-smoothed cross-entropy 0.1, fairseq's Adam."
            )
        if lm is not None and run_lm:
            tasks.append(("lm", lm_configs, lm.dictionary, lm.train_batches))
        for task, configs, dictionary, batches in tasks:
            log(f"train/{task}: {len(configs)} models")
            train[task] = run_training(
                configs, scale, dictionary, batches, device, args.train_repeats, args.warmup, args.seed, log
            )
            kept = train[task].pop("_built")
            if not args.no_profile:

                def profile_train(task: str, key: str) -> dict:
                    log(f"profiling one training step: {key}")
                    return profile_training(kept["steps"][key], batches[0], device)

                profiles = _profile_misses(results, "train", {task: (kept["models"],)}, profile_train)
                results.setdefault("profiles", {}).update(profiles)
            # Each task is timed without the other's models (and optimizer states)
            # resident, as a user trains one model: with the translation models
            # alive, lm-da measured 0.89-0.90 in two runs, 0.98 without them.
            del kept
            gc.collect()

    if "generate" in args.sections:
        from .generate import run_generation

        generate: Dict[str, object] = {}
        generation_built: Dict[str, tuple] = {}
        if mt is not None and run_mt_generation:
            log(f"generate/translation: {len(mt_generation_configs)} models")
            generate["translation"] = run_generation(
                mt_generation_configs,
                scale,
                mt.dictionary,
                mt.generation_batch,
                device,
                args.repeats,
                args.warmup,
                args.seed,
                log,
                beam=args.beam,
            )
            generation_built["translation"] = (generate["translation"].pop("_built"), mt.dictionary)
            meta["generate_note"] = (
                f"fairseq SequenceGenerator, beam {args.beam}, {scale.gen_sentences} real source "
                f"sentences of median length, exactly {scale.gen_max_len} target tokens each "
                f"(min_len = max_len), untrained weights, incremental decoding."
            )
        if lm is not None and run_lm_generation:
            log(f"generate/lm: {len(lm_generation_configs)} models")
            prompts = lm.prompts
            sample = {
                "id": torch.arange(len(prompts)),
                "net_input": {"src_tokens": prompts, "src_lengths": torch.full((len(prompts),), prompts.size(1))},
            }
            new_tokens = max(1, scale.gen_max_len - prompts.size(1))
            generate["lm"] = run_generation(
                lm_generation_configs,
                scale,
                lm.dictionary,
                sample,
                device,
                args.repeats,
                args.warmup,
                args.seed,
                log,
                beam=args.beam,
                prefix_tokens=prompts,
                new_tokens=new_tokens,
            )
            generation_built["lm"] = (generate["lm"].pop("_built"), lm.dictionary)
            meta["generate_lm_note"] = (
                f"fairseq SequenceGenerator, beam {args.beam}, {len(prompts)} real sentence "
                f"beginnings of {prompts.size(1)} tokens as prefix_tokens, {new_tokens} more "
                f"tokens each (min_len = max_len)."
            )
        results["generate"] = generate
        if not args.no_profile:
            from .generate import profile_generation

            def profile_search(task: str, key: str) -> dict:
                info, dictionary = generation_built[task]
                log(f"profiling one beam search: {key}")
                return profile_generation(
                    info["models"][key],
                    dictionary,
                    info["sample"],
                    device,
                    args.beam,
                    info["length"],
                    info["prefix_tokens"],
                )

            models = {task: (info["models"],) for task, (info, _) in generation_built.items()}
            results["generation_profiles"] = _profile_misses(results, "generate", models, profile_search)
        generation_built.clear()

    if "memory" in args.sections:
        from .memory import run_memory

        def make_batch(task: str, length: int):
            if task == C.MT:
                return mt.long_batch(length, scale.memory_rows)
            return lm.block_batch(length, scale.memory_rows)

        mt_memory = mt is not None and run_mt_presets
        lm_memory = lm is not None and run_lm
        memory_configs = ([*mt_preset_configs] if mt_memory else []) + ([*lm_configs] if lm_memory else [])
        log(f"memory: {len(memory_configs)} models at L={','.join(map(str, scale.memory_lengths))}")
        memory: Dict[str, object] = {}
        if mt_memory:
            memory.update(run_memory(mt_preset_configs, scale, mt.dictionary, make_batch, device, args.seed, log))
        if lm_memory:
            memory.update(run_memory(lm_configs, scale, lm.dictionary, make_batch, device, args.seed, log))
        results["memory"] = memory
        how = (
            "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "torch.profiler(profile_memory=True): peak of the running sum of torch CPU allocations and frees"
        )
        meta["memory_note"] = (
            f"One forward + backward pass in training mode on {scale.memory_rows} sequence(s) of "
            f"L real tokens (translation: source and target both L). Peak above the memory held "
            f"before the pass (parameters), gradients included; {how}."
        )

    if "ops" in args.sections:
        from .ops import run_ops

        log(
            f"ops: B={scale.op_batch} H={scale.op_heads} D={scale.op_head_dim} L={','.join(map(str, scale.op_lengths))}"
        )
        results["ops"] = run_ops(
            scale.op_batch,
            scale.op_heads,
            scale.op_head_dim,
            scale.op_lengths,
            device,
            args.repeats,
            args.warmup,
            args.seed,
            log,
            modes=args.op_modes,
            min_time=scale.op_min_time,
            only=args.configs,
            flex=ops_flex(args.attention_flex),
        )
        meta["ops_note"] = (
            f"q, k, v [B={scale.op_batch}, H={scale.op_heads}, L, D={scale.op_head_dim}] float32, "
            f"self-attention, no mask, no dropout; median ms per call over {args.repeats} interleaved "
            f"rounds; 'x sdpa' = cost relative to F.scaled_dot_product_attention in the same round; "
            f"exponent = log-log least-squares slope of cost vs L (target <= 2.05)."
        )

    return finish(args, results, started)


def _profile_misses(results: dict, section: str, models_by_task: Dict[str, tuple], profile) -> Dict[str, dict]:
    """Profile every candidate whose ``section`` target is missed, and its
    task's vanilla baseline once: {candidate: {"baseline_key", "baseline", "candidate"}}."""
    from .report import evaluate_targets

    baselines: Dict[str, dict] = {}
    profiles: Dict[str, dict] = {}
    for row in evaluate_targets(results):
        if row.section != section or row.status != "MISS":
            continue
        for task, kept in models_by_task.items():
            models = kept[0]
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


def finish(args, results: dict, started: float) -> int:
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


def write_reports(results: dict, out: Path) -> str:
    """Targets, floors, ``benchmark.png``, ``results.md``, ``profiles.md`` (when
    profiled), ``results.json`` and ``summary.md`` into ``out``, from the
    measurements in ``results``; returns the markdown report."""
    from .plot import write_plot
    from .report import evaluate_targets, floor_comparisons, render_markdown, write_summary

    meta = results["meta"]
    targets = evaluate_targets(results)
    results["targets"] = [t.as_dict() for t in targets]
    results["floors"] = [c.as_dict() for c in floor_comparisons(results)]
    out.mkdir(parents=True, exist_ok=True)
    plot_name = "benchmark.png"
    # the plot shows ratios to vanilla: targets relative to a floor are not drawn
    plot_targets = {
        title: {t.candidate: t.threshold for t in targets if t.section == section and t.reference == "vanilla"}
        for title, section in (
            ("Training throughput vs vanilla fairseq", "train"),
            ("Beam-5 generation vs vanilla fairseq", "generate"),
        )
    }
    meta["plot_backend"] = write_plot(results, out / plot_name, plot_targets)
    markdown = render_markdown(results, targets, plot_name)
    (out / "results.md").write_text(markdown, encoding="utf-8")
    if results.get("profiles") or results.get("generation_profiles"):
        (out / "profiles.md").write_text(_profiles_markdown(results), encoding="utf-8")
    (out / "results.json").write_text(
        json.dumps(_jsonable(results), indent=1, sort_keys=False) + "\n", encoding="utf-8"
    )
    write_summary(out / "results.json")
    return markdown


def _profiles_markdown(results: dict) -> str:
    """Full torch.profiler tables (last profiled run) of every profiled model."""
    out = [
        "# torch.profiler tables of the targets missed",
        "",
        "Operators by self CPU time, last profiled run (results.md shows the per-operator minimum over runs).",
        "",
    ]
    for section, title in (("profiles", "one training step"), ("generation_profiles", "one beam-5 search")):
        shown = set()
        for key, pair in (results.get(section) or {}).items():
            for name, side in ((pair["baseline_key"], "baseline"), (key, "candidate")):
                if name in shown:
                    continue
                shown.add(name)
                out += [f"## {name}: {title}", "", "```", pair[side]["table"].rstrip(), "```", ""]
    return "\n".join(out)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


if __name__ == "__main__":
    raise SystemExit(main())
