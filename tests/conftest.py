"""Shared fixtures: real text, small binarised datasets, and helpers to run the
fairseq command-line tools from this virtualenv.

Real text comes from ``../shared/data`` (relative to the repository root) when it
exists (developer machines and CI), otherwise from the Multi30k sample shipped in
``data/multi30k`` (a user's clone).
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# DISTATTN_SHARED_DATA overrides the location (set it to a missing path to run the
# tests as in a user's clone, on the shipped sample only).
SHARED_DATA = Path(os.environ.get("DISTATTN_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")
SHIPPED_MULTI30K = REPO_ROOT / "data" / "multi30k"
# The virtualenv's bin directory (do not resolve symlinks: .venv/bin/python links
# to the base interpreter, whose directory has no fairseq-* scripts).
BIN_DIR = Path(sys.executable).parent

# Sizes of the small datasets built for the CLI tests.
MT_TRAIN_LINES = 300
MT_VALID_LINES = 30
MT_TEST_LINES = 8
MT_BPE_MERGES = 500
LM_TRAIN_LINES = 300
LM_VALID_LINES = 40
LM_TEST_LINES = 40


# --------------------------------------------------------------------------- helpers


def read_lines(path: Path, limit: Optional[int] = None, skip: int = 0) -> List[str]:
    """Lines of a text file (``.gz`` is decompressed), without line ends.

    Skips the first ``skip`` lines and returns at most ``limit`` lines.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    out: List[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if limit is not None and len(out) >= limit:
                break
            out.append(line.rstrip("\n"))
    return out


def find_text(directory: Path, name: str) -> Path:
    """``directory/name`` or ``directory/name.gz``, whichever exists."""
    for candidate in (directory / name, directory / (name + ".gz")):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"neither {directory / name} nor {directory / name}.gz exists")


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def tool(name: str) -> str:
    """Absolute path of a console script (fairseq-train, subword-nmt, ...) in this venv."""
    path = BIN_DIR / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH")
        return found
    return str(path)


def cli_env() -> Dict[str, str]:
    """Environment for CLI subprocesses.

    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is removed on purpose: checkpoints must load with
    torch's default ``weights_only=True`` thanks to the safe globals the plugin
    registers.
    """
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(
    args: Sequence[str],
    *,
    input: Optional[str] = None,
    check: bool = True,
    timeout: float = 600,
    cwd: Optional[Path] = None,
) -> subprocess.CompletedProcess:
    """Run a console script (``args[0]`` is its name, e.g. ``fairseq-train``) from the
    repository root, so that ``--user-dir fairseq_distattn`` resolves as for a user.

    With ``check`` a non-zero exit fails the test and shows the end of the output.
    """
    cmd = [tool(args[0])] + [str(a) for a in args[1:]]
    proc = subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        text=True,
        cwd=str(cwd or REPO_ROOT),
        env=cli_env(),
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"command failed with exit status {proc.returncode}:\n  {' '.join(cmd)}\n"
            f"--- stdout (last 3000 chars) ---\n{proc.stdout[-3000:]}\n"
            f"--- stderr (last 5000 chars) ---\n{proc.stderr[-5000:]}",
            pytrace=False,
        )
    return proc


def moses_tokenise(lines: Sequence[str], lang: str) -> List[str]:
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line.strip(), escape=False, return_str=True) for line in lines]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data_dir() -> Optional[Path]:
    """``../shared/data`` next to the repository, or None in a user's clone."""
    return SHARED_DATA if SHARED_DATA.is_dir() else None


@pytest.fixture(scope="session")
def multi30k_dir(shared_data_dir) -> Path:
    """Directory with Multi30k {train,val,test_2016_flickr}.{en,de} (plain or .gz)."""
    if shared_data_dir is not None and (shared_data_dir / "multi30k" / "train.en").is_file():
        return shared_data_dir / "multi30k"
    return SHIPPED_MULTI30K


@pytest.fixture(scope="session")
def real_text(multi30k_dir) -> Dict[str, Path]:
    """Paths of real parallel text (Multi30k En-De; may be gzipped: use read_lines).

    Keys: ``train.en``, ``train.de``, ``valid.en``, ``valid.de``, ``test.en``, ``test.de``.
    """
    names = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    return {
        f"{split}.{lang}": find_text(multi30k_dir, f"{name}.{lang}")
        for split, name in names.items()
        for lang in ("en", "de")
    }


@pytest.fixture(scope="session")
def lm_text_source(shared_data_dir, multi30k_dir) -> Path:
    """A real English LM corpus: the 1B-Word-style sample, else WikiText-2 valid,
    else Multi30k English train (shipped)."""
    if shared_data_dir is not None:
        for rel in ("lm1b-sample-allennlp/sample.txt", "wikitext-2/valid.txt"):
            if (shared_data_dir / rel).is_file():
                return shared_data_dir / rel
    return find_text(multi30k_dir, "train.en")


@pytest.fixture(scope="session")
def mt_data(tmp_path_factory, real_text) -> Dict[str, Path]:
    """A small binarised En->De translation dataset built with the real tools.

    Multi30k lines (train 300, valid 30, test 8) -> sacremoses -> joint BPE
    (subword-nmt, 500 merges) -> ``fairseq-preprocess --joined-dictionary``.
    Returns ``bin`` (data-bin dir), ``codes`` (BPE codes), ``raw_test_en`` (raw
    English test sentences file) and ``prep`` (the text directory).
    """
    root = tmp_path_factory.mktemp("mt_data")
    prep = root / "prep"
    sizes = {"train": MT_TRAIN_LINES, "valid": MT_VALID_LINES, "test": MT_TEST_LINES}
    for split, n in sizes.items():
        for lang in ("en", "de"):
            raw = read_lines(real_text[f"{split}.{lang}"], limit=n)
            assert len(raw) == n, f"{real_text[f'{split}.{lang}']} has fewer than {n} lines"
            write_lines(prep / f"{split}.raw.{lang}", raw)
            write_lines(prep / f"{split}.tok.{lang}", moses_tokenise(raw, lang))

    joint = prep / "train.tok.joint"
    joint.write_text(
        (prep / "train.tok.en").read_text(encoding="utf-8") + (prep / "train.tok.de").read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    codes = prep / "codes"
    run_cli(["subword-nmt", "learn-bpe", "-s", MT_BPE_MERGES, "-i", joint, "-o", codes])
    for split in sizes:
        for lang in ("en", "de"):
            run_cli(
                [
                    "subword-nmt",
                    "apply-bpe",
                    "-c",
                    codes,
                    "-i",
                    prep / f"{split}.tok.{lang}",
                    "-o",
                    prep / f"{split}.bpe.{lang}",
                ]
            )

    data_bin = root / "data-bin"
    run_cli(
        [
            "fairseq-preprocess",
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--trainpref",
            prep / "train.bpe",
            "--validpref",
            prep / "valid.bpe",
            "--testpref",
            prep / "test.bpe",
            "--destdir",
            data_bin,
            "--joined-dictionary",
            "--workers",
            "1",
        ]
    )
    for name in ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "test.en-de.de.idx"):
        assert (data_bin / name).is_file(), f"fairseq-preprocess did not write {name}"
    return {
        "bin": data_bin,
        "codes": codes,
        "prep": prep,
        "raw_test_en": prep / "test.raw.en",
        "n_test": MT_TEST_LINES,
        "n_valid": MT_VALID_LINES,
    }


@pytest.fixture(scope="session")
def lm_data(tmp_path_factory, lm_text_source) -> Dict[str, Path]:
    """A small binarised language-modelling dataset (``fairseq-preprocess
    --only-source``) from real English text (train 300, valid 40, test 40 lines).

    The 1B-Word sample and WikiText are already tokenised; the Multi30k fallback is
    Moses-tokenised here. Returns ``bin`` and ``prep``.
    """
    root = tmp_path_factory.mktemp("lm_data")
    prep = root / "prep"
    total = LM_TRAIN_LINES + LM_VALID_LINES + LM_TEST_LINES
    lines = [line for line in read_lines(lm_text_source, limit=4 * total) if line.strip()]
    lines = lines[:total]
    assert len(lines) == total, f"{lm_text_source} has fewer than {total} non-blank lines"
    if "multi30k" in str(lm_text_source):
        lines = moses_tokenise(lines, "en")
    splits = {
        "train": lines[:LM_TRAIN_LINES],
        "valid": lines[LM_TRAIN_LINES : LM_TRAIN_LINES + LM_VALID_LINES],
        "test": lines[LM_TRAIN_LINES + LM_VALID_LINES :],
    }
    for split, split_lines in splits.items():
        write_lines(prep / f"{split}.txt", split_lines)
    data_bin = root / "data-bin"
    run_cli(
        [
            "fairseq-preprocess",
            "--only-source",
            "--trainpref",
            prep / "train.txt",
            "--validpref",
            prep / "valid.txt",
            "--testpref",
            prep / "test.txt",
            "--destdir",
            data_bin,
            "--workers",
            "1",
        ]
    )
    for name in ("dict.txt", "train.bin", "valid.bin", "test.bin"):
        assert (data_bin / name).is_file(), f"fairseq-preprocess did not write {name}"
    return {"bin": data_bin, "prep": prep}


@pytest.fixture
def workdir():
    """A scratch directory removed after the test (checkpoints are large: pytest's
    tmp_path would keep the last runs' copies on disk)."""
    path = Path(tempfile.mkdtemp(prefix="distattn-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
