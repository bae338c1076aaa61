"""The speed run's reports, from its measurements: ``results.md``, ``results.json``,
``benchmark.png``, ``profiles.md`` and ``summary.md``; ``python -m benchmarks.speed.report``
rebuilds them from a ``results.json``. What each target is, and whether it passed, is
:mod:`.targets`'s; this module lays the rows out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_distattn.tools.generated_blocks import update_pages

from ..common import REPO_ROOT
from .memory import TIMED_PASSES
from .plot import write_plot
from .targets import (
    FLOOR_TARGETS,
    OP_EXPONENT_TARGET,
    PASS,
    FloorComparison,
    TargetRow,
    evaluate_targets,
    floor_comparisons,
    memory_target_length,
)
from .timing import Summary

# --------------------------------------------------------------------------- markdown


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def fmt_sig(value, sig: int = 3) -> str:
    """Significant digits without exponent notation (parses as a float)."""
    if value is None:
        return "-"
    if value == 0 or math.isnan(value):
        return fmt(value)
    digits = max(0, sig - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{digits}f}"


def spread_cells(summary: dict, digits: int) -> Tuple[str, str, str]:
    """A measurement's median, min and max over the rounds."""
    return fmt(summary["median"], digits), fmt(summary["min"], digits), fmt(summary["max"], digits)


def ratio_cells(ratio: Optional[dict]) -> Tuple[str, str, str]:
    """A candidate's ratio to its baseline (median, min, max); a baseline (no ratio) is 1 by definition."""
    return spread_cells(ratio, 3) if ratio else ("1.000", "-", "-")


def machine_section(machine: dict, meta: dict) -> str:
    rows = [
        ("CPU", machine.get("cpu")),
        ("logical CPUs / physical cores", f"{machine.get('logical_cpus')} / {machine.get('physical_cores')}"),
        ("torch threads (fixed)", machine.get("torch_threads")),
        ("memory (GiB)", machine.get("memory_gib")),
        ("device", machine.get("device") + (f" ({machine['gpu']})" if machine.get("gpu") else "")),
        (
            "torch / fairseq / numpy / python",
            f"{machine.get('torch')} / {machine.get('fairseq')} / {machine.get('numpy')} / {machine.get('python')}",
        ),
        ("platform", machine.get("platform")),
        ("git revision", machine.get("git")),
        (
            "load average at start / end",
            f"{_load(machine.get('load_average_start'))} / {_load(machine.get('load_average_end'))}",
        ),
        ("scale", f"{meta.get('scale')}: {meta.get('scale_description')}"),
        ("timing clock", _clock(meta.get("clock"))),
        ("interleaved rounds: train / other sections; warm-up", f"{_rounds(meta)}; {meta.get('warmup')}"),
        ("translation data", meta.get("translation_data", "-")),
        ("LM data", meta.get("lm_data", "-")),
        ("command", f"`{meta.get('command')}`"),
        ("wall time (s)", fmt(meta.get("wall_seconds"), 1)),
    ]
    return md_table(["item", "value"], rows)


def _clock(name) -> str:
    if name == "cpu":
        return (
            "cpu: process CPU time (time.process_time); rates are per CPU-second, unaffected by other processes "
            "holding the core"
        )
    return f"{name}: wall time (time.perf_counter)"


def _rounds(meta: dict) -> str:
    """``train / other sections`` rounds (results from before --train-repeats: one count for all)."""
    return f"{meta.get('train_repeats', meta.get('repeats'))} / {meta.get('repeats')}"


def _load(value) -> str:
    if not value:
        return "-"
    return " ".join(f"{x:.2f}" for x in value)


def targets_section(rows: List[TargetRow]) -> str:
    body = [
        (
            r.section,
            r.candidate,
            r.metric,
            f"{r.comparison} {r.threshold:g}",
            fmt(r.median),
            fmt(r.low),
            fmt(r.high),
            r.status,
        )
        for r in rows
    ]
    return md_table(["section", "candidate", "metric", "target", "measured (median)", "min", "max", "status"], body)


def train_section(results: Dict[str, dict]) -> str:
    rows = []
    for key, r in results.items():
        t, ratio = r["throughput"], r.get("ratio")
        rows.append(
            (
                key,
                r["note"],
                r["attention"],
                f"{r['parameters']:,}",
                fmt(r["tokens_per_measurement"], 0),
                *spread_cells(t, 1),
                *ratio_cells(ratio),
            )
        )
    return md_table(
        [
            "config",
            "model",
            "attention",
            "params",
            "tokens/measurement",
            "tokens/s median",
            "tokens/s min",
            "tokens/s max",
            "ratio median",
            "ratio min",
            "ratio max",
        ],
        rows,
    )


def generation_section(results: Dict[str, dict]) -> str:
    rows = []
    for key, r in results.items():
        s, t, ratio = r["sentences_per_s"], r["tokens_per_s"], r.get("ratio")
        rows.append(
            (
                key,
                r["note"],
                r["attention"],
                fmt(r["tokens_per_sentence"], 1),
                *spread_cells(s, 2),
                fmt(t["median"], 1),
                *ratio_cells(ratio),
            )
        )
    return md_table(
        [
            "config",
            "model",
            "attention",
            "tokens/sentence",
            "sentences/s median",
            "sentences/s min",
            "sentences/s max",
            "tokens/s median",
            "ratio median",
            "ratio min",
            "ratio max",
        ],
        rows,
    )


def memory_section(results: Dict[str, dict]) -> str:
    if not results:
        return ""
    lengths = list(next(iter(results.values()))["peak_bytes"].keys())
    rows = []
    for key, r in results.items():
        mib = [fmt(r["peak_bytes"][n] / 2**20, 1) for n in lengths]
        ratios = [fmt(r.get("ratio", {}).get(n)) for n in lengths]
        rows.append((key, r["task"], r["attention"], *mib, *ratios))
    headers = ["config", "task", "attention", *[f"MiB L={n}" for n in lengths], *[f"ratio L={n}" for n in lengths]]
    return md_table(headers, rows)


def memory_time_section(results: Dict[str, dict]) -> str:
    if not results or not all("pass_seconds" in r for r in results.values()):
        return ""
    lengths = list(next(iter(results.values()))["pass_seconds"].keys())
    rows = []
    for key, r in results.items():
        ms = [fmt_sig(r["pass_seconds"][n] * 1e3) for n in lengths]
        ratios = [fmt(r.get("time_ratio", {}).get(n)) for n in lengths]
        rows.append((key, r["task"], *ms, *ratios))
    headers = ["config", "task", *[f"ms L={n}" for n in lengths], *[f"time ratio L={n}" for n in lengths]]
    return md_table(headers, rows)


def ops_section(results: Dict[str, dict]) -> str:
    if not results:
        return ""
    lengths = list(next(iter(results.values()))["seconds_per_call"].keys())
    rows = []
    for key, r in results.items():
        ms = [fmt_sig(r["seconds_per_call"][n]["median"] * 1e3) for n in lengths]
        vs = r.get("cost_vs_sdpa")
        last = lengths[-1]
        rows.append(
            (
                r["op"],
                r["mode"],
                *ms,
                fmt(vs[last]["median"], 2) if vs else "1.00",
                fmt(r["exponent"], 2),
                fmt(r["tail_exponent"], 2),
            )
        )
    headers = [
        "op",
        "mode",
        *[f"ms L={n}" for n in lengths],
        f"x sdpa L={lengths[-1]}",
        "exponent (fit)",
        f"exponent ({lengths[-2]}->{lengths[-1]})" if len(lengths) > 1 else "exponent (tail)",
    ]
    return md_table(headers, rows)


def profile_rows(pair: dict, top: int = 10, top_delta: int = 8) -> List[dict]:
    """Top operators by self CPU time of the candidate and of the baseline, plus
    the largest increases, with both times and the difference."""
    base, cand = pair["baseline"]["ops"], pair["candidate"]["ops"]
    names = set(sorted(cand, key=lambda k: -cand[k]["self_cpu_ms"])[:top])
    names |= set(sorted(base, key=lambda k: -base[k]["self_cpu_ms"])[:top])

    def delta(k):
        return cand.get(k, {}).get("self_cpu_ms", 0.0) - base.get(k, {}).get("self_cpu_ms", 0.0)

    # ties broken by name: a set's order follows string hashing, which differs between processes,
    # and the report rebuilt from results.json must list the same rows in the same order
    names |= set(sorted(set(cand) | set(base), key=lambda k: (-delta(k), k))[:top_delta])
    rows = []

    def by_time(k):
        return -cand.get(k, {}).get("self_cpu_ms", 0.0), -base.get(k, {}).get("self_cpu_ms", 0.0), k

    for name in sorted(names, key=by_time):
        rows.append(
            {
                "op": name,
                "baseline_ms": base.get(name, {}).get("self_cpu_ms", 0.0),
                "baseline_calls": base.get(name, {}).get("calls", 0),
                "candidate_ms": cand.get(name, {}).get("self_cpu_ms", 0.0),
                "candidate_calls": cand.get(name, {}).get("calls", 0),
                "delta_ms": delta(name),
            }
        )
    return rows


def profiles_section(profiles: Dict[str, dict], what: str = "one training step") -> str:
    """Per missed target: top operators by self CPU time, baseline next to candidate."""
    if not profiles:
        return ""
    parts = []
    for key, pair in profiles.items():
        base_key = pair["baseline_key"]
        base_total, cand_total = pair["baseline"]["total_self_cpu_ms"], pair["candidate"]["total_self_cpu_ms"]
        parts.append(f"### {key} vs {base_key}: {what}\n")
        parts.append(
            f"Self CPU time of {what}: "
            f"{base_key} {fmt(base_total, 1)} ms, {key} {fmt(cand_total, 1)} ms "
            f"({fmt(cand_total / base_total if base_total else float('nan'), 2)}x).\n"
        )
        rows = profile_rows(pair)
        increases = sorted(rows, key=lambda r: -r["delta_ms"])[:5]
        parts.append(
            "Largest increases: " + ", ".join(f"`{r['op']}` {r['delta_ms']:+.1f} ms" for r in increases) + ". "
            "An operator with the same number of calls in both models does the same work in both (the "
            "shared linear layers, for example): its difference is timing noise from other processes.\n"
        )
        parts.append(
            md_table(
                ["op", f"{base_key} ms", "calls", f"{key} ms", "calls", "difference ms"],
                [
                    (
                        r["op"],
                        fmt(r["baseline_ms"], 1),
                        r["baseline_calls"],
                        fmt(r["candidate_ms"], 1),
                        r["candidate_calls"],
                        f"{r['delta_ms']:+.1f}",
                    )
                    for r in rows
                ],
            )
        )
        parts.append("")
    return "\n".join(parts)


FLOOR_NOTE = (
    '"of `<floor>`": ratio to that cost floor instead, per round the ratio of the two ratios to vanilla: the window '
    "preset's floor is fairseq's own model doing the window's tensor work in stock ops (benchmarks/speed/floor.py), "
    "stick-breaking's, PaTH's and DAPE's fairseq's own model computing the mechanism's attention in stock ops "
    "(benchmarks/speed/mechanism_floor.py); a floor's own row is its ratio to vanilla and has no target. "
    + "; ".join(
        f"{section}: " + ", ".join(f"`{k}` >= {t:g} of its floor" for k, t in targets.items())
        for section, targets in FLOOR_TARGETS.items()
    )
    + ", where the floor ran."
)


def floors_section(comparisons: List[FloorComparison]) -> str:
    """Each preset next to its cost floor: preset / floor, floor / vanilla and preset / vanilla, same rounds."""

    def spread(s: Summary) -> str:
        return f"{fmt(s.median)} [{fmt(s.low)}-{fmt(s.high)}]"

    rows = [
        (
            c.section,
            c.task,
            c.preset,
            c.floor,
            spread(c.preset_vs_floor),
            spread(c.floor_vs_vanilla),
            spread(c.preset_vs_vanilla),
            f">= {FLOOR_TARGETS[c.section][c.preset]:g}" if c.preset in FLOOR_TARGETS[c.section] else "-",
        )
        for c in comparisons
    ]
    return md_table(
        [
            "section",
            "task",
            "preset",
            "floor",
            "preset / floor",
            "floor / vanilla",
            "preset / vanilla",
            "target (preset / floor)",
        ],
        rows,
    )


def render_markdown(results: dict, targets: List[TargetRow], plot_name: Optional[str]) -> str:
    """``results.md``: the run's machine and targets, then one section per measurement it made."""
    out = _opening_sections(results, targets)
    for measured, title, note, body in _measurement_sections(results):
        if measured:
            out += [f"## {title}", "", note, "", body(), ""]
    if plot_name:
        out += ["## Plot", "", f"![benchmark plot]({plot_name})", ""]
    return "\n".join(out).rstrip() + "\n"


def _opening_sections(results: dict, targets: List[TargetRow]) -> List[str]:
    """How to read the ratios, the machine, the targets and (when a floor ran) the cost floors."""
    out = ["# fairseq-distattn benchmark", ""]
    out += [
        "Ratios are candidate / vanilla fairseq, measured in interleaved pairs (each candidate sample "
        "between two vanilla samples; median with min and max over the rounds). Throughput: higher is better; "
        "memory and op cost: lower is better. Targets are reported, never asserted.",
        "",
    ]
    out += ["## Machine", "", machine_section(results["machine"], results["meta"]), ""]
    out += ["## Targets", "", targets_section(targets) if targets else "(no target measured)", ""]
    if targets:
        passed = sum(1 for t in targets if t.status == PASS)
        out += [f"{passed} of {len(targets)} targets PASS.", ""]
    comparisons = floor_comparisons(results)
    if comparisons:
        out += [
            "## Cost floors",
            "",
            "Each candidate next to its cost floor (benchmarks/speed/floor.py: fairseq's own model doing the "
            "window's tensor work in stock ops, not a model; benchmarks/speed/mechanism_floor.py: fairseq's own "
            "model computing the mechanism's attention in stock ops), measured in the same interleaved rounds: "
            "median [min-max] over rounds of preset / floor (per round, the ratio of their ratios to vanilla), "
            "floor / vanilla and preset / vanilla. Training: tokens/s; generation: beam-5 sentences/s.",
            "",
            floors_section(comparisons),
            "",
        ]
    return out


def _measurement_sections(results: dict) -> list:
    """(measured, title, note, body) of each section ``results.md`` may hold, in its order:
    a section appears when its measurements do, so ``body`` runs only then."""
    meta = results["meta"]
    train, generate = results.get("train", {}), results.get("generate", {})
    memory_time_note = (
        f"The same forward + backward passes without the profiler (median of {TIMED_PASSES}): what the "
        "memory costs in time. From key length `--attention-recompute-length` (default 256) on, the "
        "plugin recomputes each layer's attention in backward instead of keeping its [B, H, Tq, Tk] "
        "tensors."
    )
    profiles_note = "operators by self CPU time (full profiler tables in profiles.md)."
    return [
        (
            train.get("translation"),
            "Training throughput: translation",
            f"Forward + backward + Adam step, target tokens/s. {meta.get('train_note', '')}",
            lambda: train_section(train["translation"]),
        ),
        (
            train.get("lm"),
            "Training throughput: language model",
            "Forward + backward + Adam step, tokens/s.",
            lambda: train_section(train["lm"]),
        ),
        (
            generate.get("translation"),
            "Generation: translation, beam 5",
            meta.get("generate_note", ""),
            lambda: generation_section(generate["translation"]),
        ),
        (
            generate.get("lm"),
            "Generation: language model, beam 5",
            meta.get("generate_lm_note", ""),
            lambda: generation_section(generate["lm"]),
        ),
        (
            results.get("memory"),
            "Peak memory, forward + backward",
            meta.get("memory_note", ""),
            lambda: memory_section(results["memory"]),
        ),
        (
            results.get("memory"),
            "Time of the memory pass",
            memory_time_note,
            lambda: memory_time_section(results["memory"]),
        ),
        (
            results.get("ops"),
            "Attention ops vs scaled_dot_product_attention",
            meta.get("ops_note", ""),
            lambda: ops_section(results["ops"]),
        ),
        (
            results.get("profiles"),
            "Where the time goes: training targets missed",
            "torch.profiler over one training step of vanilla and of the candidate on the same batch "
            f"(2 runs each); {profiles_note}",
            lambda: profiles_section(results["profiles"]),
        ),
        (
            results.get("generation_profiles"),
            "Where the time goes: generation targets missed",
            "torch.profiler over one beam-5 search of vanilla and of the candidate on the same sentences "
            "(one run each: the profiler's per-operator overhead inflates small operators); "
            f"{profiles_note}",
            lambda: profiles_section(results["generation_profiles"], "one beam-5 search"),
        ),
    ]


def profiles_markdown(results: dict) -> str:
    """``profiles.md``: the full torch.profiler tables (last profiled run) of every profiled model."""
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


# --------------------------------------------------------------------------- summary


def render_summary(results: dict, targets: List[TargetRow]) -> str:
    """The README's benchmark table: every target, one row per candidate, from
    ``results.json`` (``python -m benchmarks.speed.report`` rebuilds it)."""
    comparisons = floor_comparisons(results)
    memory_metric = next((t.metric for t in targets if t.section == "memory"), "peak memory ratio")
    passed = sum(1 for t in targets if t.status == PASS)
    lines = _summary_header(results)
    if comparisons:
        lines += [FLOOR_NOTE, ""]
    lines += [
        md_table(
            ["candidate", "train tokens/s", "beam-5 sentences/s", memory_metric],
            _summary_rows(results, targets, comparisons),
        ),
        "",
    ]
    lines += _ops_lines([t for t in targets if t.section == "ops"])
    lines += [f"{passed} of {len(targets)} targets PASS in this run.", ""]
    return "\n".join(lines)


def _summary_header(results: dict) -> List[str]:
    """The summary's title and what its ratios are: the device, rounds, revision and command."""
    machine, meta = results["machine"], results["meta"]
    device = machine.get("device", "?") + (f" ({machine['gpu']})" if machine.get("gpu") else "")
    return [
        "# Benchmark summary (generated by `python -m benchmarks.speed.report` from results.json)",
        "",
        f"Ratio to vanilla fairseq measured in the same run: median [min-max] over interleaved rounds "
        f"(target) status. Device {device}, {machine.get('cpu')}, {machine.get('torch_threads')} torch thread(s), "
        f"scale `{meta.get('scale')}`, {_rounds(meta)} rounds (train / other sections), "
        f"git revision `{machine.get('git')}`, "
        f"command `{meta.get('command')}`.",
        "",
    ]


def _summary_rows(
    results: dict, targets: List[TargetRow], comparisons: List[FloorComparison]
) -> List[Tuple[str, str, str, str]]:
    """One row per candidate (its train, generate and memory targets), then one per floor."""
    by_candidate: Dict[str, Dict[str, TargetRow]] = {}
    for row in targets:
        if row.section != "ops":
            by_candidate.setdefault(row.candidate, {})[row.section] = row
    beside = {(c.section, c.preset): c for c in comparisons}
    rows = [
        (f"`{key}`", *(_target_cell(sections.get(s), results, beside) for s in ("train", "generate", "memory")))
        for key, sections in by_candidate.items()
    ]
    for floor in dict.fromkeys(c.floor for c in comparisons):
        of_floor = {c.section: c for c in comparisons if c.floor == floor}
        rows.append((f"`{floor}`", _floor_cell(of_floor.get("train")), _floor_cell(of_floor.get("generate")), "-"))
    return rows


def _target_cell(row: Optional[TargetRow], results: dict, beside: Dict[Tuple[str, str], FloorComparison]) -> str:
    """A target's ratio, spread, threshold and status; for memory the pass time too; beside a
    floor, the other ratio (to vanilla when the target is the floor's, else to the floor)."""
    if row is None:
        return "-"
    spread = f" [{fmt(row.low, 2)}-{fmt(row.high, 2)}]" if row.low is not None else ""
    of = f" of {row.reference}" if row.reference != "vanilla" else ""
    text = f"{fmt(row.median, 2)}{spread}{of} ({row.comparison} {row.threshold:g}) {row.status}"
    if row.section == "memory":
        text += _memory_pass_time(results["memory"][row.candidate])
    comparison = beside.get((row.section, row.candidate))
    if comparison is not None:
        other = (
            (comparison.preset_vs_vanilla, "vanilla")
            if row.reference != "vanilla"
            else (comparison.preset_vs_floor, comparison.floor)
        )
        text += f"; {fmt(other[0].median, 2)} of {other[1]}"
    return text


def _memory_pass_time(measured: dict) -> str:
    """The time of the memory pass at the target's length, as a ratio to vanilla's."""
    # the memory target alone passed window-preset on an H100 while its recomputed pass
    # took 137x vanilla's time (gpu-nvidia-h100-recompute): the time is shown beside it
    ratio = measured.get("time_ratio", {}).get(str(memory_target_length(measured["peak_bytes"])))
    return "" if ratio is None else f"; pass time {fmt(ratio, 2)}x"


def _floor_cell(comparison: Optional[FloorComparison]) -> str:
    if comparison is None:
        return "-"
    s = comparison.floor_vs_vanilla
    return f"{fmt(s.median, 2)} [{fmt(s.low, 2)}-{fmt(s.high, 2)}] (floor of {comparison.preset}, no target)"


def _ops_lines(ops: List[TargetRow]) -> List[str]:
    """One line on the attention ops' cost exponents, when they were measured."""
    if not ops:
        return []
    worst = max(ops, key=lambda t: t.median)
    return [
        f"Attention ops: cost exponent vs length <= {OP_EXPONENT_TARGET:g} for "
        f"{sum(1 for t in ops if t.status == PASS)} of {len(ops)} (largest: {worst.candidate} "
        f"{fmt(worst.median, 2)}).",
        "",
    ]


def write_summary(results_path, out_dir=None) -> str:
    """Rebuild ``summary.md`` beside ``results.json`` (and its copies in the documentation)."""
    results_path = Path(results_path)
    results = json.loads(results_path.read_text(encoding="utf-8"))
    markdown = render_summary(results, evaluate_targets(results))
    summary = Path(out_dir or results_path.parent) / "summary.md"
    summary.write_text(markdown, encoding="utf-8")
    if summary.resolve().is_relative_to((REPO_ROOT / "benchmarks" / "results").resolve()):
        update_pages(summary)  # its copies in the README and docs/, if any (the CPU and the GPU results)
    return markdown


# --------------------------------------------------------------------------- files


def write_reports(results: dict, out: Path) -> str:
    """Targets, floors, ``benchmark.png``, ``results.md``, ``profiles.md`` (when
    profiled), ``results.json`` and ``summary.md`` into ``out``, from the
    measurements in ``results``; returns the markdown report."""
    meta = results["meta"]
    targets = evaluate_targets(results)
    results["targets"] = [t.as_dict() for t in targets]
    results["floors"] = [c.as_dict() for c in floor_comparisons(results)]
    out.mkdir(parents=True, exist_ok=True)
    plot_name = "benchmark.png"
    meta["plot_backend"] = write_plot(results, out / plot_name, _plotted_targets(targets))
    markdown = render_markdown(results, targets, plot_name)
    (out / "results.md").write_text(markdown, encoding="utf-8")
    if results.get("profiles") or results.get("generation_profiles"):
        (out / "profiles.md").write_text(profiles_markdown(results), encoding="utf-8")
    (out / "results.json").write_text(
        json.dumps(_jsonable(results), indent=1, sort_keys=False) + "\n", encoding="utf-8"
    )
    write_summary(out / "results.json")
    return markdown


def _plotted_targets(targets: List[TargetRow]) -> Dict[str, Dict[str, float]]:
    """The threshold line of each panel that has one: {panel title: {candidate: threshold}}."""
    # the plot shows ratios to vanilla: targets relative to a floor are not drawn
    return {
        title: {t.candidate: t.threshold for t in targets if t.section == section and t.reference == "vanilla"}
        for title, section in (
            ("Training throughput vs vanilla fairseq", "train"),
            ("Beam-5 generation vs vanilla fairseq", "generate"),
        )
    }


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.speed.report",
        description="Rebuild summary.md (the README's benchmark table) beside a results.json.",
    )
    p.add_argument(
        "results", nargs="?", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "speed" / "results.json"
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also rebuild results.md, benchmark.png (and its targets) from results.json: for a run whose other "
        "files stayed behind (a GPU machine returns a few files only)",
    )
    args = p.parse_args(argv)
    if args.all:
        write_reports(json.loads(args.results.read_text(encoding="utf-8")), args.results.parent)
    print(write_summary(args.results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
