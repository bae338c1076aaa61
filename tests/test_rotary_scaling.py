"""The long-context rotary variants of functional/rotary_scaling.py against the code users
run: Hugging Face transformers 4.57.1 (called: its ``ROPE_INIT_FUNCTIONS``, Phi-3's rotary
module and model, Llama 4's attention module), torchtune's ``Llama3ScaledRoPE`` and the
gemma library's ``rope_proportion`` (their arithmetic restated, commits named below).

HF computes in float32. The float64 comparisons run HF's own functions with their float32
read as float64 (:func:`hf_float64`: the module's ``torch`` swapped for one whose
``torch.float``/``torch.float32`` are float64 and whose tensors' ``.float()`` is
``.double()``), so they agree to the last bits; each is also compared with HF as shipped,
to float32's rounding."""

import math

import pytest
import torch
import transformers
from transformers import DynamicCache, Llama4TextConfig, LlamaConfig, Phi3Config, Phi3ForCausalLM, PretrainedConfig
from transformers import modeling_rope_utils as hf_rope
from transformers.models.llama4 import modeling_llama4
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from fairseq_distattn.functional.rotary import turns
from fairseq_distattn.functional.rotary_scaling import (
    llama3_frequencies,
    llama4_attention_scales,
    longrope_attention_factor,
    longrope_frequencies,
    longrope_uses_long_factors,
    partial_frequencies,
)

HF_VERSION = "4.57.1"
FLOAT64 = {"rtol": 1e-15, "atol": 0.0}
FLOAT32 = {"rtol": 2e-6, "atol": 0.0}  # HF's float32 powers of base 500000: ln 500000 = 13 times float32's 6e-8


class Float64Tensor(torch.Tensor):
    """A tensor whose ``.float()`` is ``.double()`` (the subclass survives torch's ops)."""

    def float(self, *args, **kwargs):
        return self.double(*args, **kwargs)


class Float64Torch:
    """``torch`` as HF's rope module sees it under :func:`hf_float64`."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)

    def arange(self, *args, **kwargs):
        return torch.arange(*args, **kwargs).as_subclass(Float64Tensor)

    def tensor(self, *args, **kwargs):
        return torch.tensor(*args, **kwargs).as_subclass(Float64Tensor)


@pytest.fixture
def hf_float64(monkeypatch):
    """HF's ``modeling_rope_utils`` computing in float64 for the test."""
    monkeypatch.setattr(hf_rope, "torch", Float64Torch())


def plain(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(torch.Tensor)


def test_the_peer_is_the_transformers_version_read():
    assert transformers.__version__ == HF_VERSION, "re-read HF's rope code for this version and update the docstrings"
    assert set(hf_rope.ROPE_INIT_FUNCTIONS) >= {"llama3", "longrope"}
    assert "proportional" not in hf_rope.ROPE_INIT_FUNCTIONS  # p-RoPE's rope_type arrives in transformers 5


# --------------------------------------------------------------------------- Llama 3.1

# (hidden_size, heads, head_dim, partial_rotary_factor, base, factor, low, high, original, max positions)
LLAMA3_CASES = {
    "llama-3.1-8b": (4096, 32, 128, 1.0, 500000.0, 8.0, 1.0, 4.0, 8192, 131072),
    "llama-3.2-1b": (2048, 32, 64, 1.0, 500000.0, 32.0, 1.0, 4.0, 8192, 131072),
    "partial-rotary": (512, 8, 64, 0.5, 10000.0, 4.0, 2.0, 8.0, 2048, 8192),
    "no-scaling": (512, 8, 64, 1.0, 10000.0, 1.0, 1.0, 4.0, 1024, 4096),
}


def llama3_config(hidden, heads, head_dim, partial, base, factor, low, high, original, longest):
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    return LlamaConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        head_dim=head_dim,
        partial_rotary_factor=partial,
        rope_theta=base,
        max_position_embeddings=longest,
        rope_scaling=scaling,
    )


def ours_llama3(hidden, heads, head_dim, partial, base, factor, low, high, original, longest):
    return llama3_frequencies(int(head_dim * partial), base, factor, low, high, original)


@pytest.mark.parametrize("case", sorted(LLAMA3_CASES))
def test_llama3_equals_hugging_faces_init_in_float64(case, hf_float64):
    values = LLAMA3_CASES[case]
    inv_freq, attention_factor = hf_rope.ROPE_INIT_FUNCTIONS["llama3"](llama3_config(*values), None)
    assert inv_freq.dtype == torch.float64
    theta = ours_llama3(*values)
    assert theta.dtype == torch.float64 and theta.shape == inv_freq.shape
    torch.testing.assert_close(theta, plain(inv_freq), **FLOAT64)
    assert attention_factor == 1.0


@pytest.mark.parametrize("case", sorted(LLAMA3_CASES))
def test_llama3_equals_hugging_face_as_shipped_to_float32_rounding(case):
    values = LLAMA3_CASES[case]
    inv_freq, attention_factor = hf_rope.ROPE_INIT_FUNCTIONS["llama3"](llama3_config(*values), None)
    assert inv_freq.dtype == torch.float32
    torch.testing.assert_close(ours_llama3(*values), inv_freq.double(), **FLOAT32)
    assert attention_factor == 1.0


def test_llama3_bands_of_llama_3_1_8b():
    """Kept above 8192/4 positions a turn, divided by 8 below 8192, blended between (these
    values reach every branch)."""
    base = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    theta = llama3_frequencies(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    wavelength = 2 * math.pi / base
    kept, divided = wavelength < 2048, wavelength > 8192
    blended = ~kept & ~divided
    assert kept.sum() > 0 and divided.sum() > 0 and blended.sum() > 0
    assert torch.equal(theta[kept], base[kept])
    torch.testing.assert_close(theta[divided], base[divided] / 8, **FLOAT64)
    assert bool(((theta[blended] < base[blended]) & (theta[blended] > base[blended] / 8)).all())
    torch.testing.assert_close(llama3_frequencies(64, 10000.0, 1.0, 1.0, 4.0, 1024), rope_theta(64), **FLOAT64)


def torchtune_llama3_theta(dim, base, scale_factor, low_freq_factor, high_freq_factor, old_context_len):
    """torchtune's ``Llama3ScaledRoPE`` (torchtune/models/llama3_1/_position_embeddings.py at
    pytorch/torchtune commit bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1): ``rope_init``'s
    frequencies and ``apply_scaling``'s per-pair branches, restated in float64 (over 0-d
    tensors, as there: torch divides a number by a tensor through the tensor's reciprocal,
    which can differ from Python's division of floats in the last bit)."""
    pairs = torch.arange(0, dim, 2)[: dim // 2].double()
    frequencies = 1.0 / (base ** (pairs / dim))
    longest_scaled, shortest_kept = old_context_len / low_freq_factor, old_context_len / high_freq_factor
    scaled = []
    for frequency in frequencies:
        wavelength = 2 * math.pi / frequency
        if wavelength < shortest_kept:
            scaled.append(frequency)
        elif wavelength > longest_scaled:
            scaled.append(frequency / scale_factor)
        else:
            smooth = (old_context_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            scaled.append((1 - smooth) * frequency / scale_factor + smooth * frequency)
    return torch.stack(scaled)


@pytest.mark.parametrize(
    "dim, base, factor, low, high, original",
    [(128, 500000.0, 8.0, 1.0, 4.0, 8192), (64, 500000.0, 32.0, 1.0, 4.0, 8192), (32, 10000.0, 4.0, 2.0, 8.0, 2048)],
)
def test_llama3_equals_torchtunes_llama3_scaled_rope(dim, base, factor, low, high, original):
    expected = torchtune_llama3_theta(dim, base, factor, low, high, original)
    torch.testing.assert_close(llama3_frequencies(dim, base, factor, low, high, original), expected, **FLOAT64)


# --------------------------------------------------------------------------- LongRoPE (Phi-3)

PHI3_PAIRS = 48  # Phi-3 mini: hidden 3072, 32 heads, head_dim 96
# Phi-3-style factor lists (made up, of Phi-3's shape: near 1 for the short ones, growing for the long ones)
SHORT = [1.0 + 0.05 * math.sin(i) ** 2 for i in range(PHI3_PAIRS)]
LONG = [1.0 + 0.9 * i + 0.01 * i * i for i in range(PHI3_PAIRS)]


def phi3_config(partial=1.0, pairs=PHI3_PAIRS, **overrides):
    settings = dict(
        hidden_size=3072,
        num_attention_heads=32,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_theta=10000.0,
        partial_rotary_factor=partial,
        rope_scaling={"type": "longrope", "short_factor": SHORT[:pairs], "long_factor": LONG[:pairs]},
    )
    settings.update(overrides)
    return Phi3Config(**settings)


def ours_phi3(length, partial=1.0, pairs=PHI3_PAIRS):
    dims = int(96 * partial)
    return longrope_frequencies(dims, 10000.0, SHORT[:pairs], LONG[:pairs], 4096, 131072, length)


@pytest.mark.parametrize("length", [1, 100, 4095, 4096, 4097, 8192, 131072, 200000])
def test_longrope_equals_hugging_faces_init_in_float64_below_and_above_the_switch(length, hf_float64):
    inv_freq, attention_factor = hf_rope.ROPE_INIT_FUNCTIONS["longrope"](phi3_config(), None, seq_len=length)
    theta, factor = ours_phi3(length)
    assert inv_freq.dtype == theta.dtype == torch.float64 and theta.shape == (PHI3_PAIRS,)
    torch.testing.assert_close(theta, plain(inv_freq), **FLOAT64)
    assert factor == attention_factor == math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))
    assert longrope_uses_long_factors(length, 4096) == (length > 4096)


def test_longrope_without_a_length_is_hugging_faces_init_and_partial_rotary_is_followed(hf_float64):
    inv_freq, _ = hf_rope.ROPE_INIT_FUNCTIONS["longrope"](phi3_config(), None)  # the module's init: no seq_len
    torch.testing.assert_close(ours_phi3(1)[0], plain(inv_freq), **FLOAT64)
    for length in (4096, 4097):
        config = phi3_config(partial=0.5, pairs=24)
        inv_freq, attention_factor = hf_rope.ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=length)
        theta, factor = ours_phi3(length, partial=0.5, pairs=24)
        torch.testing.assert_close(theta, plain(inv_freq), **FLOAT64)
        assert factor == attention_factor


@pytest.mark.parametrize("attention_factor", [None, 1.25])
@pytest.mark.parametrize("length", [2048, 2049])
def test_longrope_from_a_config_with_factor_and_no_original_length(attention_factor, length, hf_float64):
    """HF's other path: original length = max_position_embeddings, rope_scaling's factor the scale."""
    scaling = {"rope_type": "longrope", "factor": 4.0, "short_factor": SHORT[:32], "long_factor": LONG[:32]}
    if attention_factor is not None:
        scaling["attention_factor"] = attention_factor
    config = PretrainedConfig(
        hidden_size=256, num_attention_heads=4, rope_theta=50000.0, max_position_embeddings=2048, rope_scaling=scaling
    )
    inv_freq, hf_factor = hf_rope.ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=length)
    theta, factor = longrope_frequencies(
        64, 50000.0, SHORT[:32], LONG[:32], 2048, 4 * 2048, length, attention_factor=attention_factor
    )
    torch.testing.assert_close(theta, plain(inv_freq), **FLOAT64)
    assert factor == hf_factor == (1.25 if attention_factor else math.sqrt(1 + math.log(4.0) / math.log(2048)))


def test_longrope_attention_factor_is_one_without_extension():
    assert longrope_attention_factor(4096, 4096) == 1.0 == longrope_attention_factor(4096, 2048)
    assert longrope_attention_factor(4096, 131072, 0.5) == 0.5


def test_longrope_switch_as_phi3s_rotary_module_makes_it():
    """``Phi3RotaryEmbedding`` (HF as shipped, float32) rotates with the factors of
    ``max(position_ids) + 1``, both ways, and scales cos and sin by the attention factor."""
    rotary = Phi3RotaryEmbedding(phi3_config())
    x = torch.zeros(1, dtype=torch.float32)
    for largest in (10, 4095, 4096, 9000, 4095, 0):
        cos, _ = rotary(x, torch.tensor([[0, largest]]))
        theta, factor = ours_phi3(largest + 1)
        torch.testing.assert_close(rotary.inv_freq.double(), theta, **FLOAT32)
        other, _ = ours_phi3(1 if largest + 1 > 4096 else 4097)
        assert not torch.allclose(rotary.inv_freq.double(), other, rtol=1e-3)
        assert rotary.attention_scaling == factor
        torch.testing.assert_close(cos[0, 0].double(), torch.full((96,), factor, dtype=torch.float64), **FLOAT32)


def tiny_phi3():
    torch.manual_seed(0)
    config = Phi3Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
        original_max_position_embeddings=8,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0, 2.0, 4.0, 8.0]},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = "eager"
    return Phi3ForCausalLM(config).double().eval()


@torch.no_grad()
def test_longrope_cached_keys_keep_the_short_rotation_after_the_switch():
    """HF swaps inv_freq at the switch but re-rotates no cached key: a forward call with a
    cache that crosses it differs from recomputing the sequence (it equals it before)."""
    model, tokens = tiny_phi3(), torch.randint(3, 50, (1, 10))
    cache = DynamicCache()
    model(tokens[:, :7], past_key_values=cache, use_cache=True)
    step = model(tokens[:, 7:8], past_key_values=cache, use_cache=True).logits[:, -1]  # 8 positions: short
    torch.testing.assert_close(step, model(tokens[:, :8]).logits[:, -1], rtol=1e-12, atol=1e-12)
    cached = cache.layers[0].keys.clone()
    step = model(tokens[:, 8:9], past_key_values=cache, use_cache=True).logits[:, -1]  # 9 positions: long
    assert torch.equal(cache.layers[0].keys[:, :, :8], cached)  # not re-rotated
    recomputed = model(tokens[:, :9]).logits[:, -1]  # every key with the long factors
    assert (step - recomputed).abs().max() > 1e-9


@torch.no_grad()
def test_longrope_generation_drops_phi3s_cache_at_the_switch():
    """``Phi3ForCausalLM.prepare_inputs_for_generation`` recomputes the cache once at the
    switch, so greedy generation across it equals decoding without a cache."""
    model, prompt = tiny_phi3(), torch.randint(3, 50, (1, 6))
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    sequence = prompt
    for _ in range(6):
        sequence = torch.cat([sequence, model(sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, sequence)


# --------------------------------------------------------------------------- p-RoPE


def rope_theta(head_dim, base=10000.0):
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def test_p_rope_fraction_one_keeps_every_frequency_and_zero_none():
    theta = rope_theta(128)
    assert torch.equal(partial_frequencies(theta, 1.0), theta)
    assert torch.equal(partial_frequencies(theta, 1), theta)
    assert torch.equal(partial_frequencies(theta, 0.0), torch.zeros(64, dtype=torch.float64))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.3, 1 / 3, 0.5, 0.75, 0.9])
def test_p_rope_keeps_the_highest_frequencies_as_gemmas_rope_proportion(head_dim, fraction):
    """google-deepmind/gemma, gemma/gm/math/_positional_embeddings.py (commit 74824c94):
    ``int(rope_proportion * head_dim // 2)`` pairs at ``base^(-2i/head_dim)``, the rest at an
    infinite timescale (frequency 0); transformers 5.24's ``proportional`` rope_type alike."""
    kept = int(fraction * head_dim // 2)
    rotated = 1.0 / 10000.0 ** (torch.arange(0, 2 * kept, 2, dtype=torch.float64) / head_dim)
    gemma = torch.cat([rotated, torch.zeros(head_dim // 2 - kept, dtype=torch.float64)])
    theta = partial_frequencies(rope_theta(head_dim), fraction)
    assert theta.dtype == torch.float64
    torch.testing.assert_close(theta, gemma, rtol=0, atol=0)
    assert int((theta > 0).sum()) == kept == math.floor(fraction * head_dim / 2)
    assert theta[theta > 0].min() > rope_theta(head_dim)[kept:].max()


@pytest.mark.parametrize("fraction, pairs, kept", [(0.25, 64, 16), (0.5, 64, 32), (0.1, 64, 6), (0.3, 32, 9)])
def test_p_rope_counts(fraction, pairs, kept):
    assert int((partial_frequencies(rope_theta(2 * pairs), fraction) > 0).sum()) == kept


def test_p_rope_keeps_the_largest_theta_in_any_order_and_the_rest_do_not_turn():
    theta = rope_theta(32)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    shuffled = partial_frequencies(theta[order], 0.25)
    assert sorted(shuffled[shuffled > 0].tolist(), reverse=True) == theta[:4].tolist()
    scaled = partial_frequencies(llama3_frequencies(32, 10000.0, 4.0, 1.0, 4.0, 64), 0.5)
    turn = turns(torch.arange(50)[None], scaled)
    assert torch.equal(turn[..., 8:], torch.ones_like(turn[..., 8:]))
    assert not torch.equal(turn[..., :8], torch.ones_like(turn[..., :8]))


# --------------------------------------------------------------------------- Llama 4


class Captured(Exception):
    pass


def hf_llama4_query_scales(monkeypatch, cache_position, floor_scale, attn_scale):
    """The factor HF's ``Llama4TextAttention`` (transformers 4.57.1, a NoPE layer with
    attn_temperature_tuning) puts on each query: its q projection the identity on queries of
    ones, the query it hands to the attention function read back."""
    config = Llama4TextConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        intermediate_size_mlp=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
    )
    config._attn_implementation = "eager"
    attention = modeling_llama4.Llama4TextAttention(config, layer_idx=0).double()
    assert not attention.use_rope
    with torch.no_grad():
        attention.q_proj.weight.copy_(torch.eye(16))
    seen = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen.append(plain(query).clone())
        raise Captured

    monkeypatch.setattr(modeling_llama4, "eager_attention_forward", capture)
    hidden = torch.ones(1, cache_position.numel(), 16, dtype=torch.float64)
    with pytest.raises(Captured):
        attention(hidden, position_embeddings=None, attention_mask=None, cache_position=cache_position)
    (query,) = seen
    assert torch.equal(query, query[:, :1, :, :1].expand_as(query))  # one factor per position
    return query[0, 0, :, 0]


LLAMA4_CASES = [
    (torch.arange(0, 40), 4, 0.1),
    (torch.arange(8185, 8200), 8192, 0.1),  # Llama 4's values
    (torch.tensor([100000]), 8192, 0.1),  # one decoding step far into the cache
    (torch.arange(0, 64, 3), 5, 0.37),
]


@pytest.mark.parametrize("positions, floor_scale, attn_scale", LLAMA4_CASES)
def test_llama4_scales_equal_hugging_faces_attention(monkeypatch, positions, floor_scale, attn_scale):
    ours = llama4_attention_scales(positions, floor_scale, attn_scale)
    assert ours.dtype == torch.float64 and ours.shape == positions.shape
    as_shipped = hf_llama4_query_scales(monkeypatch, positions, floor_scale, attn_scale)  # scales in float32
    torch.testing.assert_close(ours, as_shipped, rtol=1e-6, atol=0.0)
    in_float64 = hf_llama4_query_scales(monkeypatch, positions.as_subclass(Float64Tensor), floor_scale, attn_scale)
    torch.testing.assert_close(ours, in_float64, **FLOAT64)


def test_llama4_scales_count_cache_positions_from_zero():
    scales = llama4_attention_scales(torch.tensor([0, 8190, 8191, 16382, 16383]), 8192, 0.1)
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3)]
    torch.testing.assert_close(scales, torch.tensor(expected, dtype=torch.float64), **FLOAT64)
    torch.testing.assert_close(llama4_attention_scales([0, 8191], 8192, 0.1), scales[[0, 2]], rtol=0, atol=0)
    assert llama4_attention_scales(range(3), 8192, 0.1).shape == (3,)


# --------------------------------------------------------------------------- argument errors

LLAMA3 = dict(dims=128, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_length=8192)
LONGROPE = dict(
    dims=8, base=10000.0, short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_length=16, max_length=64, length=8
)
LLAMA4 = dict(positions=torch.arange(4), floor_scale=8192, attn_scale=0.1)

BAD_ARGUMENTS = [
    (llama3_frequencies, LLAMA3, "dims", 127),
    (llama3_frequencies, LLAMA3, "dims", 0),
    (llama3_frequencies, LLAMA3, "dims", 128.0),
    (llama3_frequencies, LLAMA3, "base", 0.0),
    (llama3_frequencies, LLAMA3, "base", math.inf),
    (llama3_frequencies, LLAMA3, "factor", 0.5),
    (llama3_frequencies, LLAMA3, "factor", math.nan),
    (llama3_frequencies, LLAMA3, "low_freq_factor", -1.0),
    (llama3_frequencies, LLAMA3, "high_freq_factor", 1.0),
    (llama3_frequencies, LLAMA3, "original_length", 0),
    (llama3_frequencies, LLAMA3, "original_length", 8192.5),
    (longrope_frequencies, LONGROPE, "dims", 7),
    (longrope_frequencies, LONGROPE, "base", -2.0),
    (longrope_frequencies, LONGROPE, "short_factor", [1.0] * 3),
    (longrope_frequencies, LONGROPE, "short_factor", [1.0, 1.0, 0.0, 1.0]),
    (longrope_frequencies, LONGROPE, "long_factor", [1.0, 1.0, math.nan, 1.0]),
    (longrope_frequencies, LONGROPE, "long_factor", ["a", 1.0, 1.0, 1.0]),
    (longrope_frequencies, LONGROPE, "long_factor", None),
    (longrope_frequencies, LONGROPE, "original_length", 0),
    (longrope_frequencies, LONGROPE, "max_length", 0),
    (longrope_frequencies, LONGROPE, "length", 0),
    (longrope_frequencies, LONGROPE, "length", True),
    (longrope_frequencies, LONGROPE, "attention_factor", 0.0),
    (longrope_uses_long_factors, dict(length=5, original_length=4), "length", -1),
    (longrope_uses_long_factors, dict(length=5, original_length=4), "original_length", 4.0),
    (longrope_attention_factor, dict(original_length=1, max_length=8), "original_length", 1),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "theta", [1.0, 0.5]),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "theta", torch.ones(2, 2)),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "theta", torch.arange(4)),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "fraction", 1.5),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "fraction", -0.1),
    (partial_frequencies, dict(theta=rope_theta(8), fraction=0.5), "fraction", True),
    (llama4_attention_scales, LLAMA4, "positions", torch.tensor([0.0, 1.0])),
    (llama4_attention_scales, LLAMA4, "positions", torch.tensor([-1, 0])),
    (llama4_attention_scales, LLAMA4, "positions", [0, 1.5]),
    (llama4_attention_scales, LLAMA4, "positions", 3),
    (llama4_attention_scales, LLAMA4, "floor_scale", 0),
    (llama4_attention_scales, LLAMA4, "attn_scale", math.inf),
]


@pytest.mark.parametrize(
    "function, arguments, name, value",
    BAD_ARGUMENTS,
    ids=[f"{function.__name__}-{name}-{i}" for i, (function, _, name, _) in enumerate(BAD_ARGUMENTS)],
)
def test_a_bad_argument_raises_a_one_line_value_error_naming_it(function, arguments, name, value):
    with pytest.raises(ValueError) as error:
        function(**{**arguments, name: value})
    message = str(error.value)
    assert message.startswith(f"{name} ") and "\n" not in message, message


# --------------------------------------------------------------------------
# the scalings as the rope mechanism's options (issue 64)
# --------------------------------------------------------------------------


def test_rope_scaling_llama3_and_kept_frequencies_are_the_peer_functions():
    from fairseq_distattn.functional.rotary import rotary_frequencies

    theta, logit_factor = rotary_frequencies(
        128, 500000.0, "llama3", 8.0, 8192, low_frequency_factor=1.0, high_frequency_factor=4.0
    )
    torch.testing.assert_close(theta, llama3_frequencies(128, 500000.0, 8.0, 1.0, 4.0, 8192), rtol=0, atol=0)
    assert logit_factor == 1.0
    kept, _ = rotary_frequencies(64, 10000.0, kept_frequencies=0.25)
    plain, _ = rotary_frequencies(64, 10000.0)
    torch.testing.assert_close(kept, partial_frequencies(plain, 0.25), rtol=0, atol=0)
    assert int((kept > 0).sum()) == 8


@pytest.mark.parametrize(
    "flags",
    [
        ["--rope-scaling", "llama3", "--rope-scaling-factor", "4", "--rope-original-length", "3"],
        ["--rope-kept-frequencies", "0.5"],
    ],
    ids=["llama3", "p-rope"],
)
def test_rope_language_model_with_the_new_forms_decodes_as_its_full_forward(flags):
    from .model_helpers import TINY_LM, language_model, random_tokens

    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *flags])
    tokens = random_tokens(d, 3, 7, seed=3)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    plain, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope"])
    plain.load_state_dict(model.state_dict())
    assert not torch.allclose(plain(tokens)[0], full), "the option changes what the model computes"


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--rope-scaling", "llama3", "--rope-scaling-factor", "8"], "--rope-original-length"),
        (
            ["--rope-scaling", "llama3", "--rope-scaling-factor", "8", "--rope-original-length", "64"]
            + ["--rope-high-frequency-factor", "0.5"],
            "--rope-high-frequency-factor",
        ),
        (["--rope-kept-frequencies", "1.5"], "--rope-kept-frequencies"),
    ],
)
def test_rope_scaling_flags_are_refused_in_one_line_naming_the_flag(flags, flag, capsys):
    from .model_helpers import TINY_LM, language_model

    with pytest.raises(SystemExit) as exit_status:
        language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *flags])
    assert exit_status.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error: argument" in line]
    assert len(errors) == 1 and f"error: argument {flag}: invalid value" in errors[0], errors


# --------------------------------------------------------------------------
# --rope-scaling longrope in the rope mechanism and the model (issue 64)
# --------------------------------------------------------------------------

LONGROPE_FLAGS = [
    "--rope-scaling",
    "longrope",
    "--rope-scaling-factor",
    "4",
    "--rope-original-length",
    "4",
    "--rope-short-factor",
    "1.0,1.1,1.3,1.6",
    "--rope-long-factor",
    "1.0,2.0,4.0,8.0",
]


@pytest.mark.parametrize("length", [3, 4, 5, 9])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotary_longrope_logits_equal_phi3s_rotary_as_shipped(length, partial):
    """The rope op's longrope logits are Phi-3's: HF's ``Phi3RotaryEmbedding`` (its factors
    switching at ``max(position_ids) + 1 > original``, cos and sin times the attention factor)
    and ``apply_rotary_pos_emb`` on the rotate-half layout, the same queries and keys in
    neighbouring pairs (the layouts are one rotation, :mod:`fairseq_distattn.functional.rotary`)."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    from fairseq_distattn.functional.rotary import rotary_query_key

    pairs = int(16 * partial) // 2
    config = phi3_config(partial=partial, pairs=pairs, hidden_size=64, num_attention_heads=4)
    config.max_position_embeddings, config.original_max_position_embeddings = 16, 4
    generator = torch.Generator().manual_seed(length)
    q, k = torch.randn(2, 1, 4, length, 16, generator=generator)
    cos, sin = Phi3RotaryEmbedding(config)(q, torch.arange(length)[None])
    rotated = 2 * pairs
    hf_q, hf_k = apply_rotary_pos_emb(q[..., :rotated], k[..., :rotated], cos, sin)
    hf_logits = hf_q @ hf_k.transpose(-1, -2) + q[..., rotated:] @ k[..., rotated:].transpose(-1, -2)
    order = [i // 2 + (pairs if i % 2 else 0) for i in range(rotated)] + list(range(rotated, 16))
    ours_q, ours_k = rotary_query_key(
        q[..., order].double(),
        k[..., order].double(),
        fraction=partial,
        scaling="longrope",
        scaling_factor=4.0,
        original_length=4,
        short_factor=SHORT[:pairs],
        long_factor=LONG[:pairs],
    )
    torch.testing.assert_close((ours_q @ ours_k.transpose(-1, -2)).float(), hf_logits, rtol=1e-5, atol=1e-5)


def longrope_steps(model, tokens, **decoder_inputs):
    state = {}
    return [
        model.decoder(tokens[:, : t + 1], incremental_state=state, **decoder_inputs)[0][:, -1]
        for t in range(tokens.size(1))
    ]


def test_longrope_language_model_decodes_across_the_switch_as_each_prefix_forward():
    """Incremental decoding equals the full forward of each prefix, before and after the
    switch (4 positions): at the crossing the decoder recomputes its cache, as Phi-3's
    generate() does; without that the steps after the switch would differ."""
    from .model_helpers import TINY_LM, language_model, random_tokens

    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *LONGROPE_FLAGS])
    assert model.decoder.cache_recompute_lengths == {4}
    tokens = random_tokens(d, 3, 8, seed=5)
    prefixes = [model(tokens[:, : t + 1])[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(longrope_steps(model, tokens), 1), torch.stack(prefixes, 1))
    full = model(tokens)[0]
    assert not torch.allclose(full[:, 3], prefixes[3]), "the long factors change the first positions too"
    model.decoder.cache_recompute_lengths = frozenset()  # the cache kept: HF's forward with a cache
    kept = longrope_steps(model, tokens)
    torch.testing.assert_close(torch.stack(kept[:4], 1), torch.stack(prefixes[:4], 1))
    assert not torch.allclose(kept[4], prefixes[4])


def test_longrope_translation_decoder_recomputes_its_cache_with_a_beam_reorder():
    """A translation decoder with rope in its self-attention and fairseq's own cross-attention:
    the cross-attention's cached keys are refilled too, after a beam reorder."""
    from .model_helpers import TINY, random_tokens, translation_model

    model, d = translation_model(extra=[*TINY, "--decoder-self-attention", "rope", *LONGROPE_FLAGS])
    model.decoder.set_beam_size(2)
    # two sentences x two hypotheses (fairseq's cross-attention keeps one key copy per sentence)
    src_tokens = random_tokens(d, 2, 6, seed=1).repeat_interleave(2, 0)
    src_lengths = torch.full((4,), 6)
    targets = random_tokens(d, 4, 8, seed=2)
    targets[:, 0] = d.eos()
    new_order = torch.tensor([1, 1, 3, 2])
    encoder_out, state, steps = model.encoder(src_tokens, src_lengths), {}, []
    for step in range(targets.size(1)):
        if step == 2:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            steps = [out[new_order] for out in steps]
            targets = torch.cat([targets[new_order, :step], targets[:, step:]], dim=1)
        out = model.decoder(targets[:, : step + 1], encoder_out=encoder_out, incremental_state=state)[0]
        steps.append(out[:, -1])
    prefixes = [model(src_tokens, src_lengths, targets[:, : t + 1])[0][:, -1] for t in range(targets.size(1))]
    torch.testing.assert_close(torch.stack(steps, 1), torch.stack(prefixes, 1))


@pytest.mark.parametrize(
    "flags, flag",
    [
        (LONGROPE_FLAGS[:6], "--rope-short-factor"),
        ([*LONGROPE_FLAGS[:-1], "1,2,4"], "--rope-long-factor"),
        ([*LONGROPE_FLAGS[:-1], "1,2,x,4"], "--rope-long-factor"),
        ([*LONGROPE_FLAGS[:-1], "1,2,0,4"], "--rope-long-factor"),
        ([*LONGROPE_FLAGS, "--rope-attention-factor", "-1"], "--rope-attention-factor"),
        (["--rope-short-factor", "1,1,1,1"], "--rope-short-factor"),
        (["--rope-attention-factor", "1.2"], "--rope-attention-factor"),
        (LONGROPE_FLAGS[:4] + LONGROPE_FLAGS[6:], "--rope-original-length"),
    ],
)
def test_longrope_flags_are_refused_in_one_line_naming_the_flag(flags, flag, capsys):
    from .model_helpers import TINY_LM, language_model

    with pytest.raises(SystemExit) as exit_status:
        language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *flags])
    assert exit_status.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error: argument" in line]
    assert len(errors) == 1 and f"error: argument {flag}: invalid value" in errors[0], errors


def longrope_search_start(dim, base, scale, original):
    """microsoft/LongRoPE c9e56aa's initial factors, restated: ``evolution/search.py`` (YaRN's
    mask with its llama betas 32 and 1) and ``rope/yarn.py`` (``find_correction_range``,
    ``linear_ramp_mask`` in float32)."""

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(32)), 0)
    high = min(math.ceil(correction_dim(1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    return scale * (1 - mask) + 1.0 * mask


@pytest.mark.parametrize(
    "dim, base, scale, original", [(64, 10000.0, 8.0, 64), (128, 10000.0, 32.0, 4096), (96, 5e5, 2.5, 2048)]
)
def test_longrope_initial_factors_are_its_searchs_starting_point(dim, base, scale, original):
    from fairseq_distattn.functional.rotary import longrope_initial_factors

    ours = torch.tensor(longrope_initial_factors(dim, base, scale, original), dtype=torch.float64)
    torch.testing.assert_close(ours, longrope_search_start(dim, base, scale, original).double(), rtol=1e-6, atol=1e-6)
    # the high frequencies kept (1), the low ones interpolated (s), a non-decreasing ramp between
    assert ours.min() >= 1.0 and ours.max() <= scale and bool((ours.diff() >= 0).all())
