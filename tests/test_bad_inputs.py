"""Every malformed command line stops fairseq-train the way argparse does.

Each case runs the real ``fairseq-train`` with ``--user-dir fairseq_distattn``
and one mistake, and checks what a user must get: exit status 2, exactly one
error line on stderr (the last one) naming the flag and the bad value, no
traceback, and nothing written (the plugin checks its flags right after
fairseq parses them, before any data is read or directory made). The
functional API's ``ValueError`` table is in test_functional_errors.py.
"""

from __future__ import annotations

import importlib.util
import re
from typing import List

import pytest
import torch

from benchmarks.common import size_flags

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import run_cli

# distattn_transformer has 6 encoder and 6 decoder layers; the tiny widths keep a
# wrongly accepted case (which then trains one update) fast.
TINY_MT = [
    "--task",
    "translation",
    "--source-lang",
    "en",
    "--target-lang",
    "de",
    *size_flags(dim=32, ffn=32, heads=2),
]
TINY_LM = [
    "--task",
    "language_modeling",
    "--tokens-per-sample",
    "64",
    "--decoder-layers",
    "2",
    "--decoder-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--decoder-attention-heads",
    "2",
]
# distattn_lm's widths with translation data (the translation task's own flags)
TINY_LM_ON_MT = [
    *TINY_MT[:6],
    "--decoder-layers",
    "2",
    "--decoder-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--decoder-attention-heads",
    "2",
]
MT, LM, LM_ON_MT = "mt", "lm", "lm-on-mt"
# task -> (data fixture, default --arch, flags)
SETUPS = {
    MT: ("mt_data", "distattn_transformer", TINY_MT),
    LM: ("lm_data", "distattn_lm", TINY_LM),
    LM_ON_MT: ("mt_data", "distattn_lm", TINY_LM_ON_MT),
}
WINDOW_PRESET_NOTE = "is the default of --arch"

# (task, arguments, flag the error names, substrings of which one must be in it)
BAD_INPUTS = [
    # SPEC grammar
    (MT, ["--encoder-self-attention", "foo"], "--encoder-self-attention", ["foo"]),
    (MT, ["--encoder-self-attention", "RPR"], "--encoder-self-attention", ["RPR"]),
    (MT, ["--encoder-self-attention", ""], "--encoder-self-attention", ["empty"]),
    (MT, ["--encoder-self-attention", "rpr,"], "--encoder-self-attention", ["rpr,"]),
    (MT, ["--encoder-self-attention", "rpr@"], "--encoder-self-attention", ["rpr@"]),
    (MT, ["--encoder-self-attention", "rpr@ "], "--encoder-self-attention", ["rpr@ "]),
    (MT, ["--encoder-self-attention", "rpr@\u0661"], "--encoder-self-attention", ["\u0661"]),
    (MT, ["--encoder-self-attention", "rpr@+1"], "--encoder-self-attention", ["+1"]),
    (MT, ["--encoder-self-attention", "rpr@0_1"], "--encoder-self-attention", ["0_1"]),
    (MT, ["--encoder-self-attention", "rpr@0-"], "--encoder-self-attention", ["0-"]),
    (MT, ["--encoder-self-attention", "rpr@-1"], "--encoder-self-attention", ["-1"]),
    (MT, ["--encoder-self-attention", "rpr@9"], "--encoder-self-attention", ["rpr@9"]),
    (MT, ["--encoder-self-attention", "rpr@3-1"], "--encoder-self-attention", ["3-1"]),
    (MT, ["--encoder-self-attention", "rpr@0-3,da@2-4"], "--encoder-self-attention", ["rpr@0-3"]),
    (MT, ["--decoder-self-attention", "bogus@1"], "--decoder-self-attention", ["bogus"]),
    # mechanisms that do not apply to an attention kind
    (MT, ["--cross-attention", "rpr"], "--cross-attention", ["rpr"]),
    (MT, ["--cross-attention", "da"], "--cross-attention", ["da"]),
    (MT, ["--cross-attention", "distance-mask"], "--cross-attention", ["distance-mask"]),
    (MT, ["--cross-attention", "qvi"], "--cross-attention", ["qvi"]),
    (MT, ["--cross-attention", "alibi"], "--cross-attention", ["alibi"]),
    (MT, ["--cross-attention", "t5-bias@1"], "--cross-attention", ["t5-bias"]),
    (MT, ["--decoder-self-attention", "window-mw-seg"], "--decoder-self-attention", ["window-mw-seg"]),
    (MT, ["--decoder-self-attention", "window-aw-seg@0"], "--decoder-self-attention", ["window-aw-seg"]),
    (MT, ["--no-cross-attention", "--cross-attention", "window-aw"], "--cross-attention", ["window-aw"]),
    # option values
    (MT, ["--max-relative-position", "0"], "--max-relative-position", ["'0'"]),
    (MT, ["--max-relative-position", "-3"], "--max-relative-position", ["-3"]),
    (MT, ["--max-relative-position", "1000000000"], "--max-relative-position", ["1000000000"]),
    # k of each stack against that stack's own longest sequence, not the longer of the two
    (
        MT,
        ["--encoder-self-attention", "rpr", "--max-relative-position", "16", "--max-source-positions", "4"],
        "--max-relative-position",
        ["--max-source-positions 4"],
    ),
    (
        MT,
        ["--decoder-self-attention", "rpr@1", "--max-relative-position", "16", "--max-target-positions", "4"],
        "--max-relative-position",
        ["--max-target-positions 4"],
    ),
    (MT, ["--window-segment-size", "0"], "--window-segment-size", ["'0'"]),
    (MT, ["--window-segment-size", "-1"], "--window-segment-size", ["-1"]),
    (MT, ["--arch", "transformer", "--window-expected-mask"], "--window-expected-mask", ["distattn_transformer"]),
    (MT, ["--attention-recompute-length", "-5"], "--attention-recompute-length", ["-5"]),
    (MT, ["--attention-flex", "sometimes"], "--attention-flex", ["sometimes", "auto, always, never"]),
    (MT, ["--randomized-positions", "-3"], "--randomized-positions", ["-3"]),
    (
        MT,
        ["--randomized-positions-at-evaluation"],
        "--randomized-positions-at-evaluation",
        ["--randomized-positions N, which is 0 (off)"],
    ),
    (
        MT,
        ["--no-token-positional-embeddings", "--randomized-positions", "2048"],
        "--randomized-positions",
        ["2048", "no layer's mechanism reads positions"],
    ),
    (MT, ["--distance-mask-alpha", "inf"], "--distance-mask-alpha", ["inf"]),
    (MT, ["--distance-mask-alpha", "1e39"], "--distance-mask-alpha", ["1e+39"]),
    (MT, ["--distance-mask-alpha", "nan"], "--distance-mask-alpha", ["nan"]),
    (MT, ["--distance-mask-alpha", "-1"], "--distance-mask-alpha", ["-1"]),
    (MT, ["--distance-mask-direction", "sideways"], "--distance-mask-direction", ["sideways"]),
    (
        MT,
        ["--decoder-self-attention", "distance-mask", "--distance-mask-direction", "backward"],
        "--distance-mask-direction",
        ["backward"],
    ),
    # t5-bias: buckets, and where the log-spaced buckets end (beyond half of them)
    (MT, ["--t5-bias-buckets", "2"], "--t5-bias-buckets", ["'2'"]),
    (MT, ["--t5-bias-max-distance", "0"], "--t5-bias-max-distance", ["'0'"]),
    (MT, ["--encoder-self-attention", "t5-bias", "--t5-bias-max-distance", "16"], "--t5-bias-max-distance", ["'16'"]),
    (MT, ["--arch", "transformer", "--t5-bias-per-layer"], "--t5-bias-per-layer", ["distattn_transformer"]),
    (MT, ["--arch", "transformer", "--kerple-per-layer"], "--kerple-per-layer", ["distattn_transformer"]),
    # T5 halves the buckets per direction where they are bidirectional: an odd count leaves the last unused
    (MT, ["--encoder-self-attention", "t5-bias@0", "--t5-bias-buckets", "7"], "--t5-bias-buckets", ["'7'"]),
    # the papers' ablations (tests/test_ablations.py): argparse choices, and T of the clip mapping
    (MT, ["--encoder-self-attention", "da", "--da-mapping", "tanh"], "--da-mapping", ["tanh"]),
    (MT, ["--da-adjusting", "late"], "--da-adjusting", ["late"]),
    (MT, ["--qvi-interaction", "gate"], "--qvi-interaction", ["gate"]),
    (MT, ["--da-mapping", "clip", "--da-clip-threshold", "0"], "--da-clip-threshold", ["'0.0'"]),
    (MT, ["--da-clip-threshold", "inf"], "--da-clip-threshold", ["inf"]),
    (MT, ["--arch", "transformer", "--da-mapping", "clip"], "--da-mapping", ["distattn_transformer"]),
    # rope and xpos: shares, factors and lengths, the options checked together, where xpos applies
    (MT, ["--rope-base", "0"], "--rope-base", ["'0.0'"]),
    (MT, ["--rope-fraction", "1.5"], "--rope-fraction", ["'1.5'"]),
    (MT, ["--encoder-self-attention", "rope", "--rope-fraction", "0.05"], "--rope-fraction", ["rotates no pair"]),
    (MT, ["--rope-scaling", "quadratic"], "--rope-scaling", ["quadratic"]),
    (MT, ["--rope-scaling-factor", "2"], "--rope-scaling-factor", ["--rope-scaling none"]),
    (MT, ["--rope-scaling", "linear", "--rope-scaling-factor", "0.5"], "--rope-scaling-factor", ["'0.5'"]),
    (MT, ["--rope-scaling", "yarn", "--rope-scaling-factor", "4"], "--rope-original-length", ["'0'"]),
    (MT, ["--rope-original-length", "-1"], "--rope-original-length", ["'-1'"]),
    (MT, ["--rope-kept-frequencies", "1.5"], "--rope-kept-frequencies", ["'1.5'"]),
    (MT, ["--rope-low-frequency-factor", "0"], "--rope-low-frequency-factor", ["'0.0'"]),
    (
        MT,
        ["--rope-scaling", "llama3", "--rope-scaling-factor", "8", "--rope-original-length", "64"]
        + ["--rope-high-frequency-factor", "0.5"],
        "--rope-high-frequency-factor",
        ["'0.5'"],
    ),
    (MT, ["--rope-short-factor", "1,1"], "--rope-short-factor", ["only longrope reads it"]),
    (
        MT,
        ["--rope-scaling", "longrope", "--rope-original-length", "64", "--rope-short-factor", "1,1"]
        + ["--rope-long-factor", "1,x"],
        "--rope-long-factor",
        ["numbers separated by commas"],
    ),
    (MT, ["--rope-attention-factor", "1.2"], "--rope-attention-factor", ["only longrope reads it"]),
    (MT, ["--xpos-scale-base", "0"], "--xpos-scale-base", ["'0.0'"]),
    (MT, ["--encoder-self-attention", "xpos"], "--encoder-self-attention", ["xpos"]),
    (MT, ["--cross-attention", "rope"], "--cross-attention", ["rope"]),
    # kerple, sandwich, fire: kernels, sinusoid widths (pairs), MLP widths and thresholds, where they apply
    (MT, ["--kerple-kernel", "cubic"], "--kerple-kernel", ["cubic"]),
    (MT, ["--cross-attention", "kerple"], "--cross-attention", ["kerple"]),
    (MT, ["--sandwich-dim", "7"], "--sandwich-dim", ["'7'"]),
    (MT, ["--sandwich-dim", "0"], "--sandwich-dim", ["'0'"]),
    (MT, ["--fire-mlp-width", "0"], "--fire-mlp-width", ["'0'"]),
    (MT, ["--fire-threshold", "0"], "--fire-threshold", ["'0.0'"]),
    (MT, ["--fire-threshold", "inf"], "--fire-threshold", ["inf"]),
    (MT, ["--arch", "transformer", "--fire-shared-layers"], "--fire-shared-layers", ["distattn_transformer"]),
    # the data-dependent methods: dape's biases, the decoder-only ones' switches
    (MT, ["--dape-bias", "fire"], "--dape-bias", ["fire"]),
    (MT, ["--encoder-self-attention", "stick-breaking"], "--encoder-self-attention", ["stick-breaking"]),
    (
        MT,
        ["--arch", "transformer", "--stick-breaking-attend-current"],
        "--stick-breaking-attend-current",
        ["distattn_transformer"],
    ),
    (
        MT,
        ["--arch", "transformer", "--stick-breaking-no-remainder"],
        "--stick-breaking-no-remainder",
        ["distattn_transformer"],
    ),
    (MT, ["--arch", "transformer", "--path-forget-gate"], "--path-forget-gate", ["distattn_transformer"]),
    # cope (decoder only, a table of positions) and transformer-xl (self-attention only)
    (MT, ["--cope-max-positions", "0"], "--cope-max-positions", ["'0'"]),
    (MT, ["--encoder-self-attention", "cope"], "--encoder-self-attention", ["cope"]),
    (MT, ["--cross-attention", "transformer-xl"], "--cross-attention", ["transformer-xl"]),
    (
        MT,
        ["--arch", "transformer", "--transformer-xl-per-layer-biases"],
        "--transformer-xl-per-layer-biases",
        ["distattn_transformer"],
    ),
    # llama4-temperature (decoder only) and the preset that interleaves it with rope every K-th layer
    (MT, ["--llama4-floor-scale", "0"], "--llama4-floor-scale", ["'0.0'"]),
    (MT, ["--llama4-attn-scale", "-1"], "--llama4-attn-scale", ["'-1.0'"]),
    (LM, ["--arch", "distattn_lm_llama4_gbw", "--llama4-nope-interval", "0"], "--llama4-nope-interval", ["'0'"]),
    (MT, ["--encoder-self-attention", "llama4-temperature"], "--encoder-self-attention", ["llama4-temperature"]),
    (MT, ["--cross-attention", "llama4-temperature"], "--cross-attention", ["llama4-temperature"]),
    # the model's widths and heads (fairseq's own MultiheadAttention would assert or divide by zero)
    (MT, ["--decoder-attention-heads", "3"], "--decoder-attention-heads", ["--decoder-embed-dim 32"]),
    (MT, ["--encoder-attention-heads", "0"], "--encoder-attention-heads", ["'0'"]),
    (MT, ["--encoder-attention-heads", "-2"], "--encoder-attention-heads", ["'-2'"]),
    (MT, ["--decoder-attention-heads", "64"], "--decoder-attention-heads", ["--decoder-embed-dim 32"]),
    (MT, ["--encoder-embed-dim", "0"], "--encoder-embed-dim", ["'0'"]),
    # a model and a task that do not go together
    (LM, ["--arch", "distattn_transformer"], "--arch", ["language_modeling"]),
    (LM_ON_MT, [], "--arch", ["translation"]),
    (LM_ON_MT, ["--arch", "distattn_lm_gbw"], "--arch", ["translation"]),
    # presets whose own defaults name layers the model does not have
    (
        MT,
        ["--arch", "distattn_window_wmt_en_de", "--encoder-layers", "2", "--decoder-layers", "2"],
        "--encoder-self-attention",
        [WINDOW_PRESET_NOTE],
    ),
    (
        MT,
        ["--arch", "distattn_window_wmt_en_de", "--encoder-layers", "3", "--decoder-layers", "2"],
        "--decoder-self-attention",
        [WINDOW_PRESET_NOTE],
    ),
    # plugin flags with a model that is not the plugin's would be silently ignored
    (
        MT,
        ["--arch", "transformer_iwslt_de_en", "--encoder-self-attention", "rpr"],
        "--encoder-self-attention",
        ["distattn_transformer_iwslt_de_en"],
    ),
    (
        MT,
        ["--arch", "transformer_iwslt_de_en", "--encoder-self-attention", "bogus@7"],
        "--encoder-self-attention",
        ["bogus@7"],
    ),
    (
        MT,
        ["--arch", "transformer", "--max-relative-position", "8"],
        "--max-relative-position",
        ["distattn_transformer"],
    ),
    (MT, ["--arch", "transformer", "--no-relative-values"], "--no-relative-values", ["distattn_transformer"]),
    # the language model
    (LM, ["--encoder-self-attention", "rpr"], "--encoder-self-attention", ["rpr"]),
    (LM, ["--cross-attention", "window-aw"], "--cross-attention", ["window-aw"]),
    (LM, ["--decoder-self-attention", "window-aw-seg"], "--decoder-self-attention", ["window-aw-seg"]),
    (LM, ["--arch", "distattn_lm_alibi_gbw", "--cross-attention", "alibi"], "--cross-attention", ["alibi"]),
    (LM, ["--decoder-self-attention", "rpr", "--max-relative-position", "65"], "--max-relative-position", ["65"]),
    (
        LM,
        ["--decoder-self-attention", "distance-mask", "--distance-mask-direction", "backward"],
        "--distance-mask-direction",
        ["backward"],
    ),
    (LM, ["--arch", "distattn_lm_window_gbw"], "--decoder-self-attention", [WINDOW_PRESET_NOTE]),
    (LM, ["--decoder-attention-heads", "5"], "--decoder-attention-heads", ["--decoder-embed-dim 32"]),
    (LM, ["--decoder-attention-heads", "0"], "--decoder-attention-heads", ["'0'"]),
    # every block of --tokens-per-sample tokens is longer than the model accepts: no training data is left
    (LM, ["--max-target-positions", "16"], "--max-target-positions", ["--tokens-per-sample 64"]),
    (LM, ["--arch", "transformer_lm", "--decoder-self-attention", "rpr"], "--decoder-self-attention", ["distattn_lm"]),
]


def error_lines(stderr: str) -> List[str]:
    """stderr lines that report an error (fairseq's multi-line hydra warnings,
    where any come first, are not error reports)."""
    return [line for line in stderr.splitlines() if re.search(r"\berror\b", line, re.I)]


def case_id(case) -> str:
    task, arguments = case[0], case[1]
    return f"{task}:" + " ".join(arguments).replace(" ", "=", 1)


def train_command(data, arch: str, flags: List[str], arguments: List[str], save_dir) -> List[str]:
    return [
        "fairseq-train",
        data["bin"],
        "--user-dir",
        "fairseq_distattn",
        "--arch",
        arch,
        *flags,
        *arguments,
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
        "--save-dir",
        save_dir,
    ]


def assert_refused(proc, flag: str, expected: List[str], save_dir, prog: str = "fairseq-train"):
    """Exit status 2, one error line on stderr (the last), naming ``flag`` and one
    of ``expected``, no traceback, and no ``save_dir`` written."""
    stderr = proc.stderr
    context = f"\n--- stderr ---\n{stderr[-3000:]}\n--- stdout ---\n{proc.stdout[-1500:]}"
    assert proc.returncode == 2, f"exit status {proc.returncode}, expected 2" + context
    assert "Traceback" not in stderr + proc.stdout, context
    lines = error_lines(stderr)
    assert len(lines) == 1, f"expected one error line on stderr, got {len(lines)}" + context
    message = lines[0]
    assert stderr.rstrip().splitlines()[-1] == message, "the error is not the last line" + context
    assert message.startswith(f"{prog}: error: argument "), context
    assert flag in message, f"{flag} not named in the error line" + context
    assert any(s in message for s in expected), f"none of {expected} in the error line" + context
    if save_dir is not None:
        assert not save_dir.exists(), "a refused command wrote its save directory" + context


@pytest.mark.parametrize("task,arguments,flag,expected", BAD_INPUTS, ids=[case_id(c) for c in BAD_INPUTS])
def test_bad_input_exits_2_with_one_error_line_and_writes_nothing(task, arguments, flag, expected, request, workdir):
    fixture, arch, flags = SETUPS[task]
    save_dir = workdir / "checkpoints"
    proc = run_cli(train_command(request.getfixturevalue(fixture), arch, flags, arguments, save_dir), check=False)
    assert_refused(proc, flag, expected, save_dir)


# Training precisions this machine cannot run (fairseq would fail with a traceback once the model is built):
# fairseq's --fp16 keeps its flattened float32 master weights on the current CUDA device, and its --bf16
# implies --tpu, which needs torch_xla.
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available: --fp16 trains")
NO_XLA = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed")
PRECISION_CASES = [
    pytest.param(["--fp16"], "--fp16", ["CUDA"], marks=NO_CUDA, id="fp16"),
    pytest.param(["--fp16", "--cpu"], "--fp16", ["CUDA"], marks=NO_CUDA, id="fp16-cpu"),
    pytest.param(["--bf16"], "--bf16", ["torch_xla"], marks=NO_XLA, id="bf16"),
    pytest.param(
        ["--memory-efficient-bf16", "--cpu"], "--memory-efficient-bf16", ["torch_xla"], marks=NO_XLA, id="mebf16"
    ),
    pytest.param(["--tpu"], "--tpu", ["torch_xla"], marks=NO_XLA, id="tpu"),
]


@pytest.mark.parametrize("arguments,flag,expected", PRECISION_CASES)
def test_a_precision_this_machine_cannot_train_in_is_refused(arguments, flag, expected, mt_data, workdir):
    save_dir = workdir / "checkpoints"
    proc = run_cli(train_command(mt_data, "distattn_transformer", TINY_MT, arguments, save_dir), check=False)
    assert_refused(proc, flag, expected, save_dir)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(["--memory-efficient-fp16"], id="memory-efficient-fp16"),
        pytest.param(["--fp16", "--fp16-no-flatten-grads"], id="fp16-no-flatten-grads"),
    ],
)
def test_half_precision_that_runs_without_cuda_is_not_refused(arguments, mt_data, workdir):
    """fairseq's other float16 optimisers keep no flattened copy on a CUDA device: they train on CPU too."""
    flags = [*TINY_MT, "--encoder-layers", "1", "--decoder-layers", "1"]
    run_cli(train_command(mt_data, "distattn_transformer", flags, arguments, workdir / "checkpoints"))


@pytest.fixture(scope="module")
def tiny_lm_checkpoint(lm_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("tiny_lm")
    run_cli(train_command(lm_data, "distattn_lm", TINY_LM, ["--no-epoch-checkpoints"], save_dir))
    return save_dir / "checkpoint_last.pt"


def eval_lm(lm_data, checkpoint, context_window: int):
    return run_cli(
        [
            "fairseq-eval-lm",
            lm_data["bin"],
            "--user-dir",
            "fairseq_distattn",
            "--path",
            checkpoint,
            "--tokens-per-sample",
            "64",
            "--context-window",
            str(context_window),
            "--max-tokens",
            "1024",
        ],
        check=False,
    )


@pytest.mark.parametrize("context_window", [64, 100])
def test_eval_lm_context_window_not_below_tokens_per_sample_is_refused(context_window, lm_data, tiny_lm_checkpoint):
    """fairseq-eval-lm scores blocks of --tokens-per-sample minus --context-window tokens:
    none are left (ZeroDivisionError, or a negative block size deep in the data code)."""
    proc = eval_lm(lm_data, tiny_lm_checkpoint, context_window)
    assert_refused(proc, "--context-window", ["--tokens-per-sample 64"], None, prog="fairseq-eval-lm")


def test_eval_lm_context_window_below_tokens_per_sample_scores(lm_data, tiny_lm_checkpoint):
    proc = eval_lm(lm_data, tiny_lm_checkpoint, 63)
    assert proc.returncode == 0 and "Perplexity" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_the_table_covers_every_plugin_flag():
    from fairseq_distattn.models.arguments import OPTION_DEFAULTS, SPEC_ATTRIBUTES

    flags = {"--" + attr.replace("_", "-") for attr in [*SPEC_ATTRIBUTES, *OPTION_DEFAULTS]}
    assert flags <= {case[2] for case in BAD_INPUTS}
    assert len(BAD_INPUTS) >= 40
