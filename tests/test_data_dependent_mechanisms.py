"""The data-dependent mechanisms of 2024-2025 as layers (issue 63): ``fox``, ``selective``,
``stick-breaking``, ``path`` and ``dape``. Their ops are checked against the authors'
arithmetic in their own test files (test_forgetting_attention.py and the others); here,
what each layer makes of its input, restated from the authors' layer code in float64,
and what the registry-wide tests cannot see (the encoder's form of FoX, the decoding
state of selective attention). Incremental decoding, padding and the execution paths
of every mechanism are in test_models.py, test_execution_paths.py and the other
registry-parametrised tests."""

import math

import pytest
import torch
import torch.nn.functional as F

import fairseq_distattn.mechanisms  # noqa: F401 (registers every mechanism)
from fairseq_distattn.functional import alibi_bias, forgetting_attention, kerple_bias
from fairseq_distattn.functional.paths import CallOptions
from fairseq_distattn.modules.multihead_attention import MechanismMultiheadAttention
from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF, SpecError
from fairseq_distattn.spec import AttentionOptions, parse_spec

from .model_helpers import TINY_LM, language_model, random_tokens

B, H, T, D = 2, 3, 7, 4
E = H * D


def attention_layer(mechanism, causal, options=None):
    torch.manual_seed(0)
    layer = MechanismMultiheadAttention(E, H, mechanism, options or AttentionOptions(), causal, self_attention=True)
    return layer.double().eval()


def restated_heads(x, projection):
    """``[T, B, E] -> [B, H, T, D]`` through a fairseq projection."""
    return projection(x).view(x.size(0), x.size(1), H, D).permute(1, 2, 0, 3)


def test_fox_layer_is_the_authors_forget_gate_on_its_input():
    """zhixuan-lin/forgetting-transformer 883f260: ``log_fgate = logsigmoid(fgate_proj(x))``
    per head, the bias ``c_i - c_j`` of its cumsum unscaled on ``q k^T / sqrt(D)``, causal."""
    layer = attention_layer("fox", causal=True)
    assert tuple(layer.mechanism.gate.weight.shape) == (H, E)  # fgate_proj: Linear(hidden, num_heads)
    x = torch.randn(T, B, E, dtype=torch.float64)
    out, _ = layer(x, x, x, need_weights=False)
    q, k, v = (restated_heads(x, p) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    log_f = F.logsigmoid(layer.mechanism.gate(x)).permute(1, 2, 0)  # [B, H, T]
    c = log_f.cumsum(-1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D) + c[..., :, None] - c[..., None, :]
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(logits, -1) @ v
    expected = layer.out_proj(expected.permute(2, 0, 1, 3).reshape(T, B, E))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def x_transformers_bidirectional_bias(forward_gates, backward_gates):
    """x-transformers 9252ed7, ``DataDependentAlibi.forward`` with ``causal=False``:
    cumsums of the log gates, ``c_i - c_j`` kept on and below the diagonal (``tril``),
    ``r_j - r_i`` on and above it (``triu``), summed."""
    c, r = forward_gates.cumsum(-1), backward_gates.cumsum(-1)
    earlier = c[..., :, None] - c[..., None, :]
    later = r[..., None, :] - r[..., :, None]
    return earlier.tril() + later.triu()


def test_fox_bidirectional_form_is_x_transformers_data_dependent_alibi():
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    forward_gates, backward_gates = (F.logsigmoid(torch.randn(B, H, T, dtype=torch.float64)) for _ in range(2))
    out, probs = forgetting_attention(q, k, v, forward_gates, backward_gates)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D) + x_transformers_bidirectional_bias(forward_gates, backward_gates)
    torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out, torch.softmax(logits, -1) @ v, rtol=1e-12, atol=1e-14)
    # rows from an offset are those rows of the full call, and padded keys neither count nor decay
    rows, _ = forgetting_attention(q[:, :, 3:], k, v, forward_gates, backward_gates, query_offset=3)
    torch.testing.assert_close(rows, out[:, :, 3:], rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="log_forget_backward is the bidirectional form's"):
        forgetting_attention(q, k, v, forward_gates, backward_gates, causal=True)


def test_fox_encoder_layers_have_the_second_gate_and_decoder_layers_do_not():
    encoder, decoder = attention_layer("fox", causal=False), attention_layer("fox", causal=True)
    assert tuple(encoder.mechanism.gate.weight.shape) == (2 * H, E)
    assert tuple(decoder.mechanism.gate.weight.shape) == (H, E)
    assert "fox" in ENCODER_SELF.allowed and "fox" in DECODER_SELF.allowed and "fox" not in CROSS.allowed
    x = torch.randn(T, B, E, dtype=torch.float64)
    out, weights = encoder(x, x, x, need_weights=True)
    assert (weights[..., 0, -1] > 0).all(), "an encoder query sees the keys after it"


@pytest.mark.parametrize("mechanism", ["selective", "stick-breaking", "path"])
def test_the_causal_only_mechanisms_refuse_the_encoder_and_cross_attention_in_one_line(mechanism):
    for kind in (ENCODER_SELF, CROSS):
        with pytest.raises(SpecError) as error:
            parse_spec(kind, mechanism, 2)
        assert "\n" not in str(error.value) and "causal" in str(error.value)


def test_selective_decoding_carries_the_summed_selections_in_its_state():
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "selective"])
    tokens = random_tokens(d, 3, 6, seed=3)
    full = model(tokens)[0]
    state, steps = {}, []
    for t in range(tokens.size(1)):
        steps.append(model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1])
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    saved = [value for name, value in state.items() if name.endswith("attn_state")]
    selections = [buffer["prev_selection_state"] for buffer in saved]
    assert selections and all(tuple(s.shape) == (3, 1, tokens.size(1)) for s in selections)


def test_path_layer_makes_w_and_beta_as_flash_linear_attentions_layer():
    """fla bc3b101 ``PaTHAttention``: ``w = ShortConvolution(w_proj(x))`` (rank 32, a causal
    depthwise convolution of width 3 with SiLU), ``beta = 2 sigmoid(bt_proj(x))``; the op
    normalises w per head."""
    layer = attention_layer("path", causal=True)
    mechanism = layer.mechanism
    x = torch.randn(T, B, E, dtype=torch.float64)
    inputs = mechanism.inputs_from_layer(x)
    raw = mechanism.w_proj(mechanism.w_low_rank(x))  # [T, B, E]
    channels = raw.permute(1, 2, 0)  # [B, E, T]
    convolved = F.silu(F.conv1d(F.pad(channels, (2, 0)), mechanism.w_conv.weight, groups=E))
    expected_w = convolved.view(B, H, D, T).permute(0, 1, 3, 2)
    torch.testing.assert_close(mechanism.directions(inputs["path_w"], None), expected_w, rtol=1e-12, atol=1e-14)
    beta = 2 * torch.sigmoid(mechanism.beta_proj(x)).permute(1, 2, 0)
    torch.testing.assert_close(inputs["path_beta"][..., 0], beta, rtol=1e-12, atol=1e-14)
    assert "log_forget" not in inputs
    # a left-padded sentence starts as the sentence alone: its pads' projections are 0 before the convolution
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, :3] = True
    padded = mechanism.directions(inputs["path_w"], padding)
    alone = mechanism.directions(mechanism.inputs_from_layer(x[3:, 1:2])["path_w"], None)
    torch.testing.assert_close(padded[1:2, :, 3:], alone, rtol=1e-12, atol=1e-14)


def test_path_forget_gate_adds_foxs_gate():
    from fairseq_distattn.mechanisms.path import PathOptions

    layer = attention_layer("path", causal=True, options=AttentionOptions(PathOptions(path_forget_gate=True)))
    x = torch.randn(T, B, E, dtype=torch.float64)
    gates = layer.mechanism.inputs_from_layer(x)["log_forget"][..., 0]
    torch.testing.assert_close(gates, F.logsigmoid(layer.mechanism.forget_gate(x)).permute(1, 2, 0))


@pytest.mark.parametrize("base", ["kerple", "alibi"])
def test_dape_layer_adapts_the_authors_static_bias(base):
    """chuanyang-Zheng/DAPE bde344a ``ParallelKerpleLog_C`` / ``AliBi_C``: the bias is
    KERPLE's ``-p log(1 + a |i - j|)`` (p, a per layer, clamped to >= 0.01) or ALiBi's."""
    from fairseq_distattn.mechanisms.dape import DapeOptions

    layer = attention_layer("dape", causal=True, options=AttentionOptions(DapeOptions(dape_bias=base)))
    mechanism = layer.mechanism
    queries = {"query": torch.randn(B, H, 3, D, dtype=torch.float64)}
    keys = {"key": torch.randn(B, H, T, D, dtype=torch.float64)}
    (bias, *mlp), _ = mechanism.op_arguments(queries, keys, CallOptions(causal=True, query_offset=4))
    if base == "kerple":
        p, a = mechanism.scale.clamp(min=0.01), mechanism.rate.clamp(min=0.01)
        expected = kerple_bias(p.detach(), a.detach(), "log", T, T)[:, 4:]
    else:
        expected = alibi_bias(T, T, H, 0, "cpu", torch.float64)[:, 4:]
        assert not list(mechanism.parameters())[:-4], "ALiBi's base has no parameters of its own"
    torch.testing.assert_close(bias.detach(), expected, rtol=1e-12, atol=1e-14)
    assert [tuple(m.shape) for m in mlp] == [(32, 2 * H), (32,), (H, 32), (H,)]  # mlp_width 32
