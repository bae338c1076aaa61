"""RoPE, xPos and RoPE's context-length scaling against float64 references
written from the papers' equations (RoFormer eq. 14-16 with its neighbouring
pairs; xPos sec. 3.2; position interpolation, NTK-aware and YaRN as Peng et
al. 2023 eq. 14-22 state them; YaRN also as its authors' code computes it),
computed pair by pair in plain Python floats."""

import math

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.registry import SpecError

from .model_helpers import TINY_LM, language_model, random_tokens

B, H, T, D = 2, 3, 7, 8


def paper_theta(dims, base=10000.0, scaling="none", factor=1.0, original_length=0):
    """theta_i per pair, i = 0..dims/2-1, and the logit factor 1/t, from the papers' formulas."""
    if scaling == "ntk":  # Peng et al. eq. 16: b' = b s^(|D|/(|D|-2))
        base = base * factor ** (dims / (dims - 2))
    thetas = []
    for i in range(dims // 2):
        theta = base ** (-2 * i / dims)  # RoFormer eq. 15
        if scaling == "linear":  # Chen et al. eq. 3: f(x, m/s)
            theta = theta / factor
        elif scaling == "yarn-paper":  # Peng et al. eq. 17-19, alpha = 1, beta = 32
            wavelength = 2 * math.pi / theta
            r = original_length / wavelength
            gamma = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / (32 - 1)
            theta = (1 - gamma) * theta / factor + gamma * theta
        elif scaling == "yarn":  # the authors' _yarn, beta_fast = 32, beta_slow = 1
            low, high = authors_yarn_range(dims, base, original_length)
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            theta = (theta / factor) * ramp + theta * (1 - ramp)
        thetas.append(theta)
    # eq. 22; the authors' code: mscale = 0.1 ln s + 1 on cos and sin, so mscale^2 on the rotated dimensions' product
    temperature_inverse = (0.1 * math.log(factor) + 1) ** 2 if scaling in ("yarn", "yarn-paper") else 1.0
    return thetas, temperature_inverse


def authors_yarn_range(dims, base, original_length):
    """jquesnelle/yarn's _yarn_find_correction_range(beta_fast=32, beta_slow=1, dims, base, L), with
    _yarn_linear_ramp_mask's guard against an empty range."""

    def correction_dim(rotations):
        return dims * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), dims - 1)
    return low, high + 0.001 if low == high else high


def paper_rotate(x, position, dims, thetas, xpos_power=None):
    """R_position x for one vector: the paper's neighbouring pairs (2i, 2i+1) of the first
    ``dims`` dimensions; xPos multiplies pair i by zeta_i^xpos_power."""
    out = list(x)
    for i in range(dims // 2):
        angle = position * thetas[i]
        a, b = x[2 * i], x[2 * i + 1]
        scale = 1.0
        if xpos_power is not None:
            zeta = (2 * i / dims + 0.4) / 1.4
            scale = zeta**xpos_power
        out[2 * i] = scale * (a * math.cos(angle) - b * math.sin(angle))
        out[2 * i + 1] = scale * (b * math.cos(angle) + a * math.sin(angle))
    return out


def paper_attention(q, k, v, positions, fraction=1.0, scaling="none", factor=1.0, original_length=0, xpos=None):
    """softmax over keys of (R_m q)^T (R_n k) / sqrt(d) (causal), in Python floats; positions per row [B][T]."""
    head_dim = q.size(-1)
    dims = 2 * int(fraction * head_dim / 2)
    thetas, temperature_inverse = paper_theta(dims, scaling=scaling, factor=factor, original_length=original_length)
    out = torch.zeros_like(q)
    for b in range(q.size(0)):
        for h in range(q.size(1)):
            rq = [
                paper_rotate(
                    q[b, h, i].tolist(), positions[b][i], dims, thetas, None if xpos is None else positions[b][i] / xpos
                )
                for i in range(q.size(2))
            ]
            rk = [
                paper_rotate(
                    k[b, h, j].tolist(),
                    positions[b][j],
                    dims,
                    thetas,
                    None if xpos is None else -positions[b][j] / xpos,
                )
                for j in range(k.size(2))
            ]
            # yarn-paper: the temperature divides the whole logit; yarn: only the rotated dimensions' share
            whole = temperature_inverse if scaling != "yarn" else 1.0
            rotated = temperature_inverse if scaling == "yarn" else 1.0
            for i in range(q.size(2)):
                logits = [
                    whole
                    * (
                        rotated * sum(a * c for a, c in zip(rq[i][:dims], rk[j][:dims]))
                        + sum(a * c for a, c in zip(rq[i][dims:], rk[j][dims:]))
                    )
                    / math.sqrt(head_dim)
                    if j <= i
                    else -math.inf
                    for j in range(k.size(2))
                ]
                top = max(logits)
                weights = [math.exp(logit - top) for logit in logits]
                total = sum(weights)
                out[b, h, i] = sum(w / total * v[b, h, j] for j, w in enumerate(weights))
    return out


def half_layout(x, dims):
    """The rotate-half layout of paper-layout vectors: dimension i <- 2i and i + dims/2 <- 2i + 1
    (what permuting a projection's output rows does)."""
    order = [*range(0, dims, 2), *range(1, dims, 2), *range(dims, x.size(-1))]
    return x[..., order]


def rotate_half_attention(q, k, v, dims):
    """GPT-NeoX's layout (dimension i paired with i + dims/2, ``x cos + rotate_half(x) sin``), causal."""
    theta = torch.tensor(paper_theta(dims)[0], dtype=torch.float64)
    angles = torch.arange(q.size(2), dtype=torch.float64)[:, None] * theta
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((angles.sin(), angles.sin()), -1)

    def rope(x):
        head, rest = x[..., :dims], x[..., dims:]
        rotated_half = torch.cat((-head[..., dims // 2 :], head[..., : dims // 2]), -1)
        return torch.cat((head * cos + rotated_half * sin, rest), -1)

    logits = rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(q.size(-1))
    logits = logits.masked_fill(torch.ones(q.size(2), k.size(2), dtype=torch.bool).triu(1), -math.inf)
    return logits.softmax(-1) @ v


def draw(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=generator, dtype=torch.float64) for _ in range(3)]


CASES = [
    dict(),
    dict(fraction=0.5),
    dict(fraction=0.25),
    dict(scaling="linear", factor=4.0),
    dict(scaling="ntk", factor=4.0),
    dict(scaling="yarn", factor=4.0, original_length=64),
    dict(scaling="yarn", factor=16.0, original_length=4096, fraction=0.5),
    dict(scaling="yarn", factor=4.0, original_length=8, fraction=0.5),
    dict(scaling="yarn-paper", factor=4.0, original_length=64),
    dict(scaling="yarn-paper", factor=16.0, original_length=4096, fraction=0.5),
    dict(xpos=512.0),
    dict(xpos=4.0, fraction=0.5),
    dict(xpos=4.0, scaling="ntk", factor=2.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: ",".join(f"{k}={v}" for k, v in case.items()) or "rope")
def test_op_is_the_papers_attention(case):
    q, k, v = draw()
    positions = [list(range(T))] * B
    expected = paper_attention(q, k, v, positions, **case)
    out, _ = functional.rotary_attention(
        q,
        k,
        v,
        fraction=case.get("fraction", 1.0),
        scaling=case.get("scaling", "none"),
        scaling_factor=case.get("factor", 1.0),
        original_length=case.get("original_length", 0),
        xpos_scale_base=case.get("xpos"),
        causal=True,
    )
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_rotate_half_layout_is_the_same_attention_on_permuted_projections(fraction):
    """GPT-NeoX/LLaMA-HF pair dimension i with i + d/2: given q and k with their dimensions
    permuted that way, that layout computes exactly what the op computes."""
    q, k, v = draw(4)
    dims = functional.rotary_dims(D, fraction)
    ours, _ = functional.rotary_attention(q, k, v, fraction=fraction, causal=True)
    theirs = rotate_half_attention(half_layout(q, dims), half_layout(k, dims), v, dims)
    torch.testing.assert_close(theirs, ours, rtol=1e-10, atol=1e-10)


def test_scalings_change_the_attention_and_linear_is_position_interpolation():
    q, k, v = draw(1)
    plain = functional.rotary_attention(q, k, v, causal=True)[0]
    for scaling in ("linear", "ntk", "yarn"):
        # only yarn reads the training length (the others refuse one)
        arguments = dict(scaling=scaling, original_length=8 if scaling == "yarn" else 0, causal=True)
        scaled = functional.rotary_attention(q, k, v, scaling_factor=4.0, **arguments)[0]
        assert (scaled - plain).abs().max() > 1e-3, scaling
        same = functional.rotary_attention(q, k, v, scaling_factor=1.0, **arguments)[0]
        torch.testing.assert_close(same, plain, rtol=1e-12, atol=1e-12)
    # position interpolation: the angles of position m / s exactly
    theta, factor = functional.rotary_frequencies(D, scaling="linear", scaling_factor=4.0)
    original, _ = functional.rotary_frequencies(D)
    torch.testing.assert_close(theta * 4.0, original)
    assert factor == 1.0


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones():
    theta, factor = functional.rotary_frequencies(64, scaling="yarn", scaling_factor=8.0, original_length=2048)
    original, _ = functional.rotary_frequencies(64)
    wavelengths = 2 * math.pi / original
    assert torch.equal(theta[2048 / wavelengths > 32], original[2048 / wavelengths > 32])
    torch.testing.assert_close(theta[2048 / wavelengths < 1], original[2048 / wavelengths < 1] / 8)
    assert factor == pytest.approx((0.1 * math.log(8) + 1) ** 2)


def test_left_padding_shifts_positions_to_the_first_real_token():
    """A left-padded row gets exactly what it gets alone (encoder form, both directions)."""
    q, k, v = draw(2)
    pad = 3
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, :pad] = True
    batch, _ = functional.rotary_attention(q, k, v, key_padding_mask=mask, xpos_scale_base=None)
    alone, _ = functional.rotary_attention(q[:1, :, pad:], k[:1, :, pad:], v[:1, :, pad:])
    torch.testing.assert_close(batch[0, :, pad:], alone[0], rtol=1e-12, atol=1e-12)
    positions = functional.sequence_positions(mask, T, 0, "cpu")
    assert positions[0].tolist() == [0, 0, 0, 0, 1, 2, 3] and positions[1].tolist() == list(range(T))


@pytest.mark.parametrize("xpos", [None, 4.0], ids=["rope", "xpos"])
@pytest.mark.parametrize("query_offset", [0, 5], ids=["full", "decoding"])
def test_padded_rows_are_rotated_at_positions_from_their_first_real_token(xpos, query_offset):
    """The rotated queries and keys themselves, pair by pair in Python floats: the
    attention cannot show a shift of every position (RoPE and xPos are relative in
    exact arithmetic), so this checks the positions each padded row is rotated at."""
    q, k, _ = draw(4)
    q = q[:, :, query_offset:]
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, :3] = True  # row 0 left-padded by 3: its key j sits at position max(j - 3, 0)
    rotated_q, rotated_k = functional.rotary_query_key(
        q, k, key_padding_mask=mask, xpos_scale_base=xpos, query_offset=query_offset
    )
    thetas, _ = paper_theta(D)
    leading = [3, 0]
    for b in range(B):
        for h in range(H):
            for j in range(T):
                position = max(j - leading[b], 0)
                power = None if xpos is None else -position / xpos
                expected = paper_rotate(k[b, h, j].tolist(), position, D, thetas, power)
                torch.testing.assert_close(
                    rotated_k[b, h, j], torch.tensor(expected, dtype=k.dtype), rtol=1e-12, atol=1e-12
                )
            for i in range(q.size(2)):
                position = max(query_offset + i - leading[b], 0)
                power = None if xpos is None else position / xpos
                expected = paper_rotate(q[b, h, i].tolist(), position, D, thetas, power)
                torch.testing.assert_close(
                    rotated_q[b, h, i], torch.tensor(expected, dtype=q.dtype), rtol=1e-12, atol=1e-12
                )


def test_rotation_is_relative_only():
    """(R_m q)^T (R_n k) depends on n - m alone: shifting every position changes no logit."""
    q, k, _ = draw(3)
    theta, _ = functional.rotary_frequencies(D)
    positions = torch.arange(T)[None]
    logits = functional.rotate(q, positions, theta) @ functional.rotate(k, positions, theta).transpose(-1, -2)
    shifted = functional.rotate(q, positions + 1000, theta) @ functional.rotate(k, positions + 1000, theta).transpose(
        -1, -2
    )
    torch.testing.assert_close(shifted, logits, rtol=1e-9, atol=1e-9)


def test_angles_are_formed_in_float32_for_half_inputs():
    q = torch.randn(1, 1, 3, D).half()
    theta, _ = functional.rotary_frequencies(D, dtype=torch.float32)
    positions = torch.tensor([[3000, 3001, 3002]])
    expected = functional.rotate(q.double(), positions, theta.double()).half()
    torch.testing.assert_close(functional.rotate(q, positions, theta), expected, rtol=0, atol=2e-3)


@pytest.mark.parametrize(
    "flags,problem",
    [
        (["--rope-fraction", "0"], "share of the head"),
        (["--rope-fraction", "0.1"], "rotates no pair"),
        (["--rope-scaling-factor", "2"], "scales nothing with --rope-scaling none"),
        (["--rope-scaling", "yarn", "--rope-scaling-factor", "2"], "training length"),
        (["--rope-scaling", "linear", "--rope-scaling-factor", "0.5"], "finite number >= 1"),
    ],
)
def test_bad_rotary_flags_are_refused(flags, problem):
    with pytest.raises((SpecError, SystemExit)) as raised:
        language_model(extra=[*TINY_LM, "--decoder-self-attention", "rope", *flags])
    assert raised.type is SystemExit or problem in str(raised.value)


def test_xpos_is_refused_in_the_encoder():
    from fairseq_distattn.registry import ENCODER_SELF

    assert "xpos" not in ENCODER_SELF.allowed
    assert "bidirectional" in ENCODER_SELF.disallowed_reason("xpos")


@pytest.mark.parametrize(
    "flags",
    [
        ["--decoder-self-attention", "rope"],
        [
            "--decoder-self-attention",
            "rope",
            "--rope-fraction",
            "0.5",
            "--rope-scaling",
            "yarn",
            "--rope-scaling-factor",
            "4",
            "--rope-original-length",
            "3",
        ],
        [
            "--decoder-self-attention",
            "xpos",
            "--xpos-scale-base",
            "8",
            "--rope-scaling",
            "ntk",
            "--rope-scaling-factor",
            "2",
            # scale base 8 fits float32 over at most 558 positions (the default 1024 is refused)
            "--tokens-per-sample",
            "64",
        ],
    ],
)
def test_language_model_incremental_matches_full_with_each_scaling(flags):
    model, d = language_model(extra=[*TINY_LM, *flags])
    tokens = random_tokens(d, 3, 9, seed=5)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "dims, base, original_length, expected",
    [
        (128, 10000.0, 4096, (20, 46)),  # LLaMA's head: floor(20.95), ceil(45.03)
        (64, 10000.0, 64, (0, 9)),  # the LM presets' heads at 64 training tokens: floor(-3.98) -> 0, ceil(8.06)
        (8, 10000.0, 64, (0, 2)),  # ceil(1.01)... of 4 pairs
    ],
)
def test_yarns_correction_range_is_the_authors(dims, base, original_length, expected):
    """The pair indices between which ``yarn`` ramps, as the authors' code finds them from
    beta_fast = 32 and beta_slow = 1 rotations over the training length (worked by hand)."""
    assert functional.yarn_correction_range(dims, base, original_length) == expected
    assert authors_yarn_range(dims, base, original_length) == expected


def test_yarn_frequencies_and_attention_factor_are_the_authors():
    """``yarn`` is what the authors' code and Hugging Face's ``rope_type="yarn"`` compute:
    original frequencies below the ramp, theta / s above it, linear over the pair index
    between (numbers from their formulas, dims 128, base 1e4, L 4096, s 4); the attention
    factor (0.1 ln 4 + 1)^2 = 1.29647...; ``yarn-paper`` differs inside the ramp only."""
    theta, factor = functional.rotary_frequencies(128, 10000.0, "yarn", 4.0, 4096)
    original = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    torch.testing.assert_close(theta[:21], original[:21], rtol=0, atol=0)
    torch.testing.assert_close(theta[46:], original[46:] / 4, rtol=1e-15, atol=0)
    ramp = (33 - 20) / (46 - 20)  # pair 33, half way up the ramp
    expected = original[33].item() * (1 - ramp) + original[33].item() / 4 * ramp
    assert theta[33].item() == pytest.approx(expected, rel=1e-14)
    assert factor == pytest.approx((0.1 * math.log(4.0) + 1) ** 2, rel=1e-15)
    assert factor == pytest.approx(1.296476, abs=1e-6)
    paper, paper_factor = functional.rotary_frequencies(128, 10000.0, "yarn-paper", 4.0, 4096)
    assert paper_factor == factor
    inside = (theta - paper).abs() > 1e-12 * original
    assert inside.any() and not inside[:10].any() and not inside[50:].any()


def test_rope_original_length_without_a_yarn_scaling_is_refused():
    for scaling in ("none", "linear", "ntk"):
        flags = ["--decoder-self-attention", "rope", "--rope-original-length", "64", "--rope-scaling", scaling]
        if scaling != "none":
            flags += ["--rope-scaling-factor", "2"]
        with pytest.raises((SpecError, SystemExit)):
            language_model("distattn_lm", [*TINY_LM, *flags])
