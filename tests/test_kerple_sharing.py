"""KERPLE's r1, r2: one pair per head shared by the kerple layers of a stack, as the
authors' code builds them (chijames/KERPLE, ``megatron/model/gpt2_model.py``: one
``ParallelKerpleLog`` made before the layer loop and handed to every layer), or per
layer with ``--kerple-per-layer``; a checkpoint saved before the option existed (per
layer) loads as per-layer and computes what it computed."""

from pathlib import Path

import pytest
import torch

from fairseq_distattn.patches.checkpoint_upgrade import CHANGED_DEFAULTS
from fairseq_distattn.trained_settings import differences, trained_settings

from .model_helpers import language_model, old_checkpoint_log_probabilities, translation_model

FIXTURES = Path(__file__).resolve().parent / "data" / "old_checkpoints"
TINY_LM = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-attention-heads", "4"]


def kerple_modules(model):
    return [m for name, m in model.named_modules() if type(m).__name__ == "Kerple"]


def test_the_kerple_layers_of_a_stack_share_one_pair_per_head_by_default():
    model, _ = language_model("distattn_lm_kerple_gbw", TINY_LM)
    first, second = kerple_modules(model)
    assert first.scale is second.scale and first.r2 is second.r2 and first.shared_across_layers
    kerple_parameters = [name for name, _ in model.named_parameters() if name.endswith((".scale", ".rate"))]
    assert len(kerple_parameters) == 2  # 8 values for 2 layers x 4 heads, as the authors' model holds
    # a checkpoint stores the pair under each layer's name, so a per-layer model cannot take it silently
    assert sum(name.endswith(".scale") for name in model.state_dict()) == 2


def test_kerple_per_layer_gives_each_layer_its_own_pair():
    model, _ = language_model("distattn_lm_kerple_gbw", [*TINY_LM, "--kerple-per-layer"])
    first, second = kerple_modules(model)
    assert first.scale is not second.scale and not first.shared_across_layers
    assert sum(p.numel() for name, p in model.named_parameters() if name.endswith((".scale", ".rate"))) == 16


def test_the_encoder_and_decoder_stacks_each_have_their_own_pair():
    model, _ = translation_model(
        "distattn_transformer",
        ["--encoder-self-attention", "kerple", "--decoder-self-attention", "kerple", "--encoder-layers", "2"],
    )
    encoder, decoder = model.encoder.layers, model.decoder.layers
    encoder_scales = {id(layer.self_attn.mechanism.scale) for layer in encoder}
    decoder_scales = {id(layer.self_attn.mechanism.scale) for layer in decoder}
    assert len(encoder_scales) == 1 and len(decoder_scales) == 1 and encoder_scales != decoder_scales


def test_the_sharing_is_part_of_what_a_checkpoint_was_trained_as():
    """A shared model cannot resume a per-layer checkpoint (nor the other way round):
    the integrity guards compare the option; a checkpoint from before the option
    existed (no ``kerple_per_layer``) was trained per layer."""
    assert CHANGED_DEFAULTS == {"kerple_per_layer": True}
    state = torch.load(FIXTURES / "kerple-per-layer.checkpoint", weights_only=False)
    old = state["cfg"]["model"]
    assert getattr(old, "kerple_per_layer", None) is None  # made by the plugin before the option
    shared = argparse_copy(old, kerple_per_layer=False)
    per_layer = argparse_copy(old, kerple_per_layer=True)
    assert trained_settings(old, "distattn_lm")["--kerple-per-layer"] is True
    assert differences(trained_settings(old, "distattn_lm"), trained_settings(per_layer, "distattn_lm")) == []
    assert differences(trained_settings(old, "distattn_lm"), trained_settings(shared, "distattn_lm")) == [
        ("--kerple-per-layer", True, False)
    ]


def argparse_copy(namespace, **changes):
    copy = type(namespace)(**vars(namespace))
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


def test_a_per_layer_checkpoint_from_before_the_option_loads_and_computes_what_it_computed():
    """``kerple-per-layer.checkpoint``: a 2-layer kerple LM trained one update by the
    plugin at revision f2ecd07 (``make_fixture.py``), and the log-probabilities that
    revision gave a sentence, to float32 rounding (the model is float32, and another CPU's
    kernels round differently). Loaded into today's shared default, its two layers' pairs
    would go into one and the numbers would change."""
    assert (FIXTURES / "kerple-per-layer.revision").read_text().strip() == "f2ecd07"
    expected = torch.load(FIXTURES / "kerple-per-layer.logprobs")
    torch.testing.assert_close(old_checkpoint_log_probabilities("kerple-per-layer"), expected, rtol=0, atol=1e-5)


def test_overriding_the_sharing_of_a_trained_kerple_model_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        old_checkpoint_log_probabilities("kerple-per-layer", {"kerple_per_layer": False})
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "--kerple-per-layer on -> off" in message and "--model-overrides" in message
