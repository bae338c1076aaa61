"""Distance mask (Im & Cho 2017, with the directional masks): the naive
reference, the ops the contract tests run in every direction
(test_functional_contract.py), and the refusal of an unknown direction."""

import math

import pytest
import torch

from fairseq_distattn.functional import distance_mask_attention

from .functional_cases import (
    DTYPE,
    QKV,
    OpSpec,
    dot,
    naive_attention,
    position_tensor,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
)

ALPHA = 0.7  # distance-mask scale


def reference_distance_mask(params, padding, causal, query_offset, direction):
    """softmax(QK^T/sqrt(d) + M_dir - alpha |i-j|) V; forward: j <= i, backward: j >= i."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    dim = q.shape[-1]
    allowed = {None: None, "forward": lambda position, j: j <= position, "backward": lambda position, j: j >= position}[
        direction
    ]
    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim) - ALPHA * abs(position - j),
        value=lambda b, h, position, j: v[b, h, j],
        allowed=allowed,
    )


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def run_distance_mask(direction):
    def run(params, padding, causal, query_offset):
        return distance_mask_attention(
            params["q"],
            params["k"],
            params["v"],
            ALPHA,
            key_padding_mask=padding,
            causal=causal,
            query_offset=query_offset,
            direction=direction,
        )

    def reference(params, padding, causal, query_offset):
        return reference_distance_mask(params, to_numpy(padding), causal, query_offset, direction)

    return run, reference


_dm_none, _dm_forward, _dm_backward = (run_distance_mask(d) for d in (None, "forward", "backward"))

OPS = [
    OpSpec("distance_mask_no_direction", dict(QKV), position_tensor, *_dm_none),
    OpSpec("distance_mask_forward", dict(QKV), position_tensor, *_dm_forward, direction="forward"),
    OpSpec("distance_mask_backward", dict(QKV), position_tensor, *_dm_backward, direction="backward"),
]


def _fused_distance_mask(direction):
    return lambda p, pad, c, o: distance_mask_attention(
        p["q"],
        p["k"],
        p["v"],
        ALPHA,
        key_padding_mask=pad,
        causal=c,
        query_offset=o,
        direction=direction,
        need_weights=False,
    )


FUSED_RUNS = {
    "distance_mask_no_direction": _fused_distance_mask(None),
    "distance_mask_forward": _fused_distance_mask("forward"),
    "distance_mask_backward": _fused_distance_mask("backward"),
}


# --------------------------------------------------------------------------
# properties of the mechanism
# --------------------------------------------------------------------------


def test_distance_mask_rejects_unknown_direction():
    q = torch.zeros(1, 1, 2, 2, dtype=DTYPE)
    with pytest.raises(ValueError):
        distance_mask_attention(q, q, q, ALPHA, direction="sideways")
