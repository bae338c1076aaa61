"""Masks are exact in half precision: -inf (never a large negative constant
that overflows or leaks mass), so padded batches stay finite in bfloat16 and
float16 and give no probability to padding."""

import pytest
import torch

from benchmarks.diagnostics import precision
from fairseq_distattn import functional
from fairseq_distattn.spec import MECHANISMS

from .model_helpers import TINY, everywhere, left_pad, random_tokens, right_pad, translation_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def model_with_mechanism_everywhere(mechanism):
    """A tiny translation model with ``mechanism`` in every attention kind that takes it."""
    return translation_model(extra=[*TINY, *everywhere(mechanism)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mechanism", [m for m in MECHANISMS if m != "vanilla"])
def test_model_forward_is_finite_in_half_precision(mechanism, dtype, device):
    model, d = model_with_mechanism_everywhere(mechanism)
    model = model.to(device, dtype)
    sources = [random_tokens(d, 1, n, seed=n)[0] for n in (7, 3)]
    targets = [random_tokens(d, 1, n, seed=10 + n)[0] for n in (2, 5)]
    out = model(
        left_pad(sources, d.pad()).to(device),
        torch.tensor([7, 3], device=device),
        right_pad(targets, d.pad()).to(device),
    )[0]
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


# fairseq's --amp: float32 parameters, linear layers in half; CPU autocast takes bfloat16
AUTOCAST = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    pytest.param(
        "cuda",
        torch.float16,
        id="cuda-float16",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"),
    ),
]


@pytest.mark.parametrize("device, dtype", AUTOCAST)
@pytest.mark.parametrize("mechanism", [m for m in MECHANISMS if m != "vanilla"])
def test_a_float32_model_trains_and_validates_under_autocast(mechanism, device, dtype):
    """Under autocast a mechanism meets half queries, keys and values beside its own float32
    parameters (DA's w and v, rpr's tables, QVI's W, u, h), and matmuls that round to half
    inside its float32 code: every op must accept the mix. QVI's eq. 8 did not
    (``torch.lerp`` of a half and a float32 tensor), and training with --amp crashed."""
    model, d = model_with_mechanism_everywhere(mechanism)
    model = model.to(device, torch.float32)
    sources = left_pad([random_tokens(d, 1, n, seed=n)[0] for n in (7, 3)], d.pad()).to(device)
    lengths = torch.tensor([7, 3], device=device)
    targets = right_pad([random_tokens(d, 1, n, seed=10 + n)[0] for n in (2, 5)], d.pad()).to(device)
    model.train()
    with torch.autocast(device, dtype=dtype):
        out = model(sources, lengths, targets)[0]
    out.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(out).all()
    unreached = [name for name, p in model.named_parameters() if p.grad is None]
    assert not [name for name in unreached if "embed_positions" not in name], unreached
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        assert torch.isfinite(model(sources, lengths, targets)[0]).all()


@pytest.mark.parametrize("device, dtype", AUTOCAST)
def test_qvi_recomputes_half_inputs_in_float32_under_autocast_too(device, dtype):
    """QVI widens half inputs to float32 for eqs. 7-10 (its values grow with its queries);
    autocast must not round that float32 work back to half: the result under autocast is
    the result without it."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=generator).to(device, dtype) * 4 for _ in range(3))
    value_projection, gate_weight = torch.randn(2, 8, 8, generator=generator), torch.randn(2, 16, generator=generator)
    parameters = (value_projection.to(device), gate_weight.to(device), torch.zeros(2, device=device))
    plain, _ = functional.query_value_interaction_attention(q, k, v, *parameters, causal=True)
    with torch.autocast(device, dtype=dtype):
        autocast, _ = functional.query_value_interaction_attention(q, k, v, *parameters, causal=True)
    assert autocast.dtype == plain.dtype == dtype
    torch.testing.assert_close(autocast, plain, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_padding_gets_exactly_zero_probability_in_half_precision(dtype):
    q, k, v = (torch.randn(2, 2, 4, 8).to(dtype) * 30 for _ in range(3))
    padding = torch.tensor([[True, False, False, False], [False, False, False, True]])
    _, probs = functional.distance_mask_attention(q, k, v, 1000.0, key_padding_mask=padding)
    assert torch.isfinite(probs).all()
    assert (probs[0, :, :, 0] == 0).all() and (probs[1, :, :, 3] == 0).all()


# unit roundoff of each half dtype: an error below it is as exact as the dtype allows
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


@pytest.mark.parametrize("dtype", precision.HALF, ids=str)
def test_every_op_in_half_precision_is_within_2x_of_vanilla_error_at_ordinary_logits(dtype):
    """At logits of ordinary size (x1); at x100 and x1e4 a saturated softmax's error
    depends on the draw's near-ties, so the report lists those ratios without a bound."""
    errors = precision.op_errors(dtype, 1.0)
    bound = 2 * max(errors["vanilla"], UNIT_ROUNDOFF[dtype])
    worse = {name: error for name, error in errors.items() if not error <= bound}  # nan fails too
    assert not worse, f"relative error above {bound:.2e} (2x vanilla's or the unit roundoff): {worse}"


@pytest.mark.parametrize("scale", precision.SCALES, ids=lambda s: f"logits_x{s:g}")
@pytest.mark.parametrize("dtype", precision.HALF, ids=str)
@pytest.mark.parametrize("mechanism", precision.op_names())
def test_every_op_in_half_precision_has_finite_outputs_and_gradients(mechanism, dtype, scale):
    """Finite wherever the exact value fits the dtype: the float64 output and gradient
    of the same rounded inputs say which (QVI's values grow with its queries, so at
    logits x1e4 its output and the gradient of v can exceed 65504, and float16
    rightly says inf there)."""

    def run(compute_dtype):
        call, draw = precision.op_call(mechanism, compute_dtype, scale, rounded_to=dtype, requires_grad=True)
        out = call(key_padding_mask=precision.padding_mask())[0]
        out.float().square().mean().backward()
        return out, [leaf.grad for leaf in draw.leaves]

    out, gradients = run(dtype)
    exact_out, exact = run(torch.float64)
    fits = exact_out.abs() < torch.finfo(dtype).max
    assert out.dtype == dtype and torch.isfinite(out[fits]).all()
    if not fits.all():  # the exact output is beyond the dtype: so is the loss, and no gradient is defined
        return
    for index, (gradient, exact_gradient) in enumerate(zip(gradients, exact)):
        if gradient is not None:
            representable = exact_gradient.abs() < torch.finfo(dtype).max
            assert torch.isfinite(gradient[representable]).all(), f"gradient of argument {index} is not finite"


def test_distance_aware_logits_beyond_the_float16_range_stay_finite():
    """ReLU(q k^T) x (1 + e^v) exceeds 65504 with q, k scaled by 100 (NaN before
    the logits were formed in float32); vanilla is finite on the same inputs."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=generator) for _ in range(3))
    q, k = (q * 100).half(), (k * 100).half()
    sharpness = torch.full((2,), 3.0).half()  # f up to 1 + e^3 = 21
    assert torch.isfinite(functional.softmax_attention(q, k, v.half())[0]).all()
    out, probs = functional.distance_aware_attention(q, k, v.half(), torch.zeros(2).half(), sharpness)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("alpha", [1e4, 1e30, 3e38])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_distance_mask_with_a_huge_alpha_gives_no_nan(dtype, alpha, need_weights):
    """-alpha |i - j| overflows every dtype here; a query whose own position is
    padding then sees only far keys, which must not make its row NaN (nor 0 x inf
    on the diagonal)."""
    q, k, v = (torch.randn(2, 2, 5, 8).to(dtype) for _ in range(3))
    padding = torch.tensor([[True, True, False, False, False], [False] * 5])
    out, probs = functional.distance_mask_attention(q, k, v, alpha, key_padding_mask=padding, need_weights=need_weights)
    assert torch.isfinite(out).all()
    if need_weights:
        assert torch.isfinite(probs).all() and (probs[0, :, :, :2] == 0).all()
        # a visible diagonal takes all the mass
        assert torch.equal(probs[1, 0], torch.eye(5, dtype=dtype))


# Measured with benchmarks/diagnostics/precision.py: a tiny model, weights rounded to the
# dtype in both runs, the ratio of each mechanism's logit error to vanilla's
# averaged over 5 weight draws (one draw alone moves a ratio by up to 2x, so a
# single model flips between machines). The bounds, and why qvi and window-mw
# have their own, are benchmarks.diagnostics.precision.MODEL_ERROR_BOUNDS (the README's
# half-precision section is generated from the same).


@pytest.mark.parametrize("dtype", precision.HALF, ids=str)
def test_whole_model_in_half_precision_against_float64(dtype):
    errors = precision.mean_model_errors(dtype)  # what `python -m benchmarks.diagnostics.precision` prints
    ratios = {name: error / max(errors["vanilla"], UNIT_ROUNDOFF[dtype]) for name, error in errors.items()}
    worse = {
        name: round(ratio, 2)
        for name, ratio in ratios.items()
        if not ratio <= precision.MODEL_ERROR_BOUNDS.get(name, precision.DEFAULT_MODEL_ERROR_BOUND)
    }  # nan fails too
    assert not worse, f"error ratio to vanilla above its bound: {worse}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fused_additive_window_keeps_bias_differences_beyond_half_of_the_range(dtype):
    """AW's local scores x M of 40000 and 50000 on two keys (QK^T = 0): key 1
    takes all the mass. Clamping the bias into the half range would tie them."""
    zeros = torch.zeros(1, 1, 2, 1, dtype=dtype)
    q_local = torch.full((1, 1, 2, 1), 100.0, dtype=dtype)
    k_local = torch.tensor([400.0, 500.0], dtype=dtype).view(1, 1, 2, 1)
    v = torch.tensor([1.0, -1.0], dtype=dtype).view(1, 1, 2, 1)
    window = torch.ones(1, 1, 2, 2)
    out, _ = functional.additive_window_attention(zeros, zeros, q_local, k_local, v, window, need_weights=False)
    assert torch.equal(out, torch.full_like(out, -1.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fused_distance_mask_row_beyond_the_half_range_is_not_lost(dtype):
    """A padded query (position 0) sees keys 1 and 2 with biases -alpha and -2 alpha,
    alpha = 40000 (QK^T = 0): key 1 takes all the mass. Clamped into float16, both
    biases would tie; added to a large QK^T in the half dtype, the row would be all
    -inf (NaN on CUDA's math kernel)."""
    q = torch.zeros(1, 1, 3, 1, dtype=dtype)
    v = torch.tensor([0.0, 3.0, 5.0], dtype=dtype).view(1, 1, 3, 1)
    padding = torch.tensor([[True, False, False]])
    out, _ = functional.distance_mask_attention(q, q, v, 4e4, key_padding_mask=padding, need_weights=False)
    assert torch.equal(out[0, 0, 0], torch.tensor([3.0], dtype=dtype))
