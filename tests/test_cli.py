"""End-to-end tests through the real fairseq command-line tools.

Each test runs the console scripts of this virtualenv (fairseq-train, -generate,
-interactive, -eval-lm) in a subprocess from the repository root with
``--user-dir fairseq_distattn``, on small binarised real-text datasets (see
conftest.py). TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is removed from the subprocess
environment, so every checkpoint reload goes through torch's default
``weights_only=True`` loading.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import List, Sequence

import pytest

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import read_lines, run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import read_lines, run_cli

USER_DIR = ["--user-dir", "fairseq_distattn"]
MT_TASK = ["--task", "translation", "--source-lang", "en", "--target-lang", "de"]
COMMON_TRAIN = [
    "--optimizer",
    "adam",
    "--lr",
    "5e-4",
    "--seed",
    "1",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
]

# Preset dimensions are kept; only the layer count is lowered (the CLI tests must
# stay fast on 2 CPU cores), never below the layer ranges a preset names
# (distattn_window_* and distattn_lm_window_gbw use layers 0-2).
MT_LAYERS_2 = ["--encoder-layers", "2", "--decoder-layers", "2"]
MT_LAYERS_3 = ["--encoder-layers", "3", "--decoder-layers", "3"]
MT_PRESETS = [
    pytest.param(["--arch", "distattn_rpr_wmt_en_de", *MT_LAYERS_2], id="distattn_rpr_wmt_en_de"),
    pytest.param(["--arch", "distattn_da_wmt_en_de", *MT_LAYERS_2], id="distattn_da_wmt_en_de"),
    pytest.param(["--arch", "distattn_window_wmt_en_de", *MT_LAYERS_3], id="distattn_window_wmt_en_de"),
    pytest.param(
        [
            "--arch",
            "distattn_transformer",
            *MT_LAYERS_2,
            "--encoder-self-attention",
            "qvi@0",
            "--decoder-self-attention",
            "distance-mask",
            "--distance-mask-alpha",
            "0.5",
        ],
        id="distattn_transformer-qvi-distance_mask",
    ),
    pytest.param(
        [
            "--arch",
            "distattn_transformer",
            *MT_LAYERS_2,
            "--encoder-self-attention",
            "t5-bias",  # one table shared by both encoder layers
            "--decoder-self-attention",
            "alibi@0,t5-bias@1",
        ],
        id="distattn_transformer-t5_bias-alibi",
    ),
]

LM_PRESETS = [
    pytest.param("distattn_lm_rpr_gbw", 2, id="distattn_lm_rpr_gbw"),
    pytest.param("distattn_lm_da_gbw", 2, id="distattn_lm_da_gbw"),
    pytest.param("distattn_lm_window_gbw", 3, id="distattn_lm_window_gbw"),
    pytest.param("distattn_lm_alibi_gbw", 2, id="distattn_lm_alibi_gbw"),
]

ALL_ARCHS = [
    "distattn_transformer",
    "distattn_transformer_iwslt_de_en",
    "distattn_transformer_wmt_en_de",
    "distattn_transformer_vaswani_wmt_en_de_big",
    "distattn_lm",
    "distattn_lm_gbw",
    "distattn_rpr_wmt_en_de",
    "distattn_da_wmt_en_de",
    "distattn_window_wmt_en_de",
    "distattn_lm_rpr_gbw",
    "distattn_lm_da_gbw",
    "distattn_lm_window_gbw",
    "distattn_lm_alibi_gbw",
]


def hypothesis_ids(output: str) -> List[int]:
    """Sentence ids of the ``H-<id>`` lines of fairseq-generate/-interactive output."""
    return [int(m.group(1)) for m in re.finditer(r"^H-(\d+)\t", output, flags=re.M)]


def train_mt(data_bin: Path, save_dir: Path, arch_args: Sequence[str], max_update: int = 3, extra: Sequence[str] = ()):
    return run_cli(
        [
            "fairseq-train",
            data_bin,
            *USER_DIR,
            *MT_TASK,
            *arch_args,
            *COMMON_TRAIN,
            "--max-tokens",
            "1024",
            "--max-update",
            max_update,
            "--valid-subset",
            "valid",
            "--save-dir",
            save_dir,
            *extra,
        ]
    )


# ----------------------------------------------------------------------------- help


def test_all_architectures_registered_through_the_cli():
    """fairseq's --help does not list the --arch choices, so ask for an unknown
    arch: argparse then lists every registered architecture."""
    proc = run_cli(["fairseq-train", *USER_DIR, *MT_TASK, "--arch", "no_such_arch"], check=False)
    assert proc.returncode == 2
    for arch in ALL_ARCHS:
        assert f"'{arch}'" in proc.stderr, f"arch {arch} is not registered:\n{proc.stderr[-2000:]}"


def plugin_flags() -> List[str]:
    """Every flag the registry declares (the SPEC flags and each mechanism's options)."""
    from fairseq_distattn.models.arguments import OPTION_FLAGS
    from fairseq_distattn.spec import KINDS

    return [kind.flag for kind in KINDS] + [flag.flag for flag in OPTION_FLAGS]


PLUGIN_FLAGS = plugin_flags()


def test_help_lists_plugin_flags():
    proc = run_cli(["fairseq-train", *USER_DIR, "--help"])
    for flag in PLUGIN_FLAGS:
        assert flag in proc.stdout, f"{flag} missing from fairseq-train --help"
    # the flag's help says that recomputed blocks draw their own attention dropout masks
    assert "recomputed blocks draw their own dropout masks" in " ".join(proc.stdout.split())


# ------------------------------------------------------------------ translation presets


@pytest.mark.parametrize("arch_args", MT_PRESETS)
def test_translation_train_generate_interactive(arch_args, mt_data, workdir):
    save_dir = workdir / "checkpoints"
    # Validation on the 30-sentence valid split runs; only checkpoint_best.pt is
    # written, without the (large) Adam state.
    proc = train_mt(
        mt_data["bin"], save_dir, arch_args, max_update=3, extra=["--no-last-checkpoints", "--no-save-optimizer-state"]
    )
    assert "done training" in proc.stdout + proc.stderr
    assert re.search(r"valid on 'valid' subset", proc.stdout + proc.stderr), "no validation ran"
    ckpt = save_dir / "checkpoint_best.pt"
    assert ckpt.is_file(), "fairseq-train wrote no checkpoint_best.pt"

    # fairseq-generate: reload the checkpoint (weights_only), beam search the test split.
    gen = run_cli(
        [
            "fairseq-generate",
            mt_data["bin"],
            *USER_DIR,
            *MT_TASK,
            "--path",
            ckpt,
            "--gen-subset",
            "test",
            "--beam",
            "5",
            "--batch-size",
            "4",
            "--required-batch-size-multiple",
            "1",
            "--max-len-b",
            "20",
            "--num-workers",
            "0",
        ]
    )
    ids = hypothesis_ids(gen.stdout)
    assert sorted(ids) == list(range(mt_data["n_test"])), (
        f"expected one H- line per test sentence (0..{mt_data['n_test'] - 1}), got {sorted(ids)}"
    )

    # fairseq-interactive: raw English on stdin, Moses + subword-nmt BPE applied by fairseq.
    sentences = read_lines(mt_data["raw_test_en"], limit=2)
    inter = run_cli(
        [
            "fairseq-interactive",
            mt_data["bin"],
            *USER_DIR,
            *MT_TASK,
            "--path",
            ckpt,
            "--beam",
            "5",
            "--batch-size",
            "2",
            "--buffer-size",
            "2",
            "--required-batch-size-multiple",
            "1",
            "--max-len-b",
            "20",
            "--tokenizer",
            "moses",
            "--bpe",
            "subword_nmt",
            "--bpe-codes",
            mt_data["codes"],
        ],
        input="\n".join(sentences) + "\n",
    )
    assert sorted(hypothesis_ids(inter.stdout)) == [0, 1], inter.stdout[-2000:]


def test_generation_takes_attention_flex_as_a_checked_model_override(mt_data, workdir):
    """fairseq-generate has no model flags: a trained model leaves the flex path
    with --model-overrides, which reaches every layer (fairseq-generate loads
    through load_model_ensemble with these overrides) and is checked like the flag."""
    from fairseq import checkpoint_utils

    save_dir = workdir / "checkpoints"
    train_mt(mt_data["bin"], save_dir, ["--arch", "distattn_rpr_wmt_en_de", *MT_LAYERS_2], max_update=1)
    checkpoint = save_dir / "checkpoint_last.pt"
    models, _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], arg_overrides={"attention_flex": "never"})
    attentions = [m for m in models[0].modules() if hasattr(m, "mechanism")]
    assert attentions and {m.attention_flex for m in attentions} == {"never"}

    generate = [
        "fairseq-generate",
        mt_data["bin"],
        *USER_DIR,
        *MT_TASK,
        "--path",
        checkpoint,
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--max-len-b",
        "5",
        "--required-batch-size-multiple",
        "1",
        "--num-workers",
        "0",
    ]
    run_cli([*generate, "--model-overrides", "{'attention_flex': 'never'}"])
    refused = run_cli([*generate, "--model-overrides", "{'attention_flex': 'sometimes'}"], check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "fairseq-generate: error: argument --attention-flex: invalid value 'sometimes': unknown choice; "
        "allowed: auto, always, never"
    )


# -------------------------------------------------------------------- language models


@pytest.mark.parametrize("arch,layers", LM_PRESETS)
def test_language_model_train_eval_lm(arch, layers, lm_data, workdir):
    save_dir = workdir / "checkpoints"
    lm_args = ["--task", "language_modeling", "--sample-break-mode", "none", "--tokens-per-sample", "64"]
    proc = run_cli(
        [
            "fairseq-train",
            lm_data["bin"],
            *USER_DIR,
            *lm_args,
            "--arch",
            arch,
            "--decoder-layers",
            layers,
            *COMMON_TRAIN,
            "--no-last-checkpoints",
            "--no-save-optimizer-state",
            "--max-tokens",
            "512",
            "--max-update",
            "3",
            "--save-dir",
            save_dir,
        ]
    )
    assert "done training" in proc.stdout + proc.stderr
    ckpt = save_dir / "checkpoint_best.pt"
    assert ckpt.is_file(), "fairseq-train wrote no checkpoint_best.pt"

    ev = run_cli(
        [
            "fairseq-eval-lm",
            lm_data["bin"],
            *USER_DIR,
            *lm_args,
            "--path",
            ckpt,
            "--gen-subset",
            "test",
            "--max-tokens",
            "512",
            "--num-workers",
            "0",
        ]
    )
    m = re.search(r"Perplexity: ([0-9.]+|inf)", ev.stdout + ev.stderr)
    assert m, "fairseq-eval-lm printed no perplexity:\n" + (ev.stdout + ev.stderr)[-2000:]
    ppl = float(m.group(1))
    assert math.isfinite(ppl) and ppl > 1.0, f"implausible perplexity {ppl}"


# --------------------------------------------------------------------------- resuming


def test_resume_from_checkpoint_last(mt_data, workdir):
    """Train 2 updates, then resume from checkpoint_last.pt (model, Adam state, lr
    scheduler, data iterator, meters: all through weights_only loading) to 4."""
    save_dir = workdir / "checkpoints"
    arch_args = [
        "--arch",
        "distattn_transformer",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "64",
        "--decoder-embed-dim",
        "64",
        "--encoder-ffn-embed-dim",
        "128",
        "--decoder-ffn-embed-dim",
        "128",
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--encoder-self-attention",
        "rpr@0,window-aw@1",
        "--decoder-self-attention",
        "rpr",
        "--cross-attention",
        "window-aw-seg",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "10",
    ]
    first = train_mt(mt_data["bin"], save_dir, arch_args, max_update=2)
    assert "done training" in first.stdout + first.stderr
    assert (save_dir / "checkpoint_last.pt").is_file()

    second = train_mt(mt_data["bin"], save_dir, arch_args, max_update=4)
    out = second.stdout + second.stderr
    m = re.search(r"[Ll]oaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", out)
    assert m, "second run did not load checkpoint_last.pt:\n" + out[-3000:]
    assert int(m.group(1)) == 2
    assert "done training" in out

    import torch  # only to read the result back; the CLIs did the real loading above

    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4
