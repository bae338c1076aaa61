"""Every malformed call of the functional API is a ValueError that names the
argument (the command-line table is in test_bad_inputs.py)."""

import pytest
import torch

from fairseq_distattn import functional as DF

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


def softmax(**kw):
    return DF.softmax_attention(kw.pop("q", Q), kw.pop("k", K), kw.pop("v", V), **kw)


def rpr(max_distance=2, rel_keys=TABLE, **kw):
    return DF.relative_position_attention(Q, K, V, rel_keys, TABLE if rel_keys is TABLE else None, max_distance, **kw)


def da(distance_weight=HEAD_PARAMETER, **kw):
    return DF.distance_aware_attention(Q, K, V, distance_weight, HEAD_PARAMETER, **kw)


def window(segment_size=0, **kw):
    return DF.window_mask(Q, K, Q, K, segment_size, **kw)


def mw(mask=WINDOW, **kw):
    return DF.multiplicative_window_attention(Q, K, V, mask, **kw)


def aw(mask=WINDOW, **kw):
    return DF.additive_window_attention(Q, K, Q, K, V, mask, **kw)


def qvi(**kw):
    return DF.query_value_interaction_attention(Q, K, V, *QVI_PARAMETERS, **kw)


def query_aware_values(**kw):
    return DF.query_aware_values(Q, V, *QVI_PARAMETERS, **kw)


def distance_mask(alpha=1.0, **kw):
    return DF.distance_mask_attention(Q, K, V, alpha, **kw)


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
    (softmax, dict(q=Q[0]), "q"),
    (softmax, dict(k=tensors(B, H, T, D + 1)), "k"),
    (softmax, dict(v=tensors(B, H, T + 1, D)), "v"),
]


@pytest.mark.parametrize(
    "call,kwargs,argument",
    BAD_CALLS,
    ids=[f"{call.__name__}-{next(iter(kw))}-{i}" for i, (call, kw, _) in enumerate(BAD_CALLS)],
)
def test_bad_argument_is_a_value_error_naming_it(call, kwargs, argument):
    with pytest.raises(ValueError) as error:
        call(**kwargs)
    assert argument in str(error.value), str(error.value)


@pytest.mark.parametrize("call", sorted({c for c, _, _ in BAD_CALLS}, key=lambda c: c.__name__))
def test_the_same_calls_with_good_arguments_work(call):
    result = call()
    assert torch.isfinite(result[0] if isinstance(result, tuple) else result).all()
