"""Scoring translations as the papers do: BLEU, and what it needs around it (reading a
fairseq-generate output and checking it translated every test sentence, the test
set's size from the binarised data, Moses (de)tokenisation). ``scripts/evaluate.py``
scores with it, and so do the benchmarks and the tests
(``from fairseq_distattn.tools import translation_scoring``). sacreBLEU and sacremoses
are imported only by the functions that use them.

Two scores are computed for a translation test set:

* tokenised BLEU, multi-bleu.perl style: BLEU over whitespace tokens of the Moses-
  tokenised hypothesis and reference (sacreBLEU with ``tokenize='none'``, no
  smoothing), optionally after the compound splitting of tensor2tensor's
  ``get_ende_bleu.sh`` and fairseq's ``compound_split_bleu.sh`` (every ``a-b`` becomes
  ``a ##AT##-##AT## b`` in both hypothesis and reference). With splitting this is the
  number the WMT14 En-De papers report (Vaswani et al. 2017, Shaw et al. 2018, Ott et
  al. 2018, Nguyen et al. 2020);
* detokenised sacreBLEU against the raw (SGML-stripped) references, with its signature.

Two systems' translations of one test set are compared with sacreBLEU's paired bootstrap
(:func:`paired_bootstrap`, ``sacrebleu --paired-bs`` with its default resamples and seed).
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence

COMPOUND_RE = re.compile(r"(\S)-(\S)")


class IncompleteOutput(RuntimeError):
    """fairseq-generate did not translate every test sentence."""


def split_compounds(line: str) -> str:
    """perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, left to right,
    exactly as Perl's s///g)."""
    return COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], compound_split: bool = False):
    """multi-bleu.perl-style BLEU on already tokenised text (a sacrebleu BLEUScore)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if compound_split:
        hyps = [split_compounds(h) for h in hyps]
        refs = [split_compounds(r) for r in refs]
    return _tokenized_bleu_metric().corpus_score(list(hyps), [list(refs)])


# multi-bleu.perl smooths nothing: a hypothesis set with no matching 4-gram scores 0
TOKENIZED_SMOOTHING = "none"


def _tokenized_bleu_metric():
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize="none", smooth_method=TOKENIZED_SMOOTHING, force=True)


def tokenized_bleu_from_statistics(correct: Sequence[int], total: Sequence[int], hyp_len: int, ref_len: int):
    """:func:`tokenized_bleu` from its sufficient statistics (n-gram matches and counts,
    lengths), e.g. summed over several scorings to pool them: a sacrebleu BLEUScore."""
    from sacrebleu.metrics import BLEU

    return BLEU.compute_bleu(list(correct), list(total), hyp_len, ref_len, smooth_method=TOKENIZED_SMOOTHING)


def tokenized_bleu_signature() -> str:
    """sacreBLEU's signature of :func:`tokenized_bleu` (``...|tok:none|smooth:none|...``),
    single reference."""
    metric = _tokenized_bleu_metric()
    metric.corpus_score(["a"], [["a"]])  # the signature counts the references of a scoring
    return str(metric.get_signature())


def detok_bleu(hyps: Sequence[str], refs: Sequence[str]):
    """sacreBLEU with its default settings; returns (BLEUScore, signature string)."""
    from sacrebleu.metrics import BLEU

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    metric = BLEU()
    score = metric.corpus_score(list(hyps), [list(refs)])
    return score, str(metric.get_signature())


@dataclass
class GenerateOutput:
    """The S/T/H lines of a fairseq-generate output, by sentence id (first H of each)."""

    hyps: Dict[int, str] = field(default_factory=dict)
    sources: Dict[int, str] = field(default_factory=dict)
    targets: Dict[int, str] = field(default_factory=dict)


def parse_generate_output(lines: Iterable[str]) -> GenerateOutput:
    out = GenerateOutput()
    for line in lines:
        line = line.rstrip("\n")
        if len(line) < 3 or line[1] != "-" or line[0] not in "STH":
            continue
        head, _, rest = line.partition("\t")
        try:
            sid = int(head[2:])
        except ValueError:
            continue
        if line[0] == "H":
            # H-<id>\t<score>\t<text>; an empty hypothesis has an empty text field
            _score, _, text = rest.partition("\t")
            out.hyps.setdefault(sid, text)
        elif line[0] == "S":
            out.sources.setdefault(sid, rest)
        else:
            out.targets.setdefault(sid, rest)
    return out


def check_complete(ids: Iterable[int], expected: int, what: str = "test") -> None:
    """Raise IncompleteOutput unless ``ids`` are exactly 0..expected-1."""
    ids = set(ids)
    missing = sorted(set(range(expected)) - ids)
    extra = sorted(i for i in ids if i < 0 or i >= expected)
    if missing or extra:
        parts = [f"fairseq-generate produced {len(ids)} hypotheses for the {expected} {what} sentences"]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            parts.append(f"missing {len(missing)} sentence id(s): {shown}")
        if extra:
            parts.append(f"unexpected id(s): {', '.join(map(str, extra[:10]))}")
        parts.append(
            "(a dropped batch? run fairseq-generate with --required-batch-size-multiple 1; "
            "sentences longer than --max-source-positions are skipped with "
            "--skip-invalid-size-inputs-valid-test)"
        )
        raise IncompleteOutput("; ".join(parts))


MMAP_MAGIC = b"MMIDIDX\x00\x00"


def indexed_dataset_sizes(idx_path: Path) -> Optional[List[int]]:
    """Sentence lengths (tokens, with </s>) from a fairseq mmap ``.idx`` file, or None if
    the file is another format. Reads the header directly (no fairseq import)."""
    idx_path = Path(idx_path)
    if not idx_path.is_file():
        return None
    with open(idx_path, "rb") as f:
        header = f.read(9 + 8 + 1 + 8)
        if len(header) < 26 or header[:9] != MMAP_MAGIC:
            return None
        (length,) = struct.unpack("<Q", header[18:26])
        data = f.read(4 * length)
    if len(data) != 4 * length:
        return None
    return list(struct.unpack(f"<{length}i", data))


def read_text(path: Path) -> List[str]:
    """Lines of a UTF-8 text file split on "\\n" only, without the newline."""
    data = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def moses_detokenize(lines: Sequence[str], lang: str) -> List[str]:
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def moses_tokenize(lines: Sequence[str], lang: str) -> List[str]:
    """The tokenisation of scripts/prepare-wmt14*.sh (tokenizer.perl -a, escaping on)."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, aggressive_dash_splits=True, escape=True, return_str=True) for line in lines]


def format_bleu(score) -> str:
    """'27.31 (58.9/33.0/20.7/13.5, BP=1.000, ratio=1.010, hyp_len=.., ref_len=..)'"""
    precisions = "/".join(f"{p:.1f}" for p in score.precisions)
    return (
        f"{score.score:.2f} ({precisions}, BP={score.bp:.3f}, ratio={score.sys_len / max(score.ref_len, 1):.3f}, "
        f"hyp_len={score.sys_len}, ref_len={score.ref_len})"
    )


# sacreBLEU's --paired-bs: its default resamples, and its default seed (SACREBLEU_SEED)
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345


class PairedBootstrap(NamedTuple):
    """sacreBLEU's paired bootstrap of a system against a baseline on one test set."""

    score: float  # the system's sacreBLEU (detokenised, default settings: :func:`detok_bleu`)
    baseline_score: float
    p_value: float  # of "the two score the same", from the resampled test sets
    mean: float  # the system's mean and 95% CI half-width over the resampled test sets
    ci: float
    signature: str


def paired_bootstrap(
    hyps: Sequence[str],
    baseline_hyps: Sequence[str],
    refs: Sequence[str],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> PairedBootstrap:
    """``sacrebleu --paired-bs`` of detokenised ``hyps`` against ``baseline_hyps`` on ``refs``
    (one reference each): both systems scored on the same ``samples`` test sets drawn with
    replacement from this one, with a fixed ``seed``. It measures test-set sampling (would
    another test set drawn like this one rank the two the same?), not training randomness."""
    import os

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    for name, lines in (("hypotheses", hyps), ("baseline hypotheses", baseline_hyps)):
        if len(lines) != len(refs):
            raise ValueError(f"{len(lines)} {name} but {len(refs)} references")
    saved = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)  # PairedTest reads its seed from there
    sacrebleu_log = logging.getLogger("sacrebleu")
    level = sacrebleu_log.level
    # its INFO lines narrate each test; under fairseq's root logger they filled every methods --report
    sacrebleu_log.setLevel(logging.WARNING)
    try:
        test = PairedTest(
            [("baseline", list(baseline_hyps)), ("system", list(hyps))],
            {"BLEU": BLEU()},
            [list(refs)],
            test_type="bs",
            n_samples=samples,
        )
        signatures, scores = test()
    finally:
        sacrebleu_log.setLevel(level)
        if saved is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = saved
    baseline, system = scores["BLEU"]
    return PairedBootstrap(
        system.score, baseline.score, system.p_value, system.mean, system.ci, str(signatures["BLEU"])
    )
