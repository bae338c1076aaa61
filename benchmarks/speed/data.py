"""Real-text batches for the benchmarks, built in-process.

Text comes from ``../shared/data`` next to the repository (developer machines
and CI) or from the Multi30k sample shipped in ``data/multi30k``. Lines are
Moses-tokenised (sacremoses, a dependency of the plugin), a real fairseq
:class:`~fairseq.data.Dictionary` is built from them (joint for translation,
like ``fairseq-preprocess --joined-dictionary``) and batches are made by
fairseq's own :class:`~fairseq.data.LanguagePairDataset` (``batch_by_size`` +
``collater``), so vanilla fairseq and every mechanism see the very same
tensors.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..common import REPO_ROOT, shown

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SHIPPED_MULTI30K = REPO_ROOT / "data" / "multi30k"
WMT_NEWS = "wmt-newstest2008-2012-en-de"
WMT_NEWS_SETS = ("news-test2008", "newstest2009", "newstest2010", "newstest2011", "newstest2012")
MT_SOURCES = ("auto", "wmt-news", "multi30k")
LM_SOURCES = ("auto", "lm1b", "wikitext", "multi30k")


# --------------------------------------------------------------------------- text files


def read_lines(path: Path, limit: Optional[int] = None) -> List[str]:
    """Lines of a text file (``.gz`` decompressed), without line ends."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    out: List[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            out.append(line.rstrip("\n"))
    return out


def _text_file(directory: Path, name: str) -> Optional[Path]:
    for candidate in (directory / name, directory / (name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def multi30k_dir(data_root: Optional[Path] = None) -> Path:
    shared = Path(data_root) if data_root else SHARED_DATA
    for directory in (shared / "multi30k", SHIPPED_MULTI30K):
        if _text_file(directory, "train.en") and _text_file(directory, "train.de"):
            return directory
    raise FileNotFoundError(f"no Multi30k text: looked in {shared / 'multi30k'} and {SHIPPED_MULTI30K}")


def parallel_text(source: str = "auto", data_root: Optional[Path] = None) -> Tuple[str, List[Path], List[Path]]:
    """``(description, en files, de files)`` of real En-De parallel text.

    ``auto`` prefers the WMT news test sets 2008-2012 (news, about 23 words a
    sentence, like WMT training data) and falls back to Multi30k captions.
    """
    if source not in MT_SOURCES:
        raise ValueError(f"unknown translation data {source!r}; one of {MT_SOURCES}")
    shared = Path(data_root) if data_root else SHARED_DATA
    news = shared / WMT_NEWS
    if source in ("auto", "wmt-news"):
        en = [_text_file(news, f"{name}.en") for name in WMT_NEWS_SETS]
        de = [_text_file(news, f"{name}.de") for name in WMT_NEWS_SETS]
        if all(en) and all(de):
            return f"WMT news test sets 2008-2012 En-De ({shown(news)})", en, de
        if source == "wmt-news":
            raise FileNotFoundError(f"WMT news En-De text not found in {news}")
    directory = multi30k_dir(data_root)
    return (
        f"Multi30k train En-De ({shown(directory)})",
        [_text_file(directory, "train.en")],
        [_text_file(directory, "train.de")],
    )


def monolingual_text(source: str = "auto", data_root: Optional[Path] = None) -> Tuple[str, Path, bool]:
    """``(description, file, needs_tokenising)`` of real English LM text."""
    if source not in LM_SOURCES:
        raise ValueError(f"unknown LM data {source!r}; one of {LM_SOURCES}")
    shared = Path(data_root) if data_root else SHARED_DATA
    candidates = {
        "lm1b": (shared / "lm1b-sample-allennlp" / "sample.txt", "One Billion Word style news sample (AllenNLP)"),
        "wikitext": (shared / "wikitext-2" / "valid.txt", "WikiText-2 valid"),
    }
    order = ("lm1b", "wikitext") if source == "auto" else ((source,) if source != "multi30k" else ())
    for name in order:
        path, description = candidates[name]
        if path.is_file():
            return f"{description} ({shown(path)})", path, False
        if source != "auto":
            raise FileNotFoundError(f"{path} not found")
    directory = multi30k_dir(data_root)
    return f"Multi30k train English ({shown(directory)})", _text_file(directory, "train.en"), True


def tokenise(lines: Sequence[str], lang: str) -> List[str]:
    """Moses tokenisation (sacremoses), or whitespace splitting if it is missing."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:  # pragma: no cover - sacremoses is an install requirement
        return [" ".join(line.split()) for line in lines]
    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line.strip(), escape=False, return_str=True) for line in lines]


def build_dictionary(corpora: Iterable[Sequence[str]], vocab_size: int):
    """A fairseq Dictionary of the ``vocab_size`` most frequent tokens (others map to <unk>)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for lines in corpora:
        for line in lines:
            for word in line.split():
                d.add_symbol(word)
    d.finalize(nwords=vocab_size, padding_factor=8)
    return d


# --------------------------------------------------------------------------- translation


@dataclass
class TranslationData:
    description: str
    dictionary: object  # fairseq Dictionary, shared by source and target
    train_batches: List[Dict]
    generation_batch: Dict
    source_lines: List[str]
    target_lines: List[str]
    source_tokens: List[torch.Tensor]
    target_tokens: List[torch.Tensor]

    def long_batch(self, length: int, rows: int) -> Dict:
        """``rows`` pairs whose source and target are exactly ``length`` tokens
        (eos included), cut from the running real text of consecutive sentences."""
        return _collate(
            self.dictionary, *_long_pairs(self.source_tokens, self.target_tokens, self.dictionary, length, rows)
        )


def _encode(dictionary, lines: Sequence[str]) -> List[torch.Tensor]:
    return [dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long() for line in lines]


def _collate(dictionary, sources: List[torch.Tensor], targets: List[torch.Tensor]) -> Dict:
    from fairseq.data import LanguagePairDataset

    dataset = LanguagePairDataset(
        sources, [len(s) for s in sources], dictionary, targets, [len(t) for t in targets], dictionary, shuffle=False
    )
    return dataset.collater([dataset[i] for i in range(len(sources))])


def _stream(sentences: Sequence[torch.Tensor], eos: int) -> torch.Tensor:
    """Concatenated sentences without their eos."""
    return torch.cat([s[s.ne(eos)] for s in sentences])


def _long_pairs(sources, targets, dictionary, length: int, rows: int):
    eos = dictionary.eos()
    src_stream, tgt_stream = _stream(sources, eos), _stream(targets, eos)
    needed = rows * (length - 1)
    if len(src_stream) < needed or len(tgt_stream) < needed:
        repeat = needed // min(len(src_stream), len(tgt_stream)) + 1
        src_stream, tgt_stream = src_stream.repeat(repeat), tgt_stream.repeat(repeat)

    def cut(stream, r):
        return torch.cat([stream[r * (length - 1) : (r + 1) * (length - 1)], torch.tensor([eos])])

    return [cut(src_stream, r) for r in range(rows)], [cut(tgt_stream, r) for r in range(rows)]


def translation_data(
    lines: int,
    vocab_size: int,
    max_tokens: int,
    num_batches: int,
    generation_sentences: int,
    max_sentence_tokens: int = 200,
    source: str = "auto",
    data_root: Optional[Path] = None,
    seed: int = 1,
) -> TranslationData:
    """Real En-De batches: ``num_batches`` training batches of at most
    ``max_tokens`` (fairseq's ``--max-tokens``: sentences x longest side),
    spread evenly over the length-sorted batches, and one generation batch of
    ``generation_sentences`` sources of median length."""
    description, en_files, de_files = parallel_text(source, data_root)
    pairs = sentence_pairs(en_files, de_files, lines, seed)
    src_lines = tokenise([s for s, _ in pairs], "en")
    tgt_lines = tokenise([t for _, t in pairs], "de")
    dictionary = build_dictionary([src_lines, tgt_lines], vocab_size)
    sources, targets = _encode(dictionary, src_lines), _encode(dictionary, tgt_lines)
    keep = [
        i
        for i in range(len(sources))
        if len(sources[i]) <= max_sentence_tokens and len(targets[i]) <= max_sentence_tokens
    ]
    sources, targets = [sources[i] for i in keep], [targets[i] for i in keep]
    src_lines, tgt_lines = [src_lines[i] for i in keep], [tgt_lines[i] for i in keep]

    from fairseq.data import LanguagePairDataset

    dataset = LanguagePairDataset(
        sources, [len(s) for s in sources], dictionary, targets, [len(t) for t in targets], dictionary, shuffle=False
    )
    train_batches = spread_batches(dataset, max_tokens, num_batches)
    generation_batch = dataset.collater([dataset[i] for i in median_length(sources, generation_sentences)])
    return TranslationData(
        description, dictionary, train_batches, generation_batch, src_lines, tgt_lines, sources, targets
    )


def sentence_pairs(en_files: Sequence[Path], de_files: Sequence[Path], lines: int, seed: int) -> List[Tuple[str, str]]:
    """``lines`` non-empty (English, German) pairs of the line-aligned files, shuffled with ``seed``."""
    en = [line for path in en_files for line in read_lines(path)]
    de = [line for path in de_files for line in read_lines(path)]
    if len(en) != len(de):
        raise ValueError(f"parallel text is not line-aligned: {len(en)} vs {len(de)} lines")
    pairs = [(s, t) for s, t in zip(en, de) if s.strip() and t.strip()]
    random.Random(seed).shuffle(pairs)
    return pairs[:lines]


def spread_batches(dataset, max_tokens: int, count: int) -> List[dict]:
    """``count`` of ``dataset``'s batches of at most ``max_tokens`` (fairseq's ``batch_by_size``
    on its length order), evenly spaced over them, collated."""
    batches = dataset.batch_by_size(dataset.ordered_indices(), max_tokens=max_tokens)
    if len(batches) < count:
        raise ValueError(f"only {len(batches)} batches of {max_tokens} tokens from {len(dataset)} sentences")
    picks = [int(round((i + 1) * (len(batches) - 1) / (count + 1))) for i in range(count)]
    return [dataset.collater([dataset[int(i)] for i in batches[p]]) for p in picks]


def median_length(sentences: Sequence[Sequence[int]], count: int) -> List[int]:
    """The indices, in order, of ``count`` sentences around the median length (ties: by index)."""
    by_length = sorted(range(len(sentences)), key=lambda i: (len(sentences[i]), i))
    middle = len(by_length) // 2
    return sorted(by_length[max(0, middle - count // 2) :][:count])


# --------------------------------------------------------------------------- language modelling


@dataclass
class LanguageModelData:
    description: str
    dictionary: object
    stream: torch.Tensor  # the whole corpus as one token stream (eos between lines)
    train_batches: List[Dict]
    prompts: torch.Tensor  # [N, P] real sentence beginnings for generation

    def block_batch(self, length: int, rows: int, start: int = 0) -> Dict:
        return lm_sample(self.stream, length, rows, start)


def lm_sample(stream: torch.Tensor, length: int, rows: int, start: int = 0) -> Dict:
    """A fairseq ``language_modeling`` batch (``--sample-break-mode none``):
    ``rows`` blocks of ``length`` tokens, targets shifted by one."""
    needed = start + rows * length + 1
    if len(stream) < needed:
        stream = stream.repeat(needed // len(stream) + 1)
    blocks = torch.stack([stream[start + r * length : start + r * length + length + 1] for r in range(rows)])
    return {
        "id": torch.arange(rows),
        "nsentences": rows,
        "ntokens": rows * length,
        "net_input": {"src_tokens": blocks[:, :-1].contiguous(), "src_lengths": torch.full((rows,), length)},
        "target": blocks[:, 1:].contiguous(),
    }


def language_model_data(
    lines: int,
    vocab_size: int,
    tokens_per_sample: int,
    rows: int,
    num_batches: int,
    prompt_sentences: int,
    prompt_length: int,
    source: str = "auto",
    data_root: Optional[Path] = None,
) -> LanguageModelData:
    description, path, needs_tokenising = monolingual_text(source, data_root)
    text = [line for line in read_lines(path) if line.strip()][:lines]
    if needs_tokenising:
        text = tokenise(text, "en")
    dictionary = build_dictionary([text], vocab_size)
    encoded = _encode(dictionary, text)
    stream = torch.cat(encoded)
    batches = [
        lm_sample(stream, tokens_per_sample, rows, start=b * rows * tokens_per_sample) for b in range(num_batches)
    ]
    long_enough = [s[:prompt_length] for s in encoded if len(s) > prompt_length][:prompt_sentences]
    if len(long_enough) < prompt_sentences:
        raise ValueError(f"fewer than {prompt_sentences} sentences longer than {prompt_length} tokens in {path}")
    return LanguageModelData(description, dictionary, stream, batches, torch.stack(long_enough))
