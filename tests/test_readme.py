"""The documentation's code blocks run as written: README.md and every page
under docs/.

Every ```python block is executed, each in a Python process of its own. Every ```bash block is run with bash from
the repository root, the fairseq commands of this virtualenv first on PATH,
after these substitutions only (so a documented command that no longer works
fails here):

- the variable assignments of its first lines (``PREP=``, ``TEXT=``, ``DATA=``,
  ``SAVE=``) point at the small real-text datasets of conftest.py and at a
  scratch directory (the quickstart names ``val.bpe`` and ``codes.6000`` are
  links to them);
- training sizes: ``--max-update`` N becomes a few updates, and the last 2
  epoch checkpoints are averaged instead of 5 (the 300 training pairs are 5
  batches of 4096 tokens: 10 updates make 2 epochs); in the language-model
  block ``--max-tokens 4096`` becomes 1024 and ``--tokens-per-sample 512`` 64
  (the preset is 12 layers x 512 wide).

The blocks that continue another (the translation block of docs/usage.md and
the multi-process one of docs/multi-process-cpu.md use the README translation
block's data and checkpoints) run after it, in one test.

The pages' other promises are checked too: each generated block equals its
file, the typed architecture table lists every registered architecture, and
every relative link points at a file (and heading) that exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import BIN_DIR, REPO_ROOT, cli_env
except ImportError:  # rootdir-relative import mode without the package
    from conftest import BIN_DIR, REPO_ROOT, cli_env

README = REPO_ROOT / "README.md"
PAGES = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
ARCHITECTURES = REPO_ROOT / "docs" / "architectures.md"

# Every ```bash block of the pages, by page and in page order; the tests below
# run each once, by its name.
BASH_BLOCKS = {
    "README.md": ["translation", "language model"],
    "docs/usage.md": ["translation, continued"],
    "docs/multi-process-cpu.md": ["several processes"],
}


def name(page: Path) -> str:
    return page.relative_to(REPO_ROOT).as_posix()


def code_blocks(language: str, page: Path = README) -> List[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", page.read_text(encoding="utf-8"), flags=re.M | re.S)


def bash_block(block_name: str) -> str:
    for page, names in BASH_BLOCKS.items():
        if block_name in names:
            return code_blocks("bash", REPO_ROOT / page)[names.index(block_name)]
    raise KeyError(block_name)


PYTHON_BLOCKS: List[Tuple[str, int]] = [
    (name(page), index) for page in PAGES for index in range(len(code_blocks("python", page)))
]


def test_the_pages_have_the_blocks_this_file_runs():
    with_bash = {name(page): len(code_blocks("bash", page)) for page in PAGES if code_blocks("bash", page)}
    assert with_bash == {page: len(names) for page, names in BASH_BLOCKS.items()}
    translation = bash_block("translation")
    assert "fairseq-train" in translation and "fairseq-generate" in translation
    continued = bash_block("translation, continued")
    assert "fairseq-validate" in continued and "fairseq-interactive" in continued
    assert "fairseq_distattn.inspect" in continued
    assert "fairseq-eval-lm" in bash_block("language model")
    several = bash_block("several processes")
    assert several.lstrip().startswith("DATA=") and "torchrun" in several
    assert PYTHON_BLOCKS


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    first = "\n".join(lines[:10])
    assert "make quickstart" in first and "make test" in first
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail to a page under docs/"


def test_the_architecture_table_lists_every_registered_architecture():
    """The table is typed (its last column explains each preset), so this keeps it whole."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_distattn.models  # noqa: F401 (registers the architectures)

    section = ARCHITECTURES.read_text(encoding="utf-8").split("\n## ", 1)[0]  # the table, before the notes
    listed = set(re.findall(r"^\| `(distattn_\w+)` \|", section, flags=re.M))
    registered = {name for name in ARCH_MODEL_REGISTRY if name.startswith("distattn_")}
    assert listed == registered, f"missing {sorted(registered - listed)}, unknown {sorted(listed - registered)}"


def test_generated_results_in_the_pages_equal_their_results_files():
    from fairseq_distattn.tools.generated_blocks import generated_blocks, stale_blocks

    blocks = {page: set(generated_blocks(page.read_text(encoding="utf-8"))) for page in PAGES}
    # structure before results: the README shows two tables, the rest is on docs/results.md
    assert blocks[README] == {"docs/mechanisms.md", "benchmarks/results/methods/methods.md"}
    assert {
        "benchmarks/results/quality/quality.md",
        "benchmarks/results/lm_extrapolation/summary.md",
        "benchmarks/results/extrapolation/extrapolation.md",
        "benchmarks/results/lm_quality/lm_quality.md",
        "benchmarks/results/lm_extrapolation/lm_extrapolation.md",
        "docs/flags.md",
        "docs/spec-grammar.md",
    } <= set().union(*blocks.values())
    for page in PAGES:
        assert not stale_blocks(page), (
            f"{name(page)}'s copies of {stale_blocks(page)} are stale or edited by hand: "
            "run the command named in each marker"
        )


def test_a_block_of_the_first_part_stops_at_the_files_first_section(tmp_path):
    """A page may show a results file's first part (its main table), not the sections under it."""
    from fairseq_distattn.tools import generated_blocks as blocks

    source = "# Title\n\nintro\n\n| a |\n|---|\n\n## Ablations\n\n| b |\n"
    assert blocks.readme_copy(source, 2, first_part=True) == "intro\n\n| a |\n|---|\n"
    assert blocks.readme_copy(source, 2) == "intro\n\n| a |\n|---|\n\n### Ablations\n\n| b |\n"


def test_the_readme_shows_the_two_extrapolation_plots():
    text = README.read_text(encoding="utf-8")
    for plot in ("extrapolation/bleu_vs_length.png", "lm_extrapolation/ppl_vs_length.png"):
        assert re.search(rf"!\[[^\]]*\]\([^)]*{re.escape(plot)}\)", text), plot


def outside_code(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> Set[str]:
    """The ids GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    ids: Set[str] = set()
    seen: Dict[str, int] = {}
    text = re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return ids


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_points_at_a_file_that_exists(page):
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", outside_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            dead.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            dead.append(f"{target} (no such heading)")
    assert not dead, f"{name(page)} links to what does not exist: {dead}"


@pytest.mark.parametrize("page, index", PYTHON_BLOCKS, ids=[f"{page}-{index}" for page, index in PYTHON_BLOCKS])
def test_python_block_runs(page, index):
    """In a process of its own, from the repository root: a block may register
    a mechanism or change other global state."""
    block = code_blocks("python", REPO_ROOT / page)[index]
    proc = subprocess.run(
        [sys.executable, "-c", block], cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"--- {page} python block {index} ---\n{block}\n--- stderr ---\n{proc.stderr[-4000:]}"


def substitute(block: str, variables: Dict[str, Path], max_update: int, small_batches: bool = False) -> str:
    for variable, value in variables.items():
        block, count = re.subn(rf"^{variable}=\S+", f"{variable}={value}", block, flags=re.M)
        assert count == 1, f"{variable}= is not one of the block's first lines"
    block = re.sub(r"--max-update \d+", f"--max-update {max_update}", block)
    block = block.replace("--num-epoch-checkpoints 5", "--num-epoch-checkpoints 2")
    if small_batches:
        block = block.replace("--max-tokens 4096", "--max-tokens 1024")
        block = block.replace("--tokens-per-sample 512", "--tokens-per-sample 64")
    return block


def run_block(block: str) -> subprocess.CompletedProcess:
    env = cli_env()
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, f"--- script ---\n{block}\n--- stderr ---\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def quickstart_prep(mt_data, tmp_path_factory) -> Path:
    """mt_data's BPE text under the quickstart's file names."""
    prep = tmp_path_factory.mktemp("prep")
    names = {"train": "train", "val": "valid", "test": "test"}
    for split, source in names.items():
        for lang in ("en", "de"):
            (prep / f"{split}.bpe.{lang}").symlink_to(mt_data["prep"] / f"{source}.bpe.{lang}")
    (prep / "codes.6000").symlink_to(mt_data["codes"])
    return prep


def hypotheses(proc: subprocess.CompletedProcess) -> List[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("H-")]


def test_translation_and_multi_process_blocks_run(quickstart_prep, mt_data, tmp_path):
    data, save = tmp_path / "data-bin", tmp_path / "ckpt"
    paths = {"PREP": quickstart_prep, "DATA": data, "SAVE": save}
    proc = run_block(substitute(bash_block("translation"), paths, max_update=10))
    assert len(hypotheses(proc)) == mt_data["n_test"]  # fairseq-generate's test split
    assert (save / "averaged.pt").is_file()

    proc = run_block(substitute(bash_block("translation, continued"), paths, max_update=10))
    assert "valid on 'valid' subset" in proc.stdout + proc.stderr  # fairseq-validate
    assert len(hypotheses(proc)) == 1  # fairseq-interactive's one sentence
    assert (save / "inspect" / "summary.txt").is_file()  # python -m fairseq_distattn.inspect

    proc = run_block(
        substitute(bash_block("several processes"), {"DATA": data, "SAVE": tmp_path / "two"}, max_update=2)
    )
    log = proc.stdout + proc.stderr
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" in log
    assert "done training" in log and (tmp_path / "two" / "checkpoint_last.pt").is_file()


def test_language_model_block_runs(lm_data, tmp_path):
    proc = run_block(
        substitute(
            bash_block("language model"),
            {"TEXT": lm_data["prep"], "DATA": tmp_path / "lm-bin", "SAVE": tmp_path / "ckpt"},
            max_update=2,
            small_batches=True,
        )
    )
    assert re.search(r"Perplexity: [0-9.]+", proc.stdout + proc.stderr)
