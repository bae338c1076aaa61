"""LM length extrapolation: ``python -m benchmarks.quality.lm_extrapolation``.

Every finished run of ``benchmarks.quality.lm`` (trained on samples of 64
tokens) scores WikiText-2 ``test.txt`` with ``fairseq-eval-lm`` at 64 to 2048
tokens per sample (32x the training length), in two ways:

- blocks: non-overlapping samples of N tokens (``--tokens-per-sample N``), every
  token scored; beyond the training length the model meets positions it never saw,
  and the average context grows with N.
- sliding: samples of N tokens whose first N/2 are context only (``--tokens-per-sample
  N --context-window N/2``): each scored token sees N/2 to N-1 tokens of context.

Positions: fairseq's ``transformer_lm`` and the plugin's vanilla and window
presets use sinusoidal position embeddings, which are defined at any position
(positions past 64 were simply never trained on); the other presets have no
position embeddings (their mechanism encodes positions, or nothing does: nope).
No model has learned ones. lm_quality trains every model with
``--max-target-positions 2048``, the longest sample eval-lm then accepts; each
evaluation's scored-token count is checked against the run's first evaluation,
so a sample skipped as too long cannot go unnoticed. The rope models are also
evaluated beyond their training length, as trained, with each RoPE
context-length scaling of ROPE_SCALINGS (``--model-overrides``: ``--rope-scaling
linear|ntk|yarn|llama3`` by N / 64).

One JSON per (run, scaling, length) under ``<out>/runs``, skipped when present;
``<out>/lm_extrapolation.md`` and ``<out>/ppl_vs_length.png`` are rebuilt from them.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_distattn.functional.rotary import LENGTH_MODES, SCALING_MODES
from fairseq_distattn.tools.generated_blocks import update_pages

from ..common import (
    REPO_ROOT,
    add_out_argument,
    add_quality_work_argument,
    at_least,
    check_quality_work,
    check_same_budget,
    comma_separated_ints,
    comma_separated_names,
    scale_results,
    without_machine_paths,
)
from ..harness.claims import claimed
from ..harness.fingerprints import checkpoint_fingerprint, evaluated_from, models_per_run, recorded_fingerprint
from ..harness.process import log, tool_env
from ..harness.report import series_style
from ..harness.runs import load_runs
from ..harness.seeds import mean_std_text
from .lm import eval_lm
from .lm_grid import DEFAULT_OUT as LM_QUALITY_OUT
from .lm_grid import DEFAULT_WORK, PRESET_REFERENCES, draws_at_evaluation, lm_configs, same_models_of_runs
from .lm_readings import Comparison
from .lm_readings import section as readings_section

PROG = "python -m benchmarks.quality.lm_extrapolation"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "lm_extrapolation"
LENGTHS = (64, 128, 256, 512, 1024, 2048)
MODES = ("blocks", "sliding")
# RoPE's context-length scalings: every --rope-scaling choice except none, yarn-paper (the
# paper's ramp, kept as an option beside yarn, the authors' code that users run) and longrope (its
# per-pair factors come from a search per model, which LongRoPE runs and this harness does not). Each
# is evaluated on the RoPE models as trained beyond their training length (up to it they scale by 1,
# which changes nothing); xpos takes the same flags, but its published comparisons do not scale it, and
# each scaling costs a full sweep
ROPE_SCALINGS = tuple(mode for mode in SCALING_MODES if mode not in ("none", "yarn-paper", "longrope"))
# evaluated, like them, on the rope models as trained, with the factors benchmarks.quality.lm_longrope
# searched for each model at the longest length evaluated (rows only for the runs it searched)
SEARCHED_SCALING = "longrope"
ROTARY_MECHANISMS = ("rope",)


def rotary_configs() -> List[str]:
    """The presets whose decoder self-attention is rope in every layer (Llama 4's interleaving, rope in some
    layers, has its own rows: a scaling of its rope layers is not the rope rows' protocol)."""
    from fairseq_distattn.models.arguments import ARCHITECTURES

    return [
        name
        for name, (_, specs) in ARCHITECTURES.items()
        if specs.get("decoder_self_attention", "") in ROTARY_MECHANISMS
    ]


def scaling_overrides(scaling: str, length: int, trained: int) -> Dict[str, object]:
    """--model-overrides that evaluate a rotary model trained on ``trained`` tokens at ``length``
    with RoPE scaling ``scaling``, by the factor ``length / trained`` (1 at or below it); yarn and
    llama3 also scale by the training length (the other scalings refuse it: they do not read it)."""
    overrides = {"rope_scaling": scaling, "rope_scaling_factor": max(1.0, length / trained)}
    if scaling in LENGTH_MODES:
        overrides["rope_original_length"] = trained
    return overrides


def longrope_file(out: Path, run_name: str, target: int) -> Path:
    """Where ``benchmarks.quality.lm_longrope`` keeps a run's factors searched at ``target`` tokens."""
    return out / "longrope" / f"{run_name}-L{target}.json"


def searched_longrope(out: Path, run_dir: Path, target: int, fingerprint: str) -> Optional[List[float]]:
    """The factors searched for the run at ``target`` tokens on its checkpoint as it is now (whose
    sha256 the caller has: ``fingerprint``), else None."""
    path = longrope_file(out, run_dir.name, target)
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record["checkpoint_sha256"] != fingerprint:
        log(f"{path.name} was searched on another checkpoint than {run_dir.name}'s: run lm_longrope again")
        return None
    return record["factors"]


def longrope_overrides(factors: Sequence[float], trained: int, target: int) -> Dict[str, object]:
    """--model-overrides of LongRoPE's factors searched at ``target`` tokens for a model trained on
    ``trained``: the long factors on every sequence beyond the training length, the short ones 1 (the
    model as trained), and the attention factor of ``target / trained``, as Hugging Face's longrope
    reads a config of ``original_max_position_embeddings = trained`` and ``max_position_embeddings =
    target`` (the factors are given as text, as on a command line)."""
    return {
        "rope_scaling": "longrope",
        "rope_scaling_factor": target / trained,
        "rope_original_length": trained,
        "rope_short_factor": ",".join("1.0" for _ in factors),
        "rope_long_factor": ",".join(repr(float(f)) for f in factors),
    }


def is_finetuned(config: str) -> bool:
    """A row of ``benchmarks.quality.lm_finetune``: a model fine-tuned with a scaling."""
    return config.endswith("-ft")


def model_of(config: str) -> str:
    """The trained model a row's results come from: a scaling's row (``X+yarn``) evaluates X; a
    fine-tuned row (``X+yarn-ft``) and a variant of a preset (``X+per-layer``) are models of their own."""
    base, _, suffix = config.partition("+")
    return base if suffix in (*ROPE_SCALINGS, SEARCHED_SCALING) else config


def trained_runs(runs_dir: Path, configs) -> List[Path]:
    """The run folders of ``benchmarks.quality.lm`` under ``runs_dir`` (its work folder's scale)
    with a trained model, of the configurations ``configs``."""
    return sorted(
        path.parent
        for path in runs_dir.glob("*-seed*/checkpoint_best.pt")
        if re.fullmatch(r".+-seed\d+", path.parent.name) and path.parent.name.rsplit("-seed", 1)[0] in configs
    )


def context_window(mode: str, length: int) -> int:
    return length // 2 if mode == "sliding" else 0


def training_setup(run_dir: Path) -> Dict[str, object]:
    """The data-bin directory and training sample length of an lm_quality run, from its training command
    (a run without one, or whose command lacks them, is one error line naming the run)."""
    log_path = run_dir / "train.log"
    if not log_path.is_file():
        raise SystemExit(
            f"{run_dir.name}: no train.log in {run_dir}, so its data and training length are unknown "
            "(a run of benchmarks.quality.lm keeps the log of its training beside checkpoint_best.pt)"
        )
    command = next(
        (
            line[2:]
            for line in log_path.read_text(encoding="utf-8").splitlines()
            if line.startswith("$ ") and "fairseq-train" in line
        ),
        None,
    )
    if command is None:
        raise SystemExit(f"{run_dir.name}: no fairseq-train command in {log_path}")
    words = shlex.split(command)
    flag = "--tokens-per-sample"
    length = words[words.index(flag) + 1] if flag in words[:-1] else ""
    if len(words) < 2 or not length.isdigit():
        raise SystemExit(f"{run_dir.name}: the fairseq-train command in {log_path} has no data-bin or no {flag} N")
    return {"data_bin": Path(words[1]), "tokens_per_sample": int(length)}


def evaluate_run(run_dir: Path, lengths: Sequence[int], out: Path, quality_runs: Path, env: Dict[str, str]) -> None:
    """One JSON per length for one run. A length with a JSON already is skipped
    unless that JSON is from another checkpoint than the run's (a model trained
    again; ``evaluated_from``, with the run's file in ``quality_runs``): then it is
    evaluated again, so one seed's row never mixes models."""
    config = run_dir.name.rsplit("-seed", 1)[0]
    setup = training_setup(run_dir)
    fingerprint = checkpoint_fingerprint(run_dir / "checkpoint_best.pt")
    recorded = recorded_fingerprint(quality_runs / f"{run_dir.name}.json")
    trained = setup["tokens_per_sample"]
    reference: Optional[int] = None  # the tokens every length must score: the first length's
    scalings = (None, *ROPE_SCALINGS) if config in rotary_configs() else (None,)
    searched_at = max(lengths)
    searches = scalings[1:] and searched_at > trained
    factors = searched_longrope(out, run_dir, searched_at, fingerprint) if searches else None
    scalings += (SEARCHED_SCALING,) if factors else ()
    runs = [(length, scaling) for scaling in scalings for length in lengths if scaling is None or length > trained]
    for length, scaling in runs:
        name = run_dir.name if scaling is None else f"{run_dir.name}-{scaling}"
        path = out / "runs" / f"{name}-L{length}.json"
        if scaling == SEARCHED_SCALING:
            overrides = longrope_overrides(factors, trained, searched_at)
        else:
            overrides = None if scaling is None else scaling_overrides(scaling, length, trained)
        if path.is_file():
            existing = json.loads(path.read_text(encoding="utf-8"))
            if evaluated_from(existing, fingerprint, recorded) and existing.get("model_overrides") == overrides:
                reference = reference or existing["blocks"]["tokens"]
                continue
            log(f"{path.name} was evaluated from another checkpoint or with other overrides: again")
        log(f"{name} at {length} tokens per sample")
        results = evaluate_length(run_dir, setup["data_bin"], length, overrides, env)
        reference = reference or results["blocks"]["tokens"]
        check_every_token_scored(f"{run_dir.name} at {length}", results, reference)
        record = length_record(run_dir, scaling, trained, length, fingerprint, overrides, results)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(without_machine_paths(json.dumps(record, indent=1)) + "\n", encoding="utf-8")


def evaluate_unclaimed(
    runs: Sequence[Path], lengths: Sequence[int], out: Path, quality_runs: Path, env: Dict[str, str]
) -> None:
    """:func:`evaluate_run` of each run that no other process holds (``claimed``): fairseq-eval-lm
    writes to the run's extrapolation.log, and each evaluation reads its numbers back from where the
    log stood when it started, so two processes on one run would take each other's numbers."""
    for run_dir in runs:
        with claimed(run_dir) as holder:
            if holder:
                log(f"{run_dir.name}: skipped, held by {holder} (one process evaluates a run at a time)")
                continue
            evaluate_run(run_dir, lengths, out, quality_runs, env)


def evaluate_length(
    run_dir: Path, data_bin: Path, length: int, overrides: Optional[Dict], env: Dict[str, str]
) -> Dict[str, Dict]:
    """``fairseq-eval-lm`` of the run's best checkpoint at ``length`` tokens per sample, in each mode."""
    return {
        mode: eval_lm(
            run_dir / "checkpoint_best.pt",
            data_bin,
            length,
            context_window(mode, length),
            run_dir / "extrapolation.log",
            env,
            model_overrides=overrides,
        )
        for mode in MODES
    }


def check_every_token_scored(what: str, results: Dict[str, Dict], reference: int) -> None:
    """Every mode scored the tokens the first length did: fairseq-eval-lm silently skips
    samples longer than the model's max positions, which would score a shorter text."""
    scored = {mode: result["tokens"] for mode, result in results.items()}
    if set(scored.values()) != {reference}:
        raise RuntimeError(
            f"{what}: scored {scored} tokens, not {reference} as at the first "
            "length: fairseq-eval-lm skipped samples longer than the model's max positions"
        )


def length_record(
    run_dir: Path,
    scaling: Optional[str],
    trained: int,
    length: int,
    fingerprint: str,
    overrides: Optional[Dict],
    results: Dict[str, Dict],
) -> Dict:
    """The run file of one run at one length (and RoPE scaling): what was evaluated, from which checkpoint."""
    config, seed = run_dir.name.rsplit("-seed", 1)
    return {
        "config": config if scaling is None else f"{config}+{scaling}",
        "seed": int(seed),
        "baseline": lm_configs()[config].baseline,
        "train_tokens_per_sample": trained,
        "tokens_per_sample": length,
        "scale": run_dir.parent.name,
        "checkpoint_sha256": fingerprint,
        **({} if overrides is None else {"model_overrides": overrides}),
        **results,
    }


# ------------------------------------------------------------------ report


def ppl_table(records: Sequence[Dict]) -> Dict[str, Dict[str, Dict[int, List[float]]]]:
    """``{config: {mode: {length: [ppl of each seed]}}}``; a scaled config (``X+yarn``) takes X's
    values up to the training length, where the scaling factor is 1 (a fine-tuned one, ``X+yarn-ft``,
    is another model: only its own values)."""
    table: Dict[str, Dict[str, Dict[int, List[float]]]] = {}
    for record in records:
        for mode in MODES:
            table.setdefault(record["config"], {}).setdefault(mode, {}).setdefault(
                record["tokens_per_sample"], []
            ).append(record[mode]["ppl"])
    trained = {record["config"]: record["train_tokens_per_sample"] for record in records}
    for name, modes in table.items():
        unscaled = model_of(name)
        if name != unscaled and unscaled in table:
            for mode, per_length in modes.items():
                for length, values in table[unscaled][mode].items():
                    if length <= trained[name]:
                        per_length.setdefault(length, values)
    return table


def cell(values: Optional[Sequence[float]]) -> str:
    return mean_std_text(values) if values else "-"


def fingerprints_decide(record: Dict, quality_run: Dict) -> bool:
    """Whether the checkpoint fingerprints alone tell that ``record`` (a training-length result) is
    from the model of its quality run record ``quality_run``: its model draws positions in evaluation,
    so the two evaluations' perplexities differ by the draw, and both name a checkpoint
    (:func:`models_per_run` compares them)."""
    return (
        draws_at_evaluation(record["config"])
        and "checkpoint_sha256" in record
        and quality_run.get("checkpoint_sha256") is not None
    )


def check_one_model_per_seed(records: Sequence[Dict], quality_runs: Optional[Path]) -> None:
    """Refuse a table whose row would mix models: one seed's lengths evaluated from
    different checkpoints (their recorded fingerprints differ) or from another than
    the one its quality run file records, or its training length scoring other than
    the test ppl that file records (the same evaluation of the same model gives the
    same number). A model that draws positions in evaluation (:func:`draws_at_evaluation`)
    scores another draw each evaluation: where both files name its checkpoint, those
    fingerprints are the check, not the perplexity."""
    problems = models_per_run(
        records,
        # a scaling's files: the same model; a fine-tuned one's (lm_finetune): its own
        lambda record: (model_of(record["config"]), record["seed"]),
        lambda config, seed: (
            None if quality_runs is None or is_finetuned(config) else quality_runs / f"{config}-seed{seed}.json"
        ),
    )
    for record in records:
        if (
            quality_runs is None
            or model_of(record["config"]) != record["config"]
            or record["tokens_per_sample"] != record["train_tokens_per_sample"]
        ):
            continue
        quality = quality_runs / f"{record['config']}-seed{record['seed']}.json"
        if quality.is_file():
            quality_run = json.loads(quality.read_text(encoding="utf-8"))
            recorded = quality_run["test_ppl"]
            if not fingerprints_decide(record, quality_run) and abs(record["blocks"]["ppl"] - recorded) > 0.011:
                problems.append(
                    f"{record['config']} seed {record['seed']}: {record['blocks']['ppl']} at the training length, "
                    f"{recorded} in {quality}"
                )
    if problems:
        raise SystemExit(
            "LM extrapolation results from more than one model per seed (remove that seed's "
            "runs/<config>-seed<N>-L*.json and evaluate again): " + "; ".join(problems)
        )


def report(out: Path, quality_runs: Optional[Path] = None) -> str:
    """The tables and plot from the run files; ``quality_runs``: the LM quality run
    files the training-length results must agree with."""
    records = load_runs(out)
    check_one_model_per_seed(records, quality_runs)
    table = ppl_table(records)
    baselines = {r["config"]: r["baseline"] for r in records}
    order = sorted(table, key=lambda name: (baselines[name], name != baselines[name], name))
    lengths = sorted({r["tokens_per_sample"] for r in records})
    trained = sorted({r["train_tokens_per_sample"] for r in records})
    drawing = [name for name in order if draws_at_evaluation(name)]
    lines = header_lines(lengths, trained, drawing)
    for mode in MODES:
        lines += mode_table(table, order, lengths, mode)
    if len(trained) == 1:
        _, repeats = same_models_of_runs(records)
        lines += readings_section(
            table, comparisons(table, order, trained[0], repeats), reading_lengths(table, trained[0]), trained[0]
        )
    markdown = "\n".join(lines).rstrip("\n") + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm_extrapolation.md").write_text(markdown, encoding="utf-8")
    (out / "summary.md").write_text(summary(table, order, lengths, trained), encoding="utf-8")
    if out.resolve() == DEFAULT_OUT.resolve():
        update_pages(out / "lm_extrapolation.md")
        update_pages(out / "summary.md")
    if records:
        plot(table, order, trained, out / "ppl_vs_length.png")
    return markdown


def comparisons(table: Dict, order: Sequence[str], trained: int, repeats: Dict[str, str]) -> List[Comparison]:
    """Every row that changes one model, with that model's row (a variant's or a scaling's: the name
    before ``+``; a preset's: PRESET_REFERENCES; a preset the grid did not train, being another's
    model at the runs' scale: that one, ``repeats``) and the lengths it has numbers of its own at."""
    found = []
    for name in order:
        reference = PRESET_REFERENCES.get(name) or (name.partition("+")[0] if "+" in name else None)
        reference = repeats.get(reference, reference)
        if reference in table:
            # a scaling's row shows its model's numbers up to the training length (ppl_table)
            own = [n for n in table[name]["blocks"] if model_of(name) == name or n > trained]
            found.append(Comparison(name, reference, tuple(sorted(own))))
    return found


def reading_lengths(table: Dict, trained: int) -> List[int]:
    """The lengths the readings show: the summary's (the training length, 8x and 32x it) and the
    fine-tuned rows' (only evaluated at their fine-tune's length)."""
    tuned = {n for name, modes in table.items() if is_finetuned(name) for n in modes["blocks"]}
    lengths = {n for modes in table.values() for n in modes["blocks"]}
    return sorted(({trained * factor for factor in SUMMARY_FACTORS} | tuned) & lengths)


def scaling_names() -> str:
    """The scaling rows' suffixes, as the captions name them: `+linear`, `+ntk`, ..."""
    return ", ".join(f"`+{scaling}`" for scaling in ROPE_SCALINGS)


def header_lines(lengths: Sequence[int], trained: Sequence[int], drawing: Sequence[str] = ()) -> List[str]:
    """The title and what the tables measure: the training lengths, the modes, the RoPE scalings, and
    which rows score a draw of positions (``drawing``: :func:`draws_at_evaluation`)."""
    draws = (
        f" {', '.join(f'`{name}`' for name in drawing)}: positions drawn in evaluation too, so each evaluation "
        "scores one draw (fairseq-eval-lm does not seed torch): at the training length they differ from "
        "`benchmarks.quality.lm`'s test ppl of the same checkpoint by the draw."
        if drawing
        else ""
    )
    return [
        f"# LM length extrapolation on WikiText-2 (generated by `{PROG} --report`)",
        "",
        f"Models of `benchmarks.quality.lm` (trained on samples of {'/'.join(map(str, trained)) or '-'} tokens) "
        "score WikiText-2 test.txt with `fairseq-eval-lm` at longer samples. *blocks*: non-overlapping samples of N "
        "tokens, all scored. *sliding*: samples of N tokens, the first N/2 context only (`--context-window N/2`). "
        "Test perplexity, mean +- std over seeds (a single number: one seed so far); the ratio is ppl at N over ppl "
        f"at {lengths[0] if lengths else '-'} in the same mode (below 1: the longer context helps). Sinusoidal "
        "positions for fairseq's models and the vanilla and window presets; none for the others (their "
        f"mechanism, or nothing at all for nope). {scaling_names()}: the rope models as trained, "
        "evaluated with that `--rope-scaling` by the factor N / training length (1 up to it; "
        f"{' and '.join(s for s in ROPE_SCALINGS if s in LENGTH_MODES)} with `--rope-original-length` the "
        "training length), as `--model-overrides`, no retraining. `+<scaling>-ft`: the same scaling by a fixed "
        "factor after a short fine-tune at the longer length, as the PI and YaRN papers use them "
        f"(`benchmarks.quality.lm_finetune`). `+{SEARCHED_SCALING}`: the rope models as trained with "
        "LongRoPE's factors, searched for each model at the longest length (`benchmarks.quality.lm_longrope`)." + draws,
        "",
    ]


def mode_table(table: Dict, order: Sequence[str], lengths: Sequence[int], mode: str) -> List[str]:
    """One mode's table: each configuration's ppl at every length, and its ratio to the first length's."""
    header = ["config", *(f"N = {n}" for n in lengths), *(f"{n}/{lengths[0]}" for n in lengths[1:])]
    lines = [f"## {mode}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in order:
        per_length = table[name][mode]
        means = {n: statistics.fmean(per_length[n]) for n in per_length}
        ratios = [
            f"{means[n] / means[lengths[0]]:.2f}" if n in means and lengths[0] in means else "-" for n in lengths[1:]
        ]
        lines.append(f"| {name} | " + " | ".join([cell(per_length.get(n)) for n in lengths] + ratios) + " |")
    return lines + [""]


SUMMARY_FACTORS = (1, 8, 32)  # the training length, 8x and 32x it


def summary(table: Dict, order: Sequence[str], lengths: Sequence[int], trained: Sequence[int]) -> str:
    """The README's short form: test ppl at the training length, 8x and 32x it, blocks and sliding."""
    base = trained[0] if len(trained) == 1 else None
    shown = [base * factor for factor in SUMMARY_FACTORS if base and base * factor in lengths] if base else []
    header = ["config", *(f"{mode} N = {n}" for mode in MODES for n in shown)]
    lines = [
        f"Test ppl on WikiText-2 of the LMs trained on {base or '-'}-token samples, evaluated at "
        f"{', '.join(f'{n // base}x' for n in shown) or '-'} that length (mean +- std over seeds; "
        f"{scaling_names()}: the rope models with that RoPE scaling at evaluation, no retraining).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name in order:
        cells = [cell(table[name][mode].get(n)) for mode in MODES for n in shown]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: Dict, order: Sequence[str], trained: Sequence[int], path: Path) -> None:
    # importing fairseq sets the root logger to DEBUG, and matplotlib logs at import
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(MODES), figsize=(11, 4.5), sharey=True)
    for axis, mode in zip(axes, MODES):
        for index, name in enumerate(order):
            points = sorted((n, statistics.fmean(values)) for n, values in table[name][mode].items())
            axis.plot(*zip(*points), **series_style(index), label=name)
        for length in trained:
            axis.axvline(length, color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("tokens per sample at evaluation (dotted: training)")
        axis.set_title(f"{mode}")
    axes[0].set_ylabel("WikiText-2 test perplexity")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_quality_work_argument(p, DEFAULT_WORK, "benchmarks.quality.lm")
    p.add_argument("--scale", default="small", help="the lm_quality runs' scale (default: small)")
    p.add_argument(
        "--configs",
        default="",
        help="comma-separated configurations to evaluate (default: every one with a trained model)",
    )
    p.add_argument(
        "--lengths",
        default=",".join(map(str, LENGTHS)),
        help=f"tokens per sample at evaluation, even numbers (default: {','.join(map(str, LENGTHS))})",
    )
    add_out_argument(p, DEFAULT_OUT)
    p.add_argument(
        "--quality-out",
        type=Path,
        default=None,
        help="benchmarks.quality.lm's --out, whose run files each training-length result must match "
        f"(default: {LM_QUALITY_OUT} for the scale)",
    )
    p.add_argument("--threads", type=at_least(1), default=1, help="OMP_NUM_THREADS (default: 1)")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot")
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    args.quality_out = args.quality_out or scale_results(LM_QUALITY_OUT, args.scale)
    if not args.report:
        check_same_budget(p, args.out, {"scale": args.scale})
    args.length_list = comma_separated_ints(p, "--lengths", args.lengths, 2)
    if any(n % 2 for n in args.length_list):
        p.error("argument --lengths: each length must be an even number >= 2 (the sliding mode scores half)")
    if not args.report:
        check_quality_work(p, args.quality_work, args.scale, "benchmarks.quality.lm")
        args.configs = set(comma_separated_names(p, "--configs", args.configs, lm_configs()))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        env = tool_env(args.threads)
        runs = trained_runs(args.quality_work / args.scale, args.configs)
        log(f"{len(runs)} trained models under {args.quality_work / args.scale}")
        evaluate_unclaimed(runs, args.length_list, args.out, args.quality_out / "runs", env)
    print(report(args.out, args.quality_out / "runs"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
