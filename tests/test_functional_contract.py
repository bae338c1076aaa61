"""The contract every op of :mod:`fairseq_distattn.functional` meets, checked
against the naive float64 references of the per-mechanism files
(``test_functional_<module>.py``, named for the package's modules; each exports
its ``OPS`` and ``FUSED_RUNS``) and the softmax baseline of ``functional_cases.py``.

Every op (and the fused ``need_weights=False`` path of the additive-bias ops)
is checked for: agreement with its reference on masked / causal / offset /
cross-attention cases, exact zeros, gradcheck, incremental decoding,
invariance to left/right padding, and attention dropout. A new mechanism's file
joins by being listed in ``MECHANISMS``.
"""

import pytest
import torch
from torch.autograd import gradcheck
from torch.testing import assert_close

from fairseq_distattn.functional import (
    additive_window_attention,
    alibi_attention,
    distance_aware_attention,
    distance_mask_attention,
    multiplicative_window_attention,
    relative_position_attention,
    softmax_attention,
    t5_bias_attention,
    window_mask,
)

from . import (
    test_functional_alibi,
    test_functional_differentiable_window,
    test_functional_distance_aware,
    test_functional_distance_mask,
    test_functional_query_value_interaction,
    test_functional_relative_position,
    test_functional_t5_bias,
)
from .functional_cases import (
    DTYPE,
    GRADCHECK_CASES,
    KEY,
    PAIR,
    PARAM,
    QUERY,
    REFERENCE_CASES,
    SOFTMAX_FUSED_RUNS,
    SOFTMAX_OPS,
    TIGHT,
    Case,
    OpSpec,
    build,
    comparable,
    fused_variant,
    generator_for,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
    visibility,
)
from .test_functional_distance_mask import ALPHA
from .test_functional_relative_position import MAX_DISTANCE

# in the order their ops are listed (and collected)
MECHANISMS = (
    test_functional_relative_position,
    test_functional_distance_aware,
    test_functional_differentiable_window,
    test_functional_distance_mask,
    test_functional_query_value_interaction,
    test_functional_alibi,
    test_functional_t5_bias,
)
PLAIN_OPS = SOFTMAX_OPS + [op for mechanism in MECHANISMS for op in mechanism.OPS]
FUSED_RUNS = dict(SOFTMAX_FUSED_RUNS)
for mechanism in MECHANISMS:
    FUSED_RUNS.update(mechanism.FUSED_RUNS)
OPS = PLAIN_OPS + [fused_variant(op, FUSED_RUNS[op.name]) for op in PLAIN_OPS if op.name in FUSED_RUNS]


def op_case_pairs(cases):
    return [
        pytest.param(op, case, id=f"{op.name}-{case.name}")
        for op in OPS
        for case in cases
        if op.supports_cross or not case.is_cross
    ]


# --------------------------------------------------------------------------
# 1-2: agreement with the naive references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("op,case", op_case_pairs(REFERENCE_CASES))
def test_matches_naive_reference(op: OpSpec, case: Case):
    params, padding = build(op, case)
    actual = op.run(params, padding, case.causal, case.query_offset)
    expected = op.reference(params, padding, case.causal, case.query_offset)
    assert len(actual) == len(expected)
    for kind, got in zip(op.output_kinds, actual):
        last = case.dim if kind == "rows" else case.src_len
        assert got.shape == (case.batch, case.heads, case.tgt_len, last)
    for got, want in zip(comparable(op, actual, padding), comparable(op, expected, padding)):
        assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("op,case", op_case_pairs(REFERENCE_CASES))
def test_invisible_keys_get_exact_zero_and_empty_rows_give_zero(op: OpSpec, case: Case):
    params, padding = build(op, case, "zeros")
    outputs = op.run(params, padding, case.causal, case.query_offset)
    for t in outputs:
        assert torch.isfinite(t).all()
    visible = visibility(
        (case.batch, case.tgt_len, case.src_len), to_numpy(padding), case.causal, case.query_offset, op.direction
    ).expand(-1, case.heads, -1, -1)
    empty_rows = ~visible.any(dim=-1)  # [B, H, Tq]
    if op.probability_output is not None:
        probs = outputs[op.probability_output]
        assert torch.equal(probs[~visible], torch.zeros_like(probs[~visible]))
        if op.rows_sum_to_one:
            assert_close(probs.sum(-1)[~empty_rows], torch.ones_like(probs.sum(-1)[~empty_rows]), **TIGHT)
    for t in outputs:
        assert torch.equal(t[empty_rows], torch.zeros_like(t[empty_rows]))


# --------------------------------------------------------------------------
# 3: gradients (all float inputs incl. learnable parameters)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("op,case", op_case_pairs(GRADCHECK_CASES))
def test_gradcheck(op: OpSpec, case: Case):
    params, padding = build(op, case, "grad")
    names = list(params)
    inputs = tuple(params[name].detach().clone().requires_grad_(True) for name in names)

    def function(*tensors):
        return op.run(dict(zip(names, tensors)), padding, case.causal, case.query_offset)

    assert gradcheck(function, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("op", OPS, ids=str)
def test_gradients_finite_with_fully_padded_sequence(op: OpSpec):
    case = Case("fully_padded_grad", 3, 2, 5, 5, 4, "one_empty", True, 0)
    params, padding = build(op, case, "nan-grad")
    inputs = {name: t.detach().clone().requires_grad_(True) for name, t in params.items()}
    outputs = op.run(inputs, padding, case.causal, case.query_offset)
    sum(t.sum() for t in outputs).backward()
    for name, t in inputs.items():
        assert t.grad is not None, name
        assert torch.isfinite(t.grad).all(), name
    # the fully padded sequence cannot influence anything: its q/k/v get zero gradient
    for name, role in op.roles.items():
        if role in (QUERY, KEY, PAIR):
            assert torch.equal(inputs[name].grad[1], torch.zeros_like(inputs[name].grad[1])), name


# --------------------------------------------------------------------------
# 5: incremental (one query at a time) == full causal call
# --------------------------------------------------------------------------


def slice_step(op: OpSpec, params, step: int):
    """Inputs for the query at position ``step`` seeing keys 0..step."""
    sliced = {}
    for name, tensor in params.items():
        role = op.roles[name]
        if role == QUERY:
            sliced[name] = (
                tensor[:, :, : step + 1] if op.incremental_needs_all_queries else tensor[:, :, step : step + 1]
            )
        elif role == KEY:
            sliced[name] = tensor[:, :, : step + 1]
        elif role == PAIR:
            sliced[name] = tensor[:, :, step : step + 1, : step + 1]
        else:
            sliced[name] = tensor
    return sliced


@pytest.mark.parametrize("padding", [None, "left"])
@pytest.mark.parametrize("op", OPS, ids=str)
def test_incremental_rows_match_full_causal_call(op: OpSpec, padding):
    length = 5
    case = Case(f"incremental_{padding}", 3, 2, length, length, 4, padding, True, 0)
    params, key_padding = build(op, case)
    full = op.run(params, key_padding, True, 0)
    for step in range(length):
        step_params = slice_step(op, params, step)
        step_padding = None if key_padding is None else key_padding[:, : step + 1]
        if op.incremental_needs_all_queries:
            # QVI eq. 7 needs the cached queries: pass queries 0..step and keep the last row
            outputs = op.run(step_params, step_padding, True, 0)
            outputs = tuple(t[:, :, -1:] for t in outputs)
        else:
            outputs = op.run(step_params, step_padding, True, step)
        for kind, got, whole in zip(op.output_kinds, outputs, full):
            want = whole[:, :, step : step + 1]
            if kind == "pairs":
                want = want[..., : step + 1]
            assert_close(got, want, **TIGHT)
    if op.probability_output is not None:
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        probs = full[op.probability_output]
        assert torch.equal(probs[..., future], torch.zeros_like(probs[..., future]))


# --------------------------------------------------------------------------
# padding invariance: left/right padding does not change a sentence's results
# --------------------------------------------------------------------------


def pad_params(op: OpSpec, params, amount: int, side: str, gen: torch.Generator):
    """Insert ``amount`` junk positions on ``side`` of every position-indexed tensor."""
    padded = {}
    for name, tensor in params.items():
        role = op.roles[name]
        if role == PARAM:
            padded[name] = tensor
            continue
        dims = (2,) if role in (QUERY, KEY) else (2, 3)
        result = tensor
        for dim in dims:
            shape = list(result.shape)
            shape[dim] = amount
            junk = randn(gen, *shape, scale=5.0)
            if name == "mask":
                junk = junk.abs()
            result = torch.cat([junk, result] if side == "left" else [result, junk], dim=dim)
        padded[name] = result
    return padded


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("op", OPS, ids=str)
def test_padding_does_not_change_real_positions(op: OpSpec, side: str, causal: bool):
    length, amount = 5, 3
    case = Case("unpadded", 1, 2, length, length, 4, None, causal, 0)
    params, _ = build(op, case, "invariance")
    padded = pad_params(op, params, amount, side, generator_for(op.name, "junk", side))
    key_padding = torch.zeros(1, length + amount, dtype=torch.bool)
    if side == "left":
        key_padding[:, :amount] = True
        real = slice(amount, amount + length)
    else:
        key_padding[:, length:] = True
        real = slice(0, length)
    unpadded_out = op.run(params, None, causal, 0)
    padded_out = op.run(padded, key_padding, causal, 0)
    for kind, got, want in zip(op.output_kinds, padded_out, unpadded_out):
        got = got[:, :, real]
        if kind == "pairs":
            got = got[..., real]
        assert_close(got, want, **TIGHT)


# --------------------------------------------------------------------------
# attention dropout: applied to what multiplies V, never to the returned probs
# --------------------------------------------------------------------------


def _dropout_calls():
    """name -> call(q, k, v, dropout_p) -> (out, probs) with plain V in the output."""
    gen = generator_for("dropout-params")
    heads, dim = 2, 6
    rel_keys = randn(gen, 2 * MAX_DISTANCE + 1, dim)
    rel_values = torch.zeros(2 * MAX_DISTANCE + 1, dim, dtype=DTYPE)  # out == dropped probs @ V
    weight, sharpness = randn(gen, heads), randn(gen, heads)
    t5_table = randn(gen, 32, heads)
    return {
        "softmax_attention": lambda q, k, v, p: softmax_attention(q, k, v, dropout_p=p),
        "relative_position": lambda q, k, v, p: relative_position_attention(
            q, k, v, rel_keys, rel_values, MAX_DISTANCE, dropout_p=p
        ),
        "distance_aware": lambda q, k, v, p: distance_aware_attention(q, k, v, weight, sharpness, dropout_p=p),
        "distance_mask": lambda q, k, v, p: distance_mask_attention(q, k, v, ALPHA, dropout_p=p),
        "alibi": lambda q, k, v, p: alibi_attention(q, k, v, dropout_p=p),
        "t5_bias": lambda q, k, v, p: t5_bias_attention(q, k, v, t5_table, dropout_p=p),
        "multiplicative_window": lambda q, k, v, p: multiplicative_window_attention(
            q, k, v, window_mask(q, k, k, q), dropout_p=p
        ),
        "additive_window": lambda q, k, v, p: additive_window_attention(
            q, k, k, q, v, window_mask(q, k, k, q), dropout_p=p
        ),
    }


def _fused_dropout_calls():
    """Fused (need_weights=False) paths; ``probs`` recomputed with dropout_p=0."""
    gen = generator_for("fused-dropout-params")
    rel_keys = randn(gen, 2 * MAX_DISTANCE + 1, 6)
    t5_table = randn(gen, 32, 2)
    return {
        "softmax_attention_fused": lambda q, k, v, p: softmax_attention(q, k, v, dropout_p=p, need_weights=False),
        "relative_position_keys_only_fused": lambda q, k, v, p: relative_position_attention(
            q, k, v, rel_keys, None, MAX_DISTANCE, dropout_p=p, need_weights=False
        ),
        "distance_mask_fused": lambda q, k, v, p: distance_mask_attention(
            q, k, v, ALPHA, dropout_p=p, need_weights=False
        ),
        "additive_window_fused": lambda q, k, v, p: additive_window_attention(
            q, k, k, q, v, window_mask(q, k, k, q), dropout_p=p, need_weights=False
        ),
        "alibi_fused": lambda q, k, v, p: alibi_attention(q, k, v, dropout_p=p, need_weights=False),
        "t5_bias_fused": lambda q, k, v, p: t5_bias_attention(q, k, v, t5_table, dropout_p=p, need_weights=False),
    }


@pytest.mark.parametrize("name", list(_fused_dropout_calls()))
def test_fused_dropout_zeroes_or_rescales_each_attention_weight(name):
    """Same one-hot-values trick on the fused path: out must be 0 or weight / (1 - p)."""
    call = _fused_dropout_calls()[name]
    gen = generator_for("fused-dropout", name)
    batch, heads, length, p = 2, 2, 6, 0.5
    q = randn(gen, batch, heads, length, length)
    k = randn(gen, batch, heads, length, length)
    v = torch.eye(length, dtype=DTYPE).expand(batch, heads, length, length)
    weights, none = call(q, k, v, 0.0)  # with one-hot v the output row is the weight row
    assert none is None
    assert_close(weights.sum(-1), torch.ones(batch, heads, length, dtype=DTYPE), **TIGHT)
    torch.manual_seed(99)
    out, _ = call(q, k, v, p)
    kept = (out - weights / (1 - p)).abs() < 1e-12
    dropped = out == 0
    assert (kept | dropped).all()
    assert dropped.any() and kept.any()


@pytest.mark.parametrize("name", list(_dropout_calls()))
def test_dropout_drops_attended_weights_but_returns_undropped_probs(name):
    """With one-hot values (v_j = e_j, Tk = D) the output row *is* the attended
    weight row, so every entry must be 0 or weight / (1 - p)."""
    call = _dropout_calls()[name]
    gen = generator_for("dropout", name)
    batch, heads, length, p = 2, 2, 6, 0.5
    q = randn(gen, batch, heads, length, length)
    k = randn(gen, batch, heads, length, length)
    v = torch.eye(length, dtype=DTYPE).expand(batch, heads, length, length)
    out_plain, probs_plain = call(q, k, v, 0.0)
    assert_close(out_plain, probs_plain, **TIGHT)
    torch.manual_seed(1234)
    out, probs = call(q, k, v, p)
    assert_close(probs, probs_plain, **TIGHT)
    kept = (out - probs / (1 - p)).abs() < 1e-12
    dropped = out == 0
    assert (kept | dropped).all()
    assert dropped.any() and (kept & (probs > 1e-9)).any()
    # p = 1 would drop every weight: refused, like any p outside [0, 1)
    with pytest.raises(ValueError, match="dropout_p"):
        call(q, k, v, 1.0)
