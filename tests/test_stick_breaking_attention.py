"""Stick-breaking attention (Tan, Yang, Courville, Panda, Shen 2025): ``stick_breaking_attention``
against a plain restatement of the authors' PyTorch reference and against an explicit loop over
the stick-breaking product, in float64; padding as the authors' packed sequences treat it,
incremental decoding, the weights' range, need_weights, dropout, half precision, gradients and
the refusals.

The restatement reads (not copied): github.com/shawntan/stickbreaking-attention at commit
3147a3841b025a31d271fc8f873120ff6fa0461b, ``stickbreaking_attention/sb_ref.py``
(``stickbreaking(q, k, v, mask, cum_weight)``) and the ``ref_fwd`` of ``tests/test_attn.py`` /
``tests/test_varlen.py`` (hidden mask ``triu(0)``, or ``triu(1)`` with ``attend_current``; the
strictly lower-triangular ``cum_weight``; the output ``o + rem * v``). Padding: the authors'
varlen kernel runs each packed sequence on its own tokens, which is what the tests compare a
padded batch element with.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_distattn import functional
from fairseq_distattn.functional import stick_breaking_attention, stick_breaking_weights

from .functional_cases import single_thread_torch  # noqa: F401 (autouse: one torch thread in this module)

DTYPE = torch.float64
B, H, T, D = 3, 2, 7, 4
CLOSE = dict(rtol=1e-10, atol=1e-12)
HALF_CLOSE = dict(rtol=1e-2, atol=1e-2)
LENGTHS = (1, 2, 5, 9)


def draw(seed, batch=B, heads=H, length=T, dim=D, dtype=DTYPE, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, dim)
    return tuple((scale * torch.randn(shape, generator=generator, dtype=DTYPE)).to(dtype) for _ in range(3))


def padding(kind, batch=B, length=T):
    """[B, T] bool, True = pad: ``left`` / ``right`` with 0, 2 and T-1 pads per element."""
    if kind is None:
        return None
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for b, amount in enumerate((0, min(2, length - 1), length - 1)[:batch]):
        if amount:
            if kind == "left":
                mask[b, :amount] = True
            else:
                mask[b, length - amount :] = True
    return mask


def sb(q, k, v, *args, **kw):
    return stick_breaking_attention(q, k, v, *args, causal=True, **kw)


# --------------------------------------------------------------------------
# the authors' reference, restated, and the loop definition
# --------------------------------------------------------------------------


def authors_reference(q, k, v, hidden, attend_current=False, remainder=True):
    """sb_ref.stickbreaking + ref_fwd: ``hidden`` [T, T] bool (True = masked), to which the
    diagonal-and-future triangle is added; returns (out, att)."""
    length = q.size(-2)
    triangle = torch.ones(length, length, dtype=torch.bool).triu(1 if attend_current else 0)
    mask = triangle if hidden is None else triangle | hidden
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_one_minus = F.logsigmoid(-logits).masked_fill(mask, 0.0)
    strictly_lower = torch.ones(length, length, dtype=q.dtype).tril(-1)  # cum_weight[l, j] = 1 for l > j
    att = (log_z + torch.einsum("bhil,lj->bhij", log_one_minus, strictly_lower)).exp()
    out = att @ v
    if remainder:
        out = out + (1 - att.sum(-1))[..., None] * v
    return out, att


def loop_weights(q, k, key_padding_mask=None, query_offset=0, attend_current=False):
    """A_ij = beta_ij prod_{visible l, j < l, l before the query} (1 - beta_il), by loops."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.size(2)
    weights = torch.zeros(batch, heads, tgt_len, src_len, dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            for i in range(tgt_len):
                position = query_offset + i
                keys = [
                    j
                    for j in range(src_len)
                    if (j < position or (attend_current and j == position))
                    and (key_padding_mask is None or not key_padding_mask[b, j])
                ]
                beta = {key: torch.sigmoid(q[b, h, i] @ k[b, h, key] / math.sqrt(dim)) for key in keys}
                for j in keys:
                    stick = 1.0
                    for between in keys:
                        if between > j:
                            stick = stick * (1 - beta[between])
                    weights[b, h, i, j] = beta[j] * stick
    return weights


# --------------------------------------------------------------------------
# float64 against the references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("remainder", [True, False])
def test_equals_the_authors_reference(length, attend_current, remainder):
    q, k, v = draw(length, length=length)
    out, probs = sb(q, k, v, attend_current, remainder)
    ref_out, ref_att = authors_reference(q, k, v, None, attend_current, remainder)
    torch.testing.assert_close(probs, ref_att, **CLOSE)
    torch.testing.assert_close(out, ref_out, **CLOSE)


@pytest.mark.parametrize("kind", ["left", "right"])
@pytest.mark.parametrize("length", [2, 5, 9])
@pytest.mark.parametrize("attend_current", [False, True])
def test_padding_is_the_authors_mask_and_their_packed_sequences(kind, length, attend_current):
    q, k, v = draw(10 + length, length=length)
    mask = padding(kind, length=length)
    out, probs = sb(q, k, v, attend_current, key_padding_mask=mask)
    assert probs[mask[:, None, None, :].expand_as(probs)].eq(0).all(), "a padded key gets no weight"
    for b in range(B):
        # the reference with the padding in its hidden mask: every query row
        ref_out, ref_att = authors_reference(q[b : b + 1], k[b : b + 1], v[b : b + 1], mask[b][None, :], attend_current)
        torch.testing.assert_close(probs[b : b + 1], ref_att, **CLOSE)
        own_padded = mask[b][:, None]  # no remainder on a padded query's own (padded) value
        ref_out = torch.where(own_padded, ref_out - (1 - ref_att.sum(-1))[..., None] * v[b : b + 1], ref_out)
        torch.testing.assert_close(out[b : b + 1], ref_out, **CLOSE)
        # the real tokens alone, as the authors' varlen kernel runs a packed sequence
        real = ~mask[b]
        alone_out, alone_att = authors_reference(
            q[b : b + 1, :, real], k[b : b + 1, :, real], v[b : b + 1, :, real], None, attend_current
        )
        torch.testing.assert_close(out[b : b + 1, :, real], alone_out, **CLOSE)
        torch.testing.assert_close(probs[b : b + 1, :, real][..., real], alone_att, **CLOSE)


@pytest.mark.parametrize("kind", [None, "left", "right"])
@pytest.mark.parametrize("attend_current", [False, True])
def test_the_loop_definition(kind, attend_current):
    q, k, v = draw(20, length=6)
    mask = padding(kind, length=6)
    _, probs = sb(q, k, v, attend_current, key_padding_mask=mask)
    torch.testing.assert_close(probs, loop_weights(q, k, mask, 0, attend_current), **CLOSE)
    # a block of query rows after the first positions: query_offset
    _, block = sb(q[:, :, 3:], k, v, attend_current, key_padding_mask=mask, query_offset=3)
    torch.testing.assert_close(block, loop_weights(q[:, :, 3:], k, mask, 3, attend_current), **CLOSE)


def test_stick_breaking_weights_and_the_remainder():
    q, k, v = draw(30)
    mask = padding("right")
    out, probs = sb(q, k, v, key_padding_mask=mask)
    dropped, same = sb(q, k, v, remainder=False, key_padding_mask=mask)
    torch.testing.assert_close(same, probs, **CLOSE)
    remainder = 1 - probs.sum(-1)
    own = torch.where(mask[:, None, :, None], 0.0, remainder[..., None] * v)
    torch.testing.assert_close(out - dropped, own, **CLOSE)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    visible = torch.ones(T, T, dtype=torch.bool).tril(-1) & ~mask[:, None, None, :]
    weights, rem = stick_breaking_weights(logits, visible)
    torch.testing.assert_close(weights, probs, **CLOSE)
    torch.testing.assert_close(rem, remainder, **CLOSE)
    product = torch.where(visible, 1 - torch.sigmoid(logits), 1.0).prod(-1)
    torch.testing.assert_close(rem, product, **CLOSE)


# --------------------------------------------------------------------------
# incremental decoding
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [None, "left"])
@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("remainder", [True, False])
def test_incremental_decoding_equals_the_full_call(kind, attend_current, remainder):
    q, k, v = draw(40)
    mask = padding(kind)
    out, probs = sb(q, k, v, attend_current, remainder, key_padding_mask=mask)
    last_out, last_probs = sb(q[:, :, -1:], k, v, attend_current, remainder, key_padding_mask=mask, query_offset=T - 1)
    torch.testing.assert_close(last_out, out[:, :, -1:], **CLOSE)
    torch.testing.assert_close(last_probs, probs[:, :, -1:], **CLOSE)
    block_out, block_probs = sb(q[:, :, 2:5], k, v, attend_current, remainder, key_padding_mask=mask, query_offset=2)
    torch.testing.assert_close(block_out, out[:, :, 2:5], **CLOSE)
    torch.testing.assert_close(block_probs, probs[:, :, 2:5], **CLOSE)
    # the keys decoded so far only (the cache holds positions 0..p)
    step_out, step_probs = sb(
        q[:, :, 4:5],
        k[:, :, :5],
        v[:, :, :5],
        attend_current,
        remainder,
        key_padding_mask=None if mask is None else mask[:, :5],
        query_offset=4,
    )
    torch.testing.assert_close(step_out, out[:, :, 4:5], **CLOSE)
    torch.testing.assert_close(step_probs, probs[:, :, 4:5, :5], **CLOSE)


# --------------------------------------------------------------------------
# the weights, empty rows, need_weights, dropout
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 6.0])
def test_weights_are_a_broken_stick(scale):
    q, k, v = draw(50, length=12, scale=scale)
    _, probs = sb(q, k, v, key_padding_mask=padding("left", length=12))
    assert probs.ge(0).all() and probs.le(1).all()
    assert probs.sum(-1).le(1 + 1e-12).all()
    assert probs.triu(0).eq(0).all(), "no weight on the query itself or after it"
    _, with_current = sb(q, k, v, True)
    assert with_current.triu(1).eq(0).all() and with_current.sum(-1).le(1 + 1e-12).all()


def test_a_row_without_visible_keys_gives_zero():
    q, k, v = draw(60)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1] = True  # a fully padded element
    mask[2, :4] = True  # left padding: its rows 0..3 are padded queries that see no key
    for remainder in (True, False):
        out, probs = sb(q, k, v, remainder=remainder, key_padding_mask=mask)
        assert probs[1].eq(0).all() and out[1].eq(0).all()
        assert probs[2, :, :5].eq(0).all() and out[2, :, :4].eq(0).all()
        assert probs[0, :, 0].eq(0).all()
        # the first real token sees no key: its whole stick goes to its own value, or nowhere
        first = v[2, :, 4] if remainder else torch.zeros_like(v[2, :, 4])
        torch.testing.assert_close(out[2, :, 4], first, **CLOSE)
        torch.testing.assert_close(out[0, :, 0], v[0, :, 0] if remainder else 0 * v[0, :, 0], **CLOSE)
    empty_out, empty_probs = sb(q[:, :, :0], k, v)
    assert empty_out.shape == (B, H, 0, D) and empty_probs.shape == (B, H, 0, T)


@pytest.mark.parametrize("flex", ["auto", "always", "never"])
def test_need_weights_changes_nothing_but_the_weights(flex):
    q, k, v = draw(70)
    mask = padding("right")
    out, probs = sb(q, k, v, key_padding_mask=mask)
    without, none = sb(q, k, v, key_padding_mask=mask, need_weights=False, flex=flex)
    assert none is None and probs is not None
    torch.testing.assert_close(without, out, rtol=0, atol=0)


def test_dropout_drops_the_weights_that_multiply_the_values_only():
    q, k, v = draw(80)
    out, probs = sb(q, k, v)
    torch.manual_seed(3)
    dropped_out, dropped_probs = sb(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(dropped_probs, probs, **CLOSE)  # returned undropped
    torch.manual_seed(3)
    attended = F.dropout(probs, p=0.5, training=True)
    expected = attended @ v + (1 - probs.sum(-1))[..., None] * v
    torch.testing.assert_close(dropped_out, expected, **CLOSE)
    assert not torch.allclose(dropped_out, out)


# --------------------------------------------------------------------------
# half precision, gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_half_precision_is_finite_and_close_to_float64(dtype, scale):
    q, k, v = draw(90, length=16, dim=8, dtype=dtype)
    q, k = q * scale, k * scale  # scale 40: q k^T passes float16's 65504, the logits are float32
    mask = padding("left", length=16)
    out, probs = sb(q, k, v, key_padding_mask=mask)
    assert out.dtype == dtype and probs.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    ref_out, ref_probs = sb(q.to(DTYPE), k.to(DTYPE), v.to(DTYPE), key_padding_mask=mask)
    torch.testing.assert_close(probs.to(DTYPE), ref_probs, **HALF_CLOSE)
    torch.testing.assert_close(out.to(DTYPE), ref_out, **HALF_CLOSE)


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("remainder", [True, False])
def test_gradcheck(attend_current, remainder):
    q, k, v = draw(100, batch=2, heads=1, length=4, dim=2)
    mask = torch.tensor([[False, False, False, False], [True, False, False, False]])
    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))

    def both(q, k, v):
        return sb(q, k, v, attend_current, remainder, key_padding_mask=mask)

    assert torch.autograd.gradcheck(both, inputs)


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------


def test_errors_name_the_argument():
    q, k, v = draw(110)
    with pytest.raises(ValueError, match="causal must be True"):
        stick_breaking_attention(q, k, v)
    with pytest.raises(ValueError, match="^q must be"):
        sb(q[0], k, v)
    with pytest.raises(ValueError, match="^v "):
        sb(q, k, v[:, :, :-1])
    with pytest.raises(ValueError, match="share B, H and D"):
        sb(q, k[..., :-1], v)
    with pytest.raises(ValueError, match="^key_padding_mask must be"):
        sb(q, k, v, key_padding_mask=torch.zeros(B, T + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="^key_padding_mask must be a bool"):
        sb(q, k, v, key_padding_mask=torch.zeros(B, T))
    with pytest.raises(ValueError, match="^flex must be"):
        sb(q, k, v, flex="sometimes")
    with pytest.raises(ValueError, match="^dropout_p must be"):
        sb(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="^query_offset must be"):
        sb(q, k, v, query_offset=-1)
    with pytest.raises(ValueError, match="^attend_current must be a bool"):
        sb(q, k, v, 1)
    with pytest.raises(ValueError, match="^remainder must be a bool"):
        sb(q, k, v, False, None)
    with pytest.raises(ValueError, match="^query_offset \\+ Tq must be <= Tk"):
        sb(q, k, v, query_offset=1)
    assert sb(q, k, v, remainder=False, query_offset=1)[0].shape == q.shape  # no own value needed
    with pytest.raises(ValueError, match="^visible must be a bool"):
        stick_breaking_weights(q @ k.transpose(-1, -2), torch.ones(T, T))
    with pytest.raises(ValueError, match="^visible .* must broadcast"):
        stick_breaking_weights(q @ k.transpose(-1, -2), torch.ones(T + 1, T, dtype=torch.bool))
    with pytest.raises(ValueError, match="^logits must be"):
        stick_breaking_weights(torch.ones(T, T, dtype=torch.long))


def test_part_of_the_functional_api():
    assert functional.stick_breaking_attention is stick_breaking_attention
    assert "stick_breaking_weights" in functional.__all__
