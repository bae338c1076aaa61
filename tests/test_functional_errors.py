"""Every malformed call of the functional API is a ValueError that names the
argument (the command-line table is in test_bad_inputs.py), and a NaN query row
gives what the README says on each path."""

import re

import pytest
import torch

from fairseq_distattn import functional

B, H, T, D = 2, 2, 5, 4


def tensors(*shape, count=1):
    generator = torch.Generator().manual_seed(0)
    made = [torch.randn(*(shape or (B, H, T, D)), generator=generator) for _ in range(count)]
    return made if count > 1 else made[0]


Q, K, V = tensors(count=3)
PADDING = torch.zeros(B, T, dtype=torch.bool)
FLOAT_KEEP_MASK = torch.ones(B, T)  # 1 = keep: read as padding before this check, inverting the mask
TABLE = tensors(2 * 2 + 1, D)
HEAD_PARAMETER = torch.zeros(H)
WINDOW = torch.ones(B, H, T, T)
QVI_PARAMETERS = (torch.eye(D).repeat(H, 1, 1), torch.zeros(H, 2 * D), torch.zeros(H))
T5_TABLE = torch.zeros(8, H)  # 8 buckets: max_distance must exceed 4


def meta(tensor):
    """The tensor on the meta device: a shape without values (and a device that is not q's)."""
    return tensor.to("meta")


def softmax(**kw):
    return functional.softmax_attention(kw.pop("q", Q), kw.pop("k", K), kw.pop("v", V), **kw)


def rpr(max_distance=2, rel_keys=TABLE, q=Q, **kw):
    return functional.relative_position_attention(
        q, K, V, rel_keys, TABLE if rel_keys is TABLE else None, max_distance, **kw
    )


def da(distance_weight=HEAD_PARAMETER, q=Q, **kw):
    return functional.distance_aware_attention(q, K, V, distance_weight, HEAD_PARAMETER, **kw)


def window(segment_size=0, q_left=Q, q_right=Q, **kw):
    return functional.window_mask(q_left, K, q_right, K, segment_size, **kw)


def mw(mask=WINDOW, q=Q, **kw):
    return functional.multiplicative_window_attention(q, K, V, mask, **kw)


def aw(mask=WINDOW, q_global=Q, q_local=Q, **kw):
    return functional.additive_window_attention(q_global, K, q_local, K, V, mask, **kw)


def qvi(q=Q, value_projection=QVI_PARAMETERS[0], gate_weight=QVI_PARAMETERS[1], gate_bias=QVI_PARAMETERS[2], **kw):
    return functional.query_value_interaction_attention(q, K, V, value_projection, gate_weight, gate_bias, **kw)


def query_aware_values(queries=Q, **kw):
    return functional.query_aware_values(queries, V, *QVI_PARAMETERS, **kw)


def distance_mask(alpha=1.0, q=Q, **kw):
    return functional.distance_mask_attention(q, K, V, alpha, **kw)


def alibi(slopes=None, q=Q, **kw):
    return functional.alibi_attention(q, K, V, slopes, **kw)


def t5(table=T5_TABLE, q=Q, **kw):
    return functional.t5_bias_attention(q, K, V, table, max_distance=6, **kw)


# (call, keyword arguments, the argument the message must name)
BAD_CALLS = [
    (softmax, dict(key_padding_mask=FLOAT_KEEP_MASK), "key_padding_mask"),
    (rpr, dict(key_padding_mask=FLOAT_KEEP_MASK), "key_padding_mask"),
    (da, dict(key_padding_mask=FLOAT_KEEP_MASK.long()), "key_padding_mask"),
    (window, dict(key_padding_mask=FLOAT_KEEP_MASK), "key_padding_mask"),
    (qvi, dict(key_padding_mask=FLOAT_KEEP_MASK), "key_padding_mask"),
    (softmax, dict(key_padding_mask=torch.zeros(B, T + 1, dtype=torch.bool)), "key_padding_mask"),
    (distance_mask, dict(key_padding_mask=torch.zeros(T, dtype=torch.bool)), "key_padding_mask"),
    (softmax, dict(dropout_p=-0.1), "dropout_p"),
    (softmax, dict(dropout_p=1.0), "dropout_p"),
    (rpr, dict(dropout_p=1.5), "dropout_p"),
    (aw, dict(dropout_p=2), "dropout_p"),
    (qvi, dict(dropout_p=float("nan")), "dropout_p"),
    (softmax, dict(query_offset=-1), "query_offset"),
    (da, dict(query_offset=-3), "query_offset"),
    (mw, dict(query_offset=1.5), "query_offset"),
    (query_aware_values, dict(query_offset=-1), "query_offset"),
    (query_aware_values, dict(value_offset=-2), "value_offset"),
    (softmax, dict(causal="yes"), "causal"),
    (window, dict(segment_size=-1), "segment_size"),
    (window, dict(segment_size=2.5), "segment_size"),
    (window, dict(expected=1), "expected"),
    (rpr, dict(max_distance=0), "max_distance"),
    (rpr, dict(max_distance=-4), "max_distance"),
    (rpr, dict(rel_keys=tensors(3, D)), "rel_keys"),
    (da, dict(distance_weight=torch.zeros(H + 1)), "distance_weight"),
    (distance_mask, dict(alpha=float("inf")), "alpha"),
    (distance_mask, dict(alpha=-1.0), "alpha"),
    (distance_mask, dict(direction="sideways"), "direction"),
    (mw, dict(mask=torch.ones(B, H, T, T + 1)), "mask"),
    (t5, dict(table=torch.zeros(7, H)), "table"),  # bidirectional (not causal): row 6 never read
    (softmax, dict(q=Q[0]), "q"),
    (softmax, dict(k=tensors(B, H, T, D + 1)), "k"),
    (softmax, dict(v=tensors(B, H, T + 1, D)), "v"),
]

# Tensors of the wrong kind: each was a torch error (or a silent meta result)
# inside the op before the shared check looked at dtypes and devices. The
# message starts with the argument it blames: for two floating dtypes, the one
# that disagrees with the op's first tensor ("k has dtype torch.float32 but q has
# torch.float64").
# (op, its first tensor, the tensor compared with it)
OPS = [
    (softmax, "q", "k"),
    (rpr, "q", "k"),
    (da, "q", "k"),
    (window, "q_left", "k_left"),
    (mw, "q", "k"),
    (aw, "q_global", "k_global"),
    (qvi, "q", "k"),
    (query_aware_values, "queries", "queries"),  # eq. 7 checks v (its query) first: queries disagree
    (distance_mask, "q", "k"),
    (alibi, "q", "k"),
    (t5, "q", "k"),
]
TENSOR_CALLS = [
    row
    for call, first, other in OPS
    for row in (
        (call, {first: Q.double()}, other),  # float64 q with float32 k
        (call, {first: Q > 0}, first),  # bool
        (call, {first: Q.long()}, first),  # int64
        (call, {first: meta(Q)}, first),  # no values
    )
] + [
    (softmax, dict(k=meta(K)), "k"),
    (softmax, dict(v=V.double()), "v"),
    (softmax, dict(key_padding_mask=meta(PADDING)), "key_padding_mask"),  # on another device than q
    (query_aware_values, dict(query_padding_mask=FLOAT_KEEP_MASK), "query_padding_mask"),
    (window, dict(q_right=Q.double()), "q_right"),
    (aw, dict(q_local=Q.double()), "q_local"),
    (rpr, dict(rel_keys=TABLE.double()), "rel_keys"),
    (rpr, dict(rel_keys=meta(TABLE)), "rel_keys"),
    (da, dict(distance_weight=HEAD_PARAMETER.long()), "distance_weight"),
    (da, dict(distance_weight=meta(HEAD_PARAMETER)), "distance_weight"),
    (mw, dict(mask=WINDOW.double()), "mask"),
    (mw, dict(mask=WINDOW.bool()), "mask"),
    (aw, dict(mask=meta(WINDOW)), "mask"),
    (qvi, dict(value_projection=QVI_PARAMETERS[0].double()), "value_projection"),
    (qvi, dict(gate_weight=meta(QVI_PARAMETERS[1])), "gate_weight"),
    (qvi, dict(gate_bias=torch.zeros(H + 1)), "gate_bias"),
    (alibi, dict(slopes=torch.ones(H, dtype=torch.long)), "slopes"),
    (alibi, dict(slopes=meta(torch.ones(H))), "slopes"),
    (t5, dict(table=T5_TABLE.long()), "table"),
    (t5, dict(table=meta(T5_TABLE)), "table"),
]
BAD_CALLS += TENSOR_CALLS


def _ids(calls):
    return [f"{call.__name__}-{next(iter(kw))}-{i}" for i, (call, kw, _) in enumerate(calls)]


@pytest.mark.parametrize("call,kwargs,argument", BAD_CALLS, ids=_ids(BAD_CALLS))
def test_bad_argument_is_a_value_error_naming_it(call, kwargs, argument):
    with pytest.raises(ValueError) as error:
        call(**kwargs)
    assert re.search(rf"\b{argument}\b", str(error.value)), str(error.value)


@pytest.mark.parametrize("call,kwargs,argument", TENSOR_CALLS, ids=_ids(TENSOR_CALLS))
def test_a_tensor_of_the_wrong_dtype_or_device_is_blamed_first(call, kwargs, argument):
    with pytest.raises(ValueError) as error:
        call(**kwargs)
    assert str(error.value).startswith(f"{argument} "), str(error.value)


def test_a_dtype_mismatch_names_both_dtypes():
    with pytest.raises(ValueError, match=r"^k has dtype torch\.float32 but q has torch\.float64$"):
        softmax(q=Q.double())


@pytest.mark.parametrize("call", sorted({c for c, _, _ in BAD_CALLS}, key=lambda c: c.__name__))
def test_the_same_calls_with_good_arguments_work(call):
    result = call()
    assert torch.isfinite(result[0] if isinstance(result, tuple) else result).all()


@pytest.mark.parametrize("rows", [5, 7, 33])
def test_an_odd_t5_table_is_refused_only_where_its_buckets_are_bidirectional(rows):
    """T5 halves bidirectional buckets (``num_buckets //= 2``), so an odd table's last
    row would never be read (as ``--t5-bias-buckets`` refuses for the encoder);
    unidirectional buckets read every row."""
    table = torch.randn(rows, H)
    for direction in (dict(), dict(causal=True, bidirectional=True)):
        with pytest.raises(ValueError, match=rf"^table .*, got {rows}: .* row {rows - 1} would never be read"):
            functional.t5_bias_attention(Q, K, V, table, max_distance=64, **direction)
    for direction in (dict(causal=True), dict(bidirectional=False)):
        out, _ = functional.t5_bias_attention(Q, K, V, table, max_distance=64, **direction)
        assert torch.isfinite(out).all()


def test_a_float64_call_works_when_every_tensor_is_float64():
    out, probs = functional.relative_position_attention(
        Q.double(), K.double(), V.double(), TABLE.double(), TABLE.double(), 2, key_padding_mask=PADDING
    )
    assert out.dtype == probs.dtype == torch.float64 and torch.isfinite(out).all()


# The exported position helpers: lengths and offsets are integers >= 0.
def relative_distance(tgt_len=3, src_len=5, query_offset=0):
    return functional.relative_distance(tgt_len, src_len, query_offset, "cpu")


def alibi_bias(tgt_len=3, src_len=5, num_heads=4, query_offset=0, dtype=torch.float32):
    return functional.alibi_bias(tgt_len, src_len, num_heads, query_offset, "cpu", dtype)


def t5_relative_bias(table=T5_TABLE, tgt_len=3, src_len=5, max_distance=6, query_offset=0):
    return functional.t5_relative_bias(table, tgt_len, src_len, max_distance, True, query_offset)


def relative_position_bucket_table(num_buckets=8, max_distance=6, bidirectional=True):
    return functional.relative_position_bucket_table(num_buckets, max_distance, bidirectional)


def offsets(tgt_len=3, src_len=5, query_offset=0):
    return functional.offsets(tgt_len, src_len, query_offset, "cpu")


def logit_mask(tgt_len=3, src_len=5, query_offset=0):
    return functional.logit_mask(None, True, query_offset, tgt_len, src_len, "cpu", torch.float32)


POSITION_CALLS = [
    (relative_distance, dict(tgt_len=-1), "tgt_len"),
    (relative_distance, dict(src_len=-1), "src_len"),
    (relative_distance, dict(tgt_len=2.5), "tgt_len"),
    (relative_distance, dict(query_offset=-1), "query_offset"),
    (relative_distance, dict(query_offset=0.5), "query_offset"),
    (alibi_bias, dict(tgt_len=-1), "tgt_len"),
    (alibi_bias, dict(src_len=-2), "src_len"),
    (alibi_bias, dict(query_offset=-1), "query_offset"),
    (alibi_bias, dict(dtype=torch.long), "dtype"),
    (t5_relative_bias, dict(tgt_len=-1), "tgt_len"),
    (t5_relative_bias, dict(query_offset=-1), "query_offset"),
    (t5_relative_bias, dict(max_distance=2), "max_distance"),
    (t5_relative_bias, dict(table=torch.zeros(8)), "table"),
    (relative_position_bucket_table, dict(num_buckets=0), "num_buckets"),
    (relative_position_bucket_table, dict(max_distance=2), "max_distance"),
    (relative_position_bucket_table, dict(max_distance=6.5), "max_distance"),
    (offsets, dict(tgt_len=-1), "tgt_len"),
    (offsets, dict(query_offset=-1), "query_offset"),
    (logit_mask, dict(tgt_len=-1), "tgt_len"),
    (logit_mask, dict(src_len=1.5), "src_len"),
]


@pytest.mark.parametrize("call,kwargs,argument", POSITION_CALLS, ids=_ids(POSITION_CALLS))
def test_a_bad_length_or_offset_of_a_position_helper_is_a_value_error_naming_it(call, kwargs, argument):
    with pytest.raises(ValueError) as error:
        call(**kwargs)
    assert str(error.value).startswith(f"{argument} "), str(error.value)


@pytest.mark.parametrize("call", sorted({c for c, _, _ in POSITION_CALLS}, key=lambda c: c.__name__))
def test_the_same_position_helpers_with_good_arguments_work(call):
    call()


def test_relative_distance_is_still_cached():
    first = functional.relative_distance(3, 5, 1, "cpu")
    assert functional.relative_distance(3, 5, 1, "cpu") is first
    assert first.tolist()[0] == [-1, 0, 1, 2, 3]


# A NaN query: every logit of its row is NaN. The weights path gives NaN
# probabilities and output. The fused path (need_weights=False) runs SDPA; on CPU,
# when SDPA gets no mask (here: no key_padding_mask; causal as SDPA's own) and the
# row has fewer keys than one SIMD vector, torch's flash kernel takes the NaN row
# for a fully masked one and returns 0 (docs/functional-api.md, softmax_attention's
# docstring).
# Pinned where measured (AVX2, 8 float32 lanes), so that a torch that changes it is
# noticed; on other CPUs (AVX512 would predict 16 lanes, unmeasured) only "NaN or 0".
X86_FLOAT32_LANES = {"AVX2": 8}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [5, 17])
def test_a_nan_query_row_on_the_weights_and_the_fused_path(length, causal):
    q, k, v = tensors(B, H, length, D, count=3)
    q[0, 0, 1] = float("nan")
    out, probs = functional.softmax_attention(q, k, v, causal=causal)
    assert probs[0, 0, 1].isnan().all() and out[0, 0, 1].isnan().all()
    padding = torch.zeros(B, length, dtype=torch.bool)  # a mask, though it hides nothing: SDPA gets attn_mask
    masked, _ = functional.softmax_attention(q, k, v, causal=causal, key_padding_mask=padding, need_weights=False)
    assert masked[0, 0, 1].isnan().all()
    fused, _ = functional.softmax_attention(q, k, v, causal=causal, need_weights=False)
    for result in (out, masked, fused):  # the other rows are untouched
        assert torch.isfinite(result[1]).all() and torch.isfinite(result[0, 1]).all()
    lanes = X86_FLOAT32_LANES.get(torch.backends.cpu.get_cpu_capability())
    if lanes is None:  # another CPU: which rows fit in one vector is not pinned here
        assert fused[0, 0, 1].isnan().all() or (fused[0, 0, 1] == 0).all()
    elif length < lanes:
        assert (fused[0, 0, 1] == 0).all(), fused[0, 0, 1]
    else:
        assert fused[0, 0, 1].isnan().all(), fused[0, 0, 1]
