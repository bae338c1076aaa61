"""``--window-expected-mask`` / ``window_mask(..., expected=True)``: the expected
window the paper states (sec. 3.2, m_hat = E(m) in [0, 1]), departing from eq. 9
as written, which counts a key twice where both boundary pointers fall on it:
eq. 9 = E[1{min(l,r) <= j <= max(l,r)}] + p_l(j) p_r(j).

The float64 references enumerate every (l, r) pair weighted by p_l(l) p_r(r)
and average the discrete window's indicator; the segment variant's indicator is
1{seg(min(l,r)) <= seg(j) <= seg(max(l,r))} (eq. 11 minus each pointer's mass
in key j's segment, multiplied)."""

import itertools

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional.differentiable_window import _TokenWindowMask, key_segments

from .model_helpers import TINY, left_pad, random_tokens, translation_model

# (batch, heads, Tq, Tk, dim)
SHAPE = (2, 2, 5, 7, 4)


def inputs(seed, shape=SHAPE, scale=2.0):
    batch, heads, tgt_len, src_len, dim = shape
    generator = torch.Generator().manual_seed(seed)

    def draw(length):
        return torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64) * scale

    return draw(tgt_len), draw(src_len), draw(tgt_len), draw(src_len)


def padding_mask(src_len, lengths):
    """Left padding (fairseq's source side): the last ``length`` keys are real."""
    return torch.stack([torch.arange(src_len) < src_len - length for length in lengths])


def pointers(q, k, key_padding_mask, causal, query_offset):
    """Eqs. 7-8 over the keys the query may see, float64."""
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
    tgt_len, src_len = q.size(2), k.size(2)
    hidden = torch.zeros(q.size(0), 1, tgt_len, src_len, dtype=torch.bool)
    if key_padding_mask is not None:
        hidden = hidden | key_padding_mask[:, None, None, :]
    if causal:
        hidden = hidden | (torch.arange(src_len)[None, :] > torch.arange(tgt_len)[:, None] + query_offset)
    # a query that sees no key at all (left padding with causal) points nowhere: zeros, as masked_softmax
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).nan_to_num(0.0)


def brute_force(q_left, k_left, q_right, k_right, segment_size, key_padding_mask, causal, query_offset, expected):
    """sum over (l, r) of p_l(l) p_r(r) times the discrete indicator: the expected
    window (``expected``) or eq. 9/11's two terms 1{l <= j <= r} + 1{r <= j <= l}."""
    left = pointers(q_left, k_left, key_padding_mask, causal, query_offset)
    right = pointers(q_right, k_right, key_padding_mask, causal, query_offset)
    batch, heads, tgt_len, src_len = left.shape
    segments = key_segments(key_padding_mask, src_len, segment_size or 1, "cpu")[:, 0, 0, :]
    if segment_size == 0:
        segments = torch.arange(src_len)[None].expand(batch, src_len)
    out = torch.zeros(batch, heads, tgt_len, src_len, dtype=torch.float64)
    for b, h, i in itertools.product(range(batch), range(heads), range(tgt_len)):
        seg = segments[b if segments.size(0) > 1 else 0].tolist()
        for j in range(src_len):
            total = 0.0
            for lo, hi in itertools.product(range(src_len), range(src_len)):
                weight = left[b, h, i, lo].item() * right[b, h, i, hi].item()
                if expected:
                    flag = seg[min(lo, hi)] <= seg[j] <= seg[max(lo, hi)]
                else:
                    flag = (seg[lo] <= seg[j] <= seg[hi]) + (seg[hi] <= seg[j] <= seg[lo])
                total += weight * flag
            out[b, h, i, j] = total
    return out


def visible_keys(key_padding_mask, causal, query_offset, tgt_len, src_len):
    """Where the window is defined: real keys (the mask on padding is never used)."""
    keep = torch.ones(1, 1, tgt_len, src_len, dtype=torch.bool)
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask[:, None, None, :]
    return keep.expand(SHAPE[0], SHAPE[1], tgt_len, src_len)


CASES = [
    # (segment_size, padded, causal, query_offset)
    (0, False, False, 0),
    (0, True, False, 0),
    (0, False, True, 0),
    (0, False, True, 2),
    (0, True, True, 1),
    (1, False, False, 0),
    (2, False, False, 0),
    (2, True, False, 0),
    (3, True, False, 0),
    (3, False, True, 2),
    (5, True, False, 0),
    (7, False, False, 0),
    (9, True, False, 0),
]


@pytest.mark.parametrize("expected", [True, False], ids=["expected", "eq9"])
@pytest.mark.parametrize("segment_size,padded,causal,query_offset", CASES)
def test_window_mask_equals_brute_force_enumeration(segment_size, padded, causal, query_offset, expected):
    q_left, k_left, q_right, k_right = inputs(seed=segment_size * 10 + padded + 2 * causal + query_offset)
    tgt_len, src_len = q_left.size(2), k_left.size(2)
    key_padding_mask = padding_mask(src_len, [src_len, 4]) if padded else None
    mask = functional.window_mask(
        q_left,
        k_left,
        q_right,
        k_right,
        segment_size,
        key_padding_mask=key_padding_mask,
        causal=causal,
        query_offset=query_offset,
        expected=expected,
    )
    reference = brute_force(
        q_left, k_left, q_right, k_right, segment_size, key_padding_mask, causal, query_offset, expected
    )
    keep = visible_keys(key_padding_mask, causal, query_offset, tgt_len, src_len)
    torch.testing.assert_close(mask[keep], reference[keep], rtol=0, atol=1e-12)
    if expected:
        assert mask.min() >= -1e-12 and mask.max() <= 1 + 1e-12
    # the autograd path (a closed-form backward for tokens) gives the same values
    with torch.enable_grad():
        grad_inputs = [t.clone().requires_grad_() for t in (q_left, k_left, q_right, k_right)]
        tracked = functional.window_mask(
            *grad_inputs,
            segment_size,
            key_padding_mask=key_padding_mask,
            causal=causal,
            query_offset=query_offset,
            expected=expected,
        )
    torch.testing.assert_close(tracked.detach(), mask, rtol=0, atol=1e-14)


@pytest.mark.parametrize("segment_size", [0, 2, 3])
def test_expected_is_eq9_minus_the_double_count(segment_size):
    args = inputs(seed=11)
    key_padding_mask = padding_mask(SHAPE[3], [SHAPE[3], 5])
    eq9 = functional.window_mask(*args, segment_size, key_padding_mask=key_padding_mask)
    expected = functional.window_mask(*args, segment_size, key_padding_mask=key_padding_mask, expected=True)
    assert (eq9 - expected).min() >= -1e-15  # the removed term is a product of probabilities
    assert eq9.max() > 1  # eq. 9 as written leaves [0, 1] with these inputs (the finding)
    assert expected.max() <= 1 + 1e-12


@pytest.mark.parametrize("segment_size", [0, 1, 3])
def test_both_pointers_on_one_key_give_1_not_2(segment_size):
    """The finding's reproducer: one key, both pointers on it. Eq. 9 as written
    (the default, unchanged) gives 2; the discrete window [1, 1] and the expected mask give 1."""
    q = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    assert functional.window_mask(q, q.clone(), q, q.clone(), segment_size).item() == 2.0
    assert functional.window_mask(q, q.clone(), q, q.clone(), segment_size, expected=False).item() == 2.0
    assert functional.window_mask(q, q.clone(), q, q.clone(), segment_size, expected=True).item() == 1.0
    # near one-hot pointers on the same key of a longer sequence
    k = torch.zeros(1, 1, 6, 4, dtype=torch.float64)
    k[0, 0, 2, 0] = 60.0
    q = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    q[0, 0, 0, 0] = 2.0
    eq9 = functional.window_mask(q, k, q, k.clone(), segment_size)
    expected = functional.window_mask(q, k, q, k.clone(), segment_size, expected=True)
    assert eq9.max().item() == pytest.approx(2.0, abs=1e-9)
    assert expected.max().item() == pytest.approx(1.0, abs=1e-9)


def test_expected_must_be_a_bool():
    with pytest.raises(ValueError, match="expected"):
        functional.window_mask(*inputs(seed=0), expected=1)


@pytest.mark.parametrize("expected", [True, False], ids=["expected", "eq9"])
def test_closed_form_backward_of_the_token_mask(expected):
    generator = torch.Generator().manual_seed(5)
    left = torch.softmax(torch.randn(2, 2, 3, 5, generator=generator, dtype=torch.float64), -1).requires_grad_()
    right = torch.softmax(torch.randn(2, 2, 3, 5, generator=generator, dtype=torch.float64), -1).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: _TokenWindowMask.apply(a, b, expected), (left, right), fast_mode=True)
    assert torch.autograd.gradcheck(lambda a, b: _TokenWindowMask.apply(a, b, expected), (left, right))


@pytest.mark.parametrize("segment_size,padded,causal", [(0, False, False), (0, True, True), (2, True, False)])
def test_gradcheck_through_the_pointer_softmaxes(segment_size, padded, causal):
    shape = (1, 2, 3, 5, 3)
    args = tuple(t.requires_grad_() for t in inputs(seed=3, shape=shape, scale=1.0))
    key_padding_mask = padding_mask(5, [3]) if padded else None

    def fn(*tensors):
        return functional.window_mask(
            *tensors, segment_size, key_padding_mask=key_padding_mask, causal=causal, query_offset=2, expected=True
        )

    assert torch.autograd.gradcheck(fn, args, fast_mode=True)


EXPECTED_FLAGS = [
    *TINY,
    "--encoder-self-attention",
    "window-aw@0",
    "--decoder-self-attention",
    "window-mw@0",
    "--cross-attention",
    "window-aw-seg@0",
    "--window-segment-size",
    "2",
    "--window-expected-mask",
]


def test_a_model_with_the_flag_trains_a_step_and_decodes_incrementally():
    model, d = translation_model(extra=EXPECTED_FLAGS)
    windows = [m for m in model.modules() if type(m).__name__ == "DifferentiableWindow"]
    assert len(windows) == 3 and all(m.expected_mask for m in windows)
    assert all("expected_mask=True" in m.extra_repr() for m in windows)
    default, _ = translation_model(extra=EXPECTED_FLAGS[:-1])
    assert not any(m.expected_mask for m in default.modules() if type(m).__name__ == "DifferentiableWindow")
    assert "expected_mask" not in repr(default)

    lengths = [7, 4]
    src_tokens = left_pad([random_tokens(d, 1, n, seed=i)[0] for i, n in enumerate(lengths)], d.pad())
    src_lengths = torch.tensor(lengths)
    targets = random_tokens(d, 2, 5, seed=9)
    targets[:, 0] = d.eos()

    # one training step: finite gradients reach the pointer projections, parameters move
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logits = model(src_tokens, src_lengths, targets[:, :-1])[0]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets[:, 1:].reshape(-1))
    loss.backward()
    pointer_grads = [p.grad for name, p in model.named_parameters() if "left" in name or "right" in name]
    assert pointer_grads and all(g is not None and torch.isfinite(g).all() for g in pointer_grads)
    assert any(g.abs().sum() > 0 for g in pointer_grads)
    optimizer.step()
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters() if "left" in name)
    assert torch.isfinite(loss)

    # incremental decoding equals the full forward
    model.eval()
    with torch.no_grad():
        full = model(src_tokens, src_lengths, targets)[0]
        encoder_out = model.encoder(src_tokens, src_lengths)
        state = {}
        steps = [
            model.decoder(targets[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1]
            for t in range(targets.size(1))
        ]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-6)
