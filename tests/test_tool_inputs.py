"""scripts/evaluate.py refuses inputs that cannot be right, or says what it did with
them (issue 28): a language pair its checkpoint was not trained on is refused
before translating; the scores name the target language and the exact metrics, and
a compound splitting the language does not get is warned about.
(The length limit of ``python -m fairseq_distattn.inspect`` is tested in
tests/test_inspect.py, with its fixtures.)"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

import pytest

from benchmarks.common import size_flags

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import REPO_ROOT, cli_env, read_lines, run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import REPO_ROOT, cli_env, read_lines, run_cli

EVALUATE = REPO_ROOT / "scripts" / "evaluate.py"
TINY_TRAINING = [
    "--arch",
    "distattn_transformer",
    *size_flags(dim=16, ffn=32, heads=2, layers=1),
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--max-tokens",
    "1024",
    "--max-update",
    "1",
    "--disable-validation",
    "--num-workers",
    "0",
    "--no-save-optimizer-state",
]
# a short decoding: the hypotheses' quality does not matter here
QUICK_DECODING = ["--cpu", "--beam", "2", "--", "--max-len-a", "0", "--max-len-b", "4"]


def evaluate(*argv, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EVALUATE), *(str(a) for a in argv)],
        capture_output=True,
        text=True,
        cwd=str(cwd),
        env=cli_env(),
        timeout=600,
    )


def evaluate_module():
    """scripts/evaluate.py as a module (its name would clash with other packages' on sys.path)."""
    spec = importlib.util.spec_from_file_location("distattn_evaluate_script", EVALUATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"


def rewrite_task(source: Path, target: Path, **task) -> Path:
    """A copy of a checkpoint whose recorded task says ``task`` (languages, data)."""
    import torch

    import fairseq_distattn.models  # noqa: F401  (allow-lists fairseq's config classes)

    state = torch.load(source, map_location="cpu", weights_only=True)
    state["cfg"]["task"].update(task)
    torch.save(state, target)
    return target


@pytest.fixture(scope="module")
def en_de(mt_data, tmp_path_factory):
    """An En->De checkpoint of one update (fairseq-train -s en -t de) on the conftest data."""
    save_dir = tmp_path_factory.mktemp("tool-inputs") / "checkpoints"
    run_cli(
        [
            "fairseq-train",
            mt_data["bin"],
            "--user-dir",
            "fairseq_distattn",
            "--task",
            "translation",
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            *TINY_TRAINING,
            "--save-dir",
            save_dir,
        ]
    )
    return save_dir / "checkpoint_last.pt"


# --------------------------------------------------------------------------- evaluate.py mt


@pytest.mark.parametrize(
    "flags, given",
    [
        (["--source-lang", "de", "--target-lang", "en"], "--source-lang de --target-lang en"),
        (["--target-lang", "fr"], "--target-lang fr"),
    ],
)
def test_mt_refuses_a_pair_the_checkpoint_was_not_trained_on(mt_data, en_de, tmp_path, flags, given):
    out = tmp_path / "eval"
    proc = evaluate("mt", mt_data["bin"], "--path", en_de, "--ref-dir", mt_data["prep"], "--output-dir", out, *flags)
    assert proc.returncode == 2, show(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"evaluate.py mt: error: checkpoint {en_de} was trained en->de, but {given} was given"
    ), show(proc)
    assert "fairseq-generate" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "generate-test.txt").exists()  # refused before translating


def test_mt_takes_the_languages_from_the_checkpoint_when_none_are_given(mt_data, en_de, tmp_path):
    # the binarised data is en-de; a de->en model evaluated on it without languages
    # used to translate en->de (German into German-trained decoder input: BLEU 0)
    de_en = rewrite_task(en_de, tmp_path / "de_en.pt", source_lang="de", target_lang="en")
    out = tmp_path / "eval"
    proc = evaluate(
        "mt", mt_data["bin"], "--path", de_en, "--ref-dir", mt_data["prep"], "--output-dir", out, *QUICK_DECODING
    )
    assert proc.returncode == 0, show(proc)
    assert "--source-lang de --target-lang en" in proc.stderr, show(proc)
    result = json.loads((out / "bleu.json").read_text())
    assert result["pair"] == "de-en" and result["target_lang"] == "en"
    assert result["sentences"] == mt_data["n_test"] and result["hypotheses"] == mt_data["n_test"]

    # and the checkpoint's own pair, given in part, in full or not at all, is the one
    # evaluated (through the function; the run above is the whole command)
    script = evaluate_module()
    for flags in ([], ["--target-lang", "de"], ["--source-lang", "en", "--target-lang", "de"]):
        args = script.build_parser().parse_args(["mt", str(mt_data["bin"]), "--path", str(en_de), *flags])
        setup = script.Setup(args, args.data)
        assert script.mt_languages(args, setup, script.model_checkpoints(args, setup)) == ("en", "de"), flags


def test_mt_without_recorded_languages_checks_what_fairseq_inferred_from_the_training_data(
    mt_data, en_de, tmp_path, capsys
):
    # fairseq-train without -s/-t records None and infers the pair from its data directory
    unrecorded = rewrite_task(en_de, tmp_path / "none.pt", source_lang=None, target_lang=None)
    proc = evaluate(
        "mt",
        mt_data["bin"],
        "--path",
        unrecorded,
        "--ref-dir",
        mt_data["prep"],
        "--output-dir",
        tmp_path / "eval",
        "--source-lang",
        "de",
        "--target-lang",
        "en",
    )
    assert proc.returncode == 2, show(proc)
    assert not (tmp_path / "eval").exists()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"evaluate.py mt: error: checkpoint {unrecorded} records no languages;"), show(proc)
    assert f"fairseq inferred en->de from its training data {mt_data['bin']}" in last
    assert last.endswith("but --source-lang de --target-lang en was given")

    # training data no longer there: nothing to compare with, the languages given are used
    script = evaluate_module()
    assert script.checkpoint_pair(unrecorded) == (
        "en",
        "de",
        f"records no languages; fairseq inferred en->de from its training data {mt_data['bin']}",
    )
    moved = rewrite_task(en_de, tmp_path / "moved.pt", source_lang=None, target_lang=None, data=str(tmp_path / "gone"))
    assert script.checkpoint_pair(moved) is None
    args = script.build_parser().parse_args(
        ["mt", str(mt_data["bin"]), "--path", str(moved), "--source-lang", "de", "--target-lang", "en"]
    )
    setup = script.Setup(args, args.data)
    assert script.mt_languages(args, setup, script.model_checkpoints(args, setup)) == ("de", "en")
    assert f"checkpoint {moved} records no languages" in capsys.readouterr().err


def test_a_legacy_checkpoint_s_args_give_its_languages(tmp_path):
    import torch

    legacy = tmp_path / "legacy.pt"
    torch.save(
        {"args": argparse.Namespace(task="translation", source_lang="en", target_lang="fr", data="x"), "model": {}},
        legacy,
    )
    assert evaluate_module().checkpoint_pair(legacy) == ("en", "fr", "was trained en->fr")


# --------------------------------------------------------------------------- evaluate.py score


def generate_output(path: Path, sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str]) -> Path:
    lines: List[str] = []
    for i, (src, hyp, ref) in enumerate(zip(sources, hyps, refs)):
        lines += [f"S-{i}\t{src}", f"T-{i}\t{ref}", f"H-{i}\t-0.5\t{hyp}", f"D-{i}\t-0.5\t{hyp}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def german_case(mt_data, tmp_path):
    """German test references (Multi30k, real) and hypotheses: the references with a
    word dropped from every other one, and a hyphenated compound."""
    prep = mt_data["prep"]
    sources = read_lines(prep / "test.raw.en")
    refs = read_lines(prep / "test.tok.de")
    refs[1] = "Ein Boston Terrier läuft über saftig-grünes Gras vor einem Ost-West-Zaun ."
    hyps = [" ".join(r.split()[:2] + r.split()[3:]) if i % 2 else r for i, r in enumerate(refs)]
    hyps[1] = "Ein Terrier läuft über saftig-grünes Gras vor einem Ost-Zaun ."
    (tmp_path / "ref.tok.de").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    generate = generate_output(tmp_path / "generate-test.txt", sources, hyps, refs)
    return {
        "generate": generate,
        "src_raw": prep / "test.raw.en",
        "ref_raw": prep / "test.raw.de",
        "ref_tok": tmp_path / "ref.tok.de",
    }


def score(case, target_lang: str, out: Path, *extra) -> subprocess.CompletedProcess:
    return evaluate(
        "score",
        case["generate"],
        "--source-lang",
        "en",
        "--target-lang",
        target_lang,
        "--src-raw",
        case["src_raw"],
        "--ref-raw",
        case["ref_raw"],
        "--ref-tok",
        case["ref_tok"],
        "--output-dir",
        out,
        *extra,
    )


def test_score_names_the_target_language_and_the_metrics_and_warns_of_a_dropped_splitting(german_case, tmp_path):
    german = score(german_case, "de", tmp_path / "de")
    assert german.returncode == 0, show(german)
    header = german.stdout.splitlines()
    assert "target language: de" in header[1] and "sacremoses" in header[1]
    assert header[2].startswith("metrics: tokenised BLEU with compound splitting")
    assert "sacreBLEU nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in header[2]
    assert "warning" not in german.stderr
    result = json.loads((tmp_path / "de" / "bleu.json").read_text())
    assert result["target_lang"] == "de" and result["compound_split"]["applied"] is True
    assert result["metrics"]["tokenized_bleu_compound_split"].startswith("tokenised BLEU with compound splitting")

    # the same German text scored as French: no splitting, and it says so
    french = score(german_case, "fr", tmp_path / "fr")
    assert french.returncode == 0, show(french)
    header = french.stdout.splitlines()
    assert "(en-fr)" in header[0]
    assert "target language: fr" in header[1] and "lang=fr" in header[1]
    assert header[2].startswith("metrics: tokenised BLEU without compound splitting")
    warnings = [line for line in french.stderr.splitlines() if "compound splitting" in line]
    assert len(warnings) == 1 and "warning" in warnings[0] and "not applied" in warnings[0], show(french)
    assert "target language is fr" in warnings[0] and "German" in warnings[0]
    assert f"warning: the target language is fr, but --ref-raw {german_case['ref_raw']} ends in .de" in french.stderr
    result = json.loads((tmp_path / "fr" / "bleu.json").read_text())
    assert result["target_lang"] == "fr" and result["tokenized_bleu_compound_split"] is None
    assert result["compound_split"] == {
        "requested": "auto",
        "applied": False,
        "reason": result["compound_split"]["reason"],
    }
    assert "fr" in result["compound_split"]["reason"]
    assert result["metrics"]["tokenized_bleu_compound_split"] is None
    assert result["metrics"]["sacrebleu"] == result["sacrebleu_signature"]

    # asked for anyway: applied, with a warning that it is a German convention
    forced = score(german_case, "fr", tmp_path / "forced", "--compound-split", "yes")
    assert forced.returncode == 0, show(forced)
    warnings = [line for line in forced.stderr.splitlines() if "compound splitting" in line]
    assert len(warnings) == 1 and "applied" in warnings[0] and "fr" in warnings[0], show(forced)
    assert json.loads((tmp_path / "forced" / "bleu.json").read_text())["compound_split"]["applied"] is True

    # and no warning when splitting is turned off
    off = score(german_case, "fr", tmp_path / "off", "--compound-split", "no")
    assert off.returncode == 0 and "compound splitting" not in off.stderr, show(off)
