"""The mechanism registry is the one place a mechanism is declared: the SPEC
names, the kinds each allows, the options and their flags, --help, the
README's table and the tests' lists derive from it; a mechanism registered
from outside the package appears everywhere with no other change. The
functional API imports with torch alone and changes no global state of
torch, and its attention ops share one keyword-only calling convention."""

import argparse
import dataclasses
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

from fairseq_distattn import functional as DF
from fairseq_distattn.mechanisms import MECHANISM_REGISTRY
from fairseq_distattn.registry import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    KINDS,
    REGISTRY,
    OptionContext,
    option_flag,
    registered,
)
from fairseq_distattn.spec import MECHANISMS, OPTION_CLASSES, MechanismOptions, accepted_by
from fairseq_distattn.tools.docs import (
    FLAG_TABLE,
    MECHANISM_TABLE,
    SPEC_GRAMMAR,
    flag_table,
    mechanism_table,
    spec_grammar,
)

from .conftest import REPO_ROOT


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=300
    )


def test_the_functional_api_imports_without_fairseq_and_leaves_torch_alone():
    proc = run_python("""
        import sys, warnings
        sys.modules["fairseq"] = None  # any import of fairseq now fails
        import torch
        safe_globals = list(torch.serialization.get_safe_globals())
        filters, device_count = list(warnings.filters), torch.cuda.device_count
        import fairseq_distattn.functional as DF
        import fairseq_distattn.spec, fairseq_distattn.registry, fairseq_distattn.mechanisms
        q = torch.randn(1, 2, 3, 4)
        assert DF.alibi_attention(q, q, q, causal=True)[0].shape == q.shape
        assert DF.t5_bias_attention(q, q, q, torch.zeros(32, 2))[1].shape == (1, 2, 3, 3)
        assert list(torch.serialization.get_safe_globals()) == safe_globals, "safe globals changed"
        assert list(warnings.filters) == filters, "warning filters changed"
        assert torch.cuda.device_count is device_count
        assert not [m for m in sys.modules if m.startswith("fairseq_distattn.models")]
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_importing_fairseq_after_the_package_registers_the_fairseq_side():
    """``import fairseq_distattn`` first (a script, the inspect tool), fairseq later."""
    proc = run_python("""
        import fairseq_distattn
        import torch
        from fairseq.models import ARCH_MODEL_REGISTRY
        assert "distattn_lm_alibi_gbw" in ARCH_MODEL_REGISTRY and "distattn_transformer" in ARCH_MODEL_REGISTRY
        import argparse
        assert argparse.Namespace in torch.serialization.get_safe_globals()
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_lists_derive_from_the_registry():
    assert MECHANISMS == ("vanilla", *(info.name for info in registered()))
    assert set(MECHANISM_REGISTRY) == set(REGISTRY) and {"alibi", "t5-bias"} <= set(REGISTRY)
    for kind in (ENCODER_SELF, DECODER_SELF, CROSS):
        assert kind.allowed == {"vanilla"} | {info.name for info in registered() if kind.key in info.kinds}
        for info in registered():
            if kind.key not in info.kinds:
                assert kind.disallowed_reason(info.name) == info.unsupported[kind.key]
    for name in ("alibi", "t5-bias"):
        assert name in ENCODER_SELF.allowed and name in DECODER_SELF.allowed and name not in CROSS.allowed
    fields = {field.name for field in dataclasses.fields(MechanismOptions)}
    for info in registered():
        assert {field.name for field in info.option_fields()} <= fields


def test_every_declared_option_is_a_flag_in_help_and_has_its_default():
    from fairseq_distattn.models.arguments import OPTION_DEFAULTS, add_distattn_args

    parser = argparse.ArgumentParser()
    add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))
    help_text = parser.format_help()
    defaults = MechanismOptions()
    for field in dataclasses.fields(MechanismOptions):
        flag = option_flag(field)
        assert flag.flag in help_text
        assert OPTION_DEFAULTS[flag.attr] == flag.arg_default
        assert flag.convert(flag.arg_default, OptionContext()) == getattr(defaults, field.name)
    for flag in ("--t5-bias-buckets", "--t5-bias-max-distance", "--t5-bias-per-layer"):
        assert flag in help_text


@pytest.mark.parametrize(
    "path, generate", [(MECHANISM_TABLE, mechanism_table), (FLAG_TABLE, flag_table), (SPEC_GRAMMAR, spec_grammar)]
)
def test_the_readme_tables_are_the_registrys(path, generate):
    """(tests/test_readme.py checks that each README block equals its file.)"""
    assert (REPO_ROOT / path).read_text(encoding="utf-8") == generate(), (
        f"{path} is stale: run python -m fairseq_distattn.mechanisms --write"
    )
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"<!-- generated from {path} by " in readme


def test_the_readme_names_every_mechanism_and_flag_where_a_user_looks_for_it():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    grammar = readme.split("### SPEC grammar", 1)[1]
    mech_rule = grammar[grammar.index("MECH   :=") : grammar.index("What each attention flag accepts")]
    for info in registered():
        assert f"| `{info.name}` |" in readme
        assert f"| {info.name}\n" in mech_rule + "\n" or f"| {info.name} " in mech_rule, info.name
    flags = readme.split("### Flags", 1)[1].split("### SPEC grammar", 1)[0]
    for options_class in OPTION_CLASSES:
        for field in dataclasses.fields(options_class):
            assert f"| `{option_flag(field).flag}" in flags, option_flag(field).flag


def test_the_generated_docs_say_what_each_flag_accepts_and_why_it_refuses():
    grammar = spec_grammar()
    rows = {
        line.split(" | ")[0][3:-1]: line[2:-2].split(" | ") for line in grammar.splitlines() if line.startswith("| `--")
    }
    assert set(rows) == {kind.flag for kind in (ENCODER_SELF, DECODER_SELF, CROSS)}
    for kind in (ENCODER_SELF, DECODER_SELF, CROSS):
        _, accepts, refuses = rows[kind.flag]
        assert accepts == ", ".join(f"`{name}`" for name in MECHANISMS if name in kind.allowed)
        for name in set(MECHANISMS) - kind.allowed:
            assert f"`{name}`" in refuses and kind.disallowed_reason(name) in refuses
    assert "`rpr`" in rows[CROSS.flag][2] and "`window-aw-seg`" in rows[DECODER_SELF.flag][2]
    assert accepted_by(["encoder-self", "decoder-self"]) == [
        name for name in MECHANISMS if name in ENCODER_SELF.allowed and name in DECODER_SELF.allowed
    ]
    with pytest.raises(ValueError, match="unknown attention kind"):
        accepted_by(["decoder"])
    table = flag_table()
    assert "| `--no-relative-values` | off |" in table and "| `--max-relative-position K` | `16` |" in table
    assert "(default:" not in table, "the default has a column of its own"
    for line in table.splitlines()[4:]:
        assert line.replace("\\|", "").count("|") == 5, f"an unescaped | splits the row: {line}"
    assert "| `--max-relative-position K` | `16` | rpr: " in table and table.count(" | fixed |") >= 3
    assert (
        "| distance-mask: weight alpha of the -alpha \\|i-j\\| added to the attention logits | `--model-overrides` |"
        in table
    )


def test_a_mechanism_registered_from_outside_appears_everywhere():
    """What adding a mechanism takes: its functional op and its module file (here
    inline, registered before the package's lists are built). Nothing else."""
    proc = run_python("""
        import dataclasses, torch
        from fairseq_distattn.registry import SELF_ATTENTION, CROSS_KIND, option, positive_integer, register_attention
        from fairseq_distattn.mechanisms.base import Mechanism, shared_arguments
        import fairseq_distattn.functional as DF

        @dataclasses.dataclass(frozen=True)
        class ToyOptions:
            toy_width: int = option(3, "--toy-width", "toy: width (default: {default})",
                                    convert=positive_integer("--toy-width"), type=int, metavar="W")

        @register_attention("toy", ToyOptions, order=99, kinds=SELF_ATTENTION, unsupported={CROSS_KIND: "no"},
                            fused="without weights", description="a toy", paper="none")
        class Toy(Mechanism):
            def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
                return DF.softmax_attention(queries["query"], keys["key"], keys["value"], **shared_arguments(
                    key_padding_mask, causal, query_offset, dropout_p, need_weights))

        from fairseq_distattn.spec import MECHANISMS, MechanismOptions
        from fairseq_distattn.registry import DECODER_SELF, SpecError
        from fairseq_distattn.tools.docs import mechanism_table
        import argparse
        assert MECHANISMS[-1] == "toy" and "toy" in DECODER_SELF.allowed
        assert MechanismOptions().toy_width == 3
        try:
            MechanismOptions.from_args(argparse.Namespace(toy_width=0))
            raise AssertionError("no error")
        except SpecError as error:
            assert str(error).startswith("argument --toy-width: invalid value '0'")
        assert "| `toy` | a toy |" in mechanism_table()
        from fairseq_distattn.spec import accepted_by
        from fairseq_distattn.tools.docs import flag_table, spec_grammar
        assert "| toy\\n" in spec_grammar() and "| `--toy-width W` | `3` | toy: width |" in flag_table()
        assert accepted_by(["decoder-self"])[-1] == "toy" and "toy" not in accepted_by(["cross"])
        from fairseq_distattn.models.arguments import OPTION_DEFAULTS
        assert OPTION_DEFAULTS["toy_width"] == 3
        from tests.model_helpers import TINY_LM, language_model
        model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "toy@1", "--toy-width", "4"])
        assert type(model.decoder.layers[1].self_attn.mechanism).__name__ == "Toy"
        assert model.decoder.layers[1].self_attn.mechanism.config.options.toy_width == 4
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


SHARED = ("key_padding_mask", "causal", "query_offset", "dropout_p", "need_weights")
B, H, T, D = 2, 2, 4, 3


def attention_ops():
    """Every public attention op of the functional API, with a call on small tensors."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    window = DF.window_mask(q, k, q, k)
    rel_keys, rel_values, t5_table = (torch.randn(*shape, generator=g) for shape in ((5, D), (5, D), (32, H)))
    return {
        "softmax_attention": lambda **kw: DF.softmax_attention(q, k, v, **kw),
        "relative_position_attention": lambda **kw: DF.relative_position_attention(
            q, k, v, rel_keys, rel_values, 2, **kw
        ),
        "distance_aware_attention": lambda **kw: DF.distance_aware_attention(
            q, k, v, torch.zeros(H), torch.zeros(H), **kw
        ),
        "multiplicative_window_attention": lambda **kw: DF.multiplicative_window_attention(q, k, v, window, **kw),
        "additive_window_attention": lambda **kw: DF.additive_window_attention(q, k, q, k, v, window, **kw),
        "query_value_interaction_attention": lambda **kw: DF.query_value_interaction_attention(
            q, k, v, torch.eye(D).repeat(H, 1, 1), torch.zeros(H, 2 * D), torch.zeros(H), **kw
        ),
        "distance_mask_attention": lambda **kw: DF.distance_mask_attention(q, k, v, 0.5, **kw),
        "alibi_attention": lambda **kw: DF.alibi_attention(q, k, v, **kw),
        "t5_bias_attention": lambda **kw: DF.t5_bias_attention(q, k, v, t5_table, **kw),
    }


def test_the_table_covers_every_attention_op_of_the_api():
    ops = {name for name in DF.__all__ if name.endswith("_attention")}
    assert ops == set(attention_ops())


@pytest.mark.parametrize("name", sorted(attention_ops()))
def test_shared_arguments_are_keyword_only_and_identical(name):
    parameters = inspect.signature(getattr(DF, name)).parameters
    defaults = {"key_padding_mask": None, "causal": False, "query_offset": 0, "dropout_p": 0.0, "need_weights": True}
    for argument in SHARED:
        assert parameters[argument].kind is inspect.Parameter.KEYWORD_ONLY, argument
        assert parameters[argument].default == defaults[argument], argument
    positional = [p.name for p in parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not set(positional) & set(SHARED)


@pytest.mark.parametrize("name", sorted(attention_ops()))
@pytest.mark.parametrize("causal", [False, True])
def test_need_weights_false_returns_no_probabilities_and_the_same_output(name, causal):
    call = attention_ops()[name]
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, 0] = True
    out, probs = call(key_padding_mask=padding, causal=causal)
    out_without, none = call(key_padding_mask=padding, causal=causal, need_weights=False)
    assert probs is not None and probs.shape == (B, H, T, T) and none is None
    torch.testing.assert_close(out_without, out, rtol=1e-5, atol=1e-6)


def test_kinds_are_the_registrys():
    assert (ENCODER_SELF, DECODER_SELF, CROSS) == KINDS


@pytest.mark.skipif(
    not (REPO_ROOT / ".venv" / ".installed").exists(), reason="quickstart.sh runs in the repository's .venv"
)
def test_the_quickstart_offers_every_mechanism_both_self_attentions_accept(tmp_path):
    """MECH comes from the registry: a new mechanism is offered without an edit
    to the script, and the refusal lists what is on offer."""

    def quickstart(mech):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MECH": mech, "WORK": str(tmp_path / "work")}
        env["DATA"] = str(tmp_path / "no-data")  # a MECH it takes stops at the data, before any real work
        return subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / "quickstart.sh")], env=env, capture_output=True, text=True, timeout=300
        )

    offered = [name for name in accepted_by(["encoder-self", "decoder-self"]) if name != "vanilla"]
    refused = quickstart("not-a-mechanism")
    assert refused.returncode == 2, refused.stderr
    assert f"one of {', '.join(offered)}, or set ATTN_ARGS" in refused.stderr
    assert quickstart("window-aw-seg").returncode == 2  # not a decoder self-attention mechanism
    taken = quickstart(offered[-1])
    assert taken.returncode == 1 and "quickstart: missing" in taken.stderr, taken.stderr


MECHANISM_OPTION_FIELDS = [field for info in registered() for field in info.option_fields()]


def _another_value(field: dataclasses.Field):
    """A value of the option's flag other than its default."""
    flag = option_flag(field)
    default, choices = flag.arg_default, flag.argparse.get("choices")
    if isinstance(default, bool):
        return not default
    if choices:
        return next(choice for choice in choices if choice != default)
    return default + 1 if isinstance(default, (int, float)) else f"{default}-other"


@pytest.mark.parametrize(
    "field", list(dict.fromkeys(MECHANISM_OPTION_FIELDS)), ids=lambda field: option_flag(field).flag
)
def test_an_option_no_layer_uses_is_reported_and_one_in_use_is_not(field):
    from fairseq_distattn.spec import option_users, unused_options

    flag = option_flag(field)
    users = option_users(field)
    assert users, f"{flag.flag} configures no mechanism"
    values = {flag.attr: _another_value(field)}
    if flag.only_with is not None:
        values[flag.only_with[0]] = flag.only_with[1]
    others = ",".join(f"{name}@0" for name in MECHANISMS if name not in users)
    specs = {"--encoder-self-attention": "vanilla", "--decoder-self-attention": others}
    assert [found for found in unused_options(values, specs) if found[0] == flag.flag] == [
        (
            flag.flag,
            values[flag.attr],
            f"it configures {', '.join(users)}, which no layer uses (--decoder-self-attention {others})",
        )
    ]
    for user in users:  # (values also holds the option it needs, if any: at the value it needs)
        assert unused_options(values, {"--decoder-self-attention": f"{user}@1-2,vanilla@0"}) == []
    assert unused_options({flag.attr: flag.arg_default}, {"--decoder-self-attention": "vanilla"}) == []
    assert unused_options(values, {"--decoder-self-attention": "vanilla"})[-1][2].endswith("(every layer is vanilla)")


def test_an_option_that_needs_another_options_value_is_reported_without_it():
    from fairseq_distattn.spec import unused_options

    specs = {"--encoder-self-attention": "da"}
    assert unused_options({"da_clip_threshold": 4.0, "da_mapping": "clip"}, specs) == []
    assert unused_options({"da_clip_threshold": 4.0}, specs) == [
        ("--da-clip-threshold", 4.0, "it is used only with --da-mapping clip, not --da-mapping learnable-sigmoid")
    ]


def test_option_users_follow_the_options_class_and_its_narrowing():
    from fairseq_distattn.spec import option_users

    by_flag = {option_flag(field).flag: option_users(field) for field in MECHANISM_OPTION_FIELDS}
    assert by_flag["--max-relative-position"] == ("rpr",)
    assert by_flag["--window-segment-size"] == ("window-mw-seg", "window-aw-seg")
    assert by_flag["--window-expected-mask"] == ("window-mw", "window-aw", "window-mw-seg", "window-aw-seg")
