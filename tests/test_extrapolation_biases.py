"""KERPLE (Chi et al. 2022), Sandwich (Chi et al. 2023) and FIRE (Li et al.
2024) against float64 references written from the papers' equations in plain
Python floats, beyond the registry-parametrised tests that pick them up with no
edit (incremental beam search == full forward, padding independence, fused ==
explicit, half precision, recomputation, flags, docs): each bias at every
visible (query, key) pair, with padding, causality and decoding offsets; the
constraints and initialisation the authors' code uses; FIRE's normaliser by
the query's position; the LM presets."""

import math

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional.paths import CallOptions
from fairseq_distattn.mechanisms import build_mechanism
from fairseq_distattn.mechanisms.kerple import KerpleOptions
from fairseq_distattn.registry import DECODER_SELF, ENCODER_SELF
from fairseq_distattn.spec import AttentionOptions

from .functional_cases import REFERENCE_CASES, make_padding_mask, naive_attention
from .model_helpers import TINY_LM, language_model, random_tokens, translation_model

SELF_CASES = [case for case in REFERENCE_CASES if not case.is_cross]
TIGHT = dict(rtol=1e-10, atol=1e-10)


def draw_qkv(case, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_q = (case.batch, case.heads, case.tgt_len, case.dim)
    shape_k = (case.batch, case.heads, case.src_len, case.dim)
    return (
        torch.randn(*shape_q, generator=g, dtype=torch.float64),
        torch.randn(*shape_k, generator=g, dtype=torch.float64),
        torch.randn(*shape_k, generator=g, dtype=torch.float64),
    )


def first_real(padding, b, src_len):
    """Index of sequence b's first real key (0 without padding)."""
    if padding is None:
        return 0
    return next((j for j in range(src_len) if not padding[b, j]), 0)


def reference(q, k, v, padding, causal, query_offset, bias):
    """softmax(q_i . k_j / sqrt(d) + bias(b, h, position, j)) v over the visible keys."""
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    pad = None if padding is None else padding.numpy()
    dim = q.size(-1)
    return naive_attention(
        qn,
        kn,
        pad,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: float(qn[b, h, i] @ kn[b, h, j]) / math.sqrt(dim) + bias(b, h, position, j),
        value=lambda b, h, position, j: vn[b, h, j],
    )


# ----------------------------------------------------------------------------- KERPLE


def paper_kerple(kernel, r1, r2, distance):
    """Sec. 4.3: -r1 log(1 + r2 |m - n|) and -r1 |m - n|^r2, with the parameters clamped as
    the authors' code does (>= 0.01; the power's exponent <= 2)."""
    r1 = max(r1, 0.01)
    r2 = max(r2, 0.01) if kernel == "log" else min(max(r2, 0.01), 2.0)
    if kernel == "log":
        return -r1 * math.log(1 + r2 * distance)
    return -r1 * distance**r2


@pytest.mark.parametrize("kernel", functional.KERPLE_KERNELS)
@pytest.mark.parametrize("case", SELF_CASES, ids=str)
def test_kerple_is_the_papers_kernel_bias(kernel, case):
    q, k, v = draw_qkv(case)
    # one head out of bounds on each side: the clamp is part of the kernel
    r1 = torch.tensor([0.7, -0.3], dtype=torch.float64)[: case.heads]
    r2 = torch.tensor([2.6, 0.4], dtype=torch.float64)[: case.heads]
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = functional.kerple_attention(
        q, k, v, r1, r2, kernel=kernel, key_padding_mask=padding, causal=case.causal, query_offset=case.query_offset
    )
    want_out, want_probs = reference(
        q,
        k,
        v,
        padding,
        case.causal,
        case.query_offset,
        lambda b, h, position, j: paper_kerple(kernel, r1[h].item(), r2[h].item(), abs(position - j)),
    )
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(probs, want_probs, **TIGHT)


@pytest.mark.parametrize("kernel", functional.KERPLE_KERNELS)
def test_kerple_gradients_reach_both_parameters(kernel):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    r1 = torch.tensor([0.5, 1.2], dtype=torch.float64, requires_grad=True)
    r2 = torch.tensor([0.8, 1.5], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda *x: functional.kerple_attention(*x, kernel=kernel, causal=True)[0],
        (q, k, v, r1, r2),
        eps=1e-6,
        atol=1e-7,
    )
    functional.kerple_attention(q, k, v, r1, r2, kernel=kernel, causal=True)[0].sum().backward()
    assert torch.isfinite(r2.grad).all() and (r2.grad != 0).all()  # 0 ** r2 at distance 0 gives no NaN


def test_kerple_power_with_exponent_1_is_alibi_with_learned_slopes():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)  # above the 0.01 bound
    kerple = functional.kerple_attention(
        q, k, v, slopes, torch.ones(4, dtype=torch.float64), kernel="power", causal=True
    )
    alibi = functional.alibi_attention(q, k, v, slopes, causal=True)
    torch.testing.assert_close(kerple[0], alibi[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("kernel,r1_range,r2_range", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_kerple_initialisation_and_projection_are_the_authors(kernel, r1_range, r2_range):
    torch.manual_seed(0)
    mechanism = build_mechanism("kerple", 64, 4, AttentionOptions(KerpleOptions(kerple_kernel=kernel)))
    r2_name = {"log": "rate", "power": "exponent"}[kernel]
    assert sorted(name for name, _ in mechanism.named_parameters()) == sorted(["scale", r2_name])
    assert ((mechanism.scale >= 0.01) & (mechanism.scale <= r1_range)).all()
    assert ((mechanism.r2 >= 0.01) & (mechanism.r2 <= r2_range)).all()
    assert mechanism.scale.std() > 0.1 * r1_range  # uniform, not constant
    q = torch.randn(1, 64, 3, 4)
    with torch.no_grad():
        mechanism.scale.fill_(-1.0)
        mechanism.r2.fill_(5.0)
    mechanism.eval()
    options = CallOptions(causal=True, need_weights=False)
    evaluated = mechanism({"query": q}, {"key": q, "value": q}, options)[0]
    assert (mechanism.scale == -1.0).all()  # evaluation projects nothing: the op clamps
    mechanism.train()
    trained = mechanism({"query": q}, {"key": q, "value": q}, options)[0]
    assert (mechanism.scale == 0.01).all()
    assert (mechanism.r2 == (2.0 if kernel == "power" else 5.0)).all()
    torch.testing.assert_close(trained, evaluated)  # the same kernel either way


def test_kerple_clamp_passes_the_gradient_at_the_bound():
    """The authors' projection leaves a parameter exactly at the bound, where the gradient
    must still reach it (else it could never leave)."""
    r1 = torch.full((2,), 0.01, dtype=torch.float64, requires_grad=True)
    r2 = torch.full((2,), 0.01, dtype=torch.float64, requires_grad=True)
    functional.kerple_bias(r1, r2, "log", 4, 4).sum().backward()
    assert (r1.grad != 0).all() and (r2.grad != 0).all()


def test_a_kerple_kernel_is_part_of_the_trained_model():
    log_model, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "kerple"])
    power_model, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "kerple", "--kerple-kernel", "power"])
    with pytest.raises(RuntimeError, match="rate|exponent"):
        power_model.load_state_dict(log_model.state_dict())


# ----------------------------------------------------------------------------- Sandwich


def paper_sandwich(distance, head, heads, dim):
    """(sum_{k=1}^{d/2} cos(|m-n| / 10000^(2k/d)) - d/2) / (n 8 / H) for head n = head + 1."""
    inner = sum(math.cos(distance / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
    return (inner - dim / 2) / ((head + 1) * 8 / heads)


@pytest.mark.parametrize("dim", [None, 6])
@pytest.mark.parametrize("case", SELF_CASES, ids=str)
def test_sandwich_is_the_inner_product_of_sinusoids(dim, case):
    q, k, v = draw_qkv(case)
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = functional.sandwich_attention(
        q, k, v, dim, key_padding_mask=padding, causal=case.causal, query_offset=case.query_offset
    )
    width = dim or case.dim
    want_out, want_probs = reference(
        q,
        k,
        v,
        padding,
        case.causal,
        case.query_offset,
        lambda b, h, position, j: paper_sandwich(abs(position - j), h, case.heads, width),
    )
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(probs, want_probs, **TIGHT)


def test_sandwich_bias_at_a_glance():
    """0 at distance 0, about logarithmic decay with ripples, head n at 1/n of head 1."""
    bias = functional.sandwich_bias(1, 1001, 8, 64, 1000, "cpu", torch.float64)[:, 0].flip(-1)  # by distance
    assert bias[:, 0].abs().max() == 0
    for distance in (1, 10, 50, 100, 1000):
        assert bias[0, distance].item() == pytest.approx(paper_sandwich(distance, 0, 8, 64), abs=1e-9)
    assert bias[0, 50] < bias[0, 100] < 0  # a ripple: not monotone
    torch.testing.assert_close(bias[7], bias[0] / 8)
    assert (bias >= -64).all()


def test_sandwich_refuses_odd_widths_and_defaults_to_the_presets_head_size():
    with pytest.raises(ValueError, match="even"):
        functional.sandwich_bias(2, 2, 1, 3, 0, "cpu", torch.float64)
    assert build_mechanism("sandwich", 2, 3, AttentionOptions()).dim == 64
    for arch in ("distattn_lm_sandwich_gbw",):
        model, _ = language_model(arch=arch, extra=[*TINY_LM])
        assert model.decoder.layers[0].self_attn.mechanism.dim == 64


# ----------------------------------------------------------------------------- FIRE


class PaperFire:
    """Li et al. eq. 4-5 in Python floats: f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c x| + 1)
    (the listing's abs), 1e-6 added to the normaliser, f = Linear(1, W), ReLU, Linear(W, H)."""

    def __init__(self, heads, width, seed, threshold):
        g = torch.Generator().manual_seed(seed)
        self.c = torch.tensor(0.3, dtype=torch.float64)
        self.threshold = torch.tensor(float(threshold), dtype=torch.float64)
        self.w1 = torch.randn(width, generator=g, dtype=torch.float64)
        self.b1 = torch.randn(width, generator=g, dtype=torch.float64)
        self.w2 = torch.randn(heads, width, generator=g, dtype=torch.float64)
        self.b2 = torch.randn(heads, generator=g, dtype=torch.float64)

    def tensors(self):
        return self.c, self.threshold, self.w1, self.b1, self.w2, self.b2

    def bias(self, head, i, j):
        c, threshold = self.c.item(), self.threshold.item()
        x = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(threshold, i)) + 1) + 1e-6)
        hidden = [max(0.0, self.w1[u].item() * x + self.b1[u].item()) for u in range(self.w1.numel())]
        return sum(self.w2[head, u].item() * hidden[u] for u in range(len(hidden))) + self.b2[head].item()


@pytest.mark.parametrize("threshold", [2, 512])  # 2: queries beyond L normalise by their own position
@pytest.mark.parametrize("case", SELF_CASES, ids=str)
def test_fire_is_the_papers_bias_from_each_sentences_first_token(threshold, case):
    q, k, v = draw_qkv(case)
    fire = PaperFire(case.heads, 5, seed=3, threshold=threshold)
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = functional.fire_attention(
        q, k, v, *fire.tensors(), key_padding_mask=padding, causal=case.causal, query_offset=case.query_offset
    )

    def bias(b, h, position, j):
        start = first_real(None if padding is None else padding.numpy(), b, case.src_len)
        return fire.bias(h, max(position - start, 0), max(j - start, 0))

    want_out, want_probs = reference(q, k, v, padding, case.causal, case.query_offset, bias)
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(probs, want_probs, **TIGHT)


def test_fire_normaliser_follows_the_query_beyond_the_threshold():
    """Within L a query's bias depends on the distance alone; beyond it the same distance
    maps to a smaller input, psi(i - j) / psi(i): the interpolation."""
    fire = PaperFire(2, 5, seed=4, threshold=4)
    bias = functional.fire_bias(*fire.tensors(), 10, 10)[0]
    assert bias[:, 3, 2].tolist() == pytest.approx(bias[:, 2, 1].tolist(), abs=1e-12)  # both within L
    assert bias[:, 9, 8].tolist() != pytest.approx(bias[:, 2, 1].tolist(), abs=1e-6)
    normalised = functional.fire.normalized_distance(
        fire.c, fire.threshold, torch.arange(10)[None], torch.arange(10)[None]
    )
    causal_half = normalised[0].tril()  # keys up to the query: inputs within [0, 1]
    assert causal_half.max().item() <= 1.0 and normalised[0, 9, 0].item() == pytest.approx(1.0, abs=1e-5)


def test_fire_gradients_reach_every_parameter():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fire = PaperFire(2, 3, seed=5, threshold=3)
    params = [t.clone().requires_grad_() for t in fire.tensors()]
    mask = torch.tensor([[True, False, False, False, False], [False] * 5])
    torch.autograd.gradcheck(
        lambda *x: functional.fire_attention(*x, key_padding_mask=mask, causal=True)[0],
        (q, k, v, *params),
        eps=1e-6,
        atol=1e-7,
    )


def test_fire_initialisation_is_the_listings_and_sharing_is_per_stack():
    model, _ = translation_model(extra=["--encoder-self-attention", "fire", "--encoder-layers", "2"], perturb=False)
    first, second = (layer.self_attn.mechanism for layer in model.encoder.layers)
    assert first.function is not second.function
    assert first.function.c.item() == pytest.approx(0.1) and first.function.threshold_multiplier.item() == 1.0
    assert first.function.hidden.weight.shape == (32, 1) and first.function.output.weight.shape[1] == 32
    shared, _ = translation_model(
        extra=["--encoder-self-attention", "fire", "--encoder-layers", "2", "--fire-shared-layers"], perturb=False
    )
    first, second = (layer.self_attn.mechanism for layer in shared.encoder.layers)
    assert first.function is second.function
    assert first.learned_values(causal=False)[1].values.item() == 512.0


def test_fire_language_model_decodes_past_the_threshold_as_it_scores():
    """The normaliser depends on the query's absolute position: a decoding step passes it."""
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "fire", "--fire-threshold", "3"])
    tokens = random_tokens(d, 2, 9, seed=7)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- presets and kinds


@pytest.mark.parametrize("name", ["kerple", "sandwich", "fire"])
def test_lm_preset_uses_the_mechanism_in_every_layer_without_positions(name):
    model, _ = language_model(arch=f"distattn_lm_{name}_gbw", extra=[*TINY_LM])
    assert model.decoder.embed_positions is None
    assert all(layer.self_attn.mechanism.config.name == name for layer in model.decoder.layers)


@pytest.mark.parametrize("name", ["kerple", "sandwich", "fire"])
def test_the_biases_serve_both_self_attentions_and_not_cross_attention(name):
    assert name in ENCODER_SELF.allowed and name in DECODER_SELF.allowed
    from fairseq_distattn.registry import CROSS

    assert name not in CROSS.allowed
