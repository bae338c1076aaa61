#!/usr/bin/env python3
"""Evaluate fairseq-distattn models with the papers' protocols.

Translation (``mt``): runs ``fairseq-generate`` with beam 4 and length penalty 0.6
(Vaswani et al. 2017; Shaw et al. 2018), ``--remove-bpe`` and always
``--required-batch-size-multiple 1`` (otherwise fairseq-generate can drop the last
batch), optionally on the average of the last N checkpoints; checks that every test
sentence got a hypothesis (exit status 3 otherwise); then reports

  * tokenised BLEU with compound splitting (t2t get_ende_bleu.sh / fairseq
    compound_split_bleu.sh: "a-b" -> "a ##AT##-##AT## b" in hypothesis and reference,
    then multi-bleu.perl-style BLEU on the Moses-tokenised text) - the number the
    WMT14 En-De papers report; for other target languages splitting is off unless
    --compound-split yes;
  * plain tokenised BLEU (no splitting);
  * detokenised sacreBLEU against the raw newstest references, with its signature.

The language pair is the checkpoint's: without --source-lang/--target-lang, the pair
its task records (or, if it records none, the pair fairseq inferred from its training
data); a different pair given is refused before anything runs (exit status 2), as a
model translates only the direction it was trained on.

Scoring (``score``): the same checks and scores for an existing fairseq-generate
output file. The result (printed, and bleu.json) names the target language, which
sets sacremoses' (de)tokenisation rules, and the exact metrics applied; compound
splitting asked for (or left on auto) with a target language other than German gets
a warning saying why it is not (or is) applied.

Language modelling (``lm``): perplexity through ``fairseq-eval-lm`` (sentence-level
on the 1B Word benchmark: --sample-break-mode eos --tokens-per-sample 512
--context-window 0 --max-tokens 4096 --softmax-batch 1024), checking that every
test token was scored.

Examples:

  python scripts/evaluate.py mt work/wmt14_en_de --path checkpoints/rpr/checkpoint_best.pt
  python scripts/evaluate.py mt work/wmt14_en_de --checkpoint-dir checkpoints/dw \\
      --average-last 5
  python scripts/evaluate.py score generate-test.txt --prep-dir work/wmt14_en_de
  python scripts/evaluate.py lm work/lm1b --path checkpoints/lm/checkpoint_best.pt

DATA is a directory written by scripts/prepare-*.sh (it has prep.json, data-bin/ and
ref/) or a fairseq data-bin directory (then give --ref-dir or the --ref-* files for
the references and the languages). Arguments after ``--`` go to fairseq-generate /
fairseq-eval-lm unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

SCRIPTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPTS_DIR.parent
# average_checkpoints is this file's neighbour: on sys.path when it runs as a script, not
# when it is loaded from its path (the tests do). The checkout's fairseq_distattn comes
# first: the one --user-dir names, also where the package is not installed (or is
# installed from another checkout)
for directory in (SCRIPTS_DIR, REPO_ROOT):
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))

from fairseq_distattn.tools import translation_scoring  # noqa: E402

PROG = "evaluate"
USER_DIR = REPO_ROOT / "fairseq_distattn"


class EvalError(RuntimeError):
    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class UsageError(EvalError):
    """Arguments that cannot be right together: reported as argparse reports a bad
    command line (``evaluate.py mt: error: ...``, exit status 2)."""

    def __init__(self, message: str):
        super().__init__(message, status=2)


def log(message: str) -> None:
    print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


def tool(name: str) -> str:
    """A console script next to this Python (the virtualenv), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    import shutil

    found = shutil.which(name)
    if not found:
        raise EvalError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


# --------------------------------------------------------------------------- data / references


class Setup:
    """Where the binarised data, references and settings of a test set are."""

    def __init__(self, args, data: Optional[str]):
        self.prep: Dict[str, object] = {}
        self.data_bin: Optional[Path] = None
        prep_dir = getattr(args, "prep_dir", None)
        if data is not None:
            data_path = Path(data)
            if (data_path / "prep.json").is_file():
                prep_dir = prep_dir or str(data_path)
                self.data_bin = data_path / "data-bin"
            else:
                self.data_bin = data_path
        if prep_dir:
            prep_file = Path(prep_dir) / "prep.json"
            if not prep_file.is_file():
                raise EvalError(f"{prep_file} not found (not an output directory of scripts/prepare-*.sh)")
            self.prep = json.loads(prep_file.read_text(encoding="utf-8"))
            if self.data_bin is None and self.prep.get("data_bin"):
                self.data_bin = Path(prep_dir) / "data-bin"
        self.src = getattr(args, "source_lang", None) or self.prep.get("source_lang")
        self.tgt = getattr(args, "target_lang", None) or self.prep.get("target_lang")
        self.segmentation = getattr(args, "segmentation", None) or self.prep.get("segmentation") or "subword_nmt"
        ref_dir = getattr(args, "ref_dir", None) or (str(Path(prep_dir) / "ref") if prep_dir else None)
        self.ref_dir = Path(ref_dir) if ref_dir else None
        self.subset = getattr(args, "subset", "test")
        self.args = args

    def languages(self):
        if self.src and self.tgt:
            return self.src, self.tgt
        if self.data_bin is not None:  # from <subset>.<src>-<tgt>.<lang>.idx
            for idx in sorted(self.data_bin.glob(f"{self.subset}.*-*.*.idx")):
                pair = idx.name.split(".")[1]
                src, tgt = pair.split("-", 1)
                return self.src or src, self.tgt or tgt
        raise EvalError("cannot tell the languages: give --source-lang and --target-lang")

    def ref_file(self, explicit: Optional[str], kind: str, lang: str) -> Optional[Path]:
        if explicit:
            path = Path(explicit)
            if not path.is_file():
                raise EvalError(f"reference file {path} not found")
            return path
        if self.ref_dir is not None:
            path = self.ref_dir / f"{self.subset}.{kind}.{lang}"
            if path.is_file():
                return path
        return None


def expected_count(setup: Setup, src: str, tgt: str, src_raw: Optional[Path]) -> Optional[int]:
    """Number of test sentences: the raw source file, else the binarised data."""
    counts = {}
    if src_raw is not None:
        counts[str(src_raw)] = len(translation_scoring.read_text(src_raw))
    if setup.data_bin is not None:
        sizes = translation_scoring.indexed_dataset_sizes(setup.data_bin / f"{setup.subset}.{src}-{tgt}.{src}.idx")
        if sizes is not None:
            counts[str(setup.data_bin / f"{setup.subset}.{src}-{tgt}.{src}.idx")] = len(sizes)
    if len(set(counts.values())) > 1:
        raise EvalError("the test set sizes disagree: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    return next(iter(counts.values()), None)


# --------------------------------------------------------------------------- scoring


def compound_splitting(requested: str, tgt: str):
    """(whether tokenised BLEU is also computed with compound splitting, the warning
    to print or None). The splitting is the WMT14 En-De (German) convention:
    ``--compound-split auto`` applies it to German targets only."""
    if tgt == "de" or requested == "no":
        return requested != "no", None
    if requested == "yes":
        return True, (
            f"compound splitting applied to target language {tgt} as --compound-split yes asks, but it is "
            "the WMT14 En-De convention for German compounds: this score is not comparable to published "
            f"{tgt} scores"
        )
    return False, (
        f"compound splitting (--compound-split auto) not applied: the target language is {tgt}, and the "
        "splitting of hyphenated compounds is the WMT14 En-De convention for German only (is --target-lang "
        "right? --compound-split yes applies it anyway, --compound-split no silences this)"
    )


def warn_of_other_languages(setup: Setup, args, tgt: str) -> None:
    """One warning line when prep.json or the name of a reference file given
    (``newstest2014.de``) says another target language than the one scored."""
    hints = []
    prep_tgt = setup.prep.get("target_lang")
    if prep_tgt and prep_tgt != tgt:
        hints.append(f"prep.json's is {prep_tgt}")
    for flag in ("ref_raw", "ref_tok"):
        value = getattr(args, flag, None)
        suffix = Path(value).suffix[1:] if value else ""
        if re.fullmatch(r"[a-z]{2}", suffix) and suffix != tgt:
            hints.append(f"--{flag.replace('_', '-')} {value} ends in .{suffix}")
    if hints:
        log(f"warning: the target language is {tgt}, but " + "; ".join(hints) + " (is --target-lang right?)")


def translated_test_set(generate_file: Path, setup: Setup, src: str, tgt: str, src_raw: Optional[Path]):
    """(the fairseq-generate output, the number of test sentences), once every sentence
    has a hypothesis: a missing one would silently lower BLEU."""
    output = translation_scoring.parse_generate_output(translation_scoring.read_text(generate_file))
    n = expected_count(setup, src, tgt, src_raw)
    if n is None:
        n = len(output.sources)
        log(
            f"warning: no raw source file or binarised data to count the {setup.subset} sentences; "
            f"checking against the {n} S- lines of the output"
        )
    translation_scoring.check_complete(output.hyps.keys(), n, setup.subset)
    return output, n


def hypotheses_both_ways(hyps: List[str], segmentation: str, tgt: str) -> Tuple[List[str], List[str]]:
    """(Moses-tokenised, detokenised) hypotheses: with ``--remove-bpe`` a subword-nmt
    model writes Moses-tokenised text, a sentencepiece model raw text."""
    if segmentation == "sentencepiece":
        return translation_scoring.moses_tokenize(hyps, tgt), hyps
    return hyps, translation_scoring.moses_detokenize(hyps, tgt)


def references_both_ways(
    output: translation_scoring.GenerateOutput,
    n: int,
    setup: Setup,
    tgt: str,
    ref_tok: Optional[Path],
    ref_raw: Optional[Path],
):
    """(Moses-tokenised references, raw references, notes): the reference files, else
    the T- lines of the output (fairseq's binarised, so tokenised, target) brought to
    the form needed, with a note saying so, as such scores are not the published ones."""
    notes = []
    if ref_tok is not None:
        refs_tok = translation_scoring.read_text(ref_tok)
    else:
        translation_scoring.check_complete(output.targets.keys(), n, setup.subset)
        refs_tok = [output.targets[i] for i in range(n)]
        if setup.segmentation == "sentencepiece":
            refs_tok = translation_scoring.moses_tokenize(refs_tok, tgt)
        notes.append("tokenised references taken from the T- lines of the fairseq-generate output")
    if ref_raw is not None:
        refs_raw = translation_scoring.read_text(ref_raw)
    else:
        refs_raw = [output.targets.get(i, "") for i in range(n)]
        if setup.segmentation != "sentencepiece":
            refs_raw = translation_scoring.moses_detokenize(refs_raw, tgt)
        notes.append(
            "no raw references: sacreBLEU is computed against detokenised T- lines "
            "(not comparable to published sacreBLEU scores)"
        )
    for name, refs in (("tokenised", refs_tok), ("raw", refs_raw)):
        if len(refs) != n:
            raise EvalError(f"{len(refs)} {name} references for {n} {setup.subset} sentences")
    return refs_tok, refs_raw, notes


# a NamedTuple, not a dataclass: the tests load this file without registering it in
# sys.modules, which a dataclass with string annotations needs
class BleuScores(NamedTuple):
    """The scores of a test set (sacrebleu BLEUScores) and the metric each one is."""

    tokenized: object
    tokenized_compound_split: Optional[object]  # None where compound splitting is not applied
    sacrebleu: object
    sacrebleu_signature: str
    tokenized_metric: str  # how tokenised BLEU is computed, with sacreBLEU's signature of it

    def metrics(self) -> Dict[str, Optional[str]]:
        """What each score of bleu.json is (None for a score not computed)."""
        return {
            "tokenized_bleu_compound_split": (
                "tokenised BLEU with compound splitting (a-b -> a ##AT##-##AT## b, t2t get_ende_bleu.sh), "
                f"{self.tokenized_metric}"
                if self.tokenized_compound_split is not None
                else None
            ),
            "tokenized_bleu": f"tokenised BLEU without compound splitting, {self.tokenized_metric}",
            "sacrebleu": self.sacrebleu_signature,
        }


def bleu_scores(hyp_tok, hyp_detok, refs_tok, refs_raw, compound: bool) -> BleuScores:
    tokenized = translation_scoring.tokenized_bleu(hyp_tok, refs_tok, compound_split=False)
    compound_split = translation_scoring.tokenized_bleu(hyp_tok, refs_tok, compound_split=True) if compound else None
    sacrebleu, sacrebleu_signature = translation_scoring.detok_bleu(hyp_detok, refs_raw)
    signature = translation_scoring.tokenized_bleu_signature()
    return BleuScores(
        tokenized=tokenized,
        tokenized_compound_split=compound_split,
        sacrebleu=sacrebleu,
        sacrebleu_signature=sacrebleu_signature,
        tokenized_metric=f"multi-bleu.perl style on the Moses-tokenised text: sacreBLEU {signature}",
    )


def moses_description(segmentation: str, tgt: str, ref_tok: Optional[Path], ref_raw: Optional[Path]) -> str:
    """What sacremoses did to which text, and with which language's rules: the
    language changes the (de)tokenisation, so a wrong target language changes BLEU."""
    moses_uses = []
    if segmentation == "sentencepiece":
        moses_uses.append("Moses-tokenised the hypotheses for tokenised BLEU")
    else:
        moses_uses.append("detokenised the hypotheses for sacreBLEU")
    if ref_tok is None and segmentation == "sentencepiece":
        moses_uses.append("tokenised the T- references")
    if ref_raw is None and segmentation != "sentencepiece":
        moses_uses.append("detokenised the T- references")
    return (
        f"sacremoses lang={tgt} {' and '.join(moses_uses)}; the language picks Moses' nonbreaking "
        "prefixes and its apostrophe and punctuation rules"
    )


def write_scored_texts(out_dir: Path, tgt: str, hyp_tok, hyp_detok, refs_tok, compound: bool) -> None:
    """The texts the scores were computed on, to check a score by hand."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def dump(name: str, lines: Sequence[str]) -> None:
        (out_dir / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    dump(f"hyp.tok.{tgt}", hyp_tok)
    dump(f"hyp.detok.{tgt}", hyp_detok)
    if compound:
        dump(f"hyp.tok.compound.{tgt}", [translation_scoring.split_compounds(h) for h in hyp_tok])
        dump(f"ref.tok.compound.{tgt}", [translation_scoring.split_compounds(r) for r in refs_tok])


def print_scores(result: Dict[str, object], scores: BleuScores, out_dir: Path) -> None:
    n, target, signature = result["sentences"], result["target_lang"], scores.sacrebleu_signature
    name = result["test_set"] or result["subset"]
    print(f"{PROG}: scored {n}/{n} sentences of {name} ({result['pair']}); outputs in {out_dir}")
    print(f"target language: {target} ({result['moses']})")
    tokenised = (
        "tokenised BLEU with compound splitting (the papers' En-De metric) and without"
        if scores.tokenized_compound_split is not None
        else "tokenised BLEU without compound splitting"
    )
    print(f"metrics: {tokenised} ({scores.tokenized_metric}); detokenised sacreBLEU {signature}")
    if scores.tokenized_compound_split is not None:
        compound = translation_scoring.format_bleu(scores.tokenized_compound_split)
        print(f"tokenized BLEU, compound splitting (papers' En-De metric) = {compound}")
    print(f"tokenized BLEU = {translation_scoring.format_bleu(scores.tokenized)}")
    print(f"sacreBLEU (detokenized) = {scores.sacrebleu.score:.2f}  signature: {signature}")
    for note in result["notes"]:
        print(f"note: {note}")


def score_generate_output(generate_file: Path, setup: Setup, args, out_dir: Path) -> Dict[str, object]:
    """Score a fairseq-generate output: writes the texts scored and bleu.json into
    ``out_dir``, prints the scores; returns bleu.json's contents."""
    src, tgt = setup.languages()
    src_raw = setup.ref_file(getattr(args, "src_raw", None), "raw", src)
    ref_raw = setup.ref_file(getattr(args, "ref_raw", None), "raw", tgt)
    ref_tok = setup.ref_file(getattr(args, "ref_tok", None), "tok", tgt)

    output, n = translated_test_set(generate_file, setup, src, tgt, src_raw)
    hyp_tok, hyp_detok = hypotheses_both_ways([output.hyps[i] for i in range(n)], setup.segmentation, tgt)
    refs_tok, refs_raw, notes = references_both_ways(output, n, setup, tgt, ref_tok, ref_raw)

    warn_of_other_languages(setup, args, tgt)
    compound, compound_reason = compound_splitting(args.compound_split, tgt)
    if compound_reason is not None:
        log(f"warning: {compound_reason}")
    scores = bleu_scores(hyp_tok, hyp_detok, refs_tok, refs_raw, compound)
    write_scored_texts(out_dir, tgt, hyp_tok, hyp_detok, refs_tok, compound)

    result = {
        "subset": setup.subset,
        "test_set": setup.prep.get("test_set") if setup.subset == "test" else setup.prep.get("valid_set"),
        "pair": f"{src}-{tgt}",
        "source_lang": src,
        "target_lang": tgt,
        "moses": moses_description(setup.segmentation, tgt, ref_tok, ref_raw),
        "compound_split": {
            "requested": args.compound_split,
            "applied": compound,
            "reason": compound_reason,
        },
        "metrics": scores.metrics(),
        "sentences": n,
        "hypotheses": len(output.hyps),
        "tokenized_bleu_compound_split": (
            round(scores.tokenized_compound_split.score, 2) if scores.tokenized_compound_split else None
        ),
        "tokenized_bleu": round(scores.tokenized.score, 2),
        "sacrebleu": round(scores.sacrebleu.score, 2),
        "sacrebleu_signature": scores.sacrebleu_signature,
        "generate_output": str(generate_file),
        "notes": notes,
    }
    (out_dir / "bleu.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print_scores(result, scores, out_dir)
    return result


# --------------------------------------------------------------------------- checkpoints


def load_checkpoint_state(path: Path):
    """A checkpoint's contents, loaded as fairseq_distattn.check loads them (weights-only,
    with the plugin's allow-list of fairseq's config classes; tensors memory-mapped)."""
    from fairseq_distattn.patches.checkpoint_loading import read_checkpoint
    from fairseq_distattn.tools.check import failure_reason

    if not path.is_file():
        raise EvalError(f"checkpoint {path} not found")
    try:
        return read_checkpoint(path)
    except Exception as error:  # any reason a checkpoint cannot be read is reported the same way
        raise EvalError(f"cannot read checkpoint {path}: {failure_reason(error)}")


def config_value(config, name: str):
    """``config[name]`` of an omegaconf node or dict (``cfg['task']``), or the
    attribute of an ``argparse.Namespace`` (legacy ``args``); None when absent."""
    if isinstance(config, argparse.Namespace):
        return getattr(config, name, None)
    try:
        return config.get(name)
    except Exception:  # an omegaconf node in struct mode without that key
        return None


def checkpoint_pair(path: Path) -> Optional[Tuple[str, str, str]]:
    """``(source, target, how)`` of the language pair a translation checkpoint was
    trained on, ``how`` completing "checkpoint PATH ...": the languages its task
    records (``cfg['task']``, or the legacy ``args``), else the pair fairseq
    inferred from its training data directory when it did not record them (fairseq's
    own inference, on that directory if it is still there); None when unknown."""
    state = load_checkpoint_state(Path(path))
    cfg = state.get("cfg")
    task = config_value(cfg, "task") if cfg is not None else None
    if task is None:
        task = state.get("args")
    if task is None:
        raise EvalError(f"cannot read checkpoint {path}: it holds no fairseq task configuration (no 'cfg' or 'args')")
    src, tgt = config_value(task, "source_lang"), config_value(task, "target_lang")
    if src and tgt:
        return src, tgt, f"was trained {src}->{tgt}"
    # fairseq's translation task, given no languages, takes them from the first
    # <split>.<src>-<tgt>.* file name in the first data directory
    data = config_value(task, "data")
    first = str(data).split(os.pathsep)[0] if data else None
    if not first or not Path(first).is_dir():
        return None
    from fairseq.data.data_utils import infer_language_pair

    src, tgt = infer_language_pair(first)
    if not (src and tgt):
        return None
    return src, tgt, f"records no languages; fairseq inferred {src}->{tgt} from its training data {first}"


def check_model_arguments(args, setup: Setup) -> None:
    if setup.data_bin is None or not setup.data_bin.is_dir():
        raise EvalError(f"no data-bin directory at {setup.data_bin}")
    if not args.path and not args.checkpoint_dir:
        raise EvalError("give --path CHECKPOINT or --checkpoint-dir DIR (with --average-last N)")
    if args.checkpoint_dir and not args.average_last:
        raise EvalError("--checkpoint-dir needs --average-last N (or use --path)")


def model_checkpoints(args, setup: Setup) -> List[Path]:
    """The checkpoint files of the model: the ``--path`` ensemble members, or the
    checkpoints ``--checkpoint-dir`` and ``--average-last`` average."""
    check_model_arguments(args, setup)
    if args.checkpoint_dir:
        import average_checkpoints  # scripts/average_checkpoints.py

        return average_checkpoints.last_checkpoints(Path(args.checkpoint_dir), args.average_last, by=args.average_by)
    return [Path(p) for p in args.path.split(":")]


def mt_languages(args, setup: Setup, checkpoints: Sequence[Path]) -> Tuple[str, str]:
    """The pair to translate: the one the checkpoints were trained on (a different
    ``--source-lang``/``--target-lang`` is refused before anything runs), else the
    languages given, or prep.json's, or the data-bin file names'."""
    given = " ".join(
        f"{flag} {value}"
        for flag, value in (("--source-lang", args.source_lang), ("--target-lang", args.target_lang))
        if value
    )
    trained = None
    for path in checkpoints:
        pair = checkpoint_pair(path)
        if pair is None:
            log(
                f"note: checkpoint {path} records no languages, and its training data is not here to tell "
                "them: the language pair is not checked against the model"
            )
            continue
        src, tgt, how = pair
        if (args.source_lang or src, args.target_lang or tgt) != (src, tgt):
            raise UsageError(f"checkpoint {path} {how}, but {given} was given")
        if trained is not None and trained[:2] != (src, tgt):
            raise UsageError(f"checkpoint {trained[2]} {trained[3]}, but checkpoint {path} {how}")
        trained = (src, tgt, path, how)
    if trained is not None:
        src, tgt, path, how = trained
        if not (args.source_lang and args.target_lang):
            prep = (setup.prep.get("source_lang"), setup.prep.get("target_lang"))
            also = f" (prep.json: {prep[0]}-{prep[1]})" if setup.prep and prep != (src, tgt) else ""
            log(f"translating {src}->{tgt}: checkpoint {path} {how}{also}")
        setup.src, setup.tgt = src, tgt
    return setup.languages()


# --------------------------------------------------------------------------- commands


def split_passthrough(argv: Sequence[str]):
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def run_logged(cmd: List[str], stdout_path: Path, log_path: Path, what: str) -> None:
    log(f"running {what}: {' '.join(cmd)}")
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # checkpoints load with weights_only=True
    with open(stdout_path, "w", encoding="utf-8") as out, open(log_path, "w", encoding="utf-8") as err:
        proc = subprocess.run(cmd, stdout=out, stderr=err, env=env)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        tail = [line if len(line) <= 300 else line[:300] + " ..." for line in tail]
        raise EvalError(f"{what} failed with exit status {proc.returncode} (log: {log_path}):\n" + "\n".join(tail))


def averaged_checkpoint(args, out_dir: Path) -> str:
    import average_checkpoints  # scripts/average_checkpoints.py

    ckpt_dir = Path(args.checkpoint_dir)
    inputs = average_checkpoints.last_checkpoints(ckpt_dir, args.average_last, by=args.average_by)
    output = out_dir / f"averaged_last{args.average_last}_{args.average_by}s.pt"
    log(f"averaging {len(inputs)} checkpoints: {', '.join(p.name for p in inputs)}")
    average_checkpoints.write_average(inputs, output)
    return str(output)


def checkpoint_and_output_dir(args, setup: Setup, out_name: str):
    """(checkpoint path for fairseq, output directory): ``--path``, or the average
    of the last ``--average-last`` checkpoints of ``--checkpoint-dir``; outputs go
    to ``--output-dir`` or ``OUT_NAME-SUBSET`` beside the checkpoints."""
    check_model_arguments(args, setup)
    out_dir = (
        Path(args.output_dir)
        if args.output_dir
        else (Path(args.checkpoint_dir or Path(args.path.split(":")[0]).parent) / f"{out_name}-{setup.subset}")
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.checkpoint_dir:
        return args.path, out_dir
    return averaged_checkpoint(args, out_dir), out_dir


def cmd_mt(args, passthrough: List[str]) -> int:
    setup = Setup(args, args.data)
    # before anything runs: a model translates only the pair it was trained on
    src, tgt = mt_languages(args, setup, model_checkpoints(args, setup))
    path, out_dir = checkpoint_and_output_dir(args, setup, "evaluate")

    remove_bpe = "sentencepiece" if setup.segmentation == "sentencepiece" else "subword_nmt"
    cmd = [
        tool("fairseq-generate"),
        str(setup.data_bin),
        "--user-dir",
        str(USER_DIR),
        "--task",
        "translation",
        "--source-lang",
        src,
        "--target-lang",
        tgt,
        "--path",
        path,
        "--gen-subset",
        setup.subset,
        "--beam",
        str(args.beam),
        "--lenpen",
        str(args.lenpen),
        "--remove-bpe",
        remove_bpe,
    ]
    cmd += ["--batch-size", str(args.batch_size)] if args.batch_size else ["--max-tokens", str(args.max_tokens)]
    if args.cpu:
        cmd.append("--cpu")
    cmd += passthrough
    # last, so that it wins over anything passed through: never drop the last batch
    cmd += ["--required-batch-size-multiple", "1"]
    generate_file = out_dir / f"generate-{setup.subset}.txt"
    run_logged(cmd, generate_file, out_dir / f"generate-{setup.subset}.log", "fairseq-generate")
    result = score_generate_output(generate_file, setup, args, out_dir)
    result["checkpoint"] = path
    (out_dir / "bleu.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


def cmd_score(args, passthrough: List[str]) -> int:
    if passthrough:
        raise EvalError("score takes no arguments after --")
    setup = Setup(args, args.data)
    generate_file = Path(args.generate_output)
    if not generate_file.is_file():
        raise EvalError(f"{generate_file} not found")
    # beside the scored file by default (not the current directory), and said as an absolute path
    out_dir = Path(args.output_dir) if args.output_dir else generate_file.resolve().parent
    score_generate_output(generate_file, setup, args, out_dir.resolve())
    return 0


def cmd_lm(args, passthrough: List[str]) -> int:
    setup = Setup(args, args.data)
    path, out_dir = checkpoint_and_output_dir(args, setup, "evaluate-lm")
    cmd = [
        tool("fairseq-eval-lm"),
        str(setup.data_bin),
        "--user-dir",
        str(USER_DIR),
        "--task",
        "language_modeling",
        "--path",
        path,
        "--gen-subset",
        setup.subset,
        "--sample-break-mode",
        args.sample_break_mode,
        "--tokens-per-sample",
        str(args.tokens_per_sample),
        "--context-window",
        str(args.context_window),
        "--max-tokens",
        str(args.max_tokens),
        "--softmax-batch",
        str(args.softmax_batch),
    ]
    if args.cpu:
        cmd.append("--cpu")
    cmd += passthrough
    log_file = out_dir / f"eval-lm-{setup.subset}.log"
    run_logged(cmd, out_dir / f"eval-lm-{setup.subset}.out", log_file, "fairseq-eval-lm")
    text = log_file.read_text(encoding="utf-8", errors="replace") + (out_dir / f"eval-lm-{setup.subset}.out").read_text(
        encoding="utf-8", errors="replace"
    )
    m_count = re.search(r"Evaluated ([\d,]+) tokens", text)
    m_ppl = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+|inf|nan)", text)
    if not m_count or not m_ppl:
        raise EvalError(f"could not find the perplexity in the fairseq-eval-lm log {log_file}")
    count = int(m_count.group(1).replace(",", ""))
    sizes = translation_scoring.indexed_dataset_sizes(setup.data_bin / f"{setup.subset}.idx")
    expected = sum(sizes) if sizes is not None else None
    if expected is not None and count != expected:
        raise EvalError(
            f"fairseq-eval-lm scored {count:,} tokens but the {setup.subset} set has "
            f"{expected:,} (with </s>): sentences were skipped or truncated (too long for "
            "--tokens-per-sample / the model's positions?)",
            status=3,
        )
    result = {
        "subset": setup.subset,
        "tokens": count,
        "loss_base2": float(m_ppl.group(1)),
        "perplexity": float(m_ppl.group(2)),
        "checkpoint": path,
        "settings": {
            "sample_break_mode": args.sample_break_mode,
            "tokens_per_sample": args.tokens_per_sample,
            "context_window": args.context_window,
            "max_tokens": args.max_tokens,
            "softmax_batch": args.softmax_batch,
            "extra": passthrough,
        },
    }
    (out_dir / "perplexity.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{PROG}: scored all {count:,} tokens of {setup.subset}; outputs in {out_dir}")
    print(f"perplexity = {result['perplexity']:.2f} (loss {result['loss_base2']:.4f} bits/token)")
    return 0


def add_reference_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("test set and references")
    g.add_argument("--prep-dir", help="output directory of scripts/prepare-*.sh (prep.json, ref/)")
    g.add_argument("--subset", default="test", help="test (default) or valid")
    g.add_argument(
        "--source-lang",
        help="default: mt: the checkpoint's; else from prep.json or the data-bin file names "
        "(mt refuses a pair the checkpoint was not trained on)",
    )
    g.add_argument("--target-lang")
    g.add_argument("--ref-dir", help="directory with SUBSET.raw.LANG and SUBSET.tok.TGT")
    g.add_argument("--src-raw", help="raw source file (counts the test sentences)")
    g.add_argument("--ref-raw", help="raw reference file for sacreBLEU")
    g.add_argument("--ref-tok", help="Moses-tokenised reference file for tokenised BLEU")
    g.add_argument(
        "--segmentation",
        choices=["subword_nmt", "sentencepiece"],
        help="subword model of the data (default: from prep.json, else subword_nmt)",
    )
    g.add_argument(
        "--compound-split",
        choices=["auto", "yes", "no"],
        default="auto",
        help="compound splitting for tokenised BLEU (auto: for German targets)",
    )
    p.add_argument(
        "--output-dir",
        help="where to write hypotheses and scores (default: mt: evaluate-SUBSET "
        "beside the checkpoint; score: the directory of GENERATE_OUTPUT)",
    )


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--path", help="checkpoint (colon-separated for an ensemble)")
    g.add_argument("--checkpoint-dir", help="average checkpoints of this directory (with --average-last)")
    g.add_argument("--average-last", type=int, help="average the last N checkpoints of --checkpoint-dir")
    g.add_argument(
        "--average-by",
        choices=["epoch", "update"],
        default="epoch",
        help="checkpointN.pt (epoch, default) or checkpoint_E_U.pt (update) files",
    )
    g.add_argument("--cpu", action="store_true", help="run on CPU")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evaluate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("mt", help="translate a test set and report BLEU")
    p.add_argument("data", help="prepare-*.sh output directory or fairseq data-bin directory")
    add_checkpoint_args(p)
    g = p.add_argument_group("decoding (Shaw et al. 2018 / Vaswani et al. 2017)")
    g.add_argument("--beam", type=int, default=4)
    g.add_argument("--lenpen", type=float, default=0.6)
    g.add_argument("--max-tokens", type=int, default=4096)
    g.add_argument("--batch-size", type=int, help="sentences per batch (instead of --max-tokens)")
    add_reference_args(p)
    p.set_defaults(func=cmd_mt)

    p = sub.add_parser("score", help="score an existing fairseq-generate output")
    p.add_argument("generate_output", help="fairseq-generate stdout (S-/T-/H- lines)")
    p.add_argument("--data", help="prepare-*.sh output directory or data-bin (to count the test set)")
    add_reference_args(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("lm", help="language-model perplexity (fairseq-eval-lm)")
    p.add_argument("data", help="prepare-lm1b.sh output directory or fairseq data-bin directory")
    add_checkpoint_args(p)
    g = p.add_argument_group("fairseq-eval-lm settings (sentence-level, 1B Word benchmark)")
    g.add_argument("--subset", default="test")
    g.add_argument(
        "--sample-break-mode",
        default="eos",
        help="eos: each sentence scored on its own (default; the benchmark's sentences are shuffled)",
    )
    g.add_argument("--tokens-per-sample", type=int, default=512)
    g.add_argument("--context-window", type=int, default=0)
    g.add_argument("--max-tokens", type=int, default=4096)
    g.add_argument("--softmax-batch", type=int, default=1024)
    p.add_argument("--prep-dir", help=argparse.SUPPRESS)
    p.add_argument("--output-dir", help="where to write the log and perplexity.json")
    p.set_defaults(func=cmd_lm)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, passthrough = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    try:
        return args.func(args, passthrough)
    except translation_scoring.IncompleteOutput as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 3
    except UsageError as error:
        print(f"evaluate.py {args.command}: error: {error}", file=sys.stderr)
        return error.status
    except EvalError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.status


if __name__ == "__main__":
    sys.exit(main())
