"""RoPE's and xPos's arguments where they cannot work (issue 47, section 4.5): xPos's
scales centred on a fixed position, the scale bases whose factors leave float32
refused, and one validation for the functional ops (ValueError naming the argument)
and the command line (SpecError naming the flag)."""

import math
import re

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional import rotary as rotary_module
from fairseq_distattn.models.distattn_lm import DistAttnLanguageModel
from fairseq_distattn.registry import SpecError

from .model_helpers import TINY_LM, language_model, parse, random_tokens

GAMMA = 0.4


def uncentred_xpos_attention(q, k, v, scale_base, key_padding_mask=None):
    """xPos as the paper writes it (positions from 0, the query times zeta^(n/B), the key times
    zeta^(-m/B)), causal, written with complex pairs: (a, b) . (c, d) = Re((a + ib) conj(c + id))."""
    head_dim = q.size(-1)
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    theta = 10000.0 ** (-2 * pairs / head_dim)
    zeta = (2 * pairs / head_dim + GAMMA) / (1 + GAMMA)
    positions = torch.arange(q.size(2), dtype=torch.float64)[:, None]

    def turned(x, sign):
        complex_pairs = torch.complex(x[..., 0::2], x[..., 1::2])
        return complex_pairs * torch.polar(zeta ** (sign * positions / scale_base), positions * theta)

    logits = (turned(q, 1) @ turned(k, -1).conj().transpose(-1, -2)).real / math.sqrt(head_dim)
    hidden = torch.ones(q.size(2), k.size(2), dtype=torch.bool).triu(1)
    if key_padding_mask is not None:
        hidden = hidden | key_padding_mask[:, None, None, :]
    return logits.masked_fill(hidden, -math.inf).softmax(-1) @ v


def draw(length, seed=0, heads=2, head_dim=8, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, length, head_dim, generator=generator, dtype=dtype) for _ in range(3)]


# --------------------------------------------------------------------------- xPos's range


@pytest.mark.parametrize("scale_base", [0.1, 1.0])
def test_xpos_scale_bases_whose_factors_leave_float32_are_refused_by_the_op(scale_base):
    """At 128 tokens the logits' factor zeta_0^(-(127)/B) is e^1591 (0.1) and e^159 (1.0):
    refused with the smallest scale base that fits, rather than NaN attention."""
    q, k, v = draw(128)
    for op in (
        lambda: functional.rotary_attention(q, k, v, xpos_scale_base=scale_base, causal=True),
        lambda: functional.rotary_query_key(q, k, xpos_scale_base=scale_base),
    ):
        with pytest.raises(ValueError, match=r"^xpos_scale_base .*float32.*allowed: a scale base >= 1\.83 "):
            op()
    assert functional.smallest_xpos_scale_base(128) == 1.83
    assert 127 * math.log(3.5) / 1.83 <= rotary_module.XPOS_EXPONENT_LIMIT < 127 * math.log(3.5) / 1.82


@pytest.mark.parametrize("scale_base", [1.83, 8.0, 512.0])
@pytest.mark.parametrize("centre", [None, 0.0, 40.0, 127.0])
def test_centred_xpos_is_the_uncentred_attention(scale_base, centre):
    """Any fixed centre gives the paper's (uncentred) attention, in float64, down to the
    smallest scale base 128 tokens allow; in float32 every path, the ones that add the causal
    mask to already formed logits included, stays finite there."""
    q, k, v = draw(128, seed=1)
    mask = torch.zeros(1, 128, dtype=torch.bool)
    expected = uncentred_xpos_attention(q, k, v, scale_base)
    out, _ = functional.rotary_attention(q, k, v, xpos_scale_base=scale_base, xpos_centre=centre, causal=True)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-9)
    single = [x.float() for x in (q, k, v)]
    for need_weights in (True, False):
        for key_padding_mask in (None, mask):
            out32, _ = functional.rotary_attention(
                *single,
                xpos_scale_base=scale_base,
                xpos_centre=centre,
                causal=True,
                need_weights=need_weights,
                key_padding_mask=key_padding_mask,
            )
            assert out32.isfinite().all(), (need_weights, key_padding_mask is not None)
            torch.testing.assert_close(out32.double(), expected, rtol=1e-3, atol=1e-3)


def test_a_centre_far_from_the_positions_is_refused():
    q, k, v = draw(128)
    with pytest.raises(ValueError, match=r"^xpos_centre .*such as 63\.5"):
        functional.rotary_attention(q, k, v, xpos_scale_base=2.0, xpos_centre=10000.0, causal=True)
    with pytest.raises(ValueError, match=r"^xpos_centre must be a finite number"):
        functional.rotary_query_key(q, k, xpos_scale_base=2.0, xpos_centre=math.nan)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_incremental_decoding_against_keys_cached_with_a_fixed_centre_is_the_full_pass(padded):
    """Keys rotated one call at a time (as a decoding cache keeps them) with a fixed centre give
    each later query the logits of the full pass; rotary_attention, which centres each call on
    the middle of its own positions, gives a later block of queries the full pass's rows too."""
    length, centre, scale_base = 24, 20.0, 4.0
    q, k, v = draw(length, seed=2)
    mask = torch.zeros(1, length, dtype=torch.bool)
    if padded:
        mask[0, :3] = True
    arguments = dict(xpos_scale_base=scale_base, xpos_centre=centre, key_padding_mask=mask)
    full_q, full_k = functional.rotary_query_key(q, k, **arguments)
    full_logits = full_q @ full_k.transpose(-1, -2)
    cached = []
    for t in range(length):
        # step t sees the padding of the tokens so far, rotates its own query and key only
        step = dict(arguments, key_padding_mask=mask[:, : t + 1])
        step_q, step_k = functional.rotary_query_key(
            q[:, :, t : t + 1], k[:, :, t : t + 1], query_offset=t, key_offset=t, **step
        )
        cached.append(step_k)
        logits = step_q @ torch.cat(cached, dim=2).transpose(-1, -2)
        real = int(mask[0].sum())  # padded steps: their keys are masked, their outputs unused
        if t >= real:
            torch.testing.assert_close(logits[..., 0, real:], full_logits[..., t, real : t + 1], rtol=1e-10, atol=1e-10)
    full, _ = functional.rotary_attention(q, k, v, xpos_scale_base=scale_base, causal=True, key_padding_mask=mask)
    later, _ = functional.rotary_attention(
        q[:, :, 16:], k, v, xpos_scale_base=scale_base, causal=True, query_offset=16, key_padding_mask=mask
    )
    torch.testing.assert_close(later, full[:, :, 16:], rtol=1e-10, atol=1e-10)
    if not padded:
        torch.testing.assert_close(full, uncentred_xpos_attention(q, k, v, scale_base), rtol=1e-10, atol=1e-10)


def test_half_inputs_at_6000_tokens_with_the_default_scale_base_are_finite():
    """zeta_0^(-5999/512) = e^14.7 leaves float16 (65504 = e^11.1): uncentred, the late keys
    were inf and the attention NaN. The scales are formed in float32 and centred, so the
    rotated queries and keys stay finite in float16, and so does the (fused causal) attention."""
    length = 6000
    q, k, v = draw(length, seed=3, heads=1, dtype=torch.float16)
    turn = functional.turns(torch.arange(length)[None], functional.rotary_frequencies(8, dtype=torch.float32)[0])
    assert turn.dtype == torch.complex64  # angles and scales in float32 for half inputs
    rotated_q, rotated_k = functional.rotary_query_key(q, k, xpos_scale_base=512.0, xpos_centre=(length - 1) / 2)
    assert rotated_q.dtype == torch.float16 and rotated_q.isfinite().all() and rotated_k.isfinite().all()
    out, _ = functional.rotary_attention(q, k, v, xpos_scale_base=512.0, causal=True, need_weights=False)
    assert out.dtype == torch.float16 and out.isfinite().all()
    single, _ = functional.rotary_attention(
        q.float(), k.float(), v.float(), xpos_scale_base=512.0, causal=True, need_weights=False
    )
    torch.testing.assert_close(out.float(), single, rtol=0, atol=2e-2)


# --------------------------------------------------------------------------- one validation


# (arguments of the op, the argument it names, the same values as flags)
REFUSED = [
    (dict(base=-1.0), "base", ["--rope-base", "-1"]),
    (dict(base=0.0), "base", ["--rope-base", "0"]),
    (dict(base=math.nan), "base", ["--rope-base", "nan"]),
    (dict(scaling="none", scaling_factor=4.0), "scaling_factor", ["--rope-scaling-factor", "4"]),
    (
        dict(scaling="linear", scaling_factor=2.0, original_length=64),
        "original_length",
        ["--rope-scaling", "linear", "--rope-scaling-factor", "2", "--rope-original-length", "64"],
    ),
    (
        dict(scaling="linear", scaling_factor=0.5),
        "scaling_factor",
        ["--rope-scaling", "linear", "--rope-scaling-factor", "0.5"],
    ),
    (dict(fraction=0.1), "fraction", ["--rope-fraction", "0.1"]),  # 2 * floor(0.1 * 8 / 2) = 0 of 8 dims
]
FLAGS = {
    "base": "--rope-base",
    "fraction": "--rope-fraction",
    "scaling_factor": "--rope-scaling-factor",
    "original_length": "--rope-original-length",
    "xpos_scale_base": "--xpos-scale-base",
}
IDS = ["base=-1", "base=0", "base=nan", "none-with-factor-4", "linear-with-length", "factor-0.5", "fraction-0.1"]


def op_problem(arguments):
    """The op's ValueError (the tiny LM's heads: 16 / 2 = 8 dims)."""
    q, k, v = draw(5)
    with pytest.raises(ValueError) as raised:
        functional.rotary_attention(q, k, v, causal=True, **arguments)
    with pytest.raises(ValueError) as raised_again:
        functional.rotary_query_key(q, k, **arguments)
    assert str(raised_again.value) == str(raised.value)
    return str(raised.value)


def flag_problem(flags, mechanism="rope"):
    """The SpecError the distattn_lm's checks raise for ``flags`` given as --model-overrides give
    them: set on the parsed arguments of a valid model, then checked as its build checks them
    (new_model=False; fairseq-train's parse exits with the same line)."""
    args = parse("language_modeling", "distattn_lm", [*TINY_LM, "--decoder-self-attention", mechanism])
    for flag, value in zip(flags[::2], flags[1::2]):
        attribute = flag[2:].replace("-", "_")
        setattr(args, attribute, type(getattr(args, attribute, value))(value) if hasattr(args, attribute) else value)
    with pytest.raises(SpecError) as raised:
        DistAttnLanguageModel.check_attention_args(args, new_model=False)
    return raised.value


@pytest.mark.parametrize("arguments, argument, flags", REFUSED, ids=IDS)
def test_the_op_refuses_what_the_command_line_refuses_naming_the_argument(arguments, argument, flags):
    message = op_problem(arguments)
    assert message.startswith(f"{argument} "), message
    error = flag_problem(flags)
    assert error.flag == FLAGS[argument]
    # one predicate: the op says what the flag's error says, in its own names
    assert re.sub(r"--rope-scaling ([a-z-]+)", r"scaling='\1'", error.problem) in message


@pytest.mark.parametrize("arguments, argument, flags", REFUSED, ids=IDS)
def test_the_command_line_refuses_them_with_one_line(arguments, argument, flags, capsys):
    with pytest.raises(SystemExit):
        language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *flags])
    assert f"argument {FLAGS[argument]}: invalid value" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, positions",
    [
        (["--xpos-scale-base", "0.1"], 1024),  # the LM's default --tokens-per-sample
        (["--xpos-scale-base", "1.0", "--tokens-per-sample", "128"], 128),
        (["--tokens-per-sample", "40000"], 40000),  # even the paper's 512 at 40000 positions
    ],
    ids=["0.1-at-1024", "1.0-at-128", "512-at-40000"],
)
def test_xpos_scale_bases_beyond_float32_are_refused_on_the_command_line(flags, positions, capsys):
    """Also as --model-overrides: the model's build (new_model=False) refuses them, not only fairseq-train."""
    error = flag_problem(flags, mechanism="xpos")
    assert error.flag == "--xpos-scale-base"
    assert "beyond float32" in error.problem and f"--tokens-per-sample {positions}" in error.problem
    assert error.allowed == f"a scale base >= {functional.smallest_xpos_scale_base(positions):g} at this length"
    with pytest.raises(SystemExit):
        language_model(extra=[*TINY_LM, "--decoder-self-attention", "xpos", *flags])
    assert "--xpos-scale-base" in capsys.readouterr().err


def test_the_smallest_scale_base_the_message_names_builds_and_runs():
    model, d = language_model(
        extra=[*TINY_LM, "--decoder-self-attention", "xpos", "--xpos-scale-base", "1.83", "--tokens-per-sample", "128"]
    )
    model = model.float()
    tokens = random_tokens(d, 2, 128, seed=7)
    assert model(tokens)[0].isfinite().all()


# --------------------------------------------------------------------------- the model's centre


def xpos_layers(model):
    return [m for m in model.modules() if getattr(m, "xpos", False)]


def test_a_model_centres_xpos_on_the_middle_of_its_positions_and_computes_the_same_logits():
    """The layers centre on (L-1)/2 of the stack's positions (--tokens-per-sample 64 here);
    in float64 the log-probabilities are the paper's uncentred ones."""
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "xpos", "--tokens-per-sample", "64"])
    layers = xpos_layers(model)
    assert layers and all(layer.arguments["xpos_centre"] == 31.5 for layer in layers)
    tokens = random_tokens(d, 2, 40, seed=4)
    with torch.no_grad():
        centred = model(tokens)[0]
        for layer in layers:
            layer.arguments["xpos_centre"] = 0.0
        uncentred = model(tokens)[0]
    torch.testing.assert_close(centred, uncentred, rtol=1e-10, atol=1e-10)


def test_a_half_model_layer_keeps_its_keys_finite_at_6000_positions():
    """With the paper's c = 0, the key scale at position 5999 is e^14.7 with the default
    scale base 512, beyond float16's 65504; centred on 2999.5 it is e^7.3."""
    length = 6000
    model, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "xpos", "--tokens-per-sample", str(length)])
    layer = xpos_layers(model)[0]
    assert layer.arguments["xpos_centre"] == (length - 1) / 2
    heads, head_dim = layer.config.num_heads, layer.config.head_dim
    q, k = torch.ones(2, 1, heads, length, head_dim, dtype=torch.float16).unbind(0)
    query, key = layer.encode_positions({"query": q}, {"key": k}, None, 0)
    assert query["query"].isfinite().all() and key["key"].isfinite().all()
