"""Relative position representations (Shaw et al. 2018, eqs. 3-4): the naive
reference, the ops the contract tests run (test_functional_contract.py), and the
mechanism's own properties: rows sum to one over the visible keys, the bucket
terms against per-pair tables, one dropped weight for values and relative values."""

import math

import pytest
import torch
from torch.autograd import gradcheck
from torch.testing import assert_close

from fairseq_distattn.functional import relative_position_attention

from .functional_cases import (
    DTYPE,
    PARAM,
    QKV,
    REFERENCE_CASES,
    TIGHT,
    Case,
    OpSpec,
    dot,
    generator_for,
    make_padding_mask,
    naive_attention,
    position_tensor,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
    visibility,
)

MAX_DISTANCE = 2  # Shaw clipping distance k; small so clipping is exercised with T=5/6


def clip(x: int, bound: int) -> int:
    return max(-bound, min(bound, x))


def reference_relative_position(params, padding, causal, query_offset):
    """Shaw eqs. 3-4: e_ij = q_i (k_j + a^K_ij) / sqrt(d), z_i = sum_j a_ij (v_j + a^V_ij)."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    rel_keys, rel_values = to_numpy(params["rel_keys"]), to_numpy(params.get("rel_values"))
    dim = q.shape[-1]

    def bucket(position, j):
        return clip(j - position, MAX_DISTANCE) + MAX_DISTANCE

    def value(b, h, position, j):
        return v[b, h, j] if rel_values is None else v[b, h, j] + rel_values[bucket(position, j)]

    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j] + rel_keys[bucket(position, j)]) / math.sqrt(dim),
        value=value,
    )


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def make_param(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
    if name in ("rel_keys", "rel_values"):
        return randn(gen, 2 * MAX_DISTANCE + 1, case.dim)
    return position_tensor(name, case, gen)


OPS = [
    OpSpec(
        "relative_position_keys_only",
        {**QKV, "rel_keys": PARAM},
        make_param,
        lambda p, pad, c, o: relative_position_attention(
            p["q"], p["k"], p["v"], p["rel_keys"], None, MAX_DISTANCE, key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_relative_position(p, to_numpy(pad), c, o),
    ),
    OpSpec(
        "relative_position_keys_and_values",
        {**QKV, "rel_keys": PARAM, "rel_values": PARAM},
        make_param,
        lambda p, pad, c, o: relative_position_attention(
            p["q"],
            p["k"],
            p["v"],
            p["rel_keys"],
            p["rel_values"],
            MAX_DISTANCE,
            key_padding_mask=pad,
            causal=c,
            query_offset=o,
        ),
        lambda p, pad, c, o: reference_relative_position(p, to_numpy(pad), c, o),
    ),
]

FUSED_RUNS = {
    "relative_position_keys_only": lambda p, pad, c, o: relative_position_attention(
        p["q"],
        p["k"],
        p["v"],
        p["rel_keys"],
        None,
        MAX_DISTANCE,
        key_padding_mask=pad,
        causal=c,
        query_offset=o,
        need_weights=False,
    ),
}


# --------------------------------------------------------------------------
# properties of the mechanism
# --------------------------------------------------------------------------


@pytest.mark.parametrize("with_values", [False, True], ids=["keys_only", "keys_and_values"])
@pytest.mark.parametrize("case", REFERENCE_CASES, ids=str)
def test_relative_position_rows_sum_to_one_over_visible_keys(case: Case, with_values: bool):
    gen = generator_for("rpr-sum", case.name, with_values)
    q = randn(gen, case.batch, case.heads, case.tgt_len, case.dim, scale=3.0)
    k = randn(gen, case.batch, case.heads, case.src_len, case.dim, scale=3.0)
    v = randn(gen, case.batch, case.heads, case.src_len, case.dim)
    rel_keys = randn(gen, 2 * MAX_DISTANCE + 1, case.dim, scale=3.0)
    rel_values = randn(gen, 2 * MAX_DISTANCE + 1, case.dim) if with_values else None
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = relative_position_attention(
        q,
        k,
        v,
        rel_keys,
        rel_values,
        MAX_DISTANCE,
        key_padding_mask=padding,
        causal=case.causal,
        query_offset=case.query_offset,
    )
    visible = visibility(
        (case.batch, case.tgt_len, case.src_len), to_numpy(padding), case.causal, case.query_offset
    ).expand_as(probs)
    has_key = visible.any(-1)
    assert (probs >= 0).all()
    assert_close(probs.sum(-1)[has_key], torch.ones_like(probs.sum(-1)[has_key]), **TIGHT)
    assert torch.equal(probs.sum(-1)[~has_key], torch.zeros_like(probs.sum(-1)[~has_key]))
    assert torch.equal(out[~has_key], torch.zeros_like(out[~has_key]))


BUCKET_SHAPES = [  # (Tq, Tk, k, query_offset): square, Tq > Tk, Tq < Tk, one step, k > T, k = 1, k = 0
    (6, 6, 2, 0),
    (7, 4, 2, 0),
    (3, 9, 3, 0),
    (1, 8, 2, 7),
    (4, 9, 2, 5),
    (5, 5, 9, 0),
    (5, 5, 1, 0),
    (6, 6, 0, 0),
]


@pytest.mark.parametrize(
    "tgt_len,src_len,max_distance,query_offset,causal",
    [
        (*shape, causal)
        for shape in BUCKET_SHAPES
        for causal in (False, True)
        if not causal or shape[3] + shape[0] <= shape[1]  # causal queries see keys 0..query_offset+i
    ],
    ids=lambda value: str(value),
)
def test_relative_position_bucket_terms_match_per_pair_tables_and_gradcheck(
    tgt_len, src_len, max_distance, query_offset, causal
):
    """The bias ``q_i . a^K_ij`` and value term ``sum_j alpha_ij a^V_ij`` (read
    per bucket, without gather/scatter over [Tq, Tk]) against the per-pair
    tables a_ij built outright, with causal inputs zero after each query as
    relative_position_attention gives them; gradcheck covers both adjoints."""
    from fairseq_distattn.functional.relative_position import (
        relative_position_bias,
        relative_position_buckets,
        relative_position_values,
    )

    gen = generator_for("rpr-buckets", tgt_len, src_len, max_distance, query_offset, causal)
    dim, buckets_count = 3, 2 * max_distance + 1
    q = randn(gen, 2, 2, tgt_len, dim).requires_grad_()
    probs = randn(gen, 2, 2, tgt_len, src_len).requires_grad_()
    rel_keys = randn(gen, buckets_count, dim).requires_grad_()
    rel_values = randn(gen, buckets_count, dim).requires_grad_()
    buckets = relative_position_buckets(tgt_len, src_len, max_distance, query_offset, q.device)
    distance = torch.arange(src_len)[None, :] - torch.arange(query_offset, query_offset + tgt_len)[:, None]
    after_query = (distance > 0) if causal else torch.zeros_like(distance, dtype=torch.bool)
    pair_index = distance.clamp(-max_distance, max_distance) + max_distance

    def bias(q, rel_keys):
        got = relative_position_bias(q, rel_keys, buckets, max_distance, query_offset, causal)
        return got.masked_fill(after_query, 0.0)  # as the caller's mask hides them

    def values(probs, rel_values):
        return relative_position_values(
            probs.masked_fill(after_query, 0.0), rel_values, buckets, max_distance, query_offset, causal
        )

    want_bias = torch.einsum("bhid,ijd->bhij", q, rel_keys[pair_index]).masked_fill(after_query, 0.0)
    want_values = torch.einsum("bhij,ijd->bhid", probs.masked_fill(after_query, 0.0), rel_values[pair_index])
    assert_close(bias(q, rel_keys), want_bias, **TIGHT)
    assert_close(values(probs, rel_values), want_values, **TIGHT)
    assert gradcheck(bias, (q, rel_keys), eps=1e-6, atol=1e-7, rtol=1e-5)
    assert gradcheck(values, (probs, rel_values), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_relative_position_dropout_uses_the_same_dropped_weights_for_values_and_rel_values():
    """Eq. 3 with dropout: z_i = sum_j alpha~_ij (v_j + a^V_ij) with one dropped alpha~.
    Values are one-hot in the first Tk coordinates and a^V one-hot per bucket in
    the last 2k+1, so the output exposes both weight uses separately."""
    gen = generator_for("rpr-dropout")
    batch, heads, length, buckets = 2, 2, 6, 2 * MAX_DISTANCE + 1
    dim = length + buckets
    q, k = randn(gen, batch, heads, length, dim), randn(gen, batch, heads, length, dim)
    v = torch.zeros(batch, heads, length, dim, dtype=DTYPE)
    v[..., :length] = torch.eye(length, dtype=DTYPE)
    rel_keys = randn(gen, buckets, dim)
    rel_values = torch.zeros(buckets, dim, dtype=DTYPE)
    rel_values[:, length:] = torch.eye(buckets, dtype=DTYPE)
    torch.manual_seed(4321)
    out, probs = relative_position_attention(q, k, v, rel_keys, rel_values, MAX_DISTANCE, dropout_p=0.5)
    attended = out[..., :length]
    assert (attended == 0).any()
    per_bucket = torch.zeros(batch, heads, length, buckets, dtype=DTYPE)
    for i in range(length):
        for j in range(length):
            per_bucket[:, :, i, clip(j - i, MAX_DISTANCE) + MAX_DISTANCE] += attended[:, :, i, j]
    assert_close(out[..., length:], per_bucket, **TIGHT)
