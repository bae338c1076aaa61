"""What adding a mechanism takes is what docs/adding-a-mechanism.md says: its
math and its registration, two files (here tests/toy_mechanism/, registered
from outside the package). With nothing else, the toy shows up in the SPEC
grammar, the flags and --help, the generated docs, the op contract tests, the
fused-path tests, the half-precision op table, the op cost benchmark, the
model summary, the inspection plots, its LM preset, the translation grid and
the methods table's rows."""

import subprocess
import sys
import textwrap

from .conftest import REPO_ROOT

TOY = ("tests/toy_mechanism/functional.py", "tests/toy_mechanism/mechanism.py")


def test_the_docs_show_exactly_the_toy_s_two_files():
    page = (REPO_ROOT / "docs" / "adding-a-mechanism.md").read_text(encoding="utf-8")
    for path in TOY:
        text = (REPO_ROOT / path).read_text(encoding="utf-8")
        # the fence names the file: tests/test_readme.py runs only the blocks fenced ```python alone
        assert f"```python {path}\n{text}```" in page, f"{path} differs from the docs"


TOY_EVERYWHERE = """
import argparse, dataclasses, pathlib, tempfile
import torch
import tests.toy_mechanism.mechanism  # registers log-distance: the only step

from fairseq_distattn.registry import DECODER_SELF, REGISTRY, SpecError, registered
from fairseq_distattn.spec import MECHANISMS, AttentionOptions, accepted_by
from fairseq_distattn.tools.docs import flag_table, mechanism_table, spec_grammar

NAME = "log-distance"
info = REGISTRY[NAME]
assert [i.name for i in registered()][-1] == NAME, "listed after every earlier paper"

# the SPEC grammar and the kinds
assert MECHANISMS[-1] == NAME and NAME in DECODER_SELF.allowed
assert accepted_by(["decoder-self"])[-1] == NAME and NAME not in accepted_by(["cross"])
assert f"| {NAME}\\n" in spec_grammar()

# the flags: options, their check, --help, the defaults fairseq sees
assert AttentionOptions().for_mechanism(NAME).log_distance_init == 0.5
try:
    AttentionOptions.from_args(argparse.Namespace(log_distance_init=0))
    raise AssertionError("no error")
except SpecError as error:
    assert str(error).startswith("argument --log-distance-init: invalid value '0'")
from fairseq_distattn.models.arguments import OPTION_DEFAULTS, add_distattn_args
assert OPTION_DEFAULTS["log_distance_init"] == 0.5
parser = argparse.ArgumentParser()
add_distattn_args(parser, (DECODER_SELF,))
assert "--log-distance-init" in parser.format_help()

# the generated docs
assert "| `log-distance` | learned per-head slope on the log of the distance |" in mechanism_table()
assert "| `--log-distance-init S` | `0.5` | log-distance: the slopes' initial value |" in flag_table()

# the op contract tests and the fused-path tests, parametrised over the registry
import tests.test_registry as registry_tests
import tests.test_fused_paths as fused_tests
assert "log_distance_attention" in registry_tests.OPS
registry_tests.test_shared_arguments_are_keyword_only_and_identical("log_distance_attention")
for causal in (False, True):
    registry_tests.test_need_weights_false_returns_no_probabilities_and_the_same_output(NAME, causal)
cases = [case for case in fused_tests.CASES if case[0].name == NAME]
assert [label for _, label, _ in cases] == ["defaults"]
for case in cases:
    for causal in (False, True):
        fused_tests.test_fused_path_equals_explicit_path(*case, causal)

# the half-precision op table and the op cost benchmark
PRECISION_AND_OPS

# the model summary and the inspection plots of a model with the toy in one layer
from tests.model_helpers import TINY_LM, language_model
from fairseq_distattn.modules.summary import attention_summary, attention_sites
from fairseq_distattn.tools import inspection
toy_flags = ["--decoder-self-attention", "log-distance@1", "--log-distance-init", "0.25"]
model, dictionary = language_model(extra=[*TINY_LM, *toy_flags])
summary = attention_summary(model)
slopes = model.decoder.layers[1].self_attn.mechanism.slopes.detach()  # (the helper perturbs every weight)
learned = "      slopes per head: " + " ".join(f"{value:+.4f}" for value in slopes.tolist())
assert "  layer 1: log-distance" in summary and learned in summary, summary
site = [site for site in attention_sites(model) if site.name == NAME][0]
out, written = pathlib.Path(tempfile.mkdtemp()), []
tokens = torch.tensor([[dictionary.eos(), 4, 5, 6, 7]])
with inspection.AttentionRecorder(model) as recorder:
    model(tokens)
    records = recorder.take()
labels = [str(t) for t in range(5)]
axes = {DECODER_SELF: inspection.Axes(labels, labels, ("query", "key"))}
inspection.plot_sentence(records, axes, out, written)
inspection.plot_model(model, {}, "", 8, out, written)
names = {path.name for path in written}
plots = {"log-distance-bias-decoder-self-layer1.png", "learned-log-distance.png", "log-distance-bias-curves.png"}
assert plots <= names, names

# the benchmarks: its LM preset, its translation grid configuration and its methods-table row
from fairseq.models import ARCH_MODEL_INV_REGISTRY
from fairseq_distattn.models.arguments import ARCHITECTURES
from benchmarks.quality.lm_grid import lm_configs
from benchmarks.quality.mt_grid import default_configs
from benchmarks.quality.methods import method_rows
PRESET = "distattn_lm_log_distance_gbw"
assert PRESET in ARCH_MODEL_INV_REGISTRY["distattn_lm"]
assert ARCHITECTURES[PRESET][1] == {"decoder_self_attention": NAME}
assert PRESET in lm_configs() and "no position embeddings" in lm_configs()[PRESET].note
grid = default_configs()
assert list(grid)[-1] == NAME and grid[NAME].attention == (
    "--encoder-self-attention", NAME, "--decoder-self-attention", NAME
) and not grid[NAME].absolute_positions
rows = method_rows(list(grid), list(lm_configs()))
assert (NAME, info.paper.split(", *")[0], NAME, PRESET) in rows and rows[-1][0] == "nope", rows
print("ok")
"""

PRECISION_AND_OPS = """
from benchmarks.diagnostics.precision import op_errors
errors = op_errors(torch.bfloat16, 1.0)
assert NAME in errors and errors[NAME] < 0.05, errors
from benchmarks.speed.ops import run_ops
results = run_ops(
    1, 2, 4, [8], "cpu", repeats=1, warmup=0, seed=0, log=lambda line: None, modes=("fwd",), min_time=0.0, only=[NAME]
)
assert {result["op"] for result in results.values()} == {"sdpa", NAME}, results
"""


def test_a_mechanism_registered_from_outside_appears_everywhere():
    code = TOY_EVERYWHERE.replace("PRECISION_AND_OPS", PRECISION_AND_OPS)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
