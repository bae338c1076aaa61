"""Length extrapolation of the translation grid's models: ``python -m benchmarks.quality.mt_extrapolation``.

Multi30k sentences are short (13 words on average), so the translation models
of ``benchmarks.quality.mt`` never saw a long input. Here each finished run's
averaged model translates test sets built by concatenating 1, 2, 4 and 8
consecutive test_2016_flickr sentences (sources and references alike), with
beam 5; BLEU is reported per concatenation factor and per source-length
bucket, per mechanism. One JSON per (run, factor) under ``<out>/runs``,
skipped when present unless it records another model than the run's (a run
trained again); ``<out>/extrapolation.md`` and ``<out>/bleu_vs_length.png``
are rebuilt from them. The default grid's runs are evaluated; an ablation's
(``benchmarks.quality.mt --grid ablations``) when ``--configs`` names it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_distattn.tools import translation_scoring
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
)
from ..harness.fingerprints import checkpoint_fingerprint, evaluated_from, models_per_run, recorded_fingerprint
from ..harness.process import log, run, tool, tool_env
from ..harness.report import series_style
from ..harness.runs import load_runs
from ..harness.seeds import mean_std, mean_std_text
from .mt import score_translation, translate_test_set
from .mt_grid import DEFAULT_OUT as QUALITY_OUT
from .mt_grid import DEFAULT_WORK, default_configs

PROG = "python -m benchmarks.quality.mt_extrapolation"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "extrapolation"
FACTORS = (1, 2, 4, 8)
# source length in BPE tokens (upper bounds, inclusive)
BUCKETS = (16, 32, 64, 128, 256)
BUCKET_LABELS = tuple(f"<={bound}" for bound in BUCKETS) + (f">{BUCKETS[-1]}",)


def concatenated(lines: Sequence[str], factor: int) -> List[str]:
    """Every ``factor`` consecutive lines joined by a space (a shorter last group is kept)."""
    return [" ".join(lines[start : start + factor]) for start in range(0, len(lines), factor)]


def build_test_set(prep: Path, data_bin: Path, factor: int, work: Path, env: Dict[str, str]) -> Path:
    """Binarised test set of ``factor``-sentence groups with the training dictionaries; its
    text (``test.{bpe,tok,raw}.{en,de}``) is written beside it."""
    directory = work / f"x{factor}"
    if (directory / "data-bin" / ".done").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ("bpe", "tok", "raw"):
        for lang in ("en", "de"):
            lines = translation_scoring.read_text(prep / f"test.{kind}.{lang}")
            (directory / f"test.{kind}.{lang}").write_text(
                "".join(line + "\n" for line in concatenated(lines, factor)), encoding="utf-8"
            )
    run(
        [
            tool("fairseq-preprocess"),
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--testpref",
            directory / "test.bpe",
            "--destdir",
            directory / "data-bin",
            "--srcdict",
            data_bin / "dict.en.txt",
            "--tgtdict",
            data_bin / "dict.de.txt",
            "--workers",
            "1",
        ],
        directory / "preprocess.log",
        env,
    )
    (directory / "data-bin" / ".done").touch()
    return directory


def bucket_of(length: int) -> str:
    return next((label for bound, label in zip(BUCKETS, BUCKET_LABELS) if length <= bound), BUCKET_LABELS[-1])


def evaluate(model: Path, test_set: Path, out_dir: Path, env: Dict[str, str]) -> Dict[str, object]:
    """Beam-5 translation of one concatenated test set; corpus BLEU and BLEU per source-length bucket."""
    out_dir.mkdir(parents=True, exist_ok=True)
    generated = out_dir / "generate-test.txt"
    log_path = out_dir / "eval.log"
    # one length limit in proportion to the source at every factor (see check_one_model_per_run)
    max_len = ("--max-len-a", "1.5", "--max-len-b", "10")
    translate_test_set(test_set / "data-bin", model, generated, log_path, env, batch_size=32, extra=max_len)
    scores = score_translation(generated, test_set / "test", out_dir, log_path, env)
    sources = translation_scoring.read_text(test_set / "test.bpe.en")
    hyps_tok = translation_scoring.read_text(out_dir / "hyp.tok.de")
    refs_tok = translation_scoring.read_text(test_set / "test.tok.de")
    groups: Dict[str, List[int]] = {}
    for index, source in enumerate(sources):
        groups.setdefault(bucket_of(len(source.split())), []).append(index)
    per_bucket = {}
    for bucket, indices in sorted(groups.items(), key=lambda item: BUCKET_LABELS.index(item[0])):
        score = translation_scoring.tokenized_bleu(
            [hyps_tok[i] for i in indices], [refs_tok[i] for i in indices], compound_split=True
        )
        per_bucket[bucket] = {
            "sentences": len(indices),
            "tokenized_bleu_compound_split": round(score.score, 2),
            # BLEU's sufficient statistics: buckets of several factors are pooled in the report
            "bleu_statistics": {
                "correct": list(score.counts),
                "total": list(score.totals),
                "hypothesis_length": score.sys_len,
                "reference_length": score.ref_len,
            },
        }
    lengths = [len(source.split()) for source in sources]
    return {
        "sentences": len(sources),
        "mean_source_bpe_tokens": round(sum(lengths) / len(lengths), 1),
        "max_source_bpe_tokens": max(lengths),
        "tokenized_bleu_compound_split": scores["tokenized_bleu_compound_split"],
        "sacrebleu": scores["sacrebleu"],
        "sacrebleu_signature": scores["sacrebleu_signature"],
        "per_source_length": per_bucket,
    }


def check_one_model_per_run(records: Sequence[Dict], quality_runs: Optional[Path]) -> None:
    """Refuse a table whose row would mix models: one run's factors evaluated from
    different averaged checkpoints (their recorded fingerprints differ), or from
    another model than the one its quality run file records. (Files from before
    fingerprints were recorded are not checked. The x1 BLEU is not compared with
    the quality run's: x1 decodes with ``--max-len-a 1.5 --max-len-b 10`` in
    batches of 32, the quality run with fairseq's default length limit in
    batches of 64, so the same model need not give the same hypotheses; the
    fingerprints name the model itself.)"""
    problems = models_per_run(
        records,
        lambda record: (record["config"], record["seed"]),
        lambda config, seed: None if quality_runs is None else quality_runs / f"{config}-seed{seed}.json",
    )
    if problems:
        raise SystemExit(
            "translation extrapolation results from more than one model per run (remove that run's "
            "runs/<config>-seed<N>-x*.json and evaluate again): " + "; ".join(problems)
        )


def report(out: Path, quality_runs: Optional[Path] = None) -> str:
    """Rebuild ``extrapolation.md`` and ``bleu_vs_length.png`` from the run files (each
    checked to be of the model its translation run recorded); returns the markdown."""
    records = load_runs(out)
    check_one_model_per_run(records, quality_runs)
    table = bleu_by_factor(records)
    configs = default_configs()
    order = [name for name in configs if name in table] + sorted(set(table) - set(configs))
    markdown = "\n".join(factor_table(records, table, order) + bucket_table(records, order)) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "extrapolation.md").write_text(markdown, encoding="utf-8")
    if out.resolve() == DEFAULT_OUT.resolve():
        update_pages(out / "extrapolation.md")
    if records:
        plot_bleu_vs_length(records, table, order, out / "bleu_vs_length.png")
    return markdown


def bleu_by_factor(records: Sequence[Dict]) -> Dict[str, Dict[int, List[float]]]:
    """``{config: {factor: BLEU of each seed}}``."""
    table: Dict[str, Dict[int, List[float]]] = {}
    for record in records:
        table.setdefault(record["config"], {}).setdefault(record["factor"], []).append(
            record["tokenized_bleu_compound_split"]
        )
    return table


def factor_table(records: Sequence[Dict], table: Dict[str, Dict[int, List[float]]], order: Sequence[str]) -> List[str]:
    """The title, what is measured, and per configuration its BLEU at each factor and the ratios to x1."""
    factors = sorted({record["factor"] for record in records})
    lengths = {f: sorted({r["mean_source_bpe_tokens"] for r in records if r["factor"] == f}) for f in factors}
    lines = [
        f"# Length extrapolation on Multi30k En-De (generated by `{PROG} --report`)",
        "",
        "Models of `benchmarks.quality.mt` (trained on single Multi30k sentences) translate test_2016_flickr with "
        "1, 2, 4 and 8 consecutive sentences concatenated (sources and references), beam 5. Tokenised BLEU with "
        "compound splitting, mean +- std over seeds (a single number: one seed so far); the ratio is BLEU at the "
        "factor over BLEU at x1.",
        "",
        "| config | "
        + " | ".join(f"x{f} ({'/'.join(str(v) for v in lengths[f])} BPE tokens)" for f in factors)
        + " | "
        + " | ".join(f"x{f}/x1" for f in factors if f != 1)
        + " |",
        "|---|" + "---|" * (2 * len(factors) - (1 if 1 in factors else 0)),
    ]
    for name in order:
        means = {f: mean_std(table[name][f]) for f in factors if f in table[name]}
        cells = [mean_std_text(table[name][f]) if f in means else "-" for f in factors]
        ratios = [
            f"{means[f][0] / means[1][0]:.2f}" if f in means and 1 in means and means[1][0] > 0 else "-"
            for f in factors
            if f != 1
        ]
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
    return lines


def plot_bleu_vs_length(
    records: Sequence[Dict], table: Dict[str, Dict[int, List[float]]], order: Sequence[str], path: Path
) -> None:
    """Each configuration's mean BLEU against the mean source length of each factor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, name in enumerate(order):
        points = sorted(
            (
                statistics.fmean(
                    [r["mean_source_bpe_tokens"] for r in records if r["config"] == name and r["factor"] == f]
                ),
                mean_std(table[name][f])[0],
            )
            for f in table[name]
        )
        axes.plot(*zip(*points), **series_style(index), label=name)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("mean source length (BPE tokens)")
    axes.set_ylabel("BLEU (tokenised, compound split)")
    axes.set_title("Translating concatenated test sentences")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def pooled_bucket_bleu(records: Sequence[Dict]) -> Dict[str, float]:
    """BLEU per source-length bucket over all of one run's factors (statistics summed, then BLEU)."""
    pooled: Dict[str, Dict[str, object]] = {}
    for record in records:
        for bucket, entry in record["per_source_length"].items():
            stats = entry.get("bleu_statistics")
            if stats is None:
                continue
            total = pooled.setdefault(
                bucket, {"correct": [0] * 4, "total": [0] * 4, "hypothesis_length": 0, "reference_length": 0}
            )
            for key in ("correct", "total"):
                total[key] = [a + b for a, b in zip(total[key], stats[key])]
            for key in ("hypothesis_length", "reference_length"):
                total[key] += stats[key]
    return {
        bucket: translation_scoring.tokenized_bleu_from_statistics(
            t["correct"], t["total"], t["hypothesis_length"], t["reference_length"]
        ).score
        for bucket, t in pooled.items()
    }


def bucket_table(records: Sequence[Dict], order: Sequence[str]) -> List[str]:
    """Per config, BLEU by source length in BPE tokens, pooling the sentences of every factor."""
    by_run: Dict[tuple, List[Dict]] = {}
    for record in records:
        by_run.setdefault((record["config"], record["seed"]), []).append(record)
    scores: Dict[str, Dict[str, List[float]]] = {}
    for (config, _), run_records in by_run.items():
        for bucket, bleu in pooled_bucket_bleu(run_records).items():
            scores.setdefault(config, {}).setdefault(bucket, []).append(bleu)
    buckets = [label for label in BUCKET_LABELS if any(label in per for per in scores.values())]
    if not buckets:
        return []
    lines = [
        "",
        "## BLEU by source length",
        "",
        "The test sentences of every factor pooled and grouped by source length in BPE tokens (BLEU from the "
        "summed n-gram statistics of each group, mean over seeds).",
        "",
        "| config | " + " | ".join(f"{label} tokens" for label in buckets) + " |",
        "|---|" + "---|" * len(buckets),
    ]
    for name in order:
        if name in scores:
            lines.append(
                f"| {name} | "
                + " | ".join(
                    f"{statistics.fmean(scores[name][label]):.2f}" if label in scores[name] else "-"
                    for label in buckets
                )
                + " |"
            )
    return lines


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_quality_work_argument(p, DEFAULT_WORK, "benchmarks.quality.mt")
    p.add_argument("--scale", default="small", help="the quality runs' scale (default: small)")
    p.add_argument("--factors", default=",".join(map(str, FACTORS)), help="concatenation factors (default: 1,2,4,8)")
    p.add_argument(
        "--configs",
        default="",
        help="comma-separated quality configurations to evaluate, of the default grid or the ablations "
        "(default: the default grid's; each run with a trained model)",
    )
    add_out_argument(p, DEFAULT_OUT)
    p.add_argument(
        "--quality-out",
        type=Path,
        default=None,
        help="benchmarks.quality.mt's --out, whose run files say which model each run's factors must come from "
        "(default: the scale's results folder of benchmarks.quality.mt)",
    )
    p.add_argument("--threads", type=at_least(1), default=1, help="OMP_NUM_THREADS (default: 1)")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot")
    args = p.parse_args(argv)
    args.out = args.out or scale_results(DEFAULT_OUT, args.scale)
    args.quality_out = args.quality_out or scale_results(QUALITY_OUT, args.scale)
    if not args.report:
        check_same_budget(p, args.out, {"scale": args.scale})
    args.factor_list = comma_separated_ints(p, "--factors", args.factors, 1)
    if args.configs:
        from .ablations import ABLATION_NAMES  # imports fairseq_distattn: only when named

        args.config_names = set(
            comma_separated_names(p, "--configs", args.configs, [*default_configs(), *ABLATION_NAMES])
        )
    else:
        args.config_names = set(default_configs())
    if not args.report:
        check_quality_work(p, args.quality_work, args.scale, "benchmarks.quality.mt")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.report:
        env = tool_env(args.threads)
        models = [
            model
            for model in sorted((args.quality_work / args.scale).glob("*-seed*/averaged.pt"))
            if model.parent.name.rsplit("-seed", 1)[0] in args.config_names
        ]
        log(f"{len(models)} trained models of the configurations asked for under {args.quality_work / args.scale}")
        for model in models:
            run_name = model.parent.name
            config, seed = run_name.rsplit("-seed", 1)
            data = args.quality_work / f"data-{_merges_of(model)}"
            if not (data / "data-bin" / ".done").is_file():
                raise SystemExit(f"no prepared data {data} for {model}")
            fingerprint = checkpoint_fingerprint(model)
            recorded = recorded_fingerprint(args.quality_out / "runs" / f"{run_name}.json")
            for factor in args.factor_list:
                path = args.out / "runs" / f"{run_name}-x{factor}.json"
                if path.is_file():
                    if evaluated_from(json.loads(path.read_text(encoding="utf-8")), fingerprint, recorded):
                        continue
                    log(f"{path.name} was evaluated from another model than {run_name}'s: again")
                test_set = build_test_set(
                    data / "prep", data / "data-bin", factor, args.quality_work / "extrapolation", env
                )
                log(f"{run_name} x{factor}")
                record = {
                    "config": config,
                    "seed": int(seed),
                    "factor": factor,
                    "scale": args.scale,
                    "checkpoint_sha256": fingerprint,
                    **evaluate(model, test_set, model.parent / "extrapolation" / f"x{factor}", env),
                }
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(report(args.out, args.quality_out / "runs"))
    return 0


def _merges_of(model: Path) -> int:
    """The BPE merges of a quality run, from the data directory named in its training log."""
    match = re.search(r"/data-(\d+)/data-bin", (model.parent / "train.log").read_text(encoding="utf-8"))
    if match is None:
        raise SystemExit(f"cannot tell the data of {model} from its train.log")
    return int(match.group(1))


if __name__ == "__main__":
    raise SystemExit(main())
