"""T5's relative attention bias (Raffel et al. 2020): T5's bucket function and
the naive reference, and the op the contract tests run
(test_functional_contract.py). Its own properties (the buckets, the table shared
across a stack, the options) are in test_alibi_t5.py."""

import math

import torch

from fairseq_distattn.functional import t5_bias_attention

from .functional_cases import (
    PARAM,
    QKV,
    Case,
    OpSpec,
    dot,
    naive_attention,
    position_tensor,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)

# t5-bias: few buckets and a short max_distance, so that the cases' distances reach the log-spaced buckets
T5_BUCKETS, T5_MAX_DISTANCE = 8, 6


def t5_relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's ``_relative_position_bucket`` (Mesh TensorFlow / Raffel et al. 2020), one scalar
    ``relative_position = j - i``, logarithm in float64."""
    ret, n = 0, -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(large, num_buckets - 1)


def reference_t5_bias(params, padding, causal, query_offset):
    """T5 (Raffel et al. 2020 sec. 2.1): a learned scalar per head and relative position
    bucket added to the logit; bidirectional buckets in the encoder, unidirectional in the decoder."""
    q, k, v, table = (to_numpy(params[name]) for name in ("q", "k", "v", "t5_table"))
    dim = q.shape[-1]

    def bias(h, position, j):
        return table[t5_relative_position_bucket(j - position, not causal, T5_BUCKETS, T5_MAX_DISTANCE), h]

    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim) + bias(h, position, j),
        value=lambda b, h, position, j: v[b, h, j],
    )


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def make_param(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
    if name == "t5_table":
        return randn(gen, T5_BUCKETS, case.heads)
    return position_tensor(name, case, gen)


OPS = [
    OpSpec(
        "t5_bias",
        {**QKV, "t5_table": PARAM},
        make_param,
        lambda p, pad, c, o: t5_bias_attention(
            p["q"],
            p["k"],
            p["v"],
            p["t5_table"],
            max_distance=T5_MAX_DISTANCE,
            key_padding_mask=pad,
            causal=c,
            query_offset=o,
        ),
        lambda p, pad, c, o: reference_t5_bias(p, to_numpy(pad), c, o),
    ),
]

FUSED_RUNS = {
    "t5_bias": lambda p, pad, c, o: t5_bias_attention(
        p["q"],
        p["k"],
        p["v"],
        p["t5_table"],
        max_distance=T5_MAX_DISTANCE,
        key_padding_mask=pad,
        causal=c,
        query_offset=o,
        need_weights=False,
    ),
}
