"""A checkpoint never silently changes mechanism.

A parameter-free mechanism (``alibi``, ``distance-mask``) has no state-dict key,
so fairseq's strict loading cannot notice a checkpoint loaded into another
mechanism. The plugin compares what a checkpoint was trained as
(:mod:`fairseq_distattn.trained_settings`) wherever a checkpoint meets a
configuration: resuming, ``--model-overrides``, averaging and ``check``. The
checks are parametrised over the registry (a new mechanism is covered with no
edit here); the end-to-end tests run the real commands on one tiny model.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import torch

from fairseq_distattn.registry import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    EVALUATION,
    RUNTIME,
    SpecError,
    option_flag,
    registered,
)
from fairseq_distattn.spec import option_fields, option_users
from fairseq_distattn.trained_settings import (
    canonical_spec,
    check_overrides,
    differences,
    overridable_flags,
    trained_settings,
)

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import REPO_ROOT, cli_env, run_cli
    from .model_helpers import TINY, TINY_LM, parse, translation_model
    from .test_registry import LIST_VALUES, _another_value
except ImportError:  # rootdir-relative import mode without the package
    from conftest import REPO_ROOT, cli_env, run_cli
    from model_helpers import TINY, TINY_LM, parse, translation_model
    from test_registry import LIST_VALUES, _another_value

MECHANISMS = [info.name for info in registered()]
OPTION_FIELDS = list(option_fields())


def spec_flags(mechanism: str):
    """Flags that put ``mechanism`` into every attention kind it supports."""
    from fairseq_distattn.registry import REGISTRY

    kinds = REGISTRY[mechanism].kinds
    return [
        argument
        for kind in (ENCODER_SELF, DECODER_SELF, CROSS)
        if kind.key in kinds
        for argument in (kind.flag, mechanism)
    ]


def settings(extra=()):
    return trained_settings(parse("translation", "distattn_transformer", [*TINY, *extra]), "distattn_transformer")


# --------------------------------------------------------------------------- what is compared


def test_canonical_spec_is_the_shortest_spec_that_parses_back():
    from fairseq_distattn.spec import parse_spec

    for layers, spec in [
        (["alibi"] * 3, "alibi"),
        (["vanilla"] * 3, "vanilla"),
        (["window-aw", "window-aw", "rpr", "vanilla"], "window-aw@0-1,rpr@2"),
        (["vanilla", "da", "vanilla", "da"], "da@1,da@3"),
    ]:
        assert canonical_spec(layers) == spec
        assert parse_spec(ENCODER_SELF, spec, len(layers)) == layers


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_mechanism_differs_from_vanilla_and_from_itself_elsewhere(mechanism):
    """What a resume or an average compares: a mechanism left out, or moved to other
    layers, is a difference, whether or not it has parameters."""
    trained = settings(spec_flags(mechanism))
    assert differences(trained, trained) == []
    found = differences(trained, settings())
    kinds = spec_flags(mechanism)[::2]
    assert [name for name, _, _ in found if name in kinds] == kinds
    assert all(a == mechanism and b == "vanilla" for name, a, b in found if name in kinds)
    moved = [argument if argument != mechanism else f"{mechanism}@1" for argument in spec_flags(mechanism)]
    assert {name for name, _, _ in differences(trained, settings(moved))} >= set(kinds)


def test_a_message_names_a_swapped_mechanism_not_the_options_only_one_side_has():
    from fairseq_distattn.trained_settings import describe_differences

    alibi = settings(["--encoder-self-attention", "alibi"])
    da = settings(["--encoder-self-attention", "da"])
    assert ("--da-mapping", "not set", "learnable-sigmoid") in differences(alibi, da)
    assert describe_differences(differences(alibi, da), "this command") == (
        "--encoder-self-attention alibi (this command: da)"
    )
    with pytest.raises(SpecError) as refused:
        check_overrides(alibi, da, {"encoder_self_attention": "da"})
    assert "(--encoder-self-attention alibi -> da);" in str(refused.value)


def test_positions_and_the_model_are_compared_too():
    trained = settings(["--encoder-self-attention", "alibi"])
    without_positions = settings(["--encoder-self-attention", "alibi", "--no-token-positional-embeddings"])
    assert differences(trained, without_positions) == [("--no-token-positional-embeddings", False, True)]
    plugin_flags = {"--max-relative-position", "--window-segment-size"}
    fairseq_tiny = [a for i, a in enumerate(TINY) if a not in plugin_flags and TINY[i - 1] not in plugin_flags]
    fairseqs = trained_settings(parse("translation", "transformer", fairseq_tiny), "transformer")
    assert ("model", "distattn_transformer", "transformer") in differences(trained, fairseqs)


def test_a_language_model_compares_its_decoder_only():
    from fairseq_distattn.trained_settings import trained_settings as settings_of

    def lm(extra=()):
        return settings_of(parse("language_modeling", "distattn_lm", [*TINY_LM, *extra]), "distattn_lm")

    assert [name for name in lm() if name.endswith("-attention")] == ["--decoder-self-attention"]
    assert differences(lm(["--decoder-self-attention", "alibi"]), lm()) == [
        ("--decoder-self-attention", "alibi", "vanilla")
    ]


def test_only_options_of_mechanisms_in_use_are_compared_and_runtime_ones_never():
    plain = settings(["--encoder-self-attention", "alibi"])
    assert "--max-relative-position" not in plain
    assert differences(plain, settings(["--encoder-self-attention", "alibi", "--max-relative-position", "5"])) == []
    assert differences(plain, settings(["--encoder-self-attention", "alibi", "--attention-flex", "never"])) == []
    rpr = settings(["--encoder-self-attention", "rpr"])
    assert differences(rpr, settings(["--encoder-self-attention", "rpr", "--max-relative-position", "2"])) == [
        ("--max-relative-position", 3, 2)
    ]
    # --da-clip-threshold counts only with --da-mapping clip
    da = settings(["--encoder-self-attention", "da"])
    assert "--da-clip-threshold" not in da
    clip = settings(["--encoder-self-attention", "da", "--da-mapping", "clip", "--da-clip-threshold", "4"])
    assert clip["--da-clip-threshold"] == 4.0


# --------------------------------------------------------------------------- what an override may change


def _parameters(model):
    """State-dict names and shapes, and which names share one parameter."""
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    shared = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(parameter), []).append(name)
    return shapes, sorted(shared.values())


def _choices(field):
    """The values of an option: its argparse choices, or the names its check allows
    (a string option without choices), or None."""
    from fairseq_distattn.registry import OptionContext

    flag = option_flag(field)
    if flag.argparse.get("choices") or not isinstance(flag.arg_default, str) or flag.flag in LIST_VALUES:
        return flag.argparse.get("choices")
    try:
        flag.convert("no such value", OptionContext())
    except SpecError as error:
        return error.allowed.split(", ")
    return None


# what an option's only_with setting needs beside it to be valid (longrope: the training length and both
# factor lists, one factor per rotated pair of TINY's heads of 8)
ONLY_WITH_COMPANIONS = {
    ("rope_scaling", "longrope"): [
        "--rope-original-length",
        "4",
        "--rope-short-factor",
        "1,1,1,1",
        "--rope-long-factor",
        "1,2,4,8",
    ],
}


def _only_with(flag) -> list:
    """The flags of ``flag``'s ``only_with`` setting, with what it needs beside it."""
    if flag.only_with is None:
        return []
    attribute, value = flag.only_with
    return ["--" + attribute.replace("_", "-"), str(value), *ONLY_WITH_COMPANIONS.get(flag.only_with, [])]


def _other_values(field):
    """Every other value of an option that its own check accepts: each choice, else one value
    (twice a number: its successor may be refused, an odd --t5-bias-buckets in the encoder; half
    a number whose double is refused, one more than a zero)."""
    from fairseq_distattn.registry import OptionContext

    flag = option_flag(field)
    default = flag.arg_default
    if _choices(field):
        return [value for value in _choices(field) if value != default]
    if not isinstance(default, (int, float)) or isinstance(default, bool):
        return [value for value in [_another_value(field)] if value != default]
    if flag.flag == "--randomized-positions":
        return [2048]  # N covers the tiny models' 1024 positions (a smaller N is refused)
    for value in (2 * default, default / 2, default + 1):
        try:
            flag.convert(value, OptionContext())
        except SpecError:
            continue
        if value != default:
            return [value]
    return []


def _flags(field, value):
    flag = option_flag(field)
    return [flag.flag] if value is True else [flag.flag, str(value)]


def _valid(flags) -> bool:
    try:
        settings(flags)
    except (SpecError, SystemExit):
        return False
    return True


def _alternatives(field, base=()):
    """Every other value of an option, as flags; a value that its options class refuses
    alone (``check_together``: --rope-scaling yarn without --rope-original-length) comes
    with the first other option's value that makes it valid."""
    alternatives = []
    for value in _other_values(field):
        flags = _flags(field, value)
        if _valid([*base, *flags]):
            alternatives.append(flags)
            continue
        companions = (
            _flags(other, other_value)
            for other in OPTION_FIELDS
            if other is not field
            for other_value in _other_values(other)
        )
        alternatives += [[*flags, *companion] for companion in companions if _valid([*base, *flags, *companion])][:1]
    return alternatives


def _as_overrides(flags):
    """``--model-overrides`` of flags: {attribute: value}."""
    overrides, index = {}, 0
    while index < len(flags):
        attr = flags[index][2:].replace("-", "_")
        if index + 1 < len(flags) and not flags[index + 1].startswith("--"):
            overrides[attr], index = flags[index + 1], index + 2
        else:
            overrides[attr], index = True, index + 1
    return overrides


@pytest.mark.parametrize(
    "field",
    [field for field in OPTION_FIELDS if option_users(field)],
    ids=lambda field: option_flag(field).flag,
)
def test_an_option_is_overridable_exactly_when_no_value_changes_the_parameters(field):
    """The role each option declares is checked against the models it builds: an option
    whose values build other parameters (names, shapes, sharing) must be TRAINED, and
    one whose values never do may be changed on a trained model."""
    flag = option_flag(field)
    changes_parameters = False
    for user in option_users(field):
        base = [*spec_flags(user), *_only_with(flag)]
        reference = _parameters(translation_model(extra=[*TINY, *base], perturb=False)[0])
        for alternative in _alternatives(field, base):
            if "--distance-mask-direction" in alternative and alternative[-1] == "backward":
                continue  # refused in the decoder (a causal query would see no key)
            model = translation_model(extra=[*TINY, *base, *alternative], perturb=False)[0]
            changes_parameters |= _parameters(model) != reference
    assert (flag.role != EVALUATION) or not changes_parameters, f"{flag.flag} changes parameters: TRAINED"
    assert changes_parameters or flag.role == EVALUATION, f"{flag.flag} changes no parameter: EVALUATION"


def test_runtime_options_are_the_attention_modules_own():
    from fairseq_distattn.spec import AttentionModuleOptions

    runtime = [option_flag(field).flag for field in OPTION_FIELDS if option_flag(field).role == RUNTIME]
    assert runtime == [option_flag(field).flag for field in dataclasses.fields(AttentionModuleOptions)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_override_may_not_change_the_mechanism(mechanism):
    trained = settings(spec_flags(mechanism))
    with pytest.raises(SpecError, match=r"argument --model-overrides: .*it changes what the checkpoint was trained"):
        check_overrides(trained, settings(), {"encoder_self_attention": "vanilla"})


@pytest.mark.parametrize("field", OPTION_FIELDS, ids=lambda field: option_flag(field).flag)
def test_an_override_may_change_exactly_the_parameter_free_options(field):
    flag = option_flag(field)
    # the attention module's options: any mechanism (--randomized-positions: one that takes it)
    users = option_users(field) or (("rope",) if flag.flag == "--randomized-positions" else ("rpr",))
    base = [*spec_flags(users[0]), *_only_with(flag)]
    alternative = next(a for a in _alternatives(field, base) if a[-1] != "backward")
    before, after = settings(base), settings([*base, *alternative])
    if flag.role in (EVALUATION, RUNTIME):
        check_overrides(before, after, _as_overrides(alternative))
        assert flag.flag in overridable_flags()
    else:
        with pytest.raises(SpecError, match=re.escape(flag.flag)):
            check_overrides(before, after, _as_overrides(alternative))
        assert flag.flag not in overridable_flags()


# --------------------------------------------------------------------------- the real commands

USER_DIR = ["--user-dir", "fairseq_distattn"]
MT_TASK = ["--task", "translation", "--source-lang", "en", "--target-lang", "de"]
TRAIN = [
    *TINY,
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--max-tokens",
    "1024",
    "--disable-validation",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--seed",
    "1",
]
# rpr has a table (its size is --max-relative-position); alibi and distance-mask have no parameter
ATTENTION = [
    "--encoder-self-attention",
    "rpr@0,alibi@1",
    "--decoder-self-attention",
    "distance-mask",
    "--max-relative-position",
    "2",
]
WITHOUT_ATTENTION = [a for i, a in enumerate(TINY) if a != "--max-relative-position" and TINY[i - 1] != a]


def fairseq_train(data_bin, save_dir, attention, max_update, extra=()):
    return run_cli(
        [
            "fairseq-train",
            data_bin,
            *USER_DIR,
            *MT_TASK,
            "--arch",
            "distattn_transformer",
            *TRAIN,
            *attention,
            "--max-update",
            max_update,
            "--save-dir",
            save_dir,
            *extra,
        ],
        check=False,
    )


def one_error_line(proc, prog="fairseq-train"):
    """Exit status 2 and the error as the last line of stderr, without a traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), proc.stderr[-3000:]
    return last


def updates_of(checkpoint) -> int:
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


@pytest.fixture(scope="module")
def trained(mt_data, tmp_path_factory):
    """A checkpoint of 1 update with rpr, alibi and distance-mask layers."""
    save_dir = tmp_path_factory.mktemp("trained") / "checkpoints"
    proc = fairseq_train(mt_data["bin"], save_dir, ATTENTION, 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save_dir / "checkpoint_last.pt"


def copy_of(checkpoint, directory):
    directory.mkdir(parents=True)
    (directory / "checkpoint_last.pt").write_bytes(checkpoint.read_bytes())
    return directory


@pytest.mark.parametrize(
    "attention,named",
    [
        # every flag left out: the parameter-free alibi and distance-mask layers would train on as vanilla
        (["--encoder-self-attention", "rpr@0"], "--decoder-self-attention distance-mask (this command: vanilla)"),
        ([*ATTENTION[:-1], "4"], "--max-relative-position 2 (this command: 4)"),
        ([*ATTENTION, "--distance-mask-alpha", "0.5"], "--distance-mask-alpha 1.0 (this command: 0.5)"),
        ([*ATTENTION, "--no-token-positional-embeddings"], "--no-token-positional-embeddings off (this command: on)"),
    ],
    ids=["flags-left-out", "table-size", "parameter-free-option", "positions"],
)
def test_resuming_with_another_attention_stops_with_one_line_naming_both(trained, mt_data, workdir, attention, named):
    save_dir = copy_of(trained, workdir / "resume")
    before = (save_dir / "checkpoint_last.pt").read_bytes()
    line = one_error_line(fairseq_train(mt_data["bin"], save_dir, attention, 2))
    assert f"{save_dir / 'checkpoint_last.pt'} was trained as another model than this command builds" in line
    assert named in line
    assert f"--finetune-from-model {save_dir / 'checkpoint_last.pt'} and a new --save-dir" in line
    assert (save_dir / "checkpoint_last.pt").read_bytes() == before  # nothing trained, nothing written


def test_resuming_with_its_own_flags_goes_on_and_a_deliberate_fine_tune_is_logged(trained, mt_data, workdir):
    save_dir = copy_of(trained, workdir / "resume")
    resumed = fairseq_train(mt_data["bin"], save_dir, ATTENTION, 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert updates_of(save_dir / "checkpoint_last.pt") == 2

    # into distance-mask's place, alibi (both parameter-free): the parameters load, the change is logged
    fine_tuned = workdir / "fine-tuned"
    other = [*ATTENTION[:3], "alibi", *ATTENTION[4:]]
    proc = fairseq_train(mt_data["bin"], fine_tuned, other, 2, ["--finetune-from-model", trained])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert f"fine-tuning {trained} into another configuration: --decoder-self-attention distance-mask " in out
    assert "(this command: alibi)" in out
    assert updates_of(fine_tuned / "checkpoint_last.pt") == 2  # a fine-tune counts its own updates from 0
    # and from then on its own checkpoint is what a resume compares with
    resumed = fairseq_train(mt_data["bin"], fine_tuned, other, 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert updates_of(fine_tuned / "checkpoint_last.pt") == 3
    assert one_error_line(fairseq_train(mt_data["bin"], fine_tuned, ATTENTION, 4))


def test_fairseqs_cannot_load_model_parameters_is_one_line_too(trained, mt_data, workdir):
    save_dir = copy_of(trained, workdir / "resume")
    wider = [*ATTENTION, "--encoder-ffn-embed-dim", "48"]  # not attention: fairseq's strict loading finds it
    line = one_error_line(fairseq_train(mt_data["bin"], save_dir, wider, 2))
    assert "cannot load the parameters of" in line and "size mismatch for encoder.layers.0" in line


def generate(data_bin, checkpoint, overrides):
    return run_cli(
        [
            "fairseq-generate",
            data_bin,
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
            "--model-overrides",
            str(overrides),
        ],
        check=False,
    )


@pytest.mark.parametrize(
    "overrides,named",
    [
        ({"max_relative_position": 4}, "--max-relative-position 2 -> 4"),
        ({"decoder_self_attention": "vanilla"}, "--decoder-self-attention distance-mask -> vanilla"),
        ({"encoder_self_attention": "rpr@0,distance-mask@1"}, "--encoder-self-attention rpr@0,alibi@1 -> rpr@0,"),
    ],
    ids=["table-size", "mechanism-left-out", "mechanism-swapped"],
)
def test_an_override_that_changes_the_trained_model_is_refused(trained, mt_data, overrides, named):
    line = one_error_line(generate(mt_data["bin"], trained, overrides), prog="fairseq-generate")
    assert "argument --model-overrides: invalid value" in line and named in line
    assert "--distance-mask-alpha" in line.split("allowed:")[1]  # it lists what may be overridden


def test_a_parameter_free_override_still_works(trained, mt_data):
    proc = generate(mt_data["bin"], trained, {"distance_mask_alpha": 0.5, "attention_flex": "never"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "distance-mask (alpha=0.5" in proc.stdout + proc.stderr
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == mt_data["n_test"]


def test_averaging_checkpoints_of_different_models_is_refused(trained, mt_data, workdir):
    vanilla_dir = workdir / "vanilla"
    proc = fairseq_train(mt_data["bin"], vanilla_dir, [], 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vanilla = vanilla_dir / "checkpoint_last.pt"

    def average(*inputs):
        return subprocess.run(
            [
                sys.executable,
                "scripts/average_checkpoints.py",
                "--inputs",
                *map(str, inputs),
                "--output",
                workdir / "avg.pt",
            ],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=cli_env(),
            timeout=300,
        )

    refused = average(trained, vanilla)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"average_checkpoints: error: {vanilla} is another model than {trained}: --encoder-self-attention vanilla "
        f"there, rpr@0,alibi@1 in {trained}; average only checkpoints of one training run"
    )
    assert not (workdir / "avg.pt").exists()
    assert average(trained, trained).returncode == 0


def check(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "fairseq_distattn.check", *map(str, arguments)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(REPO_ROOT.parent),
        timeout=300,
    )


def test_check_shows_every_layer_and_every_option_it_runs_with(trained):
    proc = check(trained)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "  encoder self-attention: 0=rpr, 1=alibi" in lines
    assert "  decoder self-attention: 0=distance-mask, 1=distance-mask" in lines
    assert "  encoder-decoder cross-attention: 0=vanilla, 1=vanilla" in lines
    assert "  absolute positions: encoder sinusoidal, decoder sinusoidal" in lines
    by_heading = {line.split(":")[0].strip(): line.split(": ", 1)[1] for line in lines if line.startswith("  ")}
    assert by_heading[next(h for h in by_heading if h.startswith("trained options"))] == (
        "--max-relative-position 2, --no-relative-values off"
    )
    assert by_heading[next(h for h in by_heading if h.startswith("parameter-free options"))] == (
        "--distance-mask-alpha 1.0, --distance-mask-direction none"
    )
    assert by_heading[next(h for h in by_heading if h.startswith("runtime options"))] == (
        "--attention-recompute-length 256, --attention-flex auto, --randomized-positions 0, "
        "--randomized-positions-at-evaluation off"
    )
    assert by_heading["its flags"] == (
        "--arch distattn_transformer --encoder-self-attention rpr@0,alibi@1 --decoder-self-attention distance-mask "
        "--cross-attention vanilla --encoder-attention-heads 2 --encoder-embed-dim 16 --decoder-attention-heads 2 "
        "--decoder-embed-dim 16 --distance-mask-alpha 1.0 --distance-mask-direction none "
        "--max-relative-position 2"
    )

    overridden = check(trained, "--model-overrides", "{'distance_mask_alpha': 0.5}")
    assert overridden.returncode == 0, overridden.stderr
    assert "--distance-mask-alpha 0.5" in overridden.stdout
    refused = check(trained, "--model-overrides", "{'max_relative_position': 4}")
    assert refused.returncode == 2 and "--max-relative-position 2 -> 4" in refused.stderr.strip().splitlines()[-1]


def test_the_model_lists_are_the_models_the_plugin_registers():
    """``PLUGIN_MODELS`` and ``LANGUAGE_MODELS`` are spelt out because their module sits below
    the models (it cannot import them); this holds them to fairseq's registry."""
    from fairseq.models import MODEL_REGISTRY, FairseqLanguageModel

    import fairseq_distattn  # noqa: F401 (registers the plugin's models)
    from fairseq_distattn.trained_settings import LANGUAGE_MODELS, PLUGIN_MODELS

    plugin = {name: cls for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_distattn.")}
    assert sorted(PLUGIN_MODELS) == sorted(plugin)
    assert sorted(LANGUAGE_MODELS) == sorted(n for n, cls in plugin.items() if issubclass(cls, FairseqLanguageModel))
