"""The README's code blocks run as written.

Every ```python block is executed. Every ```bash block is run with bash from
the repository root, the fairseq commands of this virtualenv first on PATH,
after these substitutions only (so a README command that no longer works
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
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import BIN_DIR, REPO_ROOT, cli_env
except ImportError:  # rootdir-relative import mode without the package
    from conftest import BIN_DIR, REPO_ROOT, cli_env

README = REPO_ROOT / "README.md"


def code_blocks(language: str) -> List[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_the_readme_has_the_blocks_this_file_runs():
    bash = code_blocks("bash")
    assert len(bash) == 3
    assert any("fairseq-validate" in block and "fairseq-interactive" in block for block in bash)
    assert any("fairseq-eval-lm" in block for block in bash)
    assert any(block.lstrip().startswith("DATA=") and "torchrun" in block for block in bash)
    assert len(code_blocks("python")) >= 1


def test_the_architecture_table_lists_every_registered_architecture():
    """The table is typed (its last column explains each preset), so this keeps it whole."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_distattn.models  # noqa: F401 (registers the architectures)

    section = README.read_text(encoding="utf-8").split("### Architectures", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `(distattn_\w+)` \|", section, flags=re.M))
    registered = {name for name in ARCH_MODEL_REGISTRY if name.startswith("distattn_")}
    assert listed == registered, f"missing {sorted(registered - listed)}, unknown {sorted(listed - registered)}"


def test_generated_results_in_the_readme_equal_their_results_files():
    from fairseq_distattn.tools.generated_blocks import generated_blocks, readme_copy

    blocks = generated_blocks(README.read_text(encoding="utf-8"))
    assert {
        "benchmarks/results/quality/quality.md",
        "benchmarks/results/extrapolation/extrapolation.md",
        "benchmarks/results/summary.md",
        "docs/mechanisms.md",
        "docs/flags.md",
        "docs/spec-grammar.md",
    } <= set(blocks)
    for source, body in blocks.items():
        assert body == readme_copy((REPO_ROOT / source).read_text(encoding="utf-8")), (
            f"README.md's copy of {source} is stale or edited by hand: run the command named in its marker"
        )


@pytest.mark.parametrize("index", range(len(code_blocks("python"))))
def test_python_block_runs(index):
    exec(compile(code_blocks("python")[index], f"README.md python block {index}", "exec"), {})


def substitute(block: str, variables: Dict[str, Path], max_update: int, small_batches: bool = False) -> str:
    for name, value in variables.items():
        block, count = re.subn(rf"^{name}=\S+", f"{name}={value}", block, flags=re.M)
        assert count == 1, f"{name}= is not one of the block's first lines"
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


def test_translation_and_multi_process_blocks_run(quickstart_prep, mt_data, tmp_path):
    translation, _, multi_process = code_blocks("bash")
    data = tmp_path / "data-bin"
    proc = run_block(
        substitute(translation, {"PREP": quickstart_prep, "DATA": data, "SAVE": tmp_path / "ckpt"}, max_update=10)
    )
    hypotheses = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    # fairseq-generate's test split, then fairseq-interactive's one sentence
    assert len(hypotheses) == mt_data["n_test"] + 1
    assert "valid on 'valid' subset" in proc.stdout + proc.stderr  # fairseq-validate
    assert (tmp_path / "ckpt" / "averaged.pt").is_file()

    proc = run_block(substitute(multi_process, {"DATA": data, "SAVE": tmp_path / "two"}, max_update=2))
    log = proc.stdout + proc.stderr
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" in log
    assert "done training" in log and (tmp_path / "two" / "checkpoint_last.pt").is_file()


def test_language_model_block_runs(lm_data, tmp_path):
    _, language_model, _ = code_blocks("bash")
    proc = run_block(
        substitute(
            language_model,
            {"TEXT": lm_data["prep"], "DATA": tmp_path / "lm-bin", "SAVE": tmp_path / "ckpt"},
            max_update=2,
            small_batches=True,
        )
    )
    assert re.search(r"Perplexity: [0-9.]+", proc.stdout + proc.stderr)
