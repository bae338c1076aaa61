"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim 2025): ``path_attention``
against a plain restatement of flash-linear-attention's naive reference and against the
definition as explicit D x D matrix products, in float64; padding as fla's layer treats it
(padded tokens removed), beta = 0 as causal softmax attention, the PaTH-FoX gate,
incremental rows, need_weights, half precision, gradients and the refusals.

The restatement reads (not copied): github.com/fla-org/flash-linear-attention at commit
bc3b101dcb713ddc5bd8924b66754eb68b5ccf89, ``fla/ops/path_attn/naive.py``
(``naive_path_attn``: per chunk the UT transform ``T = (I + strictly_lower(diag(beta) W
W^T))^{-1}``, the local block ``tril(q k^T) - tril(q W^T) T strictly_lower(diag(beta) W
k^T)``, queries carried to their chunk's start and keys to their chunk's end, the chunks
in between crossed with ``I - W^T T diag(beta) W``; the gate ``g_cumsum[i] - g_cumsum[j]``
added before ``* scale``) and ``fla/layers/path_attn.py`` (``w`` L2-normalised before the
op; padded tokens removed with ``unpad_input``).
"""

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from fairseq_distattn import functional
from fairseq_distattn.functional import forgetting_attention, path_attention, softmax_attention
from fairseq_distattn.functional.path_attention import (
    CHUNK,
    _path_logits_by_chunk,
    _path_logits_by_position,
)

from .functional_cases import single_thread_torch  # noqa: F401 (autouse: one torch thread in this module)

DTYPE = torch.float64
B, H, T, D = 3, 2, 9, 4
CLOSE = dict(rtol=1e-10, atol=1e-12)
HALF_CLOSE = dict(rtol=1e-2, atol=1e-2)


def draw(seed, batch=B, heads=H, length=T, dim=D, gate=False, unit=True):
    """q, k, v, w, beta (and log_forget with ``gate``), float64: w unit-norm (``unit``)
    or of random length, beta in (0, 2) as fla's ``2 * sigmoid`` gives it."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, dim)
    q, k, v, w = (torch.randn(shape, generator=generator, dtype=DTYPE) for _ in range(4))
    if unit:
        w = F.normalize(w, dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(batch, heads, length, generator=generator, dtype=DTYPE))
    log_forget = F.logsigmoid(torch.randn(batch, heads, length, generator=generator, dtype=DTYPE) + 2)
    return (q, k, v, w, beta, log_forget) if gate else (q, k, v, w, beta)


def padding(batch=B, length=T):
    """[B, T] bool, True = pad: none, left 2, and scattered (middle and right)."""
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[1, :2] = True
    mask[2, [1, 4, length - 1]] = True
    return mask


@pytest.fixture(autouse=True, params=[CHUNK, 4, 1], ids=lambda c: f"chunk{c}")
def chunk_size(request, monkeypatch):
    """Every test at the op's chunk (one chunk at these lengths), at 4 (a partial last
    chunk) and at 1 (every position its own chunk)."""
    # the package exports the op under the module's name, so reach the module itself
    monkeypatch.setattr(sys.modules[_path_logits_by_chunk.__module__], "CHUNK", request.param)
    return request.param


def pa(*tensors, **kw):
    return path_attention(*tensors, causal=True, **kw)


# --------------------------------------------------------------------------
# fla's naive reference, restated; the definition as matrix products
# --------------------------------------------------------------------------


def fla_naive(q, k, v, w, beta, g=None, chunk=4):
    """naive_path_attn of fla/ops/path_attn/naive.py (commit bc3b101d), restated in the
    [B, H, T, D] layout with one key head per query head: the chunked UT-transform form.
    ``w`` must be unit-norm (fla's layer normalises it first); ``g`` None is fla's zeros."""
    batch, heads, length, dim = q.shape
    scale = dim**-0.5
    extra = (-length) % chunk
    qp, kp, wp = (F.pad(x, (0, 0, 0, extra)) for x in (q, k, w))
    bp = F.pad(beta, (0, extra))
    n = (length + extra) // chunk
    Q, K, W = (x.reshape(batch, heads, n, chunk, dim) for x in (qp, kp, wp))
    WB = W * bp.reshape(batch, heads, n, chunk)[..., None]
    eye = torch.eye(chunk, dtype=q.dtype)
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    # fla's row loop over the chunk is forward substitution: it forms this inverse
    ut = torch.linalg.solve_triangular(eye + (WB @ W.transpose(-1, -2)) * strict, eye, upper=False)
    ut_wbk = ut @ ((WB @ K.transpose(-1, -2)) * strict)  # [t, j]: what positions t > j do to k_j
    qw = (Q @ W.transpose(-1, -2)) * lower  # q_i . w_t for t <= i
    ut_wb = ut @ WB
    local = (Q @ K.transpose(-1, -2)) * lower - qw @ ut_wbk
    q_start = Q - qw @ ut_wb  # each query carried back to its chunk's first position
    k_end = K - ut_wbk.transpose(-1, -2) @ W  # each key carried to its chunk's last position
    crossing = W.transpose(-1, -2) @ ut_wb  # a row r crossing chunk c becomes r - r @ crossing[c]
    logits = torch.zeros(batch, heads, n * chunk, n * chunk, dtype=q.dtype)
    for ci in range(n):
        rows = slice(ci * chunk, (ci + 1) * chunk)
        carried = q_start[:, :, ci]
        for cj in range(ci - 1, -1, -1):
            logits[:, :, rows, cj * chunk : (cj + 1) * chunk] = carried @ k_end[:, :, cj].transpose(-1, -2)
            carried = carried - carried @ crossing[:, :, cj]
        logits[:, :, rows, rows] = local[:, :, ci]
    logits = logits[..., :length, :length]
    logits = logits.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    if g is not None:
        cumulative = g.cumsum(-1)
        logits = logits + cumulative[..., :, None] - cumulative[..., None, :]
    return (logits * scale).softmax(-1) @ v


def definition(q, k, v, w, beta, g=None, query_offset=0):
    """softmax_j((q_i^T H_p ... H_{j+1} k_j + sum_{t=j+1}^{p} log f_t) / sqrt(D)) v, p =
    query_offset + i, with explicit D x D matrices and loops; w unit-norm; no padding."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.size(2)
    eye = torch.eye(dim, dtype=q.dtype)
    logits = torch.full((batch, heads, tgt_len, src_len), float("-inf"), dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            for i in range(tgt_len):
                p = query_offset + i
                for j in range(p + 1):
                    product = eye
                    for t in range(p, j, -1):  # H_p H_{p-1} ... H_{j+1}, left to right
                        product = product @ (eye - beta[b, h, t] * torch.outer(w[b, h, t], w[b, h, t]))
                    logit = q[b, h, i] @ product @ k[b, h, j]
                    if g is not None:
                        logit = logit + g[b, h, j + 1 : p + 1].sum()
                    logits[b, h, i, j] = logit / math.sqrt(dim)
    return logits.softmax(-1) @ v


def compact(mask_row, *tensors):
    """The unpadded tokens of one batch element (fla's ``unpad_input``), keeping [1, H, ...]."""
    keep = ~mask_row
    return tuple(x[None, :, keep] for x in tensors)


# --------------------------------------------------------------------------
# equality with the references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [2, 4, 16])
def test_equals_fla_naive_reference(chunk):
    q, k, v, w, beta = draw(1)
    out, probs = pa(q, k, v, w, beta)
    torch.testing.assert_close(out, fla_naive(q, k, v, w, beta, chunk=chunk), **CLOSE)
    torch.testing.assert_close(probs.sum(-1), torch.ones(B, H, T, dtype=DTYPE), **CLOSE)
    assert (probs.triu(1) == 0).all()


def test_equals_fla_naive_reference_with_the_forget_gate():
    """PaTH-FoX: fla adds g_cumsum[i] - g_cumsum[j] before scaling by 1/sqrt(D)."""
    q, k, v, w, beta, g = draw(2, gate=True)
    out, _ = pa(q, k, v, w, beta, g)
    torch.testing.assert_close(out, fla_naive(q, k, v, w, beta, g, chunk=4), **CLOSE)


@pytest.mark.parametrize("gate", [False, True])
def test_equals_the_definition_as_matrix_products(gate):
    tensors = draw(3, batch=2, length=6, dim=3, gate=gate)
    torch.testing.assert_close(pa(*tensors)[0], definition(*tensors), **CLOSE)


def test_w_is_normalised_inside():
    """fla's layer L2-normalises w before the op; so does this op (unit w unchanged)."""
    q, k, v, w, beta = draw(4, unit=False)
    out, _ = pa(q, k, v, w, beta)
    torch.testing.assert_close(out, fla_naive(q, k, v, F.normalize(w, dim=-1), beta), **CLOSE)
    torch.testing.assert_close(pa(q, k, v, 3.7 * w, beta)[0], out, **CLOSE)


@pytest.mark.parametrize("gate", [False, True])
def test_padding_equals_the_reference_on_the_unpadded_tokens(gate):
    """fla's layer removes padded tokens before the op: each element's non-padded query
    rows equal the reference on that element's unpadded tokens; padded keys get 0."""
    tensors = draw(5, gate=gate)
    mask = padding()
    # padded positions hold garbage, NaN in w: H_t there must be the identity regardless
    w = tensors[3].clone()
    w[mask[:, None, :].expand(-1, H, -1)] = float("nan")
    tensors = (*tensors[:3], w, *tensors[4:])
    out, probs = pa(*tensors, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert (probs.masked_select(mask[:, None, None, :]) == 0).all()
    for b in range(B):
        row = mask[b]
        expected = fla_naive(*compact(row, *(x[b] for x in tensors)), chunk=4)
        torch.testing.assert_close(out[b : b + 1, :, ~row], expected, **CLOSE)


def test_beta_zero_is_causal_softmax_attention():
    q, k, v, w, _ = draw(6)
    beta = torch.zeros(B, H, T, dtype=DTYPE)
    mask = padding()
    out, probs = pa(q, k, v, w, beta, key_padding_mask=mask)
    ref_out, ref_probs = softmax_attention(q, k, v, key_padding_mask=mask, causal=True)
    torch.testing.assert_close(out, ref_out, **CLOSE)
    torch.testing.assert_close(probs, ref_probs, **CLOSE)


def test_beta_zero_with_the_gate_is_fox_with_the_gate_scaled():
    """fla scales the PaTH-FoX gate by 1/sqrt(D); FoX (forgetting_attention) does not."""
    q, k, v, w, _, g = draw(7, gate=True)
    beta = torch.zeros(B, H, T, dtype=DTYPE)
    mask = padding()
    out, _ = pa(q, k, v, w, beta, g, key_padding_mask=mask)
    ref, _ = forgetting_attention(q, k, v, g / math.sqrt(D), key_padding_mask=mask, causal=True)
    torch.testing.assert_close(out, ref, **CLOSE)


@pytest.mark.parametrize(
    "tgt_len, src_len, query_offset",
    [(9, 9, 0), (1, 9, 8), (3, 12, 5), (17, 20, 3), (4, 11, 2), (0, 5, 0), (1, 1, 0)],
)
def test_chunked_form_equals_the_carry_by_position(chunk_size, tgt_len, src_len, query_offset):
    """The op's chunked UT form against the plain loop, on every causal entry, with
    beta at 0, 1 (H_t singular) and 2 and a zero w (a padded position) among the
    positions; the loop leaves the hidden entries unspecified, the chunked form 0."""
    generator = torch.Generator().manual_seed(tgt_len * 100 + src_len)
    q = torch.randn(2, 3, tgt_len, 5, generator=generator, dtype=DTYPE)
    k = torch.randn(2, 3, src_len, 5, generator=generator, dtype=DTYPE)
    w = F.normalize(torch.randn(2, 3, src_len, 5, generator=generator, dtype=DTYPE), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(2, 3, src_len, generator=generator, dtype=DTYPE))
    beta[..., ::4], beta[..., 1::4] = 1.0, 2.0
    beta[..., 2::5], w[..., 2::5, :] = 0.0, 0.0
    visible = torch.arange(src_len) <= (query_offset + torch.arange(tgt_len))[:, None]
    chunked = _path_logits_by_chunk(q, k, w, beta, query_offset, chunk_size)
    by_position = _path_logits_by_position(q, k, w, beta, query_offset)
    assert chunked.shape == by_position.shape == (2, 3, tgt_len, src_len)
    torch.testing.assert_close(chunked * visible, by_position * visible, **CLOSE)
    assert (chunked.masked_select(~visible) == 0).all()


# --------------------------------------------------------------------------
# incremental decoding, need_weights, half, gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("rows", [slice(T - 1, T), slice(3, 7), slice(0, 1)])
def test_incremental_rows_equal_the_full_call(gate, rows):
    """Queries at positions query_offset.. given all Tk keys, w, beta (and gates): the op
    recomputes from the raw keys, which is exact."""
    q, k, v, *rest = draw(8, gate=gate)
    mask = padding()
    full_out, full_probs = pa(q, k, v, *rest, key_padding_mask=mask)
    out, probs = pa(q[:, :, rows], k, v, *rest, key_padding_mask=mask, query_offset=rows.start)
    torch.testing.assert_close(out, full_out[:, :, rows], **CLOSE)
    torch.testing.assert_close(probs, full_probs[:, :, rows], **CLOSE)


def test_need_weights_false_gives_the_same_output():
    tensors = draw(9, gate=True)
    mask = padding()
    out, probs = pa(*tensors, key_padding_mask=mask)
    out_without, none = pa(*tensors, key_padding_mask=mask, need_weights=False)
    assert probs is not None and probs.shape == (B, H, T, T) and none is None
    torch.testing.assert_close(out_without, out, **CLOSE)


def test_dropout_drops_weights_not_the_returned_probabilities():
    tensors = draw(10)
    _, probs = pa(*tensors)
    torch.manual_seed(0)
    out, dropped_probs = pa(*tensors, dropout_p=0.5)
    torch.testing.assert_close(dropped_probs, probs, **CLOSE)
    assert not torch.allclose(out, pa(*tensors)[0])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_are_finite_and_close(half):
    q, k, v, w, beta, g = draw(11, gate=True)
    mask = padding()
    out, probs = pa(q.to(half), k.to(half), v.to(half), w.to(half), beta.float(), g.float(), key_padding_mask=mask)
    ref_out, ref_probs = pa(q, k, v, w.to(half).to(DTYPE), beta.float().to(DTYPE), g, key_padding_mask=mask)
    assert out.dtype == half and probs.dtype == half
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(out.to(DTYPE), ref_out, **HALF_CLOSE)
    torch.testing.assert_close(probs.to(DTYPE), ref_probs, **HALF_CLOSE)


def test_half_logits_do_not_overflow():
    """Logits are formed in float32: q . k of a few hundred per entry stays finite."""
    q, k, v, w, beta = draw(12)
    out, _ = pa((30 * q).half(), (30 * k).half(), v.half(), w.half(), beta.half())
    assert torch.isfinite(out).all()


def test_gradcheck():
    q, k, v, w, beta, g = draw(13, batch=1, heads=1, length=5, dim=3, gate=True, unit=False)
    mask = torch.tensor([[False, False, True, False, False]])
    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v, w, beta, g))

    def fn(*args):
        return pa(*args, key_padding_mask=mask)[0]

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradcheck(lambda *args: pa(*args[:5])[0], inputs[:5])


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------


def test_is_part_of_the_functional_api():
    assert functional.path_attention is path_attention
    assert "path_attention" in functional.__all__


def test_refuses_non_causal():
    with pytest.raises(ValueError, match="^causal must be True"):
        path_attention(*draw(14))


@pytest.mark.parametrize(
    "name, change",
    [
        ("w", lambda t: {**t, "w": t["w"][:, :, :-1]}),
        ("w", lambda t: {**t, "w": t["w"][..., :-1]}),
        ("w", lambda t: {**t, "w": t["w"].long()}),
        ("beta", lambda t: {**t, "beta": t["beta"][..., None]}),
        ("beta", lambda t: {**t, "beta": t["beta"][:, :1]}),
        ("beta", lambda t: {**t, "beta": torch.ones(B, H, T, dtype=torch.bool)}),
        ("log_forget", lambda t: {**t, "log_forget": t["beta"][:, :, :-1]}),
        ("log_forget", lambda t: {**t, "log_forget": t["beta"].int()}),
        ("q", lambda t: {**t, "q": t["q"][0]}),
        ("k", lambda t: {**t, "k": t["k"][..., :-1]}),
    ],
)
def test_refuses_wrong_shapes_and_types_naming_the_argument(name, change):
    q, k, v, w, beta = draw(15)
    arguments = change(dict(q=q, k=k, v=v, w=w, beta=beta))
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        pa(**arguments)


def test_refuses_queries_past_the_given_positions():
    q, k, v, w, beta = draw(16)
    with pytest.raises(ValueError, match="query_offset"):
        pa(q[:, :, :2], k, v, w, beta, query_offset=T - 1)


def test_refuses_a_bad_flex_mode():
    with pytest.raises(ValueError, match="flex"):
        pa(*draw(17), flex="sometimes")
