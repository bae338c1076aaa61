"""Data preparation, evaluation and checkpoint averaging, end to end and offline.

The prepare scripts (scripts/prepare-wmt14en2de.sh, -en2fr.sh, prepare-lm1b.sh) run
on stand-in archives built here: the upstream archive names and internal layouts
(member paths, WMT .sgm dev/test files, giga-fren's .tar of .gz files, the 99 + 50
shards of the 1B Word benchmark) filled with a few hundred lines of real news text
from ../shared/data. They are passed with --raw-dir (or served from a local HTTP
server on 127.0.0.1 to exercise the download path) and a --checksums file with
their sha256, since the built-in checksums are those of the real archives.

Also covered: a rerun does no work; a failed and a killed run resume and give
byte-identical outputs; bad checksums and failed downloads stop with a clear
message; tokenised BLEU with compound splitting and detokenised sacreBLEU agree
with independent computations; a dropped sentence fails the evaluation; averaging
two checkpoints gives their element-wise mean and the average translates.
"""

from __future__ import annotations

import collections
import functools
import gzip
import hashlib
import http.server
import importlib.util
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from fairseq_distattn.tools import translation_scoring

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "scripts"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
BIN_DIR = Path(sys.executable).parent  # the virtualenv's bin (not resolved: see conftest)


def require_shared_data() -> None:
    """Skip (only) where ../shared/data is absent, e.g. in a user's clone; CI has it."""
    if not (SHARED_DATA / "wmt-newstest2008-2012-en-de").is_dir():
        pytest.skip("../shared/data (real WMT text for the stand-in archives) is not beside the repository")


# --------------------------------------------------------------------------- stand-in archives

N_EUROPARL = 160
N_COMMONCRAWL = 120
N_NEWS_COMMENTARY = 80
N_UN = 60
N_GIGA = 60
N_DEV = 50
N_TEST_FULL = 40
N_TEST_FILTERED = 30
LM1B_TOP = "1-billion-word-language-modeling-benchmark-r13output"
LM1B_ARCHIVE = LM1B_TOP + ".tar.gz"
LM1B_PER_TRAIN_SHARD = 8
LM1B_PER_HELDOUT_SHARD = 40


def read_lines(path: Path, start: int = 0, count: Optional[int] = None) -> List[str]:
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[start : None if count is None else start + count]


def text_bytes(lines: Sequence[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def sgm_bytes(lines: Sequence[str], setid: str, kind: str, lang: str) -> bytes:
    """WMT "fake SGML": <seg>s in <doc>s of 20; some segments are padded with spaces
    inside the tags, as upstream."""
    out = [f'<{kind}set setid="{setid}" srclang="any" trglang="{lang}">']
    for i, line in enumerate(lines):
        if i % 20 == 0:
            if i:
                out.append("</p>\n</doc>")
            out.append(f'<doc sysid="{kind}" docid="doc{i // 20}" genre="news" origlang="en">\n<p>')
        pad = " " if i % 7 == 3 else ""
        out.append(f'<seg id="{i + 1}">{pad}{line}{pad}</seg>')
    out += ["</p>\n</doc>", f"</{kind}set>"]
    return text_bytes(out)


def write_tar(path: Path, members: Dict[str, bytes], gz: bool = True) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1400000000
            tar.addfile(info, io.BytesIO(data))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def build_wmt14_archives(shared: Path, out: Path) -> Dict[str, object]:
    """Every WMT14 archive both recipes use, holding both the de-en and fr-en files
    like the real ones (the real Europarl archive also has cs/es; here a Common Crawl
    annotation file and a newstest2012 dev file stand in for what is not wanted)."""
    out.mkdir(parents=True, exist_ok=True)
    de_dir = shared / "wmt-newstest2008-2012-en-de"
    fr_dir = shared / "wmt-newstest2008-2012-en-fr"

    def pair(directory: Path, name: str, tgt: str, start: int, count: int) -> Tuple[List[str], List[str]]:
        return (
            read_lines(directory / f"{name}.en", start, count),
            read_lines(directory / f"{name}.{tgt}", start, count),
        )

    ep_de, ep_fr = (
        pair(de_dir, "news-test2008", "de", 0, N_EUROPARL),
        pair(fr_dir, "news-test2008", "fr", 0, N_EUROPARL),
    )
    cc_de, cc_fr = (
        pair(de_dir, "newstest2009", "de", 0, N_COMMONCRAWL),
        pair(fr_dir, "newstest2009", "fr", 0, N_COMMONCRAWL),
    )
    nc_de, nc_fr = (
        pair(de_dir, "newstest2010", "de", 0, N_NEWS_COMMENTARY),
        pair(fr_dir, "newstest2010", "fr", 0, N_NEWS_COMMENTARY),
    )
    un_fr = pair(fr_dir, "newstest2011", "fr", 0, N_UN)
    giga_fr = pair(fr_dir, "newstest2011", "fr", N_UN, N_GIGA)
    test_de = pair(de_dir, "newstest2012", "de", 0, N_TEST_FULL)
    test_fr = pair(fr_dir, "newstest2012", "fr", 0, N_TEST_FULL)
    dev_en = read_lines(shared / "wmt13-newstest2013-en-de" / "newstest2013.en", 0, N_DEV)
    dev_de = read_lines(shared / "wmt13-newstest2013-en-de" / "newstest2013.de", 0, N_DEV)
    dev_fr = read_lines(shared / "wmt13-newstest2013-en-fr" / "newstest2013.fr", 0, N_DEV)

    write_tar(
        out / "training-parallel-europarl-v7.tgz",
        {
            "training/europarl-v7.de-en.de": text_bytes(ep_de[1]),
            "training/europarl-v7.de-en.en": text_bytes(ep_de[0]),
            "training/europarl-v7.fr-en.en": text_bytes(ep_fr[0]),
            "training/europarl-v7.fr-en.fr": text_bytes(ep_fr[1]),
        },
    )
    write_tar(
        out / "training-parallel-commoncrawl.tgz",
        {
            "commoncrawl.de-en.annotation": text_bytes(["x"] * N_COMMONCRAWL),
            "commoncrawl.de-en.de": text_bytes(cc_de[1]),
            "commoncrawl.de-en.en": text_bytes(cc_de[0]),
            "commoncrawl.fr-en.en": text_bytes(cc_fr[0]),
            "commoncrawl.fr-en.fr": text_bytes(cc_fr[1]),
        },
    )
    write_tar(
        out / "training-parallel-nc-v9.tgz",
        {
            "training/news-commentary-v9.de-en.de": text_bytes(nc_de[1]),
            "training/news-commentary-v9.de-en.en": text_bytes(nc_de[0]),
            "training/news-commentary-v9.fr-en.en": text_bytes(nc_fr[0]),
            "training/news-commentary-v9.fr-en.fr": text_bytes(nc_fr[1]),
        },
    )
    write_tar(
        out / "training-parallel-un.tgz",
        {
            "un/undoc.2000.fr-en.en": text_bytes(un_fr[0]),
            "un/undoc.2000.fr-en.fr": text_bytes(un_fr[1]),
        },
    )
    write_tar(
        out / "training-giga-fren.tar",
        {
            "giga-fren.release2.fixed.en.gz": gzip.compress(text_bytes(giga_fr[0]), mtime=0),
            "giga-fren.release2.fixed.fr.gz": gzip.compress(text_bytes(giga_fr[1]), mtime=0),
        },
        gz=False,
    )
    write_tar(
        out / "dev.tgz",
        {
            "dev/newstest2013-src.en.sgm": sgm_bytes(dev_en, "newstest2013", "src", "en"),
            "dev/newstest2013-ref.de.sgm": sgm_bytes(dev_de, "newstest2013", "ref", "de"),
            "dev/newstest2013-ref.fr.sgm": sgm_bytes(dev_fr, "newstest2013", "ref", "fr"),
            "dev/newstest2012-src.en.sgm": sgm_bytes(test_de[0][:5], "newstest2012", "src", "en"),
        },
    )
    for archive, directory, n in (
        ("test-full.tgz", "test-full", N_TEST_FULL),
        ("test-filtered.tgz", "test", N_TEST_FILTERED),
    ):
        write_tar(
            out / archive,
            {
                f"{directory}/newstest2014-deen-src.en.sgm": sgm_bytes(test_de[0][:n], "newstest2014", "src", "en"),
                f"{directory}/newstest2014-deen-ref.de.sgm": sgm_bytes(test_de[1][:n], "newstest2014", "ref", "de"),
                f"{directory}/newstest2014-deen-src.de.sgm": sgm_bytes(test_de[1][:n], "newstest2014", "src", "de"),
                f"{directory}/newstest2014-fren-src.en.sgm": sgm_bytes(test_fr[0][:n], "newstest2014", "src", "en"),
                f"{directory}/newstest2014-fren-ref.fr.sgm": sgm_bytes(test_fr[1][:n], "newstest2014", "ref", "fr"),
            },
        )
    return {
        "test_de": test_de,
        "test_fr": test_fr,
        "dev_de": (dev_en, dev_de),
        "train_de": [ep_de, cc_de, nc_de],
        "train_fr": [ep_fr, cc_fr, un_fr, nc_fr, giga_fr],
    }


def build_lm1b_archive(sample: Path, out: Path) -> Dict[str, List[str]]:
    """The 1B Word layout: 99 training shards news.en-000NN-of-00100 (NN = 01..99),
    50 held-out shards news.en.heldout-000NN-of-00050, the held-out
    news.en-00000-of-00100 and a README, from the 1000-line 1B-style sample."""
    lines = read_lines(sample)
    members: Dict[str, bytes] = {f"{LM1B_TOP}/README": b"stand-in for tests\n"}
    train: List[str] = []
    pos = 0
    for shard in range(1, 100):
        chunk = lines[pos : pos + LM1B_PER_TRAIN_SHARD]
        pos += LM1B_PER_TRAIN_SHARD
        train += chunk
        members[f"{LM1B_TOP}/training-monolingual.tokenized.shuffled/news.en-{shard:05d}-of-00100"] = text_bytes(chunk)
    heldout = {}
    for shard in range(50):
        if shard < 2:
            chunk = lines[pos : pos + LM1B_PER_HELDOUT_SHARD]
            pos += LM1B_PER_HELDOUT_SHARD
        else:
            chunk = lines[2 * shard : 2 * shard + 2]
        heldout[shard] = chunk
        members[f"{LM1B_TOP}/heldout-monolingual.tokenized.shuffled/news.en.heldout-{shard:05d}-of-00050"] = text_bytes(
            chunk
        )
    members[f"{LM1B_TOP}/heldout-monolingual.tokenized.shuffled/news.en-00000-of-00100"] = text_bytes(
        heldout[0] + heldout[1]
    )
    write_tar(out / LM1B_ARCHIVE, members)
    return {"train": train, "test": heldout[0], "valid": heldout[1]}


# --------------------------------------------------------------------------- running scripts


def script_env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    for name in (
        "RAW_DIR",
        "OUT_DIR",
        "BPE_TOKENS",
        "SPM_TYPE",
        "TEST_SET",
        "CHECKSUMS_FILE",
        "MIRROR",
        "OFFLINE",
        "FORCE",
        "DISTATTN_PREP_FAIL_AT",
        "VALID_SHARD",
        "TEST_SHARD",
    ):
        env.pop(name, None)
    env["PYTHON"] = sys.executable
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["WORKERS"] = "2"
    env["DOWNLOAD_RETRIES"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_script(
    name: str, args: Sequence[object], env: Optional[Dict[str, str]] = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPTS / name)] + [str(a) for a in args]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=str(REPO_ROOT), env=env or script_env(), timeout=timeout
    )


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


def run_python(args: Sequence[object], timeout: float = 600, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable] + [str(a) for a in args],
        capture_output=True,
        text=True,
        cwd=str(cwd or REPO_ROOT),
        env=script_env(),
        timeout=timeout,
    )


def steps_run(proc: subprocess.CompletedProcess) -> List[str]:
    return re.findall(r"\] step (\S+)", proc.stderr)


def steps_skipped(proc: subprocess.CompletedProcess) -> List[str]:
    return re.findall(r"\] skip (\S+) \(done\)", proc.stderr)


def tree_state(root: Path) -> Dict[str, Tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def output_bytes(out: Path) -> Dict[str, bytes]:
    """The files a WMT14 run produces for training and evaluation (data-bin without
    fairseq's own log, which names the output directory; BPE codes; references)."""
    files = {}
    for path in sorted((out / "data-bin").iterdir()):
        if path.name != "preprocess.log":
            files[f"data-bin/{path.name}"] = path.read_bytes()
    for path in sorted((out / "ref").iterdir()):
        files[f"ref/{path.name}"] = path.read_bytes()
    for name in ("code", "text/train.clean.en", "text/train.clean.de"):
        if (out / name).exists():
            files[name] = (out / name).read_bytes()
    return files


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pipeline_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipelines")


@pytest.fixture(scope="module")
def wmt_raw(pipeline_root) -> Dict[str, object]:
    require_shared_data()
    raw = pipeline_root / "raw-wmt14"
    info = build_wmt14_archives(SHARED_DATA, raw)
    sums = pipeline_root / "wmt14.sha256"
    sums.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in sorted(raw.iterdir())), encoding="utf-8")
    info.update({"raw": raw, "checksums": sums})
    return info


@pytest.fixture(scope="module")
def ende(pipeline_root, wmt_raw) -> Dict[str, object]:
    """One full En-De run: --raw-dir, tiny BPE through the BPE_TOKENS variable."""
    out = pipeline_root / "wmt14_en_de"
    start = time.time()
    proc = run_script(
        "prepare-wmt14en2de.sh",
        ["--raw-dir", wmt_raw["raw"], "--out", out, "--checksums", wmt_raw["checksums"]],
        env=script_env(BPE_TOKENS="200"),
    )
    assert proc.returncode == 0, show(proc)
    return {"out": out, "proc": proc, "seconds": time.time() - start}


@pytest.fixture(scope="module")
def lm1b_raw(pipeline_root) -> Dict[str, object]:
    require_shared_data()
    raw = pipeline_root / "raw-lm1b"
    raw.mkdir()
    info = build_lm1b_archive(SHARED_DATA / "lm1b-sample-allennlp" / "sample.txt", raw)
    sums = pipeline_root / "lm1b.sha256"
    sums.write_text(f"{sha256(raw / LM1B_ARCHIVE)}  {LM1B_ARCHIVE}\n", encoding="utf-8")
    info.update({"raw": raw, "checksums": sums})
    return info


class LocalMirror:
    """A directory served over HTTP on 127.0.0.1 (a thread of this process)."""

    def __init__(self, directory: Path):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def lm1b(pipeline_root, lm1b_raw) -> Dict[str, object]:
    """prepare-lm1b.sh downloading its archive from a local mirror (no --raw-dir)."""
    out = pipeline_root / "lm1b"
    with LocalMirror(lm1b_raw["raw"]) as mirror:
        proc = run_script(
            "prepare-lm1b.sh", ["--out", out, "--mirror", mirror.url, "--checksums", lm1b_raw["checksums"]]
        )
    assert proc.returncode == 0, show(proc)
    return {"out": out, "proc": proc}


# --------------------------------------------------------------------------- prepare: WMT14 En-De


def test_prepare_wmt14en2de_end_to_end(ende, wmt_raw):
    out: Path = ende["out"]
    proc = ende["proc"]
    assert steps_skipped(proc) == []
    assert steps_run(proc)[-4:] == ["apply-bpe", "clean", "binarise", "finish"]
    # only the wanted members were extracted
    assert sorted(p.name for p in (out / "orig" / "training-parallel-europarl-v7" / "training").iterdir()) == [
        "europarl-v7.de-en.de",
        "europarl-v7.de-en.en",
    ]
    assert not (out / "orig" / "training-parallel-commoncrawl" / "commoncrawl.de-en.annotation").exists()

    # the training corpora were concatenated in order
    train_en = read_lines(out / "text" / "train.raw.en")
    expected_en = [line for corpus in wmt_raw["train_de"] for line in corpus[0]]
    assert train_en == expected_en

    # dev/test: SGML stripped exactly as sacreBLEU does
    test_en, test_de = wmt_raw["test_de"]
    assert read_lines(out / "ref" / "test.raw.en") == [s.strip() for s in test_en]
    assert read_lines(out / "ref" / "test.raw.de") == [s.strip() for s in test_de]
    assert read_lines(out / "ref" / "valid.raw.de") == [s.strip() for s in wmt_raw["dev_de"][1]]

    # tokenised references: sacremoses tokenizer -a with escaping, after ’ -> '
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang="de")
    expected_tok = [
        tok.tokenize(s.strip().replace("\u2019", "'"), aggressive_dash_splits=True, escape=True, return_str=True)
        for s in test_de
    ]
    assert read_lines(out / "ref" / "test.tok.de") == expected_tok
    assert any("@-@" in line for line in read_lines(out / "text" / "train.tok.de"))

    # joint BPE with the requested number of merges
    codes = read_lines(out / "code")
    assert codes[0].startswith("#version") and len(codes) - 1 == 200
    assert any("@@ " in line for line in read_lines(out / "text" / "train.bpe.en"))

    # cleaning: clean-corpus-n.perl -ratio 1.5 ... 1 250 on the BPE'd pairs
    bpe_en, bpe_de = read_lines(out / "text" / "train.bpe.en"), read_lines(out / "text" / "train.bpe.de")
    kept = [
        (e, d)
        for e, d in zip(bpe_en, bpe_de)
        if e.strip()
        and d.strip()
        and 1 <= len(e.split()) <= 250
        and 1 <= len(d.split()) <= 250
        and len(e.split()) / len(d.split()) <= 1.5
        and len(d.split()) / len(e.split()) <= 1.5
    ]
    clean_en, clean_de = read_lines(out / "text" / "train.clean.en"), read_lines(out / "text" / "train.clean.de")
    assert list(zip(clean_en, clean_de)) == [(" ".join(e.split()), " ".join(d.split())) for e, d in kept]
    assert 0 < len(clean_en) < len(bpe_en)

    # binarised with a joined dictionary; sizes match the text
    data_bin = out / "data-bin"
    assert (data_bin / "dict.en.txt").read_bytes() == (data_bin / "dict.de.txt").read_bytes()
    for split, n in (("train", len(clean_en)), ("valid", N_DEV), ("test", N_TEST_FULL)):
        for lang in ("en", "de"):
            sizes = translation_scoring.indexed_dataset_sizes(data_bin / f"{split}.en-de.{lang}.idx")
            assert sizes is not None and len(sizes) == n, (split, lang)
    prep = json.loads((out / "prep.json").read_text())
    assert prep["source_lang"] == "en" and prep["target_lang"] == "de"
    assert prep["segmentation"] == "subword_nmt" and prep["test_set"] == "newstest2014-full"
    # every archive (dev.tgz included) was pinned by the checksums file
    assert "checksum" not in proc.stderr.lower() or "mismatch" not in proc.stderr.lower()
    assert not (out / "unverified-archives.sha256").exists()
    assert re.search(r"sha256 OK training-parallel-europarl-v7\.tgz", proc.stderr)


def test_prepare_rerun_does_no_work(ende, wmt_raw):
    out: Path = ende["out"]
    before = tree_state(out)
    start = time.time()
    proc = run_script(
        "prepare-wmt14en2de.sh",
        ["--raw-dir", wmt_raw["raw"], "--out", out, "--checksums", wmt_raw["checksums"]],
        env=script_env(BPE_TOKENS="200"),
    )
    elapsed = time.time() - start
    assert proc.returncode == 0, show(proc)
    assert steps_run(proc) == []
    assert "binarise" in steps_skipped(proc) and "finish" in steps_skipped(proc)
    assert tree_state(out) == before  # nothing rewritten
    assert elapsed < max(10.0, ende["seconds"] / 2)

    # a changed setting redoes the steps that depend on it, and only those (in a copy,
    # as the other tests compare against this output)
    copy = ende["out"].parent / "wmt14_en_de_copy"
    shutil.copytree(out, copy, symlinks=True)
    changed = run_script(
        "prepare-wmt14en2de.sh",
        ["--raw-dir", wmt_raw["raw"], "--out", copy, "--checksums", wmt_raw["checksums"], "--bpe-tokens", "150"],
    )
    assert changed.returncode == 0, show(changed)
    assert steps_run(changed) == ["learn-bpe", "apply-bpe", "clean", "binarise", "finish"]
    assert len(read_lines(copy / "code")) - 1 == 150


def test_prepare_failed_then_killed_run_resumes_with_identical_output(ende, wmt_raw, pipeline_root):
    out = pipeline_root / "wmt14_en_de_resumed"
    args = ["--raw-dir", wmt_raw["raw"], "--out", out, "--checksums", wmt_raw["checksums"]]

    # 1. a step fails (injected at the end of tokenise, after its work, before its stamp)
    failed = run_script(
        "prepare-wmt14en2de.sh", args, env=script_env(BPE_TOKENS="200", DISTATTN_PREP_FAIL_AT="tokenise")
    )
    assert failed.returncode != 0
    assert 'FAILED in step "tokenise"' in failed.stderr
    assert "rerun the same command to resume" in failed.stderr
    assert (out / ".stamps" / "normalise.done").exists()
    assert not (out / ".stamps" / "tokenise.done").exists()

    # 2. the rerun is killed (SIGKILL to its whole process group: no trap runs) as
    #    soon as it has finished learning BPE, in the middle of the later steps
    proc = subprocess.Popen(
        ["bash", str(SCRIPTS / "prepare-wmt14en2de.sh")] + [str(a) for a in args],
        cwd=str(REPO_ROOT),
        env=script_env(BPE_TOKENS="200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    try:
        while not (out / ".stamps" / "learn-bpe.done").exists():
            assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.stdout.read()
            assert time.time() < deadline, "learn-bpe did not finish in time"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed_log = proc.communicate(timeout=60)[0]
    assert proc.returncode == -signal.SIGKILL, killed_log
    assert "skip normalise (done)" in killed_log and "step tokenise" in killed_log
    assert not (out / ".stamps" / "finish.done").exists()
    assert not (out / "prep.json").exists()

    # 3. the next run resumes after the last finished step and completes
    resumed = run_script("prepare-wmt14en2de.sh", args, env=script_env(BPE_TOKENS="200"))
    assert resumed.returncode == 0, show(resumed)
    assert {"normalise", "tokenise", "learn-bpe"} <= set(steps_skipped(resumed))
    assert steps_run(resumed)[-1] == "finish"
    assert not list(out.rglob("*.tmp")), "temporary files left behind"

    # 4. byte-identical to the uninterrupted run
    expected, actual = output_bytes(ende["out"]), output_bytes(out)
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert actual[name] == expected[name], f"{name} differs from the uninterrupted run"


# --------------------------------------------------------------------------- prepare: WMT14 En-Fr


def test_prepare_wmt14en2fr_sentencepiece_filtered_test_set(wmt_raw, pipeline_root):
    """En-Fr with all five corpora (UN and giga-fren's .tar of .gz files included), a
    sentencepiece unigram model and the filtered newstest2014 (test-filtered.tgz:
    test/newstest2014-fren-*.sgm), offline, from a raw directory without the full
    test set's archive, and with a checksums file that does not pin dev.tgz (no
    published checksum): dev.tgz is reported, not verified."""
    raw = pipeline_root / "raw-no-test-full"
    raw.mkdir()
    for path in wmt_raw["raw"].iterdir():
        if path.name != "test-full.tgz":
            os.symlink(path, raw / path.name)
    sums = pipeline_root / "wmt14-no-dev.sha256"
    sums.write_text("".join(line + "\n" for line in read_lines(wmt_raw["checksums"]) if "dev.tgz" not in line))
    out = pipeline_root / "wmt14_en_fr"
    proc = run_script(
        "prepare-wmt14en2fr.sh",
        [
            "--raw-dir",
            raw,
            "--out",
            out,
            "--checksums",
            sums,
            "--spm",
            "unigram",
            "--bpe-tokens",
            "300",
            "--test",
            "filtered",
            "--offline",
        ],
    )
    assert proc.returncode == 0, show(proc)
    assert "no published checksum for dev.tgz" in proc.stderr
    assert "dev.tgz" in (out / "unverified-archives.sha256").read_text()

    expected_en = [line for corpus in wmt_raw["train_fr"] for line in corpus[0]]
    assert read_lines(out / "text" / "train.raw.en") == expected_en
    assert read_lines(out / "ref" / "test.raw.fr") == [s.strip() for s in wmt_raw["test_fr"][1][:N_TEST_FILTERED]]
    assert (out / "spm.model").is_file() and not (out / "code").exists()
    assert "\u2581" in read_lines(out / "text" / "test.bpe.fr")[0]
    assert not (out / "text" / "train.tok.en").exists()  # sentencepiece works on untokenised text
    assert (out / "ref" / "test.tok.fr").is_file()
    data_bin = out / "data-bin"
    assert (data_bin / "dict.en.txt").read_bytes() == (data_bin / "dict.fr.txt").read_bytes()
    assert len(translation_scoring.indexed_dataset_sizes(data_bin / "test.en-fr.fr.idx")) == N_TEST_FILTERED
    prep = json.loads((out / "prep.json").read_text())
    assert prep["segmentation"] == "sentencepiece" and prep["target_lang"] == "fr"
    assert prep["test_set"] == "newstest2014-filtered"


# --------------------------------------------------------------------------- prepare: failures


def test_prepare_fails_clearly_on_bad_checksum_missing_archive_and_failed_download(lm1b_raw, pipeline_root):
    bad = pipeline_root / "bad.sha256"
    bad.write_text(f"{'0' * 64}  {LM1B_ARCHIVE}\n")
    out = pipeline_root / "lm1b_bad"
    proc = run_script("prepare-lm1b.sh", ["--raw-dir", lm1b_raw["raw"], "--out", out, "--checksums", bad])
    assert proc.returncode != 0
    assert "checksum mismatch" in proc.stderr
    assert f'FAILED in step "fetch-{LM1B_ARCHIVE}"' in proc.stderr
    assert (lm1b_raw["raw"] / LM1B_ARCHIVE).exists()  # the user's file is left alone

    # the built-in (real) checksum rejects the stand-in archive
    proc = run_script("prepare-lm1b.sh", ["--raw-dir", lm1b_raw["raw"], "--out", pipeline_root / "lm1b_real"])
    assert proc.returncode != 0 and "size mismatch" in proc.stderr

    # archive missing and downloads disabled
    proc = run_script("prepare-lm1b.sh", ["--raw-dir", pipeline_root, "--out", pipeline_root / "lm1b_off", "--offline"])
    assert proc.returncode != 0 and "OFFLINE=1" in proc.stderr

    # a download that fails (nothing listens on the port)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_script(
        "prepare-lm1b.sh", ["--out", pipeline_root / "lm1b_nonet", "--mirror", f"http://127.0.0.1:{port}"]
    )
    assert proc.returncode != 0
    assert f"download of http://127.0.0.1:{port}/{LM1B_ARCHIVE} failed" in proc.stderr
    assert f'FAILED in step "fetch-{LM1B_ARCHIVE}"' in proc.stderr

    # bad option
    proc = run_script("prepare-wmt14en2de.sh", ["--test", "half"])
    assert proc.returncode != 0 and "--test must be full or filtered" in proc.stderr


# --------------------------------------------------------------------------- prepare: 1B words


def test_prepare_lm1b_downloads_verifies_and_binarises(lm1b, lm1b_raw):
    out: Path = lm1b["out"]
    proc = lm1b["proc"]
    assert "downloading http://127.0.0.1:" in proc.stderr
    assert (out / "downloads" / LM1B_ARCHIVE).read_bytes() == (lm1b_raw["raw"] / LM1B_ARCHIVE).read_bytes()
    assert "sha256 OK" in proc.stderr
    assert read_lines(out / "text" / "train.txt") == lm1b_raw["train"]  # shards 00001..00099 in order
    assert read_lines(out / "text" / "test.txt") == lm1b_raw["test"]  # held-out shard 00000
    assert read_lines(out / "text" / "valid.txt") == lm1b_raw["valid"]  # held-out shard 00001
    data_bin = out / "data-bin"
    sizes = translation_scoring.indexed_dataset_sizes(data_bin / "test.idx")
    assert sizes == [len(line.split()) + 1 for line in lm1b_raw["test"]]  # tokens as is, + </s>
    # --only-source with the full vocabulary: every training word type is in the dictionary
    vocab = {
        line.rsplit(" ", 1)[0] for line in read_lines(data_bin / "dict.txt") if not line.startswith("madeupword")
    }  # fairseq's padding to a multiple of 8
    assert vocab == {w for line in lm1b_raw["train"] for w in line.split()}
    assert "adaptive softmax cut-offs" in proc.stderr  # the tiny vocabulary is flagged
    rerun = run_script(
        "prepare-lm1b.sh", ["--out", out, "--mirror", "http://127.0.0.1:9", "--checksums", lm1b_raw["checksums"]]
    )
    assert rerun.returncode == 0, show(rerun)
    assert steps_run(rerun) == []  # nothing downloaded again
    # nor once the downloaded archive is deleted to save space
    (out / "downloads" / LM1B_ARCHIVE).unlink()
    rerun = run_script(
        "prepare-lm1b.sh", ["--out", out, "--mirror", "http://127.0.0.1:9", "--checksums", lm1b_raw["checksums"]]
    )
    assert rerun.returncode == 0, show(rerun)
    assert steps_run(rerun) == [] and "the archive itself is no longer here" in rerun.stderr


# --------------------------------------------------------------------------- BLEU


def multi_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """An independent multi-bleu.perl: corpus BLEU-4 over whitespace tokens, single
    reference, no smoothing, brevity penalty exp(1 - r/c) when c < r."""
    matches, totals = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs):
        h, r = hyp.split(), ref.split()
        hyp_len += len(h)
        ref_len += len(r)
        for n in range(1, 5):
            h_ngrams = collections.Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_ngrams = collections.Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, r_ngrams[g]) for g, c in h_ngrams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_precision)


COMPOUND_CASES = {
    "rich-text format": "rich ##AT##-##AT## text format",
    "E-Mail-Adresse und US-Präsident": "E ##AT##-##AT## Mail ##AT##-##AT## Adresse und US ##AT##-##AT## Präsident",
    # matches do not overlap (left to right, like Perl's s///g): "b" is used by the first
    "a-b-c": "a ##AT##-##AT## b-c",
    # the Moses -a hyphen token "@-@" is split too, identically in hypothesis and reference
    "Ost @-@ West": "Ost @ ##AT##-##AT## @ West",
    "- a -b c- d": "- a -b c- d",
}


def test_compound_splitting_is_the_t2t_rule():
    for line, expected in COMPOUND_CASES.items():
        assert translation_scoring.split_compounds(line) == expected, line
    perl = shutil.which("perl")
    if perl:  # the rule of t2t's get_ende_bleu.sh, run by Perl itself
        lines = list(COMPOUND_CASES)
        proc = subprocess.run(
            [perl, "-ple", "s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            check=True,
        )
        assert proc.stdout.splitlines() == [translation_scoring.split_compounds(line) for line in lines]


def fixed_translation_case(tmp: Path):
    """Real German references (newstest2012) and deterministic hypotheses: some
    identical, some with a word dropped, some with two words swapped, one empty."""
    from sacremoses import MosesTokenizer

    require_shared_data()
    refs_raw = read_lines(SHARED_DATA / "wmt-newstest2008-2012-en-de" / "newstest2012.de", 100, 24)
    srcs = read_lines(SHARED_DATA / "wmt-newstest2008-2012-en-de" / "newstest2012.en", 100, 24)
    tok = MosesTokenizer(lang="de")
    refs_tok = [tok.tokenize(r, aggressive_dash_splits=True, escape=True, return_str=True) for r in refs_raw]
    hyps_tok = []
    for i, ref in enumerate(refs_tok):
        words = ref.split()
        if i % 4 == 1 and len(words) > 3:
            words = words[:2] + words[3:]
        elif i % 4 == 2 and len(words) > 4:
            words[1], words[3] = words[3], words[1]
        elif i == 23:
            words = []
        hyps_tok.append(" ".join(words))
    # hyphenated compounds, so that splitting matters
    refs_tok[0] = "Die Ost @-@ West-Beziehungen und E-Mail-Adressen"
    hyps_tok[0] = "Die Ost-West-Beziehungen und E-Mails"
    ref_dir = tmp / "ref"
    ref_dir.mkdir(parents=True)
    (ref_dir / "test.raw.en").write_text("".join(s + "\n" for s in srcs), encoding="utf-8")
    (ref_dir / "test.raw.de").write_text("".join(s + "\n" for s in refs_raw), encoding="utf-8")
    (ref_dir / "test.tok.de").write_text("".join(s + "\n" for s in refs_tok), encoding="utf-8")
    # fairseq-generate output: sentences in length order, with S/T/H/D/P lines
    order = sorted(range(len(srcs)), key=lambda i: (len(srcs[i]), i))
    lines = []
    for i in order:
        lines += [
            f"S-{i}\t{srcs[i]}",
            f"T-{i}\t{refs_tok[i]}",
            f"H-{i}\t-0.5\t{hyps_tok[i]}",
            f"D-{i}\t-0.5\t{hyps_tok[i]}",
            f"P-{i}\t-0.5 -0.5",
        ]
    generate = tmp / "generate-test.txt"
    generate.write_text("some log line\n" + "\n".join(lines) + "\nGenerate test with beam=4\n", encoding="utf-8")
    return {
        "generate": generate,
        "ref_dir": ref_dir,
        "refs_raw": refs_raw,
        "refs_tok": refs_tok,
        "hyps_tok": hyps_tok,
        "lines": lines,
    }


def test_bleu_tooling_agrees_with_sacrebleu_and_multi_bleu(tmp_path):
    import sacrebleu
    from sacremoses import MosesDetokenizer

    case = fixed_translation_case(tmp_path)
    out = tmp_path / "scores"
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "score",
            case["generate"],
            "--ref-dir",
            case["ref_dir"],
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--output-dir",
            out,
        ]
    )
    assert proc.returncode == 0, show(proc)
    result = json.loads((out / "bleu.json").read_text())
    assert result["sentences"] == 24

    hyps, refs = case["hyps_tok"], case["refs_tok"]
    split = translation_scoring.split_compounds
    # tokenised BLEU, with and without compound splitting: sacreBLEU tokenize='none'
    # and an independent multi-bleu.perl
    plain = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none", force=True).score
    compound = sacrebleu.corpus_bleu(
        [split(h) for h in hyps], [[split(r) for r in refs]], tokenize="none", smooth_method="none", force=True
    ).score
    assert result["tokenized_bleu"] == pytest.approx(round(plain, 2), abs=1e-9)
    assert result["tokenized_bleu_compound_split"] == pytest.approx(round(compound, 2), abs=1e-9)
    assert plain == pytest.approx(multi_bleu(hyps, refs), abs=1e-6)
    assert compound == pytest.approx(multi_bleu([split(h) for h in hyps], [split(r) for r in refs]), abs=1e-6)
    assert compound != pytest.approx(plain, abs=1e-3)  # the splitting was applied
    compound_hyps = read_lines(out / "hyp.tok.compound.de")
    assert compound_hyps[0] == ("Die Ost ##AT##-##AT## West ##AT##-##AT## Beziehungen und E ##AT##-##AT## Mails")
    assert read_lines(out / "ref.tok.compound.de")[0] == (
        "Die Ost @ ##AT##-##AT## @ West ##AT##-##AT## Beziehungen und E ##AT##-##AT## Mail ##AT##-##AT## Adressen"
    )

    # detokenised sacreBLEU against the raw references, with its signature
    detok = MosesDetokenizer(lang="de")
    hyps_detok = [detok.detokenize(h.split()) for h in hyps]
    assert read_lines(out / "hyp.detok.de") == hyps_detok
    bleu = sacrebleu.metrics.BLEU()
    expected = bleu.corpus_score(hyps_detok, [case["refs_raw"]])
    assert result["sacrebleu"] == pytest.approx(round(expected.score, 2), abs=1e-9)
    assert result["sacrebleu_signature"] == str(bleu.get_signature())
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in proc.stdout
    assert "compound splitting" in proc.stdout

    # the same through the library, and no compound splitting for --compound-split no
    assert translation_scoring.tokenized_bleu(hyps, refs, compound_split=True).score == pytest.approx(compound)
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "score",
            case["generate"],
            "--ref-dir",
            case["ref_dir"],
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--output-dir",
            out,
            "--compound-split",
            "no",
        ]
    )
    assert proc.returncode == 0, show(proc)
    assert json.loads((out / "bleu.json").read_text())["tokenized_bleu_compound_split"] is None


def test_score_without_output_dir_writes_beside_its_input_and_says_where(tmp_path):
    case = fixed_translation_case(tmp_path / "case")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    relative = os.path.relpath(case["generate"], elsewhere)
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "score",
            relative,
            "--ref-dir",
            case["ref_dir"],
            "--source-lang",
            "en",
            "--target-lang",
            "de",
        ],
        cwd=elsewhere,
    )
    assert proc.returncode == 0, show(proc)
    beside = case["generate"].parent
    assert (beside / "bleu.json").is_file() and (beside / "hyp.detok.de").is_file()
    assert list(elsewhere.iterdir()) == []
    assert f"outputs in {beside.resolve()}" in proc.stdout


def test_evaluate_fails_loudly_on_a_dropped_sentence(tmp_path):
    case = fixed_translation_case(tmp_path)
    kept = [line for line in case["lines"] if not re.match(r"[HD]-7\t", line)]
    dropped = tmp_path / "generate-dropped.txt"
    dropped.write_text("\n".join(kept) + "\n", encoding="utf-8")
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "score",
            dropped,
            "--ref-dir",
            case["ref_dir"],
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--output-dir",
            tmp_path / "scores",
        ]
    )
    assert proc.returncode == 3
    assert "23 hypotheses for the 24 test sentences" in proc.stderr
    assert "missing 1 sentence id(s): 7" in proc.stderr
    assert "--required-batch-size-multiple 1" in proc.stderr
    assert not (tmp_path / "scores" / "bleu.json").exists()
    with pytest.raises(translation_scoring.IncompleteOutput):
        translation_scoring.check_complete([0, 1, 3], 4)
    translation_scoring.check_complete([2, 0, 1, 3], 4)


# --------------------------------------------------------------------------- checkpoints


def average_checkpoints_module():
    """scripts/average_checkpoints.py as a module: a command-line entry point, loaded from
    its path (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        "distattn_average_checkpoints_script", SCRIPTS / "average_checkpoints.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_last_checkpoints_are_chosen_by_number(tmp_path):
    average_checkpoints = average_checkpoints_module()
    for name in (
        "checkpoint1.pt",
        "checkpoint2.pt",
        "checkpoint10.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
        "checkpoint_3_900.pt",
        "checkpoint_3_1000.pt",
        "checkpoint_2_100.pt",
    ):
        (tmp_path / name).write_bytes(b"")
    names = lambda paths: [p.name for p in paths]  # noqa: E731
    assert names(average_checkpoints.last_checkpoints(tmp_path, 2)) == ["checkpoint2.pt", "checkpoint10.pt"]
    assert names(average_checkpoints.last_checkpoints(tmp_path, 2, by="update")) == [
        "checkpoint_3_900.pt",
        "checkpoint_3_1000.pt",
    ]
    assert names(average_checkpoints.last_checkpoints(tmp_path, 2, by="update", upper_bound=900)) == [
        "checkpoint_2_100.pt",
        "checkpoint_3_900.pt",
    ]
    with pytest.raises(SystemExit, match="need 4"):
        average_checkpoints.last_checkpoints(tmp_path, 4)


def test_average_two_checkpoints_is_their_mean_and_translates(ende, tmp_path):
    import torch

    import fairseq_distattn.models  # noqa: F401  (safe globals: torch.load stays weights_only)

    out: Path = ende["out"]
    save_dir = tmp_path / "checkpoints"
    train = subprocess.run(
        [
            str(BIN_DIR / "fairseq-train"),
            str(out / "data-bin"),
            "--user-dir",
            "fairseq_distattn",
            "--task",
            "translation",
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--arch",
            "distattn_transformer",
            "--share-all-embeddings",
            "--encoder-layers",
            "1",
            "--decoder-layers",
            "1",
            "--encoder-embed-dim",
            "32",
            "--decoder-embed-dim",
            "32",
            "--encoder-ffn-embed-dim",
            "64",
            "--decoder-ffn-embed-dim",
            "64",
            "--encoder-attention-heads",
            "2",
            "--decoder-attention-heads",
            "2",
            "--optimizer",
            "adam",
            "--lr",
            "0.005",
            "--max-tokens",
            "1000",
            "--max-update",
            "2",
            "--save-interval-updates",
            "1",
            "--no-epoch-checkpoints",
            "--disable-validation",
            "--save-dir",
            str(save_dir),
            "--seed",
            "1",
            "--num-workers",
            "0",
            "--log-format",
            "simple",
        ],
        capture_output=True,
        text=True,
        cwd=str(REPO_ROOT),
        env=script_env(),
        timeout=600,
    )
    assert train.returncode == 0, show(train)
    first, second = save_dir / "checkpoint_1_1.pt", save_dir / "checkpoint_1_2.pt"
    assert first.is_file() and second.is_file(), sorted(p.name for p in save_dir.iterdir())

    averaged = tmp_path / "averaged.pt"
    proc = run_python(
        [
            SCRIPTS / "average_checkpoints.py",
            "--inputs",
            save_dir,
            "--num-update-checkpoints",
            "2",
            "--output",
            averaged,
        ]
    )
    assert proc.returncode == 0, show(proc)

    a = torch.load(first, map_location="cpu", weights_only=True)["model"]
    b = torch.load(second, map_location="cpu", weights_only=True)["model"]
    avg_state = torch.load(averaged, map_location="cpu", weights_only=True)
    avg = avg_state["model"]
    assert list(avg) == list(a)
    changed = 0
    for key in a:
        assert avg[key].dtype == a[key].dtype and avg[key].shape == a[key].shape, key
        if a[key].is_floating_point():
            torch.testing.assert_close(
                avg[key], (a[key].double() + b[key].double()).div(2).to(a[key].dtype), rtol=0, atol=1e-7
            )
            changed += int(not torch.equal(a[key], b[key]))
        else:
            assert torch.equal(avg[key], torch.div(a[key] + b[key], 2, rounding_mode="floor")), key
    assert changed > 5, "the two checkpoints should differ after an update"
    assert "last_optimizer_state" not in avg_state and "cfg" in avg_state

    # the average translates the whole test set through scripts/evaluate.py
    eval_dir = tmp_path / "eval"
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "mt",
            out,
            "--path",
            averaged,
            "--output-dir",
            eval_dir,
            "--cpu",
            "--",
            "--max-len-a",
            "0",
            "--max-len-b",
            "8",
        ]
    )
    assert proc.returncode == 0, show(proc)
    assert "--beam 4 --lenpen 0.6 --remove-bpe subword_nmt" in proc.stderr
    assert (
        proc.stderr.rstrip().endswith("--required-batch-size-multiple 1")
        or "--required-batch-size-multiple 1" in proc.stderr
    )
    result = json.loads((eval_dir / "bleu.json").read_text())
    assert result["sentences"] == N_TEST_FULL and result["hypotheses"] == N_TEST_FULL
    assert result["test_set"] == "newstest2014-full"
    assert "tokenized BLEU, compound splitting" in proc.stdout and "sacreBLEU" in proc.stdout
    assert len(read_lines(eval_dir / "hyp.detok.de")) == N_TEST_FULL


def test_language_model_perplexity_on_lm1b(lm1b, tmp_path):
    out: Path = lm1b["out"]
    save_dir = tmp_path / "lm"
    train = subprocess.run(
        [
            str(BIN_DIR / "fairseq-train"),
            str(out / "data-bin"),
            "--user-dir",
            "fairseq_distattn",
            "--task",
            "language_modeling",
            "--arch",
            "distattn_lm",
            "--decoder-layers",
            "1",
            "--decoder-embed-dim",
            "32",
            "--decoder-ffn-embed-dim",
            "64",
            "--decoder-attention-heads",
            "2",
            "--decoder-self-attention",
            "window-mw@0",
            "--criterion",
            "adaptive_loss",
            "--adaptive-softmax-cutoff",
            "1000,3000",
            "--ddp-backend",
            "legacy_ddp",
            "--sample-break-mode",
            "eos",
            "--tokens-per-sample",
            "128",
            "--max-tokens",
            "1000",
            "--optimizer",
            "adam",
            "--lr",
            "0.001",
            "--max-update",
            "2",
            "--disable-validation",
            "--save-dir",
            str(save_dir),
            "--seed",
            "1",
            "--num-workers",
            "0",
            "--log-format",
            "simple",
        ],
        capture_output=True,
        text=True,
        cwd=str(REPO_ROOT),
        env=script_env(),
        timeout=600,
    )
    assert train.returncode == 0, show(train)
    eval_dir = tmp_path / "eval"
    proc = run_python(
        [
            SCRIPTS / "evaluate.py",
            "lm",
            out,
            "--path",
            save_dir / "checkpoint_last.pt",
            "--output-dir",
            eval_dir,
            "--tokens-per-sample",
            "128",
            "--cpu",
        ]
    )
    assert proc.returncode == 0, show(proc)
    result = json.loads((eval_dir / "perplexity.json").read_text())
    assert result["tokens"] == sum(translation_scoring.indexed_dataset_sizes(out / "data-bin" / "test.idx"))
    assert 1 < result["perplexity"] < 1e6
    assert result["settings"]["sample_break_mode"] == "eos" and result["settings"]["softmax_batch"] == 1024
