"""Query-value interaction (Wu et al., eqs. 7-10): the naive references of the
query-aware values and of the attention over them, the op the contract tests run
(test_functional_contract.py, self-attention only), and ``query_aware_values``
directly (cross shapes, offsets, gradcheck, one value at a time) and under dropout."""

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck
from torch.testing import assert_close

from fairseq_distattn.functional import query_aware_values, query_value_interaction_attention

from .functional_cases import (
    PARAM,
    QKV,
    REFERENCE_CASES,
    TIGHT,
    Case,
    OpSpec,
    build,
    dot,
    generator_for,
    make_padding_mask,
    naive_attention,
    naive_softmax,
    position_tensor,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def reference_query_aware_values(params, query_padding, causal, query_offset, value_offset):
    """QVI eqs. 7-9 per value j: q^_j = softmax_i(v_j . q_i / sqrt(d)) q (over non-pad queries,
    and queries at positions <= the value's when causal), x_j = q^_j * (v_j W),
    beta_j = sigmoid(u . [x_j ; v_j] + h), g_j = (1 - beta_j) x_j + beta_j v_j."""
    queries, v = to_numpy(params["q"]), to_numpy(params["v"])
    projection = to_numpy(params["value_projection"])
    gate_weight, gate_bias = to_numpy(params["gate_weight"]), to_numpy(params["gate_bias"])
    batch, heads, num_queries, dim = queries.shape
    num_values = v.shape[2]
    values = np.zeros((batch, heads, num_values, dim))
    for b in range(batch):
        for h in range(heads):
            for j in range(num_values):
                value_position = value_offset + j
                logits, visible = [], []
                for i in range(num_queries):
                    logits.append(dot(v[b, h, j], queries[b, h, i]) / math.sqrt(dim))
                    allowed = query_padding is None or not query_padding[b, i]
                    if causal:
                        allowed = allowed and query_offset + i <= value_position
                    visible.append(allowed)
                alpha = naive_softmax(logits, visible)
                query_mix = np.zeros(dim)
                for i in range(num_queries):
                    query_mix += alpha[i] * queries[b, h, i]
                projected = np.array([sum(v[b, h, j, d] * projection[h, d, e] for d in range(dim)) for e in range(dim)])
                interaction = query_mix * projected
                beta = sigmoid(dot(gate_weight[h], np.concatenate([interaction, v[b, h, j]])) + gate_bias[h])
                values[b, h, j] = (1.0 - beta) * interaction + beta * v[b, h, j]
    return values


def reference_query_value_interaction(params, padding, causal, query_offset):
    """QVI eq. 10: softmax(QK^T/sqrt(d)) g(Q, V), queries padded where their own position is."""
    q, k = to_numpy(params["q"]), to_numpy(params["k"])
    dim = q.shape[-1]
    query_padding = None if padding is None else padding[:, query_offset : query_offset + q.shape[2]]
    values = reference_query_aware_values(params, query_padding, causal, query_offset, 0)
    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim),
        value=lambda b, h, position, j: values[b, h, j],
    )


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def make_param(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
    h, d = case.heads, case.dim
    shapes = {"value_projection": (h, d, d), "gate_weight": (h, 2 * d), "gate_bias": (h,)}
    if name in shapes:
        return randn(gen, *shapes[name])
    return position_tensor(name, case, gen)


OPS = [
    OpSpec(
        "query_value_interaction",
        {**QKV, "value_projection": PARAM, "gate_weight": PARAM, "gate_bias": PARAM},
        make_param,
        lambda p, pad, c, o: query_value_interaction_attention(
            p["q"],
            p["k"],
            p["v"],
            p["value_projection"],
            p["gate_weight"],
            p["gate_bias"],
            key_padding_mask=pad,
            causal=c,
            query_offset=o,
        ),
        lambda p, pad, c, o: reference_query_value_interaction(p, to_numpy(pad), c, o),
        supports_cross=False,  # eq. 7 mixes queries into values: self-attention only
        incremental_needs_all_queries=True,
    ),
]

FUSED_RUNS = {
    "query_value_interaction": lambda p, pad, c, o: query_value_interaction_attention(
        p["q"],
        p["k"],
        p["v"],
        p["value_projection"],
        p["gate_weight"],
        p["gate_bias"],
        key_padding_mask=pad,
        causal=c,
        query_offset=o,
        need_weights=False,
    ),
}


# --------------------------------------------------------------------------
# query_aware_values directly (eqs. 7-9), incl. cross shapes and offsets
# --------------------------------------------------------------------------


# (name, num_queries, num_values, query_offset, value_offset, causal, query padding side)
VALUE_CASES = [
    ("self_no_mask", 5, 5, 0, 0, False, None),
    ("self_causal", 5, 5, 0, 0, True, None),
    ("self_causal_left_padding", 5, 5, 0, 0, True, "left"),
    ("self_right_padding", 5, 5, 0, 0, False, "right"),
    ("cross_more_values", 3, 6, 0, 0, False, "right"),
    ("cross_more_queries", 6, 2, 0, 0, False, "left"),
    ("causal_late_queries", 4, 6, 2, 0, True, None),  # values 0,1 see no query at all
    ("causal_value_offset", 5, 2, 0, 3, True, "left"),
    ("causal_single_value", 4, 1, 0, 3, True, None),
]


def value_params(num_queries, num_values, gen, batch=3, heads=2, dim=3):
    return {
        "q": randn(gen, batch, heads, num_queries, dim),
        "v": randn(gen, batch, heads, num_values, dim),
        "value_projection": randn(gen, heads, dim, dim),
        "gate_weight": randn(gen, heads, 2 * dim),
        "gate_bias": randn(gen, heads),
    }


@pytest.mark.parametrize(
    "name,num_queries,num_values,query_offset,value_offset,causal,padding", VALUE_CASES, ids=[c[0] for c in VALUE_CASES]
)
def test_query_aware_values_match_naive_reference(
    name, num_queries, num_values, query_offset, value_offset, causal, padding
):
    params = value_params(num_queries, num_values, generator_for("qav", name))
    query_padding = make_padding_mask(padding, 3, num_queries)
    got = query_aware_values(
        params["q"],
        params["v"],
        params["value_projection"],
        params["gate_weight"],
        params["gate_bias"],
        query_padding_mask=query_padding,
        causal=causal,
        query_offset=query_offset,
        value_offset=value_offset,
    )
    want = reference_query_aware_values(params, to_numpy(query_padding), causal, query_offset, value_offset)
    assert got.shape == params["v"].shape
    assert torch.isfinite(got).all()
    assert_close(got, torch.from_numpy(want), **TIGHT)


@pytest.mark.parametrize(
    "name,num_queries,num_values,query_offset,value_offset,causal,padding",
    [VALUE_CASES[2], VALUE_CASES[4], VALUE_CASES[7]],
    ids=[VALUE_CASES[i][0] for i in (2, 4, 7)],
)
def test_query_aware_values_gradcheck(name, num_queries, num_values, query_offset, value_offset, causal, padding):
    params = value_params(num_queries, num_values, generator_for("qav-grad", name), batch=2, heads=2, dim=3)
    query_padding = make_padding_mask(padding, 2, num_queries)
    names = list(params)
    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)

    def function(queries, v, projection, gate_weight, gate_bias):
        return query_aware_values(
            queries,
            v,
            projection,
            gate_weight,
            gate_bias,
            query_padding_mask=query_padding,
            causal=causal,
            query_offset=query_offset,
            value_offset=value_offset,
        )

    assert gradcheck(function, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("padding", [None, "left"])
def test_query_aware_values_incremental_value_matches_full(padding):
    """Causal: value j computed from queries 0..j alone (value_offset=j) equals row j of the full call."""
    length = 5
    params = value_params(length, length, generator_for("qav-inc", padding))
    query_padding = make_padding_mask(padding, 3, length)
    args = (params["value_projection"], params["gate_weight"], params["gate_bias"])
    full = query_aware_values(params["q"], params["v"], *args, query_padding_mask=query_padding, causal=True)
    for step in range(length):
        step_padding = None if query_padding is None else query_padding[:, : step + 1]
        one = query_aware_values(
            params["q"][:, :, : step + 1],
            params["v"][:, :, step : step + 1],
            *args,
            query_padding_mask=step_padding,
            causal=True,
            value_offset=step,
        )
        assert_close(one, full[:, :, step : step + 1], **TIGHT)
        prefix = query_aware_values(
            params["q"][:, :, : step + 1],
            params["v"][:, :, : step + 1],
            *args,
            query_padding_mask=step_padding,
            causal=True,
        )
        assert_close(prefix, full[:, :, : step + 1], **TIGHT)


def test_query_value_interaction_dropout_keeps_probs_and_refuses_full_dropout():
    op = OPS[0]
    case = REFERENCE_CASES[0]
    params, _ = build(op, case, "dropout")
    args = (
        params["q"],
        params["k"],
        params["v"],
        params["value_projection"],
        params["gate_weight"],
        params["gate_bias"],
    )
    out_plain, probs_plain = query_value_interaction_attention(*args)
    torch.manual_seed(0)
    out_half, probs_half = query_value_interaction_attention(*args, dropout_p=0.5)
    assert_close(probs_half, probs_plain, **TIGHT)
    assert not torch.allclose(out_half, out_plain)
    with pytest.raises(ValueError, match="dropout_p"):
        query_value_interaction_attention(*args, dropout_p=1.0)
