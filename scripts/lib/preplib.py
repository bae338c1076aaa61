#!/usr/bin/env python3
"""Text and file helpers for scripts/prepare-*.sh (one subcommand per job).

Every subcommand that writes a file writes ``FILE.tmp`` first and renames it into
place only when it is complete (``os.replace`` is atomic on one file system), so a
killed run never leaves a truncated file under a final name. Long jobs print
progress to stderr.

Subcommands (``python preplib.py CMD -h`` for the flags):

  download     fetch a URL to a file, resuming a partial ``.part`` download
  verify       check a file's size and sha256/md5 against an expected value
  sha256       print a file's sha256
  extract      extract named members of a .tar/.tgz/.tar.gz safely, atomically
  sgm2txt      strip WMT "SGML" (<seg> lines) to plain text, as sacreBLEU does
  concat       concatenate text files (plain or .gz) into one, with progress
  concat-parallel
               concatenate parallel corpora, checking each pair is line-aligned
  normalise    Moses punctuation normalisation + non-printing character removal
  tokenise     Moses tokenisation (sacremoses; -a aggressive hyphen splitting)
  apply-bpe    subword-nmt BPE segmentation (as `subword-nmt apply-bpe -c CODES`)
  clean        clean-corpus-n.perl: drop empty/long pairs and bad length ratios
  spm-train    train a sentencepiece model
  spm-encode   segment text with a sentencepiece model
  count-lines  print the number of lines of each file

Input text is read as UTF-8 split on "\\n" only (a stray "\\r" or U+2028 inside a
line does not split it, unlike Python's universal newlines), with invalid bytes
replaced, so parallel files stay line-aligned.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import multiprocessing
import os
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

PROG = "preplib"


def fail(message: str, status: int = 1) -> None:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.exit(status)


# --------------------------------------------------------------------------- I/O


def open_text_in(path: str):
    """Binary handle of a text file; ``.gz`` files are decompressed."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_lines(path: str) -> Iterator[str]:
    """Lines without their ``\\n``, split on ``\\n`` only."""
    with open_text_in(path) as f:
        for raw in f:
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            yield raw.decode("utf-8", errors="replace")


def count_lines(path: str) -> int:
    n = 0
    last = b"\n"
    with open_text_in(path) as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            n += block.count(b"\n")
            last = block[-1:]
    if last != b"\n":  # a final line without newline still counts
        n += 1
    return n


class AtomicWriter:
    """Text writer to ``path + '.tmp'``, renamed to ``path`` on success only."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = path + ".tmp"
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.handle = io.open(self.tmp, "w", encoding="utf-8", newline="\n")

    def write_line(self, line: str) -> None:
        self.handle.write(line + "\n")

    def commit(self) -> None:
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.handle.close()
        try:
            os.remove(self.tmp)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


class Progress:
    """Progress on stderr: a live line on a terminal, else a line every few seconds."""

    def __init__(
        self,
        label: str,
        total: Optional[float] = None,
        unit: str = "lines",
        scale: float = 1.0,
        interval: Optional[float] = None,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.scale = scale
        self.tty = sys.stderr.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 15.0)
        self.start = time.time()
        self.last = 0.0
        self.done = 0.0
        self.printed = None

    def _fmt(self, value: float) -> str:
        value = value / self.scale
        if self.unit == "MB":
            return f"{value:,.1f}"
        return f"{int(value):,}"

    def update(self, done: float, force: bool = False) -> None:
        self.done = done
        now = time.time()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        self.printed = done
        elapsed = max(now - self.start, 1e-6)
        rate = done / elapsed / self.scale
        text = f"[{self.label}] {self._fmt(done)}"
        if self.total:
            pct = 100.0 * done / self.total if self.total else 100.0
            text += f"/{self._fmt(self.total)} {self.unit} ({pct:5.1f}%)"
            if done > 0 and done < self.total:
                eta = (self.total - done) / (done / elapsed)
                text += f", eta {int(eta // 60)}m{int(eta % 60):02d}s"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.1f} {self.unit}/s"
        if self.tty:
            sys.stderr.write("\r" + text + "   ")
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.printed != self.done:
            self.update(self.done, force=True)
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# --------------------------------------------------------------------------- download / verify


def file_digest(path: str, algo: str, label: Optional[str] = None) -> str:
    h = hashlib.new(algo)
    size = os.path.getsize(path)
    progress = (
        Progress(label or f"{algo} {os.path.basename(path)}", total=size, unit="MB", scale=1 << 20)
        if size > (256 << 20)
        else None
    )
    done = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            h.update(block)
            done += len(block)
            if progress:
                progress.update(done)
    if progress:
        progress.close()
    return h.hexdigest()


def parse_expected(spec: str):
    """``sha256:HEX`` / ``md5:HEX`` / bare HEX (length decides) -> (algo, hex)."""
    spec = spec.strip()
    if ":" in spec:
        algo, value = spec.split(":", 1)
    else:
        value = spec
        algo = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}.get(len(value), "")
    algo = algo.lower()
    value = value.lower()
    if algo not in {"md5", "sha1", "sha256", "sha512"} or not re.fullmatch(r"[0-9a-f]+", value):
        fail(f"cannot parse checksum {spec!r} (use sha256:HEX or md5:HEX)")
    return algo, value


def cmd_verify(args) -> None:
    path = args.file
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    if args.size is not None:
        size = os.path.getsize(path)
        if size != args.size:
            fail(
                f"size mismatch for {path}: expected {args.size:,} bytes, got {size:,} (truncated or wrong file)",
                status=3,
            )
    algo, expected = parse_expected(args.expect)
    actual = file_digest(path, algo)
    if actual != expected:
        fail(f"checksum mismatch for {path}: expected {algo} {expected}, got {actual}", status=3)
    print(f"{algo} OK {os.path.basename(path)}", file=sys.stderr)


def cmd_sha256(args) -> None:
    print(file_digest(args.file, "sha256"))


def cmd_download(args) -> None:
    """Download ``url`` to ``dest`` via ``dest.part`` (resumed with an HTTP Range)."""
    dest = args.dest
    part = dest + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(dest)) or ".", exist_ok=True)
    last_error = None
    for attempt in range(1, args.retries + 1):
        have = os.path.getsize(part) if os.path.exists(part) else 0
        request = urllib.request.Request(args.url, headers={"User-Agent": "fairseq-distattn-prepare/1"})
        if have:
            request.add_header("Range", f"bytes={have}-")
        try:
            with urllib.request.urlopen(request, timeout=args.timeout) as response:
                status = getattr(response, "status", 200)
                if have and status != 206:  # server ignored the Range: start over
                    have = 0
                mode = "ab" if have else "wb"
                length = response.headers.get("Content-Length")
                total = have + int(length) if length is not None else None
                progress = Progress(f"download {os.path.basename(dest)}", total=total, unit="MB", scale=1 << 20)
                done = have
                with open(part, mode) as out:
                    while True:
                        block = response.read(1 << 20)
                        if not block:
                            break
                        out.write(block)
                        done += len(block)
                        progress.update(done)
                progress.close()
            if total is not None and os.path.getsize(part) != total:
                raise IOError(f"connection closed after {os.path.getsize(part):,} of {total:,} bytes")
            os.replace(part, dest)
            return
        except urllib.error.HTTPError as error:
            if error.code == 416 and have:  # range not satisfiable: the .part is already complete
                os.replace(part, dest)
                return
            last_error = f"HTTP {error.code} {error.reason}"
            if 400 <= error.code < 500:
                break
        except (urllib.error.URLError, OSError, IOError) as error:
            last_error = str(getattr(error, "reason", error))
        if attempt < args.retries:
            wait = min(60, 5 * attempt)
            sys.stderr.write(
                f"{PROG}: download of {args.url} failed ({last_error}); retry {attempt + 1}/{args.retries} in {wait}s\n"
            )
            time.sleep(wait)
    kept = f"partial data kept in {part}; " if os.path.exists(part) else ""
    fail(
        f"download of {args.url} failed: {last_error} ({kept}rerun to resume, or put the archive in --raw-dir)",
        status=4,
    )


# --------------------------------------------------------------------------- archives


def _safe_member_path(name: str) -> str:
    norm = os.path.normpath(name)
    if norm.startswith("..") or os.path.isabs(norm):
        fail(f"refusing to extract unsafe archive member {name!r}")
    return norm


def cmd_extract(args) -> None:
    """Extract the wanted members (all regular files if none named) into ``destdir``.

    Files go to ``destdir.tmp`` first; ``destdir`` appears only when every wanted
    member was found. Members are matched by exact path, or by glob with --glob.
    """
    import fnmatch

    archive = args.archive
    dest = args.destdir.rstrip("/")
    tmp = dest + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    wanted = {_safe_member_path(m) for m in args.member}
    patterns = list(args.glob)
    found = set()
    matched_globs = set()
    size = os.path.getsize(archive)
    progress = Progress(f"extract {os.path.basename(archive)}", total=size, unit="MB", scale=1 << 20)

    class Counting(io.RawIOBase):
        def __init__(self, raw):
            self.raw = raw

        def readable(self):
            return True

        def readinto(self, buffer):
            n = self.raw.readinto(buffer)
            progress.update(self.raw.tell())
            return n

    with open(archive, "rb") as raw:
        stream = io.BufferedReader(Counting(raw), 1 << 20)
        try:
            tar = tarfile.open(fileobj=stream, mode="r|*")
        except tarfile.TarError as error:
            fail(f"{archive}: not a tar archive ({error})")
        with tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = _safe_member_path(member.name)
                take = False
                if not wanted and not patterns:
                    take = True
                if name in wanted:
                    take = True
                    found.add(name)
                for pattern in patterns:
                    if fnmatch.fnmatchcase(name, pattern):
                        take = True
                        matched_globs.add(pattern)
                if not take:
                    continue
                target = os.path.join(tmp, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
    progress.close()
    missing = sorted(wanted - found) + sorted(set(patterns) - matched_globs)
    if missing:
        shutil.rmtree(tmp)
        fail(f"{archive} lacks {', '.join(missing)} (a wrong or corrupt archive?)")
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.replace(tmp, dest)


# --------------------------------------------------------------------------- text


SEG_RE = re.compile(r"<seg.*?>(.*)</seg>.*?")


def cmd_sgm2txt(args) -> None:
    """Same extraction as sacreBLEU's FakeSGMLDataset: lines starting with ``<seg ``,
    the text between the tags, whitespace collapsed and stripped."""
    n = 0
    with AtomicWriter(args.output) as out:
        for line in iter_lines(args.input):
            if line.startswith("<seg "):
                text = SEG_RE.sub(r"\1", line)
                out.write_line(re.sub(r"\s+", " ", text.strip()))
                n += 1
    if n == 0:
        fail(f"{args.input}: no <seg> lines (not a WMT .sgm file?)")
    print(f"{args.input}: {n} segments", file=sys.stderr)


def cmd_concat(args) -> None:
    total = sum(os.path.getsize(p) for p in args.inputs)
    progress = Progress(f"concat {os.path.basename(args.output)}", total=total, unit="MB", scale=1 << 20)
    done_bytes = 0
    lines = 0
    with AtomicWriter(args.output) as out:
        for path in args.inputs:
            for line in iter_lines(path):
                out.write_line(line)
                lines += 1
                if lines % 100000 == 0:
                    progress.update(done_bytes)
            done_bytes += os.path.getsize(path)
            progress.update(done_bytes)
    progress.close()
    print(f"{args.output}: {lines:,} lines", file=sys.stderr)


def cmd_concat_parallel(args) -> None:
    """--pair SRC TGT ... -> --src-out / --tgt-out; every pair must be line-aligned."""
    pairs = args.pair
    for src, tgt in pairs:
        for path in (src, tgt):
            if not os.path.isfile(path):
                fail(f"missing corpus file {path}")
    counts = []
    for src, tgt in pairs:
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            fail(f"corpus {src} has {n_src:,} lines but {tgt} has {n_tgt:,}: not line-aligned")
        counts.append(n_src)
    total = sum(counts)
    progress = Progress(f"concat {os.path.basename(args.src_out)}+{os.path.basename(args.tgt_out)}", total=total)
    done = 0
    with AtomicWriter(args.src_out) as out_src, AtomicWriter(args.tgt_out) as out_tgt:
        for (src, tgt), n in zip(pairs, counts):
            for line_src, line_tgt in zip(iter_lines(src), iter_lines(tgt)):
                out_src.write_line(line_src)
                out_tgt.write_line(line_tgt)
                done += 1
                if done % 100000 == 0:
                    progress.update(done)
            print(f"  {os.path.basename(src)} / {os.path.basename(tgt)}: {n:,} pairs", file=sys.stderr)
    progress.update(done)
    progress.close()


# Workers for the parallel line processors (set up once per process).
_WORKER_FN: Optional[Callable[[str], str]] = None


def _make_normaliser(lang: str, punct: bool, apostrophe: bool) -> Callable[[str], str]:
    import regex

    nonprint = regex.compile(r"\p{C}")
    normaliser = None
    if punct:
        from sacremoses import MosesPunctNormalizer

        normaliser = MosesPunctNormalizer(lang=lang)

    def run(line: str) -> str:
        if apostrophe:  # fairseq's recipe, on the test set: sed "s/\’/\'/g"
            line = line.replace("\u2019", "'")
        if normaliser is not None:  # normalize-punctuation.perl LANG
            line = normaliser.normalize(line)
        # remove-non-printing-char.perl: s/\p{C}/ /g (also removes any stray \r)
        return nonprint.sub(" ", line)

    return run


def _make_tokeniser(lang: str, aggressive: bool, escape: bool) -> Callable[[str], str]:
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)

    def run(line: str) -> str:
        # tokenizer.perl [-a] -l LANG (escapes special characters unless -no-escape)
        return tokenizer.tokenize(line, aggressive_dash_splits=aggressive, escape=escape, return_str=True)

    return run


def _make_bpe(codes: str) -> Callable[[str], str]:
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)

    def run(line: str) -> str:
        # the same per-line call as `subword-nmt apply-bpe -c CODES`
        return bpe.process_line(line)

    return run


def _init_worker(kind: str, options: dict) -> None:
    global _WORKER_FN
    if kind == "normalise":
        _WORKER_FN = _make_normaliser(**options)
    elif kind == "tokenise":
        _WORKER_FN = _make_tokeniser(**options)
    elif kind == "apply-bpe":
        _WORKER_FN = _make_bpe(**options)
    else:
        raise ValueError(kind)


def _work(chunk: List[str]) -> List[str]:
    assert _WORKER_FN is not None
    return [_WORKER_FN(line) for line in chunk]


def _chunks(lines: Iterable[str], size: int) -> Iterator[List[str]]:
    chunk: List[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def process_lines(kind: str, options: dict, input_path: str, output_path: str, workers: int, label: str) -> None:
    total = count_lines(input_path)
    progress = Progress(label, total=total)
    done = 0
    chunk_size = 2000
    with AtomicWriter(output_path) as out:
        if workers <= 1 or total < 4 * chunk_size:
            _init_worker(kind, options)
            for chunk in _chunks(iter_lines(input_path), chunk_size):
                for line in _work(chunk):
                    out.write_line(line)
                done += len(chunk)
                progress.update(done)
        else:
            with multiprocessing.Pool(workers, initializer=_init_worker, initargs=(kind, options)) as pool:
                for result in pool.imap(_work, _chunks(iter_lines(input_path), chunk_size)):
                    for line in result:
                        out.write_line(line)
                    done += len(result)
                    progress.update(done)
    progress.close()
    if done != total:
        fail(f"{label}: processed {done} of {total} lines")


def _in_out_pairs(paths: Sequence[str]) -> List[Tuple[str, str]]:
    if len(paths) % 2:
        fail("expected INPUT OUTPUT pairs")
    return [(paths[i], paths[i + 1]) for i in range(0, len(paths), 2)]


def cmd_normalise(args) -> None:
    for input_path, output_path in _in_out_pairs(args.files):
        process_lines(
            "normalise",
            {"lang": args.lang, "punct": args.punct, "apostrophe": args.apostrophe},
            input_path,
            output_path,
            args.workers,
            f"normalise {os.path.basename(input_path)}",
        )


def cmd_tokenise(args) -> None:
    for input_path, output_path in _in_out_pairs(args.files):
        process_lines(
            "tokenise",
            {"lang": args.lang, "aggressive": not args.no_aggressive, "escape": not args.no_escape},
            input_path,
            output_path,
            args.workers,
            f"tokenise {os.path.basename(input_path)}",
        )


def cmd_apply_bpe(args) -> None:
    for input_path, output_path in _in_out_pairs(args.files):
        process_lines(
            "apply-bpe",
            {"codes": args.codes},
            input_path,
            output_path,
            args.workers,
            f"apply-bpe {os.path.basename(input_path)}",
        )


def cmd_clean(args) -> None:
    """clean-corpus-n.perl [-ratio R] CORPUS L1 L2 OUT MIN MAX, line for line."""
    src_in = f"{args.corpus}.{args.l1}"
    tgt_in = f"{args.corpus}.{args.l2}"
    n_src, n_tgt = count_lines(src_in), count_lines(tgt_in)
    if n_src != n_tgt:
        fail(f"{src_in} has {n_src:,} lines but {tgt_in} has {n_tgt:,}")
    space = re.compile(r"\s+")
    long_word = re.compile(r"[^\s|]{%d}" % (args.max_word_length + 1))
    kept = 0
    progress = Progress(f"clean {os.path.basename(args.corpus)}", total=n_src)
    with AtomicWriter(f"{args.output}.{args.l1}") as out_src, AtomicWriter(f"{args.output}.{args.l2}") as out_tgt:
        for i, (e, f) in enumerate(zip(iter_lines(src_in), iter_lines(tgt_in)), 1):
            if i % 100000 == 0:
                progress.update(i)
            e = space.sub(" ", e.replace("|", "")).strip(" ")
            f = space.sub(" ", f.replace("|", "")).strip(" ")
            if not e or not f:
                continue
            ec, fc = len(e.split(" ")), len(f.split(" "))
            if ec > args.max or fc > args.max or ec < args.min or fc < args.min:
                continue
            if ec / fc > args.ratio or fc / ec > args.ratio:
                continue
            if long_word.search(e) or long_word.search(f):
                continue
            out_src.write_line(e)
            out_tgt.write_line(f)
            kept += 1
    progress.update(n_src)
    progress.close()
    print(f"clean {args.corpus}: input sentences {n_src:,}, output sentences {kept:,}", file=sys.stderr)


def cmd_spm_train(args) -> None:
    import sentencepiece as spm

    prefix = args.model_prefix
    tmp_prefix = prefix + ".tmp"
    spm.SentencePieceTrainer.train(
        input=",".join(args.inputs),
        model_prefix=tmp_prefix,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        input_sentence_size=args.input_sentence_size,
        shuffle_input_sentence=True,
        num_threads=max(1, args.workers),
        hard_vocab_limit=not args.soft_vocab_limit,
        minloglevel=1,
    )
    for ext in (".vocab", ".model"):  # .model last: it is what later steps check
        os.replace(tmp_prefix + ext, prefix + ext)


def cmd_spm_encode(args) -> None:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=args.model)
    total = count_lines(args.input)
    progress = Progress(f"spm-encode {os.path.basename(args.input)}", total=total)
    with AtomicWriter(args.output) as out:
        for i, chunk in enumerate(_chunks(iter_lines(args.input), 10000)):
            for pieces in processor.encode(chunk, out_type=str):
                out.write_line(" ".join(pieces))
            progress.update(min(total, (i + 1) * 10000))
    progress.close()


def cmd_count_lines(args) -> None:
    for path in args.files:
        print(f"{count_lines(path)}\t{path}")


# --------------------------------------------------------------------------- CLI


def add_archive_commands(sub) -> None:
    """Fetching the upstream archives, checking them against their checksums, unpacking them."""
    p = sub.add_parser("download")
    p.add_argument("url")
    p.add_argument("dest")
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("verify")
    p.add_argument("file")
    p.add_argument("--expect", required=True, help="sha256:HEX or md5:HEX")
    p.add_argument("--size", type=int)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("sha256")
    p.add_argument("file")
    p.set_defaults(func=cmd_sha256)

    p = sub.add_parser("extract")
    p.add_argument("archive")
    p.add_argument("destdir")
    p.add_argument("--member", action="append", default=[])
    p.add_argument("--glob", action="append", default=[])
    p.set_defaults(func=cmd_extract)


def add_text_extraction_commands(sub) -> None:
    """One plain-text file from the archives' members (WMT SGML, corpora in parts, parallel pairs)."""
    p = sub.add_parser("sgm2txt")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_sgm2txt)

    p = sub.add_parser("concat")
    p.add_argument("output")
    p.add_argument("inputs", nargs="+")
    p.set_defaults(func=cmd_concat)

    p = sub.add_parser("concat-parallel")
    p.add_argument("--pair", nargs=2, action="append", required=True, metavar=("SRC", "TGT"))
    p.add_argument("--src-out", required=True)
    p.add_argument("--tgt-out", required=True)
    p.set_defaults(func=cmd_concat_parallel)


def add_line_processing_commands(sub, default_workers: int) -> None:
    """The Moses and subword-nmt steps: line by line, so split over ``--workers`` processes."""
    p = sub.add_parser("normalise")
    p.add_argument("--lang", required=True)
    p.add_argument("--punct", action="store_true", help="normalize-punctuation.perl")
    p.add_argument("--apostrophe", action="store_true", help="replace U+2019 by ' (fairseq, test set)")
    p.add_argument("--workers", type=int, default=default_workers)
    p.add_argument("files", nargs="+", metavar="INPUT OUTPUT")
    p.set_defaults(func=cmd_normalise)

    p = sub.add_parser("tokenise")
    p.add_argument("--lang", required=True)
    p.add_argument("--no-aggressive", action="store_true", help="no -a hyphen splitting")
    p.add_argument("--no-escape", action="store_true")
    p.add_argument("--workers", type=int, default=default_workers)
    p.add_argument("files", nargs="+", metavar="INPUT OUTPUT")
    p.set_defaults(func=cmd_tokenise)

    p = sub.add_parser("apply-bpe")
    p.add_argument("--codes", required=True, help="subword-nmt BPE codes")
    p.add_argument("--workers", type=int, default=default_workers)
    p.add_argument("files", nargs="+", metavar="INPUT OUTPUT")
    p.set_defaults(func=cmd_apply_bpe)


def add_training_corpus_commands(sub, default_workers: int) -> None:
    """Filtering the parallel training corpus, and the sentencepiece model learnt on it and applied."""
    p = sub.add_parser("clean")
    p.add_argument("--ratio", type=float, default=9.0)
    p.add_argument("--max-word-length", type=int, default=1000)
    p.add_argument("corpus")
    p.add_argument("l1")
    p.add_argument("l2")
    p.add_argument("output")
    p.add_argument("min", type=int)
    p.add_argument("max", type=int)
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("spm-train")
    p.add_argument("--model-prefix", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    p.add_argument("--character-coverage", type=float, default=1.0)
    p.add_argument(
        "--input-sentence-size", type=int, default=10_000_000, help="sample at most this many sentences (0: all)"
    )
    p.add_argument("--soft-vocab-limit", action="store_true")
    p.add_argument("--workers", type=int, default=default_workers)
    p.add_argument("inputs", nargs="+")
    p.set_defaults(func=cmd_spm_train)

    p = sub.add_parser("spm-encode")
    p.add_argument("--model", required=True)
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_spm_encode)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # in the order of the module's docstring, which --help lists them in too
    add_archive_commands(sub)
    add_text_extraction_commands(sub)
    default_workers = max(1, os.cpu_count() or 1)
    add_line_processing_commands(sub, default_workers)
    add_training_corpus_commands(sub, default_workers)

    p = sub.add_parser("count-lines")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_count_lines)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
