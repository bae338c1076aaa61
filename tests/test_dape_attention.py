"""DAPE (Zheng et al. 2024): the op against a plain restatement of the authors'
arithmetic, its reductions (a zero last layer leaves the static bias alone),
incremental rows, half precision, gradients and argument errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from fairseq_distattn.functional import (
    alibi_attention,
    alibi_bias,
    dape_attention,
    kerple_attention,
    kerple_bias,
    softmax_attention,
)

from .functional_cases import (
    DTYPE,
    TIGHT,
    generator_for,
    make_padding_mask,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
)

BATCH, HEADS, LENGTH, DIM, WIDTH = 3, 4, 6, 5, 7


def make_inputs(*labels, batch=BATCH, heads=HEADS, tgt_len=LENGTH, src_len=LENGTH, dim=DIM, width=WIDTH):
    gen = generator_for("dape", *labels)
    q, k, v = (randn(gen, batch, heads, length, dim) for length in (tgt_len, src_len, src_len))
    mlp = (
        randn(gen, width, 2 * heads, scale=0.5),
        randn(gen, width, scale=0.5),
        randn(gen, heads, width, scale=0.5),
        randn(gen, heads, scale=0.5),
    )
    # KERPLE's p (r1) and a (r2), initialised as the authors do: uniform in [0, 2) and [0, 1)
    r1 = torch.rand(heads, generator=gen, dtype=DTYPE) * 2
    r2 = torch.rand(heads, generator=gen, dtype=DTYPE)
    return q, k, v, mlp, (r1, r2)


def static_bias(kind, kerple, heads, tgt_len, src_len, query_offset=0, dtype=DTYPE):
    if kind == "alibi":
        return alibi_bias(tgt_len, src_len, heads, query_offset, torch.device("cpu"), dtype)
    return kerple_bias(*(p.to(dtype) for p in kerple), "log", tgt_len, src_len, query_offset)


def authors_causal_bias(kind, kerple, heads, length):
    """The biases as the authors' code forms them (DAPE commit bde344a, positional_embeddings.py,
    ``AliBi_C`` and ``ParallelKerpleLog_C``): from ``tril`` of the distance i - j, so 0 above
    the diagonal, where the causal mask hides the keys."""
    positions = torch.arange(length)
    diff = torch.tril(positions[:, None] - positions[None, :]).to(DTYPE)
    if kind == "alibi":
        from fairseq_distattn.functional import alibi_slopes

        slopes = torch.tensor(alibi_slopes(heads), dtype=DTYPE)
        return -diff * slopes[:, None, None]
    p, a = (value.clamp(min=1e-2)[:, None, None] for value in kerple)
    return -p * torch.log(1 + a * diff)


def authors_dape(q, k, v, bias, mlp, padding, causal):
    """A plain restatement of the authors' arithmetic (github chuanyang-Zheng/DAPE, commit
    bde344a844f2bd1f498b2bac70240dcda41c50c1: megatron/model/positional_embeddings.py,
    ``AliBi_C`` / ``ParallelKerpleLog_C``.forward, and megatron/model/transformer.py's
    ``attention``): x = q k^T / sqrt(d); concatenate x and the bias tiled over the batch on the
    head axis, move it last, ``Sequential(Linear(2H, W), LeakyReLU(), Linear(W, H))``, move it
    back; logits x + bias + that; then the masked softmax (masked_fill with the dtype's min, as
    ``gpt2_attention_mask_func``) and the values. Padding (which the authors' LM has not) as one
    more masked_fill."""
    hidden_weight, hidden_bias, output_weight, output_bias = mlp
    x = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    tiled = torch.tile(bias, (x.shape[0], 1, 1, 1)) if bias.dim() == 3 else bias  # [B, H, Tq, Tk] as it is
    features = torch.cat((x, tiled), dim=1).permute(0, 2, 3, 1)
    hidden = F.leaky_relu(features @ hidden_weight.t() + hidden_bias)  # nn.LeakyReLU(): slope 0.01
    adaptive = (hidden @ output_weight.t() + output_bias).permute(0, 3, 1, 2)
    logits = x + bias + adaptive
    masked = torch.zeros_like(logits, dtype=torch.bool)
    if causal:
        masked = masked | torch.ones(x.size(2), x.size(3), dtype=torch.bool).triu(1)
    if padding is not None:
        masked = masked | padding[:, None, None, :]
    probs = torch.softmax(logits.masked_fill(masked, torch.finfo(logits.dtype).min), dim=-1)
    # a query that sees no key (left padding under the causal mask) gives 0, the package's convention
    probs = probs.masked_fill(masked.all(dim=-1, keepdim=True), 0.0)
    return probs @ v, probs


@pytest.mark.parametrize("kind", ["kerple", "alibi"])
@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("causal", [True, False])
def test_the_op_is_the_authors_arithmetic(kind, padding, causal):
    q, k, v, mlp, kerple = make_inputs("reference", kind, padding, causal)
    pad = make_padding_mask(padding, BATCH, LENGTH)
    bias = static_bias(kind, kerple, HEADS, LENGTH, LENGTH)
    out, probs = dape_attention(q, k, v, bias, *mlp, key_padding_mask=pad, causal=causal)
    # causal: the bias as the authors form it (tril); bidirectional: the symmetric bias itself
    reference_bias = authors_causal_bias(kind, kerple, HEADS, LENGTH) if causal else bias
    expected_out, expected_probs = authors_dape(q, k, v, reference_bias, mlp, pad, causal)
    assert_close(probs, expected_probs, **TIGHT)
    assert_close(out, expected_out, **TIGHT)


def test_a_batched_bias_and_cross_attention():
    """A [B, H, Tq, Tk] bias, and Tq != Tk without the causal mask."""
    q, k, v, mlp, _ = make_inputs("cross", tgt_len=3, src_len=5)
    bias = randn(generator_for("dape-cross-bias"), BATCH, HEADS, 3, 5)
    pad = make_padding_mask("right", BATCH, 5)
    out, probs = dape_attention(q, k, v, bias, *mlp, key_padding_mask=pad)
    expected_out, expected_probs = authors_dape(q, k, v, bias, mlp, pad, causal=False)
    assert_close(probs, expected_probs, **TIGHT)
    assert_close(out, expected_out, **TIGHT)


def test_the_negative_slope_is_the_leaky_relu_s():
    q, k, v, mlp, kerple = make_inputs("slope")
    bias = static_bias("kerple", kerple, HEADS, LENGTH, LENGTH)
    default = dape_attention(q, k, v, bias, *mlp, causal=True)[0]
    assert_close(dape_attention(q, k, v, bias, *mlp, causal=True, negative_slope=0.01)[0], default, **TIGHT)
    relu = dape_attention(q, k, v, bias, *mlp, causal=True, negative_slope=0.0)[0]
    assert not torch.allclose(relu, default)


@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_zero_last_layer_leaves_attention_with_the_bias_alone(padding, causal):
    """f = W2 h + b2 with W2 = 0 adds b2, one constant per head, which the softmax ignores."""
    q, k, v, (w1, b1, w2, b2), kerple = make_inputs("zero", padding, causal)
    pad = make_padding_mask(padding, BATCH, LENGTH)
    zero = (w1, b1, torch.zeros_like(w2), b2)
    options = dict(key_padding_mask=pad, causal=causal)
    alibi = dape_attention(q, k, v, static_bias("alibi", kerple, HEADS, LENGTH, LENGTH), *zero, **options)
    for got, expected in zip(alibi, alibi_attention(q, k, v, **options)):
        assert_close(got, expected, **TIGHT)
    log = dape_attention(q, k, v, static_bias("kerple", kerple, HEADS, LENGTH, LENGTH), *zero, **options)
    for got, expected in zip(log, kerple_attention(q, k, v, *kerple, **options)):
        assert_close(got, expected, **TIGHT)
    # and with no bias either, plain attention
    nothing = torch.zeros(1, LENGTH, LENGTH, dtype=DTYPE)
    plain = dape_attention(q, k, v, nothing, w1, b1, torch.zeros_like(w2), torch.zeros_like(b2), **options)
    for got, expected in zip(plain, softmax_attention(q, k, v, **options)):
        assert_close(got, expected, **TIGHT)


@pytest.mark.parametrize("kind", ["kerple", "alibi"])
@pytest.mark.parametrize("padding", [None, "left"])
def test_incremental_rows_equal_the_full_call_s(kind, padding):
    q, k, v, mlp, kerple = make_inputs("incremental", kind, padding)
    pad = make_padding_mask(padding, BATCH, LENGTH)
    full_out, full_probs = dape_attention(
        q, k, v, static_bias(kind, kerple, HEADS, LENGTH, LENGTH), *mlp, key_padding_mask=pad, causal=True
    )
    last = LENGTH - 1
    out, probs = dape_attention(
        q[:, :, last:],
        k,
        v,
        static_bias(kind, kerple, HEADS, 1, LENGTH, last),
        *mlp,
        key_padding_mask=pad,
        causal=True,
        query_offset=last,
    )
    assert_close(out, full_out[:, :, last:], **TIGHT)
    assert_close(probs, full_probs[:, :, last:], **TIGHT)
    # a block of rows 2..4 over the keys up to its last query
    start, stop = 2, 5
    block_pad = None if pad is None else pad[:, :stop]
    out, probs = dape_attention(
        q[:, :, start:stop],
        k[:, :, :stop],
        v[:, :, :stop],
        static_bias(kind, kerple, HEADS, stop - start, stop, start),
        *mlp,
        key_padding_mask=block_pad,
        causal=True,
        query_offset=start,
    )
    assert_close(out, full_out[:, :, start:stop], **TIGHT)
    assert_close(probs, full_probs[:, :, start:stop, :stop], **TIGHT)
    assert_close(full_probs[:, :, start:stop, stop:], torch.zeros_like(full_probs[:, :, start:stop, stop:]))


@pytest.mark.parametrize("causal", [True, False])
def test_need_weights_false_gives_the_same_output(causal):
    q, k, v, mlp, kerple = make_inputs("weights", causal)
    pad = make_padding_mask("left", BATCH, LENGTH)
    bias = static_bias("kerple", kerple, HEADS, LENGTH, LENGTH)
    out, probs = dape_attention(q, k, v, bias, *mlp, key_padding_mask=pad, causal=causal)
    out_without, none = dape_attention(q, k, v, bias, *mlp, key_padding_mask=pad, causal=causal, need_weights=False)
    assert probs is not None and none is None
    assert_close(out_without, out, **TIGHT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("weights_dtype", ["same", "float32"])
def test_half_precision_is_finite_and_close(dtype, weights_dtype):
    q, k, v, mlp, kerple = make_inputs("half", dtype, weights_dtype, tgt_len=16, src_len=16, width=32)
    pad = make_padding_mask("left", BATCH, 16)
    bias = static_bias("kerple", kerple, HEADS, 16, 16)
    expected, expected_probs = dape_attention(q, k, v, bias, *mlp, key_padding_mask=pad, causal=True)
    mlp_dtype = dtype if weights_dtype == "same" else torch.float32
    out, probs = dape_attention(
        *(x.to(dtype) for x in (q, k, v)),
        bias.to(mlp_dtype),
        *(w.to(mlp_dtype) for w in mlp),
        key_padding_mask=pad,
        causal=True,
    )
    assert out.dtype == dtype and probs.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    tolerance = 2e-2 if dtype is torch.bfloat16 else 1e-2
    assert_close(out.to(DTYPE), expected, rtol=tolerance, atol=tolerance)
    assert_close(probs.to(DTYPE), expected_probs, rtol=tolerance, atol=tolerance)


def test_half_precision_under_autocast_keeps_the_mlp_in_float32():
    q, k, v, mlp, kerple = make_inputs("autocast", tgt_len=16, src_len=16, width=32)
    bias = static_bias("alibi", kerple, HEADS, 16, 16)
    expected = dape_attention(q, k, v, bias, *mlp, causal=True)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dape_attention(
            *(x.to(torch.bfloat16) for x in (q, k, v)),
            bias.float(),
            *(w.float() for w in mlp),
            causal=True,
        )[0]
    assert torch.isfinite(out).all()
    assert_close(out.to(DTYPE), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal,padding", [(True, "left"), (False, "right")])
def test_gradcheck(causal, padding):
    q, k, v, mlp, kerple = make_inputs("grad", causal, batch=2, heads=2, tgt_len=3, src_len=3, dim=2, width=3)
    pad = make_padding_mask(padding, 2, 3)
    bias = static_bias("kerple", kerple, 2, 3, 3)
    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v, bias, *mlp))

    def run(*tensors):
        return dape_attention(*tensors, key_padding_mask=pad, causal=causal)

    assert torch.autograd.gradcheck(run, inputs)


def test_gradients_reach_kerple_s_parameters_through_the_bias():
    q, k, v, mlp, (r1, r2) = make_inputs("kerple-grad")
    r1, r2 = r1.clone().requires_grad_(), r2.clone().requires_grad_()
    bias = kerple_bias(r1, r2, "log", LENGTH, LENGTH)
    dape_attention(q, k, v, bias, *mlp, causal=True)[0].sum().backward()
    assert r1.grad is not None and r2.grad is not None and r1.grad.abs().sum() > 0


def good_arguments():
    q, k, v, mlp, kerple = make_inputs("errors")
    return [q, k, v, static_bias("alibi", kerple, HEADS, LENGTH, LENGTH), *mlp]


ARGUMENTS = ["q", "k", "v", "bias", "hidden_weight", "hidden_bias", "output_weight", "output_bias"]


@pytest.mark.parametrize(
    "name,bad",
    [
        ("bias", torch.zeros(HEADS, LENGTH, LENGTH + 1, dtype=DTYPE)),
        ("bias", torch.zeros(HEADS + 1, LENGTH, LENGTH, dtype=DTYPE)),
        ("bias", torch.zeros(BATCH + 1, HEADS, LENGTH, LENGTH, dtype=DTYPE)),
        ("bias", torch.zeros(LENGTH, LENGTH, dtype=DTYPE)),
        ("bias", torch.zeros(HEADS, LENGTH, LENGTH, dtype=torch.long)),
        ("bias", None),
        ("hidden_weight", torch.zeros(WIDTH, HEADS, dtype=DTYPE)),
        ("hidden_weight", torch.zeros(2 * HEADS, dtype=DTYPE)),
        ("hidden_bias", torch.zeros(WIDTH + 1, dtype=DTYPE)),
        ("output_weight", torch.zeros(HEADS, WIDTH + 1, dtype=DTYPE)),
        ("output_weight", torch.zeros(WIDTH, HEADS, dtype=DTYPE)),
        ("output_bias", torch.zeros(HEADS + 1, dtype=DTYPE)),
        ("output_bias", torch.zeros(1, HEADS, dtype=DTYPE)),
        ("output_bias", torch.zeros(HEADS, dtype=DTYPE, device="meta")),
    ],
)
def test_wrong_arguments_are_value_errors_naming_them(name, bad):
    arguments = good_arguments()
    arguments[ARGUMENTS.index(name)] = bad
    with pytest.raises(ValueError, match=name):
        dape_attention(*arguments, causal=True)


def test_a_wrong_negative_slope_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="negative_slope"):
        dape_attention(*good_arguments(), negative_slope="0.01")


def test_broadcast_biases_are_accepted():
    """A bias shared by the heads ([1, Tq, Tk]) is that bias in every head."""
    arguments = good_arguments()
    shared = randn(generator_for("dape-shared"), 1, LENGTH, LENGTH)
    arguments[3] = shared
    out = dape_attention(*arguments, causal=True)[0]
    arguments[3] = shared.expand(HEADS, LENGTH, LENGTH)
    assert_close(out, dape_attention(*arguments, causal=True)[0], **TIGHT)
