"""ALiBi (Press et al. 2022): the paper's slopes and the naive reference, and the
op the contract tests run (test_functional_contract.py). Its own properties (the
slopes for any head count, the bias, the LM preset) are in test_alibi_t5.py."""

import math

from fairseq_distattn.functional import alibi_attention

from .functional_cases import (
    QKV,
    OpSpec,
    dot,
    naive_attention,
    position_tensor,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)


def paper_alibi_slopes(n: int):
    """Press et al.'s ``get_slopes`` (their code, as the paper describes it):
    2^(-8/n) to the powers 1..n; for n not a power of 2, those of the closest
    smaller power of 2, then every other slope of twice that power."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


def reference_alibi(params, padding, causal, query_offset):
    """ALiBi, Press et al. 2022 sec. 3: softmax(q_i K^T / sqrt(d) + m * [-(i-1), ..., -1, 0]) V,
    i.e. -m_h (i - j) on the keys a causal query sees; -m_h |i - j| (symmetric) without causality."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    dim, slopes = q.shape[-1], paper_alibi_slopes(q.shape[1])

    def bias(h, position, j):
        return -slopes[h] * (position - j) if causal else -slopes[h] * abs(position - j)

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


OPS = [
    OpSpec(
        "alibi",
        dict(QKV),
        position_tensor,
        lambda p, pad, c, o: alibi_attention(p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o),
        lambda p, pad, c, o: reference_alibi(p, to_numpy(pad), c, o),
    ),
]

FUSED_RUNS = {
    "alibi": lambda p, pad, c, o: alibi_attention(
        p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o, need_weights=False
    ),
}
