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

from fairseq_distattn import functional
from fairseq_distattn.functional.paths import OP_OPTIONS, CallOptions
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
from fairseq_distattn.spec import MECHANISMS, AttentionOptions, accepted_by, model_option_classes, option_fields
from fairseq_distattn.tools.docs import (
    FLAG_TABLE,
    MECHANISM_TABLE,
    SPEC_GRAMMAR,
    flag_table,
    mechanism_table,
    spec_grammar,
)
from fairseq_distattn.tools.examples import ExampleDraw, example_call
from fairseq_distattn.tools.functional_exports import FUNCTIONAL_INIT, export_block, functional_init, module_exports

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
        from fairseq_distattn import functional
        import fairseq_distattn.spec, fairseq_distattn.registry, fairseq_distattn.mechanisms
        q = torch.randn(1, 2, 3, 4)
        assert functional.alibi_attention(q, q, q, causal=True)[0].shape == q.shape
        assert functional.t5_bias_attention(q, q, q, torch.zeros(32, 2))[1].shape == (1, 2, 3, 3)
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
    assert {"alibi", "t5-bias"} <= set(REGISTRY)
    assert [info.name for info in registered()] == [
        info.name for info in sorted(REGISTRY.values(), key=lambda info: (info.year, info.name))
    ], "listed in the papers' order"
    for kind in (ENCODER_SELF, DECODER_SELF, CROSS):
        assert kind.allowed == {"vanilla"} | {info.name for info in registered() if kind.key in info.kinds}
        for info in registered():
            if kind.key not in info.kinds:
                assert kind.disallowed_reason(info.name) == info.unsupported[kind.key]
    for name in ("alibi", "t5-bias"):
        assert name in ENCODER_SELF.allowed and name in DECODER_SELF.allowed and name not in CROSS.allowed
    fields = {field.name for field in option_fields()}
    for info in registered():
        assert {field.name for field in info.option_fields()} <= fields


def test_the_package_description_names_every_registered_mechanism():
    """pyproject.toml's description is what PyPI and pip show; it named 5 of 17 once."""
    import tomllib

    from .conftest import REPO_ROOT

    description = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["description"]
    for info in registered():
        family = info.name.removesuffix("-seg").removesuffix("-aw").removesuffix("-mw")
        assert family in description, f"pyproject.toml's description does not name {info.name}"


def test_every_declared_option_is_a_flag_in_help_and_has_its_default():
    from fairseq_distattn.models.arguments import OPTION_DEFAULTS, add_distattn_args

    parser = argparse.ArgumentParser()
    add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))
    help_text = parser.format_help()
    defaults = AttentionOptions()
    for options_class in model_option_classes():
        for field in dataclasses.fields(options_class):
            flag = option_flag(field)
            assert flag.flag in help_text
            assert OPTION_DEFAULTS[flag.attr] == flag.arg_default
            assert flag.convert(flag.arg_default, OptionContext()) == getattr(defaults.of(options_class), field.name)
    for flag in ("--t5-bias-buckets", "--t5-bias-max-distance", "--t5-bias-per-layer"):
        assert flag in help_text


def pages():
    """The README and every page under docs/ (what a user reads), by path."""
    paths = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
    return {path.relative_to(REPO_ROOT).as_posix(): path.read_text(encoding="utf-8") for path in paths}


@pytest.mark.parametrize(
    "path, generate", [(MECHANISM_TABLE, mechanism_table), (FLAG_TABLE, flag_table), (SPEC_GRAMMAR, spec_grammar)]
)
def test_the_generated_docs_are_the_registrys_and_shown_where_a_user_looks(path, generate):
    """(tests/test_readme.py checks that each copy equals its file.)"""
    assert (REPO_ROOT / path).read_text(encoding="utf-8") == generate(), (
        f"{path} is stale: run python -m fairseq_distattn.docs --write"
    )
    showing = [page for page, text in pages().items() if f"<!-- generated from {path} by " in text]
    assert showing, f"no page shows {path}"
    if path == MECHANISM_TABLE:
        assert "README.md" in showing, "the README shows the mechanism table"


def test_the_functional_namespace_names_every_export_and_is_current():
    """``functional/__init__.py`` imports each name explicitly (an editor follows
    ``functional.alibi_attention`` to its module), and its block is what the modules'
    ``__all__`` give: a new op's names appear after ``docs --write``, not by discovery."""
    init = REPO_ROOT / FUNCTIONAL_INIT
    text = init.read_text(encoding="utf-8")
    assert text == functional_init(text, init.parent), (
        f"{FUNCTIONAL_INIT} is stale: run python -m fairseq_distattn.docs --write"
    )
    assert "globals()" not in text and "import_module" not in text
    exports = module_exports(init.parent)
    assert sorted(functional.__all__) == sorted(name for names in exports.values() for name in names)
    for module, names in exports.items():
        for name in names:
            assert getattr(functional, name) is getattr(sys.modules[f"fairseq_distattn.functional.{module}"], name)


def test_the_functional_export_block_refuses_a_name_two_modules_export():
    with pytest.raises(ValueError, match="more than one module of functional/ exports attend"):
        export_block({"attention": ["attend"], "other": ["attend", "unique"]})


def test_the_docs_command_lists_the_mechanisms_an_attention_kind_accepts():
    out = subprocess.run(
        [sys.executable, "-m", "fairseq_distattn.docs", "--accepted-by", "cross"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "window-aw\n" in out.stdout and "alibi\n" not in out.stdout


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


# every op's keyword arguments after its tensors: what the attention module's CallOptions holds,
# less flex_from (the module's own: the ops take flex at every length)
SHARED = OP_OPTIONS
# every attention op of the functional API, and every registered mechanism's op (one added from outside too)
OPS = {
    **{name: getattr(functional, name) for name in functional.__all__ if name.endswith("_attention")},
    **{info.op.__name__: info.op for info in registered()},
}


def test_every_op_of_the_package_s_mechanisms_is_part_of_the_functional_api():
    public = {getattr(functional, name) for name in functional.__all__}
    for info in registered():
        if info.module.__module__.startswith("fairseq_distattn."):
            assert info.op in public, f"{info.name}'s op {info.op.__name__} is not in fairseq_distattn.functional"


@pytest.mark.parametrize("name", sorted(OPS))
def test_shared_arguments_are_keyword_only_and_identical(name):
    parameters = inspect.signature(OPS[name]).parameters
    assert SHARED == (
        "key_padding_mask",
        "causal",
        "query_offset",
        "dropout_p",
        "need_weights",
        "flex",
        "position_map",
    )
    for argument in SHARED:
        default = getattr(CallOptions(), argument)
        assert parameters[argument].kind is inspect.Parameter.KEYWORD_ONLY, argument
        assert parameters[argument].default == default, argument
    positional = [p.name for p in parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not set(positional) & set(SHARED)


@pytest.mark.parametrize("name", [info.name for info in registered()])
@pytest.mark.parametrize("causal", [False, True])
def test_need_weights_false_returns_no_probabilities_and_the_same_output(name, causal):
    """Every registered op, called by its module (tools.examples)."""
    call = example_call(REGISTRY[name], ExampleDraw(batch=2, heads=2, tgt_len=4, head_dim=3, dtype=torch.float32))
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1, 0] = True
    out, probs = call(key_padding_mask=padding, causal=causal)
    out_without, none = call(key_padding_mask=padding, causal=causal, need_weights=False)
    assert probs is not None and probs.shape == (2, 2, 4, 4) and none is None
    torch.testing.assert_close(out_without, out, rtol=1e-5, atol=1e-6)


def test_a_registration_says_where_its_paper_puts_it_and_what_its_op_is():
    from fairseq_distattn.mechanisms.base import Mechanism
    from fairseq_distattn.registry import register_attention

    with pytest.raises(ValueError, match="paper must read 'Authors YEAR, \\*Title\\*'"):
        register_attention("nameless", op=functional.softmax_attention, description="d", paper="somebody")(Mechanism)
    with pytest.raises(TypeError, match="op must be callable"):
        register_attention("opless", op=None, description="d", paper="A 2001, *T*")(Mechanism)
    assert "nameless" not in REGISTRY and "opless" not in REGISTRY


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


# a value of an option whose flag takes a list (one factor per rotated pair of the tiny models' heads of 8)
LIST_VALUES = {"--rope-short-factor": "1,1.5,2,3", "--rope-long-factor": "2,3,5,9"}


def _another_value(field: dataclasses.Field):
    """A value of the option's flag other than its default."""
    flag = option_flag(field)
    if flag.flag in LIST_VALUES:
        return LIST_VALUES[flag.flag]
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
    assert by_flag["--window-segment-size"] == ("window-aw-seg", "window-mw-seg")
    assert by_flag["--window-expected-mask"] == ("window-aw", "window-aw-seg", "window-mw", "window-mw-seg")


def test_only_a_mechanism_its_papers_place_in_named_layers_goes_without_derived_configurations():
    """The LM preset (``distattn_lm_<name>_gbw``) and the translation grid's configuration with the
    mechanism in every layer are derived for every mechanism, except where its papers name the layers
    (``papers_place_it``): the window, whose papers' own configurations stand instead."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    import fairseq_distattn.models  # noqa: F401  registers the presets
    from benchmarks.quality.mt_grid import PAPER_CONFIGS, default_configs, derived_config
    from fairseq_distattn.models.distattn_lm import preset_name

    placed = {info.name for info in registered() if info.papers_place_it}
    assert placed == {"window-aw", "window-mw", "window-aw-seg", "window-mw-seg"}
    grid = default_configs()
    for info in registered():
        derived = derived_config(info)
        if info.papers_place_it:
            assert preset_name(info.name) not in ARCH_CONFIG_REGISTRY
            assert derived is None or grid.get(info.name) != derived, info.name
            assert all(config.name in grid for config in PAPER_CONFIGS[info.family])
        else:
            assert (preset_name(info.name) in ARCH_CONFIG_REGISTRY) == (DECODER_SELF.key in info.kinds), info.name
            assert derived is None or info.name in grid, info.name
