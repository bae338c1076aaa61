"""Llama 4's NoPE layers (``llama4-temperature``) and the preset ``distattn_lm_llama4_gbw``.

The op is compared in float64 with Hugging Face transformers 4.57.1's
``Llama4TextAttention`` (``transformers/models/llama4/modeling_llama4.py``) in a layer
without rope and with ``attn_temperature_tuning``, on the same q, k, v projections: over a
whole sequence, and for new tokens after a kv cache (HF's ``cache_position``, the op's
``query_offset``). The factor itself is :func:`llama4_attention_scales`, compared with HF in
``tests/test_rotary_scaling.py``. HF forms the factor in float32 (``cache_position.float()``);
here ``.float()`` of the positions is float64, so that both sides compute the same numbers."""

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.models.llama4 import modeling_llama4
from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

from fairseq_distattn.functional.llama4_temperature import (
    ATTN_SCALE,
    FLOOR_SCALE,
    llama4_query_scales,
    llama4_temperature_attention,
)
from fairseq_distattn.mechanisms.llama4_temperature import NOPE_INTERVAL
from fairseq_distattn.models.distattn_lm import llama4_decoder_spec

from .model_helpers import TINY_LM, language_model, parse, random_tokens

HF_VERSION = "4.57.1"
FLOAT64 = dict(rtol=1e-12, atol=1e-13)
HEADS, HEAD_DIM = 2, 4
WIDTH = HEADS * HEAD_DIM


class Float64Tensor(torch.Tensor):
    """A tensor whose ``.float()`` is ``.double()``: HF's factor formed in float64."""

    def float(self, *args, **kwargs):
        return self.double(*args, **kwargs)


def plain(tensor):
    return tensor.as_subclass(torch.Tensor)


def hf_attention(floor_scale, attn_scale, tuning=True, seed=0):
    """HF's attention of a NoPE layer (``no_rope_layers`` [0]), float64, eager, random weights."""
    config = Llama4TextConfig(
        vocab_size=32,
        hidden_size=WIDTH,
        intermediate_size=16,
        intermediate_size_mlp=16,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        no_rope_layers=[0],
        attn_temperature_tuning=tuning,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    attention = modeling_llama4.Llama4TextAttention(config, layer_idx=0).double().eval()
    assert not attention.use_rope and not hasattr(attention, "qk_norm")
    return attention


def causal_mask(batch, tgt_len, src_len):
    """HF's additive 4D mask: query i (at src_len - tgt_len + i) sees the keys up to it."""
    offset = src_len - tgt_len
    visible = torch.arange(src_len)[None, :] <= (torch.arange(tgt_len)[:, None] + offset)
    mask = torch.zeros(tgt_len, src_len, dtype=torch.float64).masked_fill(~visible, torch.finfo(torch.float64).min)
    return mask.expand(batch, 1, tgt_len, src_len)


def hf_forward(attention, hidden, cache_position, cache=None):
    """HF's output (after ``o_proj``) for ``hidden`` ``[B, T, E]`` at ``cache_position``."""
    batch, length, _ = hidden.shape
    src_len = int(cache_position[-1]) + 1
    with torch.no_grad():
        out, _ = attention(
            hidden,
            position_embeddings=None,
            attention_mask=causal_mask(batch, length, src_len),
            past_key_values=cache,
            cache_position=cache_position.as_subclass(Float64Tensor),
        )
    return plain(out)


def heads(projection, hidden):
    """``[B, T, E]`` through a projection to ``[B, H, T, D]``."""
    batch, length, _ = hidden.shape
    return projection(hidden).view(batch, length, HEADS, HEAD_DIM).transpose(1, 2)


def our_forward(attention, hidden, new, floor_scale, attn_scale, **op_options):
    """The op on HF's projections of ``hidden`` (every position) for its last ``new`` queries."""
    with torch.no_grad():
        q, k, v = (heads(p, hidden) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        offset = hidden.size(1) - new
        out, _ = llama4_temperature_attention(
            q[:, :, offset:],
            k,
            v,
            floor_scale=floor_scale,
            attn_scale=attn_scale,
            causal=True,
            query_offset=offset,
            **op_options,
        )
        return attention.o_proj(out.transpose(1, 2).reshape(hidden.size(0), new, WIDTH))


def test_the_peer_is_the_transformers_version_read():
    assert transformers.__version__ == HF_VERSION, "re-read Llama4TextAttention.forward and update the docstrings"
    config = Llama4TextConfig()
    assert (config.floor_scale, config.attn_scale, config.attn_temperature_tuning) == (FLOOR_SCALE, ATTN_SCALE, True)
    # the preset's rule is HF's default no_rope_layers (0: a layer without rope)
    layers = Llama4TextConfig(num_hidden_layers=9).no_rope_layers
    assert layers == [
        0 if name == "llama4-temperature" else 1 for name in expand(llama4_decoder_spec(9, NOPE_INTERVAL))
    ]


@pytest.mark.parametrize("floor_scale, attn_scale", [(4, 0.37), (3, 0.1), (FLOOR_SCALE, ATTN_SCALE)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_the_op_equals_hugging_faces_nope_layer(floor_scale, attn_scale, need_weights):
    attention = hf_attention(floor_scale, attn_scale)
    hidden = torch.randn(2, 13, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = hf_forward(attention, hidden, torch.arange(13))
    ours = our_forward(attention, hidden, 13, float(floor_scale), attn_scale, need_weights=need_weights)
    torch.testing.assert_close(ours, expected, **FLOAT64)
    if floor_scale < 13:  # the factor varies along the sequence: the comparison saw it
        assert len(set(llama4_query_scales(13, 0, floor_scale, attn_scale, "cpu", torch.float64).flatten())) > 2


def test_the_op_at_a_query_offset_equals_hugging_face_decoding_with_a_cache():
    attention = hf_attention(4, 0.37)
    hidden = torch.randn(2, 12, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cache = DynamicCache()
    hf_forward(attention, hidden[:, :7], torch.arange(7), cache)
    chunk = hf_forward(attention, hidden[:, 7:11], torch.arange(7, 11), cache)
    step = hf_forward(attention, hidden[:, 11:], torch.arange(11, 12), cache)
    torch.testing.assert_close(our_forward(attention, hidden[:, :11], 4, 4.0, 0.37), chunk, **FLOAT64)
    torch.testing.assert_close(our_forward(attention, hidden, 1, 4.0, 0.37), step, **FLOAT64)


def test_attn_scale_zero_is_hugging_faces_temperature_turned_off():
    attention = hf_attention(4, 0.37, tuning=False)
    hidden = torch.randn(1, 9, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = hf_forward(attention, hidden, torch.arange(9))
    torch.testing.assert_close(our_forward(attention, hidden, 9, 4.0, 0.0), expected, rtol=0, atol=0)
    assert not torch.allclose(our_forward(attention, hidden, 9, 4.0, 0.37), expected)


def test_half_inputs_are_scaled_in_float32_and_rounded_back_as_hf_does():
    q = torch.randn(1, 2, 40, 8).to(torch.bfloat16)
    terms = llama4_temperature_attention.terms(q, q, q, (), dict(floor_scale=4.0, attn_scale=0.1), _options(q))
    factor = llama4_query_scales(40, 0, 4.0, 0.1, "cpu", torch.float32)
    assert terms.query.dtype == torch.bfloat16
    assert torch.equal(terms.query, (q * factor).to(torch.bfloat16))  # HF: bf16 times float32, rounded back


def _options(q):
    from fairseq_distattn.functional.paths import CallOptions

    return CallOptions(None, True, 0, 0.0, False, "auto")


# --------------------------------------------------------------------------- the preset


def expand(spec):
    """A SPEC of named layers as one name per layer."""
    layers = {}
    for item in spec.split(","):
        name, _, text = item.partition("@")
        first, _, last = text.partition("-")
        for layer in range(int(first), int(last or first) + 1):
            layers[layer] = name
    return [layers[i] for i in sorted(layers)]


@pytest.mark.parametrize(
    "layers, interval, spec",
    [
        (12, 4, "rope@0-2,llama4-temperature@3,rope@4-6,llama4-temperature@7,rope@8-10,llama4-temperature@11"),
        (3, 3, "rope@0-1,llama4-temperature@2"),
        (3, 4, "rope"),  # Llama 4's interval in 3 layers: no NoPE layer
        (3, 1, "llama4-temperature"),
        (5, 2, "rope@0,llama4-temperature@1,rope@2,llama4-temperature@3,rope@4"),
        (4, 2, "rope@0,llama4-temperature@1,rope@2,llama4-temperature@3"),
    ],
)
def test_the_presets_layers_follow_hfs_no_rope_layers(layers, interval, spec):
    assert llama4_decoder_spec(layers, interval) == spec
    if "@" in spec:
        hf = Llama4TextConfig(num_hidden_layers=layers, no_rope_layer_interval=interval).no_rope_layers
        assert [0 if name == "llama4-temperature" else 1 for name in expand(spec)] == hf


@pytest.mark.parametrize("layers, interval", [(3, 0), (0, 4), (3, -1), (3, 2.0), (True, 4)])
def test_the_preset_spec_refuses_bad_counts(layers, interval):
    with pytest.raises(ValueError, match=r"^(layers|interval) must be an integer >= 1"):
        llama4_decoder_spec(layers, interval)


@pytest.mark.parametrize(
    "extra, spec",
    [
        ([], llama4_decoder_spec(12, 4)),  # fairseq's gbw LM: 12 layers
        (["--decoder-layers", "3", "--llama4-nope-interval", "3"], "rope@0-1,llama4-temperature@2"),
        (["--decoder-layers", "8"], "rope@0-2,llama4-temperature@3,rope@4-6,llama4-temperature@7"),
        (["--decoder-layers", "3"], "rope"),
        (["--decoder-layers", "3", "--decoder-self-attention", "alibi@1"], "alibi@1"),  # the user's flag wins
    ],
)
def test_the_preset_defaults_follow_the_layers_and_the_interval(extra, spec):
    args = parse("language_modeling", "distattn_lm_llama4_gbw", extra)
    assert args.decoder_self_attention == spec
    assert args.no_token_positional_embeddings


@pytest.mark.parametrize("interval", ["0", "-2"])
def test_the_preset_refuses_an_interval_below_1_in_one_line(interval, capsys):
    with pytest.raises(SystemExit) as exit:
        parse("language_modeling", "distattn_lm_llama4_gbw", ["--llama4-nope-interval", interval])
    assert exit.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        f"error: argument --llama4-nope-interval: invalid value '{interval}': must be a positive integer; "
        "allowed: an integer >= 1"
    )


def llama4_model(*extra):
    flags = [*TINY_LM, "--decoder-layers", "3", "--llama4-nope-interval", "3", "--llama4-floor-scale", "2", *extra]
    return language_model("distattn_lm_llama4_gbw", flags)


def test_the_presets_model_decodes_as_its_full_forward_pass():
    model, d = llama4_model()
    names = [layer.self_attn.mechanism.config.name for layer in model.decoder.layers]
    assert names == ["rope", "rope", "llama4-temperature"]
    assert model.decoder.embed_positions is None
    tokens = random_tokens(d, 3, 9, seed=3)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    # the temperature is in the output: attn_scale 0 (HF's tuning off) changes it, after position 0
    off, _ = llama4_model("--llama4-attn-scale", "0")
    plain_full = off(tokens)[0]
    torch.testing.assert_close(plain_full[:, :1], full[:, :1], rtol=1e-5, atol=1e-6)  # factor 1 at position 0
    assert not torch.allclose(plain_full[:, 2:], full[:, 2:], rtol=1e-4, atol=1e-5)
