"""FoX, Forgetting Attention (Lin, Nikishin, He, Courville 2025): ``forgetting_attention``
against plain restatements of the authors' arithmetic, of the paper's product form and
of flash-linear-attention's reference, in float64; incremental decoding, the fused path,
half precision, gradients, and the refusals.

The restatements read (not copied):

* authors: github.com/zhixuan-lin/forgetting-transformer at commit
  883f260c636e87971339749b0d8310004794a5cc, src/forgetting_transformer/ops/forgetting_attention.py
  (``ForgettingAttention.forward`` and ``_fwd_kernel``);
* fla: github.com/fla-org/flash-linear-attention at commit
  bc3b101dcb713ddc5bd8924b66754eb68b5ccf89, fla/ops/forgetting_attn/naive.py
  (``naive_forgetting_attn``) and fla/layers/forgetting_attn.py (padding by unpadding).
"""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairseq_distattn.functional import forget_gate_bias, forgetting_attention, softmax_attention

from .functional_cases import (
    DTYPE,
    dot,
    naive_attention,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)

B, H, T, D = 3, 2, 6, 4
CLOSE = dict(rtol=1e-10, atol=1e-12)  # float64 against a float64 restatement
HALF_CLOSE = dict(rtol=1e-2, atol=1e-2)


def draw(seed, tgt_len=T, src_len=T, batch=B, heads=H, dim=D):
    """``q, k, v, log_forget`` in float64; ``log_forget = logsigmoid(randn)``."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tgt_len, dim, generator=generator, dtype=DTYPE)
    k = torch.randn(batch, heads, src_len, dim, generator=generator, dtype=DTYPE)
    v = torch.randn(batch, heads, src_len, dim, generator=generator, dtype=DTYPE)
    log_forget = F.logsigmoid(torch.randn(batch, heads, src_len, generator=generator, dtype=DTYPE))
    return q, k, v, log_forget


def padding_mask(kind, batch=B, src_len=T):
    """[B, Tk] bool, True = pad. ``left``: 0, 2 and Tk-1 leading pads (the last sequence
    keeps one real token, so its earlier query rows see no key at all); ``right``: 0, 1
    and 3 trailing pads; ``holes``: pads inside the sequences (fairseq never makes them:
    they show what a padded token's gate does)."""
    if kind is None:
        return None
    mask = torch.zeros(batch, src_len, dtype=torch.bool)
    if kind == "left":
        mask[1, :2] = True
        mask[2, : src_len - 1] = True
    elif kind == "right":
        mask[1, src_len - 1 :] = True
        mask[2, src_len - 3 :] = True
    elif kind == "holes":
        mask[0, 2] = True
        mask[1, 1:3] = True
        mask[2, 0] = True
        mask[2, 4] = True
    else:
        raise ValueError(kind)
    return mask


def fox(q, k, v, log_forget, **kw):
    return forgetting_attention(q, k, v, log_forget, causal=True, **kw)


# --------------------------------------------------------------------------
# restatements
# --------------------------------------------------------------------------


def authors_reference(q, k, v, log_forget, padding, query_offset=0):
    """Restates zhixuan-lin/forgetting-transformer @ 883f260c, src/forgetting_transformer/
    ops/forgetting_attention.py, as plain loops: padding is their ``seq_start`` (left
    padding only: the first real position of each sequence), ``log_fgate`` is set to 0
    before it, ``log_lambda`` is the running (inclusive) sum of ``log_fgate``; the query
    row m sits at position ``P_SEQ + m`` (here ``query_offset + m``) and its logit for key
    n is ``q . k * sm_scale + (log_lambda[P_SEQ + m] - log_lambda[n])`` with
    ``sm_scale = 1/sqrt(D)`` on ``q . k`` alone; keys after the query (causal) and before
    ``seq_start`` are -inf; a row with no key left (``P_SEQ + m < seq_start``) gives 0."""
    q, k, v, log_forget = (to_numpy(t) for t in (q, k, v, log_forget))
    padding = to_numpy(padding)
    batch, heads, tgt_len, dim = q.shape
    src_len = k.shape[2]
    seq_start = [0] * batch
    if padding is not None:
        for b in range(batch):
            real = [j for j in range(src_len) if not padding[b, j]]
            seq_start[b] = real[0] if real else src_len
            assert all(padding[b, j] == (j < seq_start[b]) for j in range(src_len)), "left padding only"
    log_lambda = np.zeros((batch, heads, src_len))
    for b in range(batch):
        for h in range(heads):
            total = 0.0
            for n in range(src_len):
                total += 0.0 if n < seq_start[b] else log_forget[b, h, n]
                log_lambda[b, h, n] = total
    sm_scale = 1.0 / math.sqrt(dim)
    return naive_attention(
        q,
        k,
        padding,
        True,
        query_offset,
        logit=lambda b, h, i, position, j: (
            dot(q[b, h, i], k[b, h, j]) * sm_scale + (log_lambda[b, h, position] - log_lambda[b, h, j])
        ),
        value=lambda b, h, position, j: v[b, h, j],
    )


def paper_reference(q, k, v, log_forget, padding, query_offset=0):
    """The paper's unnormalised form, no logarithm of a sum anywhere: a query at position
    p weighs key j <= p by ``F_pj exp(q . k_j / sqrt(D))`` with ``F_pj = prod_{l=j+1}^{p}
    f_l`` and ``f_l = exp(log_forget_l)``, normalised over its visible keys. A padded
    position l is no token: its gate is left out of the product (for left padding the
    authors' zeroed ``log_fgate``; elsewhere fla's unpadding)."""
    q, k, v, log_forget = (to_numpy(t) for t in (q, k, v, log_forget))
    padding = to_numpy(padding)
    dim = q.shape[-1]

    def gate_product(b, h, position, j):
        product = 1.0
        for gate in range(j + 1, position + 1):
            if padding is None or not padding[b, gate]:
                product *= math.exp(log_forget[b, h, gate])
        return product

    return naive_attention(
        q,
        k,
        padding,
        True,
        query_offset,
        # log of F_pj exp(s): naive_softmax exponentiates it back; F_pj is formed as a product
        logit=lambda b, h, i, position, j: (
            dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim) + math.log(gate_product(b, h, position, j))
        ),
        value=lambda b, h, position, j: v[b, h, j],
    )


def fla_naive(q, k, v, g):
    """Restates fla-org/flash-linear-attention @ bc3b101d, fla/ops/forgetting_attn/naive.py
    (``naive_forgetting_attn``, no window, HQ = H) in its own layout: q, k, v ``[B, T, H, D]``,
    g ``[B, T, H]``; ``gc = cumsum(g)`` over time, logits ``(q * scale) k^T + gc_i - gc_j``
    under a ``tril`` mask, softmax, times v. It computes in float32 (``.float()``); float64
    here. Returns ``[B, T, H, D]``."""
    scale = q.size(-1) ** -0.5
    length = q.size(1)
    gc = g.cumsum(1)
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool))
    logits = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    logits = logits + gc.permute(0, 2, 1)[..., :, None] - gc.permute(0, 2, 1)[..., None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, dim=-1), v)


# --------------------------------------------------------------------------
# float64 against the restatements
# --------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("tgt_len, query_offset", [(T, 0), (2, T - 2)], ids=["full", "last-two-rows"])
def test_equals_the_authors_arithmetic(padding, tgt_len, query_offset, need_weights):
    q, k, v, log_forget = draw(1, tgt_len=tgt_len)
    mask = padding_mask(padding)
    out, probs = fox(q, k, v, log_forget, key_padding_mask=mask, query_offset=query_offset, need_weights=need_weights)
    expected_out, expected_probs = authors_reference(q, k, v, log_forget, mask, query_offset)
    torch.testing.assert_close(out, expected_out, **CLOSE)
    if need_weights:
        torch.testing.assert_close(probs, expected_probs, **CLOSE)
    else:
        assert probs is None
    if padding == "left":  # the last sequence's rows before its one real token see nothing: 0
        assert (out[2, :, : max(0, T - 1 - query_offset)] == 0).all()


@pytest.mark.parametrize("padding", [None, "left", "right", "holes"])
def test_equals_the_paper_s_product_of_gates(padding):
    q, k, v, log_forget = draw(2)
    mask = padding_mask(padding)
    out, probs = fox(q, k, v, log_forget, key_padding_mask=mask)
    expected_out, expected_probs = paper_reference(q, k, v, log_forget, mask)
    torch.testing.assert_close(out, expected_out, **CLOSE)
    torch.testing.assert_close(probs, expected_probs, **CLOSE)


def test_equals_fla_s_naive_reference():
    """fla forms the same bias as the authors (inclusive cumsum, c_i - c_j, unscaled,
    added to the scaled q k^T): this checks that the layouts' difference ([B, T, H, D]
    there) is the only one, on what fla's reference takes (Tq = Tk, no padding)."""
    q, k, v, log_forget = draw(3)
    out, _ = fox(q, k, v, log_forget)
    expected = fla_naive(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), log_forget.transpose(1, 2))
    torch.testing.assert_close(out, expected.transpose(1, 2), **CLOSE)


@pytest.mark.parametrize("padding", ["left", "right", "holes"])
def test_padding_equals_fla_s_layer_which_removes_the_padded_tokens(padding):
    """fla/layers/forgetting_attn.py unpads (``unpad_input``) and runs each sequence's real
    tokens alone, gates included: each sequence here, compacted to its real tokens and run
    through fla's reference, gives the op's rows at those tokens. (fla's layer writes 0 at
    padded query rows; the op leaves them to the caller, as every op does.)"""
    q, k, v, log_forget = draw(4)
    mask = padding_mask(padding)
    out, _ = fox(q, k, v, log_forget, key_padding_mask=mask)
    for b in range(B):
        real = (~mask[b]).nonzero().flatten()
        compact = [t[b : b + 1, :, real].transpose(1, 2) for t in (q, k, v)]
        expected = fla_naive(*compact, log_forget[b : b + 1, :, real].transpose(1, 2)).transpose(1, 2)
        torch.testing.assert_close(out[b : b + 1, :, real], expected, **CLOSE)


def test_the_first_gate_and_the_gates_of_padded_keys_change_nothing():
    """D_ij sums the gates of positions j+1..i: position 0's gate is in none; a padded
    token's gate is dropped."""
    q, k, v, log_forget = draw(5)
    mask = padding_mask("holes")
    out, probs = fox(q, k, v, log_forget, key_padding_mask=mask)
    changed = log_forget.clone()
    changed[..., 0] = -7.0
    changed[mask[:, None, :].expand_as(changed)] = -3.0
    out_changed, probs_changed = fox(q, k, v, changed, key_padding_mask=mask)
    torch.testing.assert_close(out_changed, out, **CLOSE)
    torch.testing.assert_close(probs_changed, probs, **CLOSE)
    assert not torch.allclose(fox(q, k, v, changed)[0], fox(q, k, v, log_forget)[0]), "the gates of the holes count"


def test_forget_gate_bias_entries():
    _, _, _, log_forget = draw(6)
    tgt_len, query_offset = 3, 2
    bias = forget_gate_bias(log_forget, tgt_len, query_offset)
    assert bias.shape == (B, H, tgt_len, T) and bias.dtype == DTYPE
    for b in range(B):
        for h in range(H):
            for i in range(tgt_len):
                position = query_offset + i
                for j in range(T):
                    if j <= position:  # sum_{l=j+1}^{p} log f_l; 0 on the diagonal
                        expected = sum(log_forget[b, h, gate].item() for gate in range(j + 1, position + 1))
                    else:  # the same c_p - c_j: -sum_{l=p+1}^{j} log f_l, hidden by the causal mask
                        expected = -sum(log_forget[b, h, gate].item() for gate in range(position + 1, j + 1))
                    assert math.isclose(bias[b, h, i, j].item(), expected, rel_tol=1e-12, abs_tol=1e-12)
    assert (bias[..., torch.arange(tgt_len), torch.arange(tgt_len) + query_offset] == 0).all()
    assert forget_gate_bias(log_forget.half(), tgt_len, query_offset).dtype == torch.float32
    assert forget_gate_bias(log_forget.bfloat16(), tgt_len, query_offset).dtype == torch.float32
    assert forget_gate_bias(log_forget, 0, T).shape == (B, H, 0, T)


# --------------------------------------------------------------------------
# incremental decoding, the fused path, plain softmax attention
# --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [None, "left"])
def test_incremental_decoding_rows_equal_the_full_call_s(padding):
    q, k, v, log_forget = draw(7)
    mask = padding_mask(padding)
    out, probs = fox(q, k, v, log_forget, key_padding_mask=mask)
    last_out, last_probs = fox(q[:, :, T - 1 :], k, v, log_forget, key_padding_mask=mask, query_offset=T - 1)
    torch.testing.assert_close(last_out, out[:, :, T - 1 :], **CLOSE)
    torch.testing.assert_close(last_probs, probs[:, :, T - 1 :], **CLOSE)
    block_out, block_probs = fox(q[:, :, 2:5], k, v, log_forget, key_padding_mask=mask, query_offset=2)
    torch.testing.assert_close(block_out, out[:, :, 2:5], **CLOSE)
    torch.testing.assert_close(block_probs, probs[:, :, 2:5], **CLOSE)
    fused_out, none = fox(
        q[:, :, T - 1 :], k, v, log_forget, key_padding_mask=mask, query_offset=T - 1, need_weights=False
    )
    assert none is None
    torch.testing.assert_close(fused_out, out[:, :, T - 1 :], **CLOSE)


@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_need_weights_false_gives_the_same_output(dtype, padding):
    q, k, v, log_forget = (t.to(dtype) for t in draw(8))
    mask = padding_mask(padding)
    out, probs = fox(q, k, v, log_forget, key_padding_mask=mask)
    fused, none = fox(q, k, v, log_forget, key_padding_mask=mask, need_weights=False)
    assert probs is not None and none is None and fused.dtype == dtype
    tolerance = CLOSE if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused, out, **tolerance)


@pytest.mark.parametrize("padding", [None, "left"])
def test_gates_of_one_are_causal_softmax_attention(padding):
    q, k, v, _ = draw(9)
    mask = padding_mask(padding)
    zeros = torch.zeros(B, H, T, dtype=DTYPE)
    out, probs = fox(q, k, v, zeros, key_padding_mask=mask)
    expected_out, expected_probs = softmax_attention(q, k, v, key_padding_mask=mask, causal=True)
    assert torch.equal(out, expected_out) and torch.equal(probs, expected_probs)
    fused, _ = fox(q, k, v, zeros, key_padding_mask=mask, need_weights=False)
    expected_fused, _ = softmax_attention(q, k, v, key_padding_mask=mask, causal=True, need_weights=False)
    torch.testing.assert_close(fused, expected_fused, **CLOSE)


# --------------------------------------------------------------------------
# half precision, gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_inputs_are_finite_and_close_to_float64(dtype, need_weights):
    """q, k, v rounded to the half dtype, log_forget in float32 (as the authors keep it);
    float64 on the same rounded values is the reference."""
    q, k, v, log_forget = (t.to(dtype).to(DTYPE) for t in draw(10))
    log_forget = log_forget.float()
    mask = padding_mask("left")
    out, probs = fox(
        q.to(dtype), k.to(dtype), v.to(dtype), log_forget, key_padding_mask=mask, need_weights=need_weights
    )
    exact_out, exact_probs = fox(q, k, v, log_forget.double(), key_padding_mask=mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), exact_out, **HALF_CLOSE)
    if need_weights:
        assert probs.dtype == dtype and torch.isfinite(probs).all()
        torch.testing.assert_close(probs.double(), exact_probs, **HALF_CLOSE)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize(
    "tgt_len, query_offset, padding", [(4, 0, "left"), (2, 2, None)], ids=["full-left-padding", "last-two-rows"]
)
def test_gradcheck(tgt_len, query_offset, padding, need_weights):
    q, k, v, log_forget = draw(11, tgt_len=tgt_len, src_len=4, batch=2, heads=2, dim=3)
    mask = None if padding is None else torch.tensor([[False] * 4, [True, False, False, False]])
    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v, log_forget))

    def run(q, k, v, log_forget):
        out, _ = fox(q, k, v, log_forget, key_padding_mask=mask, query_offset=query_offset, need_weights=need_weights)
        return out

    assert torch.autograd.gradcheck(run, inputs)


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------

_Q, _K, _V, _LOG_FORGET = (t.float() for t in draw(12))

BAD_CALLS = {
    "not causal": (dict(causal=False), "causal"),
    "log_forget without the head axis": (dict(log_forget=_LOG_FORGET[:, 0]), "log_forget"),
    "log_forget of another length": (dict(log_forget=_LOG_FORGET[..., :-1]), "log_forget"),
    "integer log_forget": (dict(log_forget=torch.zeros(B, H, T, dtype=torch.long)), "log_forget"),
    "log_forget on the meta device": (dict(log_forget=_LOG_FORGET.to("meta")), "log_forget"),
    "queries past the last key": (dict(q=_Q[:, :, :2], query_offset=T - 1), "query_offset"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_a_bad_argument_is_a_value_error_naming_it_and_nothing_else_is_written(case, capsys):
    arguments, name = BAD_CALLS[case]
    arguments = {**dict(q=_Q, k=_K, v=_V, log_forget=_LOG_FORGET, causal=True), **arguments}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=name) as error:
            forgetting_attention(arguments.pop("q"), arguments.pop("k"), arguments.pop("v"), **arguments)
    assert "\n" not in str(error.value)
    assert not caught and capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    "arguments, name",
    [
        ((_LOG_FORGET[0], T), "log_forget"),
        ((torch.zeros(B, H, T, dtype=torch.int32), T), "log_forget"),
        ((_LOG_FORGET, T + 1), "query_offset"),
        ((_LOG_FORGET, -1), "tgt_len"),
        ((_LOG_FORGET, 2, 1.5), "query_offset"),
    ],
    ids=["no-head-axis", "integer", "past-the-last-key", "negative-length", "fractional-offset"],
)
def test_forget_gate_bias_refuses_bad_arguments(arguments, name):
    with pytest.raises(ValueError, match=name):
        forget_gate_bias(*arguments)
