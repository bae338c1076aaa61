"""fairseq's own features with per-layer mechanisms: layer pruning (``*_layers_to_keep``,
LayerDrop's use at inference), the build-time summary under LayerDrop, ``--retain-dropout``,
``--cross-self-attention``, a changed layer count, and ``--model-overrides`` of the
arithmetic revisions (issue 61). Each answer is the right one or one line, never a silent
other model."""

import argparse
import copy
import re
import shutil
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.translation import TranslationTask

from fairseq_distattn.modules.summary import attention_log_lines, attention_sites
from fairseq_distattn.patches.checkpoint_guards import check_resume
from fairseq_distattn.patches.checkpoint_upgrade import REVISIONS_ATTR
from fairseq_distattn.registry import DECODER_SELF, ENCODER_SELF, REGISTRY, registered
from fairseq_distattn.spec import RefusedConfiguration

from .model_helpers import TINY, TINY_LM, dictionary, parse, perturb_parameters, random_tokens, right_pad
from .test_inspect import save_checkpoint

OLD_CHECKPOINTS = Path(__file__).resolve().parent / "data" / "old_checkpoints"
DECODER_MECHANISMS = [info.name for info in registered() if DECODER_SELF.key in info.kinds]
ENCODER_MECHANISMS = [info.name for info in registered() if ENCODER_SELF.key in info.kinds]


def lm_args(spec: str, *extra):
    return parse(
        "language_modeling",
        "distattn_lm",
        [*TINY_LM, "--decoder-layers", "3", "--decoder-self-attention", spec, *extra],
    )


def build_lm(args):
    model = LanguageModelingTask(args, dictionary()).build_model(args)
    return model.double()


def mt_args(*extra):
    return parse(
        "translation", "distattn_transformer", [*TINY, "--encoder-layers", "3", "--decoder-layers", "3", *extra]
    )


def build_mt(args):
    d = dictionary()
    return TranslationTask(args, d, d).build_model(args).double()


def mechanism_names(layers):
    return [
        "vanilla" if getattr(layer.self_attn, "mechanism", None) is None else layer.self_attn.mechanism.config.name
        for layer in layers
    ]


def load_pruned(build, args, state, **keep):
    """What fairseq's loading does for ``--model-overrides "{'decoder_layers_to_keep': ...}"``:
    build from the configuration with the override set, then load the trained state dict, which
    ``prune_state_dict`` renames to the kept layers."""
    pruned_args = copy.deepcopy(args)
    for attr, value in keep.items():
        setattr(pruned_args, attr, value)
    model = build(pruned_args)
    model.load_state_dict(copy.deepcopy(state), strict=True, model_cfg=pruned_args)
    return model.eval()


def refusal(capsys, call) -> str:
    """The line a refused ``call`` writes, as a command line shows it: ``PROG: error: ...`` on
    stderr and exit status 2, no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1, errors
    return errors[0]


# --------------------------------------------------------------------------- layer pruning


@pytest.mark.parametrize("mechanism", DECODER_MECHANISMS)
def test_a_pruned_lm_keeps_each_kept_layers_mechanism_and_parameters(mechanism):
    """Keeping trained layers 1 and 2 of a ``MECH@1`` LM builds MECH on the first kept layer
    (trained layer 1) with its trained parameters, and computes what the trained model
    computes without layer 0 (here: a 2-layer model built as ``MECH@0`` from the same weights)."""
    args = lm_args(f"{mechanism}@1")
    trained = build_lm(args)
    perturb_parameters(trained, 0)
    state = trained.state_dict()
    pruned = load_pruned(build_lm, args, state, decoder_layers_to_keep="1,2")
    assert mechanism_names(pruned.decoder.layers) == [mechanism, "vanilla"]
    for new, old in ((0, 1), (1, 2)):
        trained_layer = dict(trained.decoder.layers[old].named_parameters())
        for name, parameter in pruned.decoder.layers[new].named_parameters():
            torch.testing.assert_close(parameter, trained_layer[name], rtol=0, atol=0)

    reference_args = lm_args(f"{mechanism}@0", "--decoder-layers", "2")
    reference = build_lm(reference_args)
    renamed = {}
    for key, value in state.items():
        match = re.match(r"decoder\.layers\.(\d+)\.(.*)", key)
        if match is None:
            renamed[key] = value
        elif match.group(1) != "0":
            renamed[f"decoder.layers.{int(match.group(1)) - 1}.{match.group(2)}"] = value
    reference.load_state_dict(renamed, strict=True)
    tokens = random_tokens(dictionary(), 2, 7, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(pruned(tokens)[0], reference.eval()(tokens)[0])


def test_pruning_a_translation_model_keeps_each_layers_mechanism_and_the_other_stack_whole():
    """``encoder_layers_to_keep`` alone: fairseq's ``prune_state_dict`` would drop every decoder
    layer's parameters (docs/fairseq-traps.md); the plugin's model keeps the decoder whole.
    rpr's tables of trained encoder layer 1 load into the first kept layer."""
    args = mt_args("--encoder-self-attention", "rpr@1,alibi@2", "--decoder-self-attention", "rpr@1")
    trained = build_mt(args)
    perturb_parameters(trained, 0)
    pruned = load_pruned(build_mt, args, trained.state_dict(), encoder_layers_to_keep="1,2")
    assert mechanism_names(pruned.encoder.layers) == ["rpr", "alibi"]
    assert mechanism_names(pruned.decoder.layers) == ["vanilla", "rpr", "vanilla"]
    torch.testing.assert_close(
        pruned.encoder.layers[0].self_attn.mechanism.relative_keys,
        trained.encoder.layers[1].self_attn.mechanism.relative_keys,
    )


@pytest.mark.parametrize(
    "keep, problem",
    [("1,5", "layer 5 is not one of the model's 3 layers"), ("1,1", "names a layer twice"), ("a,1", "not a comma")],
)
def test_a_pruning_that_names_no_trained_layers_is_refused_in_one_line(keep, problem, capsys):
    args = lm_args("alibi@1")
    args.decoder_layers_to_keep = keep
    line = refusal(capsys, lambda: build_lm(args))
    assert "--decoder-layers-to-keep" in line and problem in line


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_fairseq_train_refuses_to_train_a_pruned_model(side, capsys):
    """fairseq-train's flag check (a new model: the checks its parser runs, one line): a model
    trained pruned would save the kept count as its layer count beside the list, which no
    fairseq command loads again."""
    line = refusal(capsys, lambda: mt_args("--encoder-self-attention", "alibi@1", f"--{side}-layers-to-keep", "1,2"))
    assert f"--{side}-layers-to-keep" in line and "at inference" in line


# --------------------------------------------------------------------------- LayerDrop, retain-dropout


def test_the_build_summary_lists_every_layer_under_layerdrop():
    """A ``LayerDropModuleList`` iterated in training mode skips layers at random; the summary
    indexes it instead, so it names all 3 layers every time."""
    model = build_mt(
        mt_args("--encoder-self-attention", "alibi@1", "--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5")
    )
    model.train()
    for seed in range(20):
        torch.manual_seed(seed)
        lines = attention_log_lines(model)
        assert lines[0].startswith("encoder self-attention (3 layers") and "0 vanilla, 1 alibi" in lines[0], lines[0]
        assert lines[1].startswith("decoder self-attention (3 layers"), lines[1]
        assert len(attention_sites(model)) == 9


@pytest.mark.parametrize("mechanism", DECODER_MECHANISMS)
def test_retain_dropout_keeps_attention_dropout_at_inference(mechanism):
    """fairseq's ``--retain-dropout --retain-dropout-modules MechanismMultiheadAttention``
    sets ``apply_during_inference`` on the module's ``FairseqDropout``: two passes in eval mode
    then differ, as they do with fairseq's own attention; without it they are equal."""
    model = build_lm(lm_args(mechanism, "--attention-dropout", "0.5"))
    perturb_parameters(model, 0)
    model.eval()
    tokens = random_tokens(dictionary(), 2, 9, seed=1)
    with torch.no_grad():
        assert torch.equal(model(tokens)[0], model(tokens)[0])
        model.make_generation_fast_(retain_dropout=True, retain_dropout_modules=["MechanismMultiheadAttention"])
        model.eval()
        torch.manual_seed(0)
        first = model(tokens)[0]
        assert not torch.equal(first, model(tokens)[0])


# --------------------------------------------------------------------------- cross-self-attention


def test_cross_self_attention_is_refused_with_a_decoder_mechanism(capsys):
    line = refusal(capsys, lambda: build_mt(mt_args("--decoder-self-attention", "alibi", "--cross-self-attention")))
    assert "--cross-self-attention" in line and "--decoder-self-attention" in line


def test_cross_self_attention_runs_with_mechanisms_elsewhere():
    model = build_mt(
        mt_args("--encoder-self-attention", "rope", "--cross-attention", "window-aw", "--cross-self-attention")
    )
    model.eval()
    d = dictionary()
    source = right_pad([random_tokens(d, 1, n, seed=n)[0] for n in (6, 4)], d.pad())
    with torch.no_grad():
        out = model(source, torch.tensor([6, 4]), random_tokens(d, 2, 5, seed=9))[0]
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------- checkpoints and overrides


@pytest.fixture(scope="module")
def rope_checkpoint(tmp_path_factory) -> Path:
    """A rope LM as fairseq-train saves it today: it records ``rope:2``."""
    directory = tmp_path_factory.mktemp("rope")
    args = lm_args("rope")
    model = build_lm(args).float()
    assert getattr(args, REVISIONS_ATTR) == "rope:2"
    dictionary().save(str(directory / "dict.txt"))
    return save_checkpoint(model, args, directory / "rope.pt")


def test_fairseqs_loading_prunes_a_checkpoint_with_each_layers_mechanism(tmp_path):
    """``load_model_ensemble_and_task`` with ``--model-overrides``, as fairseq-generate and
    fairseq-eval-lm load: strict loading of rpr's tables on the layer that holds them."""
    args = lm_args("rpr@1,sandwich@2")
    model = build_lm(args).float()
    dictionary().save(str(tmp_path / "dict.txt"))
    path = save_checkpoint(model, args, tmp_path / "pruned.pt")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(tmp_path), "decoder_layers_to_keep": "1,2"}
    )
    assert mechanism_names(models[0].decoder.layers) == ["rpr", "sandwich"]


def load_with(path: Path, overrides):
    return checkpoint_utils.load_checkpoint_to_cpu(str(path), arg_overrides=overrides)


@pytest.mark.parametrize(
    "record, problem",
    [
        ("rope:1", "contradicts the checkpoint, which records rope:2"),
        ("rope:2,rope:1", "names rope more than once"),
        ("kerple:1", "names kerple, which no layer of this checkpoint uses"),
    ],
)
def test_a_revision_override_that_contradicts_the_record_is_refused(rope_checkpoint, record, problem, capsys):
    assert problem in refusal(capsys, lambda: load_with(rope_checkpoint, {REVISIONS_ATTR: record}))


def test_the_revision_a_checkpoint_records_may_be_named_again(rope_checkpoint):
    state = load_with(rope_checkpoint, {REVISIONS_ATTR: "rope:2"})
    assert getattr(state["cfg"]["model"], REVISIONS_ATTR) == "rope:2"


def test_a_checkpoint_saved_after_a_revision_refuses_an_earlier_one_without_a_record(rope_checkpoint, tmp_path, capsys):
    state = torch.load(rope_checkpoint, weights_only=False)
    delattr(state["cfg"]["model"], REVISIONS_ATTR)  # it still records the options added since rope:2 (kerple_kernel)
    torch.save(state, tmp_path / "unrecorded.pt")
    line = refusal(capsys, lambda: load_with(tmp_path / "unrecorded.pt", {REVISIONS_ATTR: "rope:1"}))
    assert "options that tell it was saved with rope:2" in line


def test_the_hub_raises_a_catchable_error_and_writes_nothing(rope_checkpoint, capsys):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    directory = rope_checkpoint.parent
    for overrides, problem in (
        ({"rope_bse": 500.0}, "did you mean 'rope_base'"),
        ({REVISIONS_ATTR: "rope:1"}, "contradicts"),
    ):
        try:
            TransformerLanguageModel.from_pretrained(
                str(directory), checkpoint_file=rope_checkpoint.name, data_name_or_path=str(directory), **overrides
            )
        except Exception as error:  # what a library caller writes; SystemExit would pass through it
            assert isinstance(error, RefusedConfiguration) and problem in str(error)
        else:
            pytest.fail(f"from_pretrained accepted {overrides}")
    assert "error:" not in capsys.readouterr().err


def converted_rope_checkpoint(tmp_path: Path) -> Path:
    """The rotate-half fixture recording rope:1, as a checkpoint of that revision would."""
    state = torch.load(OLD_CHECKPOINTS / "rope-rotate-half.checkpoint", weights_only=False)
    setattr(state["cfg"]["model"], REVISIONS_ATTR, "rope:1")
    torch.save(state, tmp_path / "checkpoint_last.pt")
    return tmp_path / "checkpoint_last.pt"


def resume_cfg(path: Path, save_dir: Path):
    state = torch.load(path, weights_only=False)
    return argparse.Namespace(
        model=copy.deepcopy(state["cfg"]["model"]), checkpoint=argparse.Namespace(save_dir=str(save_dir))
    )


def test_a_converted_checkpoint_resumes_only_with_a_reset_optimizer(tmp_path, capsys):
    path = converted_rope_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        check_resume(path, resume_cfg(path, tmp_path), reset_optimizer=False)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "converted on loading (rope from revision 1" in message and "--reset-optimizer" in message
    check_resume(path, resume_cfg(path, tmp_path), reset_optimizer=True)  # nothing else differs: it resumes


def test_a_checkpoint_whose_spec_is_corrupt_is_refused_in_one_line(rope_checkpoint, tmp_path, capsys):
    state = torch.load(rope_checkpoint, weights_only=False)
    state["cfg"]["model"].decoder_self_attention = "rope2"
    torch.save(state, tmp_path / "corrupt.pt")
    line = refusal(capsys, lambda: load_with(tmp_path / "corrupt.pt", None))
    assert "records an attention configuration this plugin cannot build" in line
    assert "unknown mechanism 'rope2'" in line
    resumed = resume_cfg(rope_checkpoint, tmp_path)
    assert "cannot build" in refusal(capsys, lambda: check_resume(tmp_path / "corrupt.pt", resumed, False))


def test_an_override_of_the_layer_count_is_refused_naming_pruning(rope_checkpoint, capsys):
    line = refusal(capsys, lambda: load_with(rope_checkpoint, {"decoder_layers": 2}))
    assert "'decoder_layers': 2 changes the number of trained layers (3)" in line
    assert "'decoder_layers_to_keep'" in line


def test_check_lists_the_pruned_model_and_the_conversion(rope_checkpoint, tmp_path, capsys):
    from fairseq_distattn.tools.check import main

    assert main([str(rope_checkpoint), "--model-overrides", "{'decoder_layers_to_keep': '0,2'}"]) == 0
    assert "decoder self-attention, pruned to trained layers 0,2 of 3: 0=rope, 1=rope" in capsys.readouterr().out
    shutil.copy(OLD_CHECKPOINTS / "dict.txt", tmp_path / "dict.txt")
    assert main([str(converted_rope_checkpoint(tmp_path))]) == 0
    assert "converted on loading: rope from revision 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(rope_checkpoint), "--model-overrides", "{'decoder_layers': 2}"])
    assert "changes the number of trained layers" in capsys.readouterr().err


def test_every_mechanism_that_applies_to_the_encoder_is_pruned_with_its_layer():
    """The same as the LM test for the encoder's stack, every mechanism in one model each."""
    for mechanism in ENCODER_MECHANISMS:
        args = mt_args("--encoder-self-attention", f"{mechanism}@2")
        trained = build_mt(args)
        perturb_parameters(trained, 0)
        pruned = load_pruned(build_mt, args, trained.state_dict(), encoder_layers_to_keep="0,2")
        assert mechanism_names(pruned.encoder.layers) == ["vanilla", mechanism], mechanism
        assert REGISTRY[mechanism].name == mechanism
