"""Selective attention (Leviathan, Kalman, Matias 2024): ``selective_attention`` and
``selection_penalty`` against plain restatements of the paper's code listing and of
x-transformers' arithmetic in float64 (with padding: the listing on each sequence
without its pads), where x-transformers departs from the listing, incremental
decoding with the carried state, the no-selection case, half precision, gradients
and the refusals.

The restatements read (not copied):

* the paper's sketch implementation (arXiv:2410.02703, Figure 2): head 0 of the scaled,
  causally masked logits, ReLU, column 0 zeroed, diagonal zeroed, rows rolled down by
  one with row 0 zeroed, cumsum over the queries, subtracted from every head;
* x-transformers: github.com/lucidrains/x-transformers at commit
  9252ed7838021ee61e6c5be0930b3a9a88efdf06, x_transformers/attend.py (``selective_attn``
  and the masking before it in ``Attend.forward``).
"""

import pytest
import torch
import torch.nn.functional as F

from fairseq_distattn.functional import selection_penalty, selective_attention, softmax_attention

from .functional_cases import (
    DTYPE,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
)

B, H, T, D = 3, 3, 7, 4
CLOSE = dict(rtol=1e-10, atol=1e-12)  # float64 against a float64 restatement
HALF_CLOSE = dict(rtol=1e-2, atol=1e-2)
PADDINGS = (None, "left", "right", "holes")


def draw(seed, tgt_len=T, src_len=T, batch=B, heads=H, dim=D):
    """``q, k, v`` in float64, scaled so that head 0 selects with logits of order 1-3."""
    generator = torch.Generator().manual_seed(seed)
    q = 1.5 * torch.randn(batch, heads, tgt_len, dim, generator=generator, dtype=DTYPE)
    k = 1.5 * torch.randn(batch, heads, src_len, dim, generator=generator, dtype=DTYPE)
    v = torch.randn(batch, heads, src_len, dim, generator=generator, dtype=DTYPE)
    return q, k, v


def padding_mask(kind, batch=B, src_len=T):
    """[B, Tk] bool, True = pad; sequence 0 never padded. ``left``: 2 and 4 leading pads;
    ``right``: 1 and 3 trailing pads; ``holes``: pads inside the sequences (fairseq makes
    none: they show that a pad neither selects nor is selected)."""
    if kind is None:
        return None
    mask = torch.zeros(batch, src_len, dtype=torch.bool)
    if kind == "left":
        mask[1, :2] = True
        mask[2, :4] = True
    elif kind == "right":
        mask[1, -1:] = True
        mask[2, -3:] = True
    else:
        mask[1, [0, 3]] = True
        mask[2, [2, 3, 5]] = True
    return mask


# --------------------------------------------------------------------------
# restatements
# --------------------------------------------------------------------------


def paper_listing(q, k, v):
    """The paper's Figure 2 on one unpadded sequence, ``q, k, v`` ``[H, N, D]`` (N queries
    and N keys): ``(out [H, N, D], weights [H, N, N], F [N, N])``."""
    n, d = q.size(1), q.size(2)
    attn_logits = torch.einsum("hnd,hmd->hnm", q, k) / d**0.5
    causal_mask = torch.ones(n, n, dtype=torch.bool).tril()
    attn_logits = torch.where(causal_mask, attn_logits, float("-inf"))
    S = attn_logits[0]  # head 0
    S = torch.relu(S)
    S[..., 0] = 0  # <BOS> is never masked
    S = (1 - torch.eye(n, dtype=S.dtype)) * S  # nor is a token by itself
    S = torch.roll(S, 1, -2)
    S[..., 0, :] = 0  # strictly for the future
    penalty = torch.cumsum(S, dim=-2)
    attn_logits = attn_logits - penalty[None]
    weights = torch.softmax(attn_logits, dim=-1)
    return weights @ v, weights, penalty


def x_transformers_weights(q, k, key_padding_mask=None, protect=None):
    """x-transformers' ``Attend`` with ``selective=True, causal=True`` up to the softmax,
    restated: ``sim`` scaled, padded keys and the causal mask filled with ``-finfo.max``,
    then ``selective_attn``: ``relu(sim[:, 0])``, column ``-i`` zeroed, ``(1 - eye)`` with
    the eye padded by ones on the left for ``j > i``, a one-row pad for the shift, cumsum,
    subtracted from every head. Its causal mask for ``j > i`` is
    ``create_causal_mask``'s ``triu(j - i + 1)``, and it drops the mask for a single
    query. ``protect`` (a list of one column per batch element, ours) additionally
    zeroes those columns of the gate: what this op does differently under left padding."""
    i, j = q.size(2), k.size(2)
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * q.size(-1) ** -0.5
    mask_value = -torch.finfo(sim.dtype).max
    if key_padding_mask is not None:
        sim = sim.masked_fill(key_padding_mask[:, None, None, :], mask_value)
    if i > 1:
        causal_mask = torch.ones(i, j, dtype=torch.bool).triu(j - i + 1)
        sim = sim.masked_fill(causal_mask, mask_value)
    gate = F.relu(sim[:, 0]).clone()
    gate[..., -i] = 0.0
    if protect is not None:
        for b, column in enumerate(protect):
            gate[b, :, column] = 0.0
    eye = torch.eye(i, dtype=sim.dtype)
    if j > i:
        eye = F.pad(eye, (j - i, 0), value=1.0)
    gate = (1.0 - eye) * gate
    gate = F.pad(gate, (0, 0, 1, -1), value=0.0)
    gate = gate.cumsum(dim=-2)
    return torch.softmax(sim - gate[:, None], dim=-1)


def real_positions(mask, b, length=T):
    return list(range(length)) if mask is None else [t for t in range(length) if not mask[b, t]]


# --------------------------------------------------------------------------
# the paper's listing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", PADDINGS)
def test_equals_the_paper_listing_on_each_sequence_without_its_pads(padding):
    q, k, v = draw(1)
    mask = padding_mask(padding)
    out, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    penalty, state = selection_penalty(q, k, key_padding_mask=mask)
    selecting = 0
    for b in range(B):
        real = real_positions(mask, b)
        want_out, want_weights, want_penalty = paper_listing(q[b][:, real], k[b][:, real], v[b][:, real])
        rows = torch.tensor(real)
        torch.testing.assert_close(out[b][:, rows], want_out, **CLOSE)
        torch.testing.assert_close(probs[b][:, rows][:, :, rows], want_weights, **CLOSE)
        torch.testing.assert_close(penalty[b, 0][rows][:, rows], want_penalty, **CLOSE)
        if mask is not None:  # padded keys get no weight on the real rows, and no penalty
            assert (probs[b][:, rows][:, :, mask[b]] == 0).all()
            assert (penalty[b, 0][:, mask[b]] == 0).all() and (state[b, 0][mask[b]] == 0).all()
        selecting += int((want_penalty > 0.1).sum())
    assert selecting > 5, "the draw must select, or the listing equals plain causal attention"


def test_a_left_padded_sequence_equals_itself_right_padded():
    """The first real key is the protected <BOS>, whatever the padding before it."""
    q, k, v = draw(2, batch=1)
    pads = 3
    shifted = [F.pad(t, (0, 0, pads, 0)) for t in (q, k, v)]
    left = torch.zeros(1, T + pads, dtype=torch.bool)
    left[0, :pads] = True
    out, probs = selective_attention(q, k, v, causal=True)
    out_left, probs_left = selective_attention(*shifted, key_padding_mask=left, causal=True)
    torch.testing.assert_close(out_left[:, :, pads:], out, **CLOSE)
    torch.testing.assert_close(probs_left[:, :, pads:, pads:], probs, **CLOSE)
    assert (out_left[:, :, :pads] == 0).all(), "a padded row that sees only pads gives 0"


# --------------------------------------------------------------------------
# x-transformers
# --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [None, "right"])
def test_equals_x_transformers_on_the_square_block(padding):
    q, k, v = draw(3)
    mask = padding_mask(padding)
    _, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    want = x_transformers_weights(q, k, mask)
    for b in range(B):
        rows = torch.tensor(real_positions(mask, b))  # x-transformers' padded rows select: not compared
        torch.testing.assert_close(probs[b][:, rows], want[b][:, rows], **CLOSE)


def test_under_left_padding_x_transformers_protects_column_0_and_this_op_the_first_real_key():
    q, k, v = draw(4)
    mask = padding_mask("left")
    _, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    first = [real_positions(mask, b)[0] for b in range(B)]
    protected = x_transformers_weights(q, k, mask, protect=first)
    plain = x_transformers_weights(q, k, mask)
    for b in range(B):
        rows = torch.tensor(real_positions(mask, b))
        torch.testing.assert_close(probs[b][:, rows], protected[b][:, rows], **CLOSE)
    differs = (probs - plain).abs()[1:].amax()
    assert differs > 1e-3, "x-transformers selects the first real token of a left-padded sequence"
    torch.testing.assert_close(probs[0], plain[0], **CLOSE)  # sequence 0 has no padding


def test_x_transformers_decoding_step_has_no_penalty_and_this_op_equals_the_full_forward():
    """x-transformers' one-query step (``j > i``) zeroes its whole gate: its row is plain
    causal softmax attention. This op, given the carried state, gives the full call's row."""
    q, k, v = draw(5)
    full_out, full_probs = selective_attention(q, k, v, causal=True)
    t = T - 1
    _, state = selection_penalty(q[:, :, :t], k[:, :, :t])
    row = (q[:, :, t:], k, v)
    out, probs = selective_attention(*row, state, causal=True, query_offset=t)
    torch.testing.assert_close(out, full_out[:, :, t:], **CLOSE)
    torch.testing.assert_close(probs, full_probs[:, :, t:], **CLOSE)
    x_probs = x_transformers_weights(q[:, :, t:], k)
    plain = softmax_attention(*row, causal=True, query_offset=t)[1]
    torch.testing.assert_close(x_probs, plain, **CLOSE)
    assert (probs - x_probs).abs().amax() > 1e-3


# --------------------------------------------------------------------------
# incremental decoding
# --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("block", [1, 3])
def test_rows_in_blocks_with_the_carried_state_equal_the_full_call(padding, block):
    q, k, v = draw(6)
    mask = padding_mask(padding)
    full_out, full_probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    state = None
    for start in range(0, T, block):
        end = min(start + block, T)
        keys = dict(key_padding_mask=None if mask is None else mask[:, :end], query_offset=start)
        rows = (q[:, :, start:end], k[:, :, :end], v[:, :, :end])
        out, probs = selective_attention(*rows, state, causal=True, **keys)
        torch.testing.assert_close(out, full_out[:, :, start:end], **CLOSE)
        torch.testing.assert_close(probs, full_probs[:, :, start:end, :end], **CLOSE)
        _, state = selection_penalty(rows[0], rows[1], state, **keys)
        assert state.shape == (B, 1, end)


def test_the_state_is_the_column_sums_of_the_selections_and_the_penalty_reads_it():
    q, k, _ = draw(7)
    penalty, state = selection_penalty(q, k)
    # F of a row after the last is every row's selection: the state
    extended = F.pad(q, (0, 0, 0, 1))
    extended_penalty, _ = selection_penalty(extended, F.pad(k, (0, 0, 0, 1)))
    torch.testing.assert_close(state[:, 0], extended_penalty[:, 0, -1, :T], **CLOSE)
    # a later call's penalty is the state plus the selections of its own earlier rows
    earlier = selection_penalty(q[:, :, :4], k[:, :, :4])[1]
    later, _ = selection_penalty(q[:, :, 4:], k, earlier, query_offset=4)
    torch.testing.assert_close(later, penalty[:, :, 4:], **CLOSE)


# --------------------------------------------------------------------------
# special cases, paths, precision, gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_no_selection_is_causal_softmax_attention(padding):
    """Head 0's scores all negative: ReLU gives S = 0, F = 0."""
    q, k, v = draw(8)
    q[:, 0] = -q[:, 0].abs()
    k[:, 0] = k[:, 0].abs()
    mask = padding_mask(padding)
    penalty, state = selection_penalty(q, k, key_padding_mask=mask)
    assert (penalty == 0).all() and (state == 0).all()
    out, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    want_out, want_probs = softmax_attention(q, k, v, key_padding_mask=mask, causal=True)
    torch.testing.assert_close(out, want_out, **CLOSE)
    torch.testing.assert_close(probs, want_probs, **CLOSE)


def test_need_weights_and_dropout_change_no_output_nor_returned_probabilities():
    q, k, v = draw(9)
    mask = padding_mask("right")
    out, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    out_without, none = selective_attention(q, k, v, key_padding_mask=mask, causal=True, need_weights=False)
    assert none is None
    torch.testing.assert_close(out_without, out, rtol=0, atol=0)
    torch.manual_seed(0)
    _, dropped_probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True, dropout_p=0.5)
    torch.testing.assert_close(dropped_probs, probs, rtol=0, atol=0)  # returned undropped


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_finite_and_close_to_float64(dtype):
    q, k, v = draw(10)
    mask = padding_mask("left")
    out, probs = selective_attention(q, k, v, key_padding_mask=mask, causal=True)
    half = [t.to(dtype) for t in (q, k, v)]
    out_half, probs_half = selective_attention(*half, key_padding_mask=mask, causal=True)
    assert out_half.dtype == dtype and probs_half.dtype == dtype
    assert torch.isfinite(out_half).all() and torch.isfinite(probs_half).all()
    penalty, state = selection_penalty(*half[:2], key_padding_mask=mask)
    assert penalty.dtype == torch.float32 and state.dtype == torch.float32
    # inputs rounded to half: compare with float64 on the rounded inputs
    rounded_out, rounded_probs = selective_attention(*[t.double() for t in half], key_padding_mask=mask, causal=True)
    torch.testing.assert_close(out_half.double(), rounded_out, **HALF_CLOSE)
    torch.testing.assert_close(probs_half.double(), rounded_probs, **HALF_CLOSE)
    torch.testing.assert_close(rounded_out, out, rtol=5e-2, atol=5e-2)


def test_gradients_match_finite_differences():
    q, k, v = (t.requires_grad_() for t in draw(11, tgt_len=4, src_len=4, batch=1, heads=2, dim=3))
    mask = torch.tensor([[False, False, False, True]])

    def full(q, k, v):
        return selective_attention(q, k, v, key_padding_mask=mask, causal=True)

    assert torch.autograd.gradcheck(full, (q, k, v))
    state = selection_penalty(q[:, :, :2], k[:, :, :2])[1].detach().requires_grad_()

    def step(q, k, v, state):
        return selective_attention(q[:, :, 2:], k, v, state, causal=True, query_offset=2)[0]

    assert torch.autograd.gradcheck(step, (q, k, v, state))


def test_empty_query_block_and_single_token():
    q, k, v = draw(12, tgt_len=1, src_len=1)
    out, probs = selective_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, v, **CLOSE)
    _, state = selection_penalty(q, k)
    out, probs = selective_attention(q[:, :, :0], k, v, state, causal=True, query_offset=1)
    assert out.shape == (B, H, 0, D) and probs.shape == (B, H, 0, 1)


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------


def test_refusals_name_the_argument():
    q, k, v = draw(13)
    with pytest.raises(ValueError, match="^causal must be True"):
        selective_attention(q, k, v)
    with pytest.raises(ValueError, match="^selection_state is required"):
        selective_attention(q[:, :, 3:], k, v, causal=True, query_offset=3)
    with pytest.raises(ValueError, match="^selection_state is required"):
        selection_penalty(q[:, :, 3:], k, query_offset=3)
    for shape in [(B, 1, 2), (B, 1, T + 1), (B, T), (B, H, T), (1, 1, T)]:
        with pytest.raises(ValueError, match="^selection_state must be"):
            selective_attention(q[:, :, 3:], k, v, torch.zeros(shape, dtype=DTYPE), causal=True, query_offset=3)
    with pytest.raises(ValueError, match="^selection_state must be a floating point"):
        selective_attention(q[:, :, 3:], k, v, torch.zeros(B, 1, 3, dtype=torch.long), causal=True, query_offset=3)
    with pytest.raises(ValueError, match="^query_offset \\+ Tq must be <= Tk"):
        selective_attention(q, k, v, torch.zeros(B, 1, 1, dtype=DTYPE), causal=True, query_offset=1)
    with pytest.raises(ValueError, match="^key_padding_mask must be a bool"):
        selective_attention(q, k, v, key_padding_mask=torch.zeros(B, T), causal=True)
