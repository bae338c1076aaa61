"""Differentiable window (Nguyen et al. 2020): the naive references of the masks
(eqs. 7-11, with the L and J matrices of eqs. 4 and 10) and of MW / AW attention
(eqs. 12-17), the ops and window_mask -> attention pipelines the contract tests
run (test_functional_contract.py), and the mechanism's own properties: one-hot
pointers give discrete windows, segments counted from the first real token, the
same rows with or without left pads, and the no-autograd path."""

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from fairseq_distattn.functional import additive_window_attention, multiplicative_window_attention, window_mask

from .functional_cases import (
    DTYPE,
    KEY,
    PAIR,
    QKV,
    QUERY,
    TIGHT,
    Case,
    OpSpec,
    as_tensors,
    dot,
    generator_for,
    key_is_visible,
    naive_attention,
    naive_softmax,
    position_tensor,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)


def one_based_positions(padding, b: int, src_len: int):
    """1-based key positions counted from the sequence's first non-pad token."""
    first_real = 0
    if padding is not None:
        first_real = next((j for j in range(src_len) if not padding[b, j]), src_len)
    return [j - first_real + 1 for j in range(src_len)]


def reference_window_mask(params, padding, causal, query_offset, segment_size):
    """Eq. 9 (L_ij = 1 iff i <= j) or eq. 11 (J_ij = 1 iff i <= b ceil(j/b)):
    m = (phi_l^T T) (phi_r^T T^T) + (phi_r^T T) (phi_l^T T^T), phi = pointer softmax (eqs. 7-8)."""
    q_left, k_left = to_numpy(params["q_left"]), to_numpy(params["k_left"])
    q_right, k_right = to_numpy(params["q_right"]), to_numpy(params["k_right"])
    batch, heads, tgt_len, dim = q_left.shape
    src_len = k_left.shape[2]
    mask = np.zeros((batch, heads, tgt_len, src_len))
    for b in range(batch):
        positions = one_based_positions(padding, b, src_len)

        def triangular(row: int, col: int) -> bool:
            if segment_size == 0:
                return row <= col  # L_n of eq. 4
            return positions[row] <= segment_size * math.ceil(positions[col] / segment_size)  # J_n of eq. 10

        for h in range(heads):
            for i in range(tgt_len):
                position = query_offset + i
                visible = [key_is_visible(padding, causal, b, position, j) for j in range(src_len)]
                phi_left = naive_softmax(
                    [dot(q_left[b, h, i], k_left[b, h, j]) / math.sqrt(dim) for j in range(src_len)], visible
                )
                phi_right = naive_softmax(
                    [dot(q_right[b, h, i], k_right[b, h, j]) / math.sqrt(dim) for j in range(src_len)], visible
                )
                for j in range(src_len):
                    f_left = sum(phi_left[t] for t in range(src_len) if triangular(t, j))  # phi^T T
                    g_left = sum(phi_left[t] for t in range(src_len) if triangular(j, t))  # phi^T T^T
                    f_right = sum(phi_right[t] for t in range(src_len) if triangular(t, j))
                    g_right = sum(phi_right[t] for t in range(src_len) if triangular(j, t))
                    mask[b, h, i, j] = f_left * g_right + f_right * g_left
    return as_tensors(mask)


def reference_multiplicative_window(params, padding, causal, query_offset, mask):
    """MW eqs. 12-13: (S(QK^T/sqrt(d)) * M) V; returns (out, weights)."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    mask = to_numpy(mask)
    dim = q.shape[-1]
    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim),
        value=lambda b, h, position, j: v[b, h, j],
        weight=lambda b, h, i, j, alpha: alpha * mask[b, h, i, j],
    )


def reference_additive_window(params, padding, causal, query_offset, mask):
    """AW eqs. 14-17: S((Q_g K_g^T + (Q_l K_l^T) * M) / sqrt(d)) V; returns (out, probs)."""
    q_global, k_global = to_numpy(params["q_global"]), to_numpy(params["k_global"])
    q_local, k_local = to_numpy(params["q_local"]), to_numpy(params["k_local"])
    v, mask = to_numpy(params["v"]), to_numpy(mask)
    dim = q_global.shape[-1]

    def logit(b, h, i, position, j):
        global_score = dot(q_global[b, h, i], k_global[b, h, j])
        local_score = dot(q_local[b, h, i], k_local[b, h, j]) * mask[b, h, i, j]
        return (global_score + local_score) / math.sqrt(dim)

    return naive_attention(
        q_global, k_global, padding, causal, query_offset, logit, value=lambda b, h, position, j: v[b, h, j]
    )


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def make_param(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
    if name == "mask":  # soft window mask input of MW/AW: values in (0, 1)
        return torch.rand(case.batch, case.heads, case.tgt_len, case.src_len, generator=gen, dtype=DTYPE)
    if name in ("q_left", "q_right", "k_left", "k_right"):
        return position_tensor(name, case, gen, scale=1.5)  # peaky pointers
    return position_tensor(name, case, gen)


def _window_inputs(params):
    return params["q_left"], params["k_left"], params["q_right"], params["k_right"]


def run_window_mask(segment_size):
    def run(params, padding, causal, query_offset):
        return (
            window_mask(
                *_window_inputs(params),
                segment_size=segment_size,
                key_padding_mask=padding,
                causal=causal,
                query_offset=query_offset,
            ),
        )

    return run


def ref_window_mask(segment_size):
    def reference(params, padding, causal, query_offset):
        return reference_window_mask(params, to_numpy(padding), causal, query_offset, segment_size)

    return reference


def run_window_pipeline(segment_size, attention, reference_attention):
    """window_mask -> a window attention (learnable q_left... included);
    ``attention(params, mask, padding, causal, query_offset)``."""

    def run(params, padding, causal, query_offset):
        mask = window_mask(
            *_window_inputs(params),
            segment_size=segment_size,
            key_padding_mask=padding,
            causal=causal,
            query_offset=query_offset,
        )
        return attention(params, mask, padding, causal, query_offset)

    def reference(params, padding, causal, query_offset):
        (mask,) = reference_window_mask(params, to_numpy(padding), causal, query_offset, segment_size)
        return reference_attention(params, to_numpy(padding), causal, query_offset, mask)

    return run, reference


def run_multiplicative_pipeline(segment_size):
    def attention(params, mask, padding, causal, query_offset):
        return multiplicative_window_attention(
            params["q"],
            params["k"],
            params["v"],
            mask,
            key_padding_mask=padding,
            causal=causal,
            query_offset=query_offset,
        )

    return run_window_pipeline(segment_size, attention, reference_multiplicative_window)


def run_additive_pipeline(segment_size):
    def attention(params, mask, padding, causal, query_offset):
        return additive_window_attention(
            params["q_global"],
            params["k_global"],
            params["q_local"],
            params["k_local"],
            params["v"],
            mask,
            key_padding_mask=padding,
            causal=causal,
            query_offset=query_offset,
        )

    return run_window_pipeline(segment_size, attention, reference_additive_window)


_mw_pipeline = run_multiplicative_pipeline(0)
_mw_segment_pipeline = run_multiplicative_pipeline(2)
_aw_pipeline = run_additive_pipeline(0)
_aw_segment_pipeline = run_additive_pipeline(3)
_WINDOW = {"q_left": QUERY, "k_left": KEY, "q_right": QUERY, "k_right": KEY}
_AW = {"q_global": QUERY, "k_global": KEY, "q_local": QUERY, "k_local": KEY, "v": KEY}

OPS = [
    OpSpec(
        "window_mask_token",
        dict(_WINDOW),
        make_param,
        run_window_mask(0),
        ref_window_mask(0),
        output_kinds=("pairs",),
        probability_output=None,
        rows_sum_to_one=False,
    ),
    OpSpec(
        "window_mask_segment2",
        dict(_WINDOW),
        make_param,
        run_window_mask(2),
        ref_window_mask(2),
        output_kinds=("pairs",),
        probability_output=None,
        rows_sum_to_one=False,
        uses_segments=True,
    ),
    OpSpec(
        "window_mask_segment3",
        dict(_WINDOW),
        make_param,
        run_window_mask(3),
        ref_window_mask(3),
        output_kinds=("pairs",),
        probability_output=None,
        rows_sum_to_one=False,
        uses_segments=True,
    ),
    OpSpec(
        "multiplicative_window",
        {**QKV, "mask": PAIR},
        make_param,
        lambda p, pad, c, o: multiplicative_window_attention(
            p["q"], p["k"], p["v"], p["mask"], key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_multiplicative_window(p, to_numpy(pad), c, o, p["mask"]),
        rows_sum_to_one=False,
    ),
    OpSpec(
        "additive_window",
        {**_AW, "mask": PAIR},
        make_param,
        lambda p, pad, c, o: additive_window_attention(
            p["q_global"],
            p["k_global"],
            p["q_local"],
            p["k_local"],
            p["v"],
            p["mask"],
            key_padding_mask=pad,
            causal=c,
            query_offset=o,
        ),
        lambda p, pad, c, o: reference_additive_window(p, to_numpy(pad), c, o, p["mask"]),
    ),
    OpSpec(
        "multiplicative_window_pipeline_token",
        {**QKV, **_WINDOW},
        make_param,
        *_mw_pipeline,
        rows_sum_to_one=False,
    ),
    OpSpec(
        "multiplicative_window_pipeline_segment2",
        {**QKV, **_WINDOW},
        make_param,
        *_mw_segment_pipeline,
        rows_sum_to_one=False,
        uses_segments=True,
    ),
    OpSpec("additive_window_pipeline_token", {**_AW, **_WINDOW}, make_param, *_aw_pipeline),
    OpSpec(
        "additive_window_pipeline_segment3",
        {**_AW, **_WINDOW},
        make_param,
        *_aw_segment_pipeline,
        uses_segments=True,
    ),
]


def _fused_window_additive(segment_size):
    def run(p, pad, c, o):
        mask = window_mask(
            *_window_inputs(p), segment_size=segment_size, key_padding_mask=pad, causal=c, query_offset=o
        )
        return additive_window_attention(
            p["q_global"],
            p["k_global"],
            p["q_local"],
            p["k_local"],
            p["v"],
            mask,
            key_padding_mask=pad,
            causal=c,
            query_offset=o,
            need_weights=False,
        )

    return run


FUSED_RUNS = {
    "additive_window": lambda p, pad, c, o: additive_window_attention(
        p["q_global"],
        p["k_global"],
        p["q_local"],
        p["k_local"],
        p["v"],
        p["mask"],
        key_padding_mask=pad,
        causal=c,
        query_offset=o,
        need_weights=False,
    ),
    "additive_window_pipeline_token": _fused_window_additive(0),
    "additive_window_pipeline_segment3": _fused_window_additive(3),
}


# --------------------------------------------------------------------------
# properties of the mechanism
# --------------------------------------------------------------------------


def one_hot_pointer_inputs(left: int, right: int, src_len: int, scale: float = 40.0):
    """Pointers whose softmax is numerically one-hot at ``left`` / ``right``."""
    keys = (torch.eye(src_len, dtype=DTYPE) * scale)[None, None]  # [1,1,Tk,D=Tk]
    return keys[:, :, left : left + 1], keys, keys[:, :, right : right + 1], keys


@pytest.mark.parametrize(
    "left,right,segment_size,expected",
    [
        (0, 5, 0, [1, 1, 1, 1, 1, 1]),  # whole sequence: mask == 1 everywhere
        (1, 3, 0, [0, 1, 1, 1, 0, 0]),  # l < r: indicator of [l, r] (eq. 6)
        (4, 1, 0, [0, 1, 1, 1, 1, 0]),  # l > r: eq. 9's second term gives [r, l]
        (3, 3, 0, [0, 0, 0, 2, 0, 0]),  # l == r: both terms of eq. 9 fire
        (1, 4, 2, [1, 1, 1, 1, 1, 1]),  # segments {0,1} {2,3} {4,5}: l in seg 0, r in seg 2
        (3, 4, 2, [0, 0, 1, 1, 1, 1]),  # seg 1 .. seg 2
        (5, 2, 2, [0, 0, 1, 1, 1, 1]),  # reversed pointers
        (0, 2, 3, [2, 2, 2, 0, 0, 0]),  # same segment: both terms of eq. 11 fire
        (2, 3, 3, [1, 1, 1, 1, 1, 1]),  # segments {0,1,2} {3,4,5}
    ],
)
def test_window_mask_with_one_hot_pointers_is_discrete_window(left, right, segment_size, expected):
    src_len = 6
    mask = window_mask(*one_hot_pointer_inputs(left, right, src_len), segment_size=segment_size)
    assert_close(mask[0, 0, 0], torch.tensor(expected, dtype=DTYPE), rtol=0, atol=1e-12)


def test_window_mask_one_hot_window_respects_left_padding_segments():
    """Segments start at the first real token: with 1 left pad and b = 2 the
    segments are {1,2} {3,4} {5,6}; pointers at 2 and 3 cover keys 1..4."""
    src_len, scale = 7, 40.0
    keys = (torch.eye(src_len, dtype=DTYPE) * scale)[None, None]
    padding = torch.tensor([[True, False, False, False, False, False, False]])
    mask = window_mask(keys[:, :, 2:3], keys, keys[:, :, 3:4], keys, segment_size=2, key_padding_mask=padding)
    expected = torch.tensor([0, 1, 1, 1, 1, 0, 0], dtype=DTYPE)
    assert_close(mask[0, 0, 0, 1:], expected[1:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("segment_size", [0, 2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_window_mask_rows_identical_with_zero_or_three_left_pads_in_one_batch(segment_size, causal):
    """The same sentence twice in one batch, once unpadded and once after 3 LEFT
    pads (the batch is 3 longer than the first sentence, which is right-padded)."""
    length, amount, heads, dim = 5, 3, 2, 4
    gen = generator_for("segment-batch", segment_size, causal)
    sentence = [randn(gen, 1, heads, length, dim, scale=1.5) for _ in range(4)]
    junk = [randn(gen, 1, heads, amount, dim, scale=5.0) for _ in range(4)]
    first = [torch.cat([s, j], dim=2) for s, j in zip(sentence, junk)]  # right padded
    second = [torch.cat([j, s], dim=2) for s, j in zip(sentence, junk)]  # left padded
    batch = [torch.cat([a, b], dim=0) for a, b in zip(first, second)]
    padding = torch.zeros(2, length + amount, dtype=torch.bool)
    padding[0, length:] = True
    padding[1, :amount] = True
    mask = window_mask(*batch, segment_size=segment_size, key_padding_mask=padding, causal=causal)
    unpadded_rows = mask[0, :, :length, :length]
    left_padded_rows = mask[1, :, amount:, amount:]
    assert_close(left_padded_rows, unpadded_rows, **TIGHT)
    alone = window_mask(*sentence, segment_size=segment_size, causal=causal)[0]
    assert_close(unpadded_rows, alone, **TIGHT)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_window_mask_without_autograd_equals_the_closed_form_function(causal):
    """Eq. 9 runs through ``_TokenWindowMask`` when a pointer needs a gradient
    and as plain tensor code otherwise (generation): both give the same bits,
    so the reference checks of either path hold for the other."""
    gen = generator_for("window-no-grad", causal)
    tgt_len, src_len = 5, 7
    inputs = [randn(gen, 2, 3, length, 4, scale=1.5) for length in (tgt_len, src_len, tgt_len, src_len)]
    padding = torch.zeros(2, src_len, dtype=torch.bool)
    padding[1, :2] = True
    tracked = window_mask(
        *(t.clone().requires_grad_() for t in inputs),
        key_padding_mask=padding,
        causal=causal,
        query_offset=src_len - tgt_len,
    )
    assert type(tracked.grad_fn).__name__ == "_TokenWindowMaskBackward"
    with torch.no_grad():
        plain = window_mask(*inputs, key_padding_mask=padding, causal=causal, query_offset=src_len - tgt_len)
    assert plain.grad_fn is None
    assert_close(plain, tracked.detach(), rtol=0, atol=0)
