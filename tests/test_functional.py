"""Tests of :mod:`fairseq_distattn.functional` against naive float64 references.

Every reference below is written directly from the papers' equations with
explicit Python loops over batch, head, query and key (numpy only for the
D-dimensional dot products), so it shares no vectorised trick with the
implementation:

* Shaw et al. 2018, eqs. 3-4 (relative position representations);
* Wu et al. 2021 (DA-Transformer), eqs. 5-6;
* Nguyen et al. 2020 (differentiable window), eqs. 7-11 (masks, with the L and
  J matrices of eqs. 4 and 10) and eqs. 12-17 (MW / AW attention);
* Im & Cho 2017 (distance mask, directional masks);
* Wu et al. (query-value interaction), eqs. 7-10.

Conventions (module docstring): query row i sits at position
``query_offset + i``, key j at position j; ``key_padding_mask`` True = pad;
``causal`` hides keys after the query position. Invisible keys must get
probability exactly 0 and a query row without any visible key gives zeros.

Every op (and the fused ``need_weights=False`` path of the additive-bias ops)
is checked for: agreement with its reference on masked / causal / offset /
cross-attention cases, exact zeros, gradcheck, incremental decoding, and
invariance to left/right padding; plus mechanism-specific properties.
"""

import math
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Tuple

import numpy as np
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
    query_aware_values,
    query_value_interaction_attention,
    relative_position_attention,
    softmax_attention,
    t5_bias_attention,
    window_mask,
)

DTYPE = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
MAX_DISTANCE = 2  # Shaw clipping distance k; small so clipping is exercised with T=5/6
ALPHA = 0.7  # distance-mask scale
# t5-bias: few buckets and a short max_distance, so that the cases' distances reach the log-spaced buckets
T5_BUCKETS, T5_MAX_DISTANCE = 8, 6
PAD_AMOUNTS = (0, 1, 3)  # padding tokens per batch element (cycled)


@pytest.fixture(scope="module", autouse=True)
def single_thread_torch():
    """The tensors here are tiny: intra-op threads only add contention (gradcheck
    runs thousands of small forward passes). Restored after this module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    heads: int
    tgt_len: int
    src_len: int
    dim: int
    padding: Optional[str]  # None, "left", "right" or "one_empty"
    causal: bool
    query_offset: int

    @property
    def is_cross(self) -> bool:
        return self.tgt_len != self.src_len and not self.causal

    def __str__(self):
        return self.name


def make_padding_mask(padding: Optional[str], batch: int, src_len: int) -> Optional[torch.Tensor]:
    """[B, Tk] bool, True = pad; different padding lengths per batch element."""
    if padding is None:
        return None
    mask = torch.zeros(batch, src_len, dtype=torch.bool)
    if padding == "one_empty":
        # element 1 is entirely padding (no visible key at all), element 2 right-padded
        mask[1 % batch, :] = True
        if batch > 2:
            mask[2, src_len - 2 :] = True
        return mask
    for b in range(batch):
        amount = min(PAD_AMOUNTS[b % len(PAD_AMOUNTS)], src_len)
        if amount == 0:
            continue
        if padding == "left":
            mask[b, :amount] = True
        elif padding == "right":
            mask[b, src_len - amount :] = True
        else:
            raise ValueError(padding)
    return mask


REFERENCE_CASES = [
    Case("no_mask", 3, 2, 5, 5, 4, None, False, 0),
    Case("left_padding", 3, 2, 5, 5, 4, "left", False, 0),
    Case("right_padding", 3, 2, 5, 5, 4, "right", False, 0),
    Case("one_sequence_all_padding", 3, 2, 5, 5, 4, "one_empty", False, 0),
    Case("causal", 3, 2, 5, 5, 4, None, True, 0),
    Case("causal_left_padding", 3, 2, 5, 5, 4, "left", True, 0),
    Case("causal_right_padding", 3, 2, 5, 5, 4, "right", True, 0),
    Case("causal_offset_tq1", 3, 2, 1, 6, 4, None, True, 5),
    Case("causal_offset_tq2", 3, 2, 2, 6, 4, None, True, 4),
    Case("causal_offset_tq2_left_padding", 3, 2, 2, 6, 4, "left", True, 4),
    Case("cross", 3, 2, 3, 6, 4, None, False, 0),
    Case("cross_left_padding", 3, 2, 3, 6, 4, "left", False, 0),
    Case("cross_right_padding", 3, 2, 4, 6, 4, "right", False, 0),
]

GRADCHECK_CASES = [
    Case("grad_no_mask", 2, 2, 4, 4, 3, None, False, 0),
    Case("grad_causal_left_padding", 2, 2, 4, 4, 3, "left", True, 0),
    Case("grad_cross_right_padding", 2, 2, 3, 4, 3, "right", False, 0),
]


def generator_for(*labels) -> torch.Generator:
    seed = zlib.crc32("/".join(str(label) for label in labels).encode())
    return torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=DTYPE) * scale


# --------------------------------------------------------------------------
# naive reference building blocks
# --------------------------------------------------------------------------


def to_numpy(tensor: Optional[torch.Tensor]):
    return None if tensor is None else tensor.detach().cpu().numpy()


def key_is_visible(padding, causal: bool, b: int, query_position: int, j: int) -> bool:
    if padding is not None and padding[b, j]:
        return False
    if causal and j > query_position:
        return False
    return True


def naive_softmax(logits, visible):
    """Softmax over the visible entries; invisible entries (and rows with no
    visible entry) get exactly 0."""
    result = [0.0] * len(logits)
    chosen = [j for j in range(len(logits)) if visible[j]]
    if not chosen:
        return result
    top = max(logits[j] for j in chosen)
    total = sum(math.exp(logits[j] - top) for j in chosen)
    for j in chosen:
        result[j] = math.exp(logits[j] - top) / total
    return result


def dot(a, b) -> float:
    return float(np.dot(a, b))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def clip(x: int, bound: int) -> int:
    return max(-bound, min(bound, x))


def as_tensors(*arrays):
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


# --------------------------------------------------------------------------
# naive references, one per mechanism
# --------------------------------------------------------------------------


def naive_attention(q, k, padding, causal, query_offset, logit, value, allowed=None, weight=None):
    """The loop every attention reference shares. For query row i at
    ``position = query_offset + i``: logits over keys j from
    ``logit(b, h, i, position, j)``, softmax over the keys ``key_is_visible``
    (and ``allowed(position, j)``) lets it see, then
    out_i = sum_j w_ij value(b, h, position, j) with w_ij = alpha_ij, or
    ``weight(b, h, i, j, alpha_ij)``. Returns (out, w) as tensors."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.shape[2]
    out = np.zeros((batch, heads, tgt_len, dim))
    weights = np.zeros((batch, heads, tgt_len, src_len))
    for b in range(batch):
        for h in range(heads):
            for i in range(tgt_len):
                position = query_offset + i
                logits = [logit(b, h, i, position, j) for j in range(src_len)]
                visible = [
                    key_is_visible(padding, causal, b, position, j) and (allowed is None or allowed(position, j))
                    for j in range(src_len)
                ]
                alpha = naive_softmax(logits, visible)
                for j in range(src_len):
                    weights[b, h, i, j] = alpha[j] if weight is None else weight(b, h, i, j, alpha[j])
                    out[b, h, i] += weights[b, h, i, j] * value(b, h, position, j)
    return as_tensors(out, weights)


def reference_softmax_attention(params, padding, causal, query_offset):
    """Plain scaled dot-product attention softmax(QK^T / sqrt(d)) V (Vaswani et al.)."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    dim = q.shape[-1]
    return naive_attention(
        q,
        k,
        padding,
        causal,
        query_offset,
        logit=lambda b, h, i, position, j: dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim),
        value=lambda b, h, position, j: v[b, h, j],
    )


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


def reference_distance_aware(params, padding, causal, query_offset):
    """DA eq. 5 f = (1+exp(v))/(1+exp(v - w|i-j|)), eq. 6 softmax(ReLU(QK^T) * f / sqrt(d)) V."""
    q, k, v = to_numpy(params["q"]), to_numpy(params["k"]), to_numpy(params["v"])
    weight, sharpness = to_numpy(params["distance_weight"]), to_numpy(params["sharpness"])
    dim = q.shape[-1]

    def logit(b, h, i, position, j):
        distance = weight[h] * abs(position - j)
        coefficient = (1.0 + math.exp(sharpness[h])) / (1.0 + math.exp(sharpness[h] - distance))
        return max(0.0, dot(q[b, h, i], k[b, h, j])) * coefficient / math.sqrt(dim)

    return naive_attention(q, k, padding, causal, query_offset, logit, value=lambda b, h, position, j: v[b, h, j])


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
# op specifications: parameter factories, implementation calls, references
# --------------------------------------------------------------------------

QUERY, KEY, PAIR, PARAM = "query", "key", "pair", "param"


@dataclass(frozen=True)
class OpSpec:
    """One public op (or a window-mask -> attention pipeline) under test.

    ``roles`` tells how each tensor follows positions: QUERY tensors are
    ``[B,H,Tq,*]``, KEY tensors ``[B,H,Tk,*]``, PAIR tensors ``[B,H,Tq,Tk]``,
    PARAM tensors are position independent. ``output_kinds`` says the same
    for each returned tensor ("rows" = [B,H,Tq,D], "pairs" = [B,H,Tq,Tk]).
    """

    name: str
    roles: Dict[str, str]
    make_param: Callable[[str, Case, torch.Generator], torch.Tensor]
    run: Callable
    reference: Callable
    output_kinds: Tuple[str, ...] = ("rows", "pairs")
    probability_output: Optional[int] = 1  # index of the output that must be 0 on invisible keys
    rows_sum_to_one: bool = True
    supports_cross: bool = True
    direction: Optional[str] = None
    incremental_needs_all_queries: bool = False
    uses_segments: bool = False

    def make_params(self, case: Case, gen: torch.Generator) -> Dict[str, torch.Tensor]:
        return {name: self.make_param(name, case, gen) for name in self.roles}

    def __str__(self):
        return self.name


def per_position(scale: float = 1.0):
    """Factory for QUERY/KEY/PAIR tensors and learnable parameters of the usual shapes."""

    def make(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
        b, h, tq, tk, d = case.batch, case.heads, case.tgt_len, case.src_len, case.dim
        shapes = {
            "q": (b, h, tq, d),
            "q_left": (b, h, tq, d),
            "q_right": (b, h, tq, d),
            "q_global": (b, h, tq, d),
            "q_local": (b, h, tq, d),
            "k": (b, h, tk, d),
            "v": (b, h, tk, d),
            "k_left": (b, h, tk, d),
            "k_right": (b, h, tk, d),
            "k_global": (b, h, tk, d),
            "k_local": (b, h, tk, d),
            "rel_keys": (2 * MAX_DISTANCE + 1, d),
            "rel_values": (2 * MAX_DISTANCE + 1, d),
            "distance_weight": (h,),
            "sharpness": (h,),
            "value_projection": (h, d, d),
            "gate_weight": (h, 2 * d),
            "gate_bias": (h,),
            "t5_table": (T5_BUCKETS, h),
        }
        if name == "mask":  # soft window mask input of MW/AW: values in (0, 1)
            return torch.rand(b, h, tq, tk, generator=gen, dtype=DTYPE)
        if name in ("q_left", "q_right", "k_left", "k_right"):
            return randn(gen, *shapes[name], scale=1.5)  # peaky pointers
        if name == "distance_weight":
            return randn(gen, *shapes[name], scale=0.6)
        return randn(gen, *shapes[name], scale=scale)

    return make


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


_mw_pipeline = run_multiplicative_pipeline(0)
_mw_segment_pipeline = run_multiplicative_pipeline(2)
_aw_pipeline = run_additive_pipeline(0)
_aw_segment_pipeline = run_additive_pipeline(3)
_dm_none, _dm_forward, _dm_backward = (run_distance_mask(d) for d in (None, "forward", "backward"))
_QKV = {"q": QUERY, "k": KEY, "v": KEY}
_WINDOW = {"q_left": QUERY, "k_left": KEY, "q_right": QUERY, "k_right": KEY}
_AW = {"q_global": QUERY, "k_global": KEY, "q_local": QUERY, "k_local": KEY, "v": KEY}

OPS = [
    OpSpec(
        "softmax_attention",
        dict(_QKV),
        per_position(),
        lambda p, pad, c, o: softmax_attention(p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o),
        lambda p, pad, c, o: reference_softmax_attention(p, to_numpy(pad), c, o),
    ),
    OpSpec(
        "relative_position_keys_only",
        {**_QKV, "rel_keys": PARAM},
        per_position(),
        lambda p, pad, c, o: relative_position_attention(
            p["q"], p["k"], p["v"], p["rel_keys"], None, MAX_DISTANCE, key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_relative_position(p, to_numpy(pad), c, o),
    ),
    OpSpec(
        "relative_position_keys_and_values",
        {**_QKV, "rel_keys": PARAM, "rel_values": PARAM},
        per_position(),
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
    OpSpec(
        "distance_aware",
        {**_QKV, "distance_weight": PARAM, "sharpness": PARAM},
        per_position(),
        lambda p, pad, c, o: distance_aware_attention(
            p["q"], p["k"], p["v"], p["distance_weight"], p["sharpness"], key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_distance_aware(p, to_numpy(pad), c, o),
    ),
    OpSpec(
        "window_mask_token",
        dict(_WINDOW),
        per_position(),
        run_window_mask(0),
        ref_window_mask(0),
        output_kinds=("pairs",),
        probability_output=None,
        rows_sum_to_one=False,
    ),
    OpSpec(
        "window_mask_segment2",
        dict(_WINDOW),
        per_position(),
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
        per_position(),
        run_window_mask(3),
        ref_window_mask(3),
        output_kinds=("pairs",),
        probability_output=None,
        rows_sum_to_one=False,
        uses_segments=True,
    ),
    OpSpec(
        "multiplicative_window",
        {**_QKV, "mask": PAIR},
        per_position(),
        lambda p, pad, c, o: multiplicative_window_attention(
            p["q"], p["k"], p["v"], p["mask"], key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_multiplicative_window(p, to_numpy(pad), c, o, p["mask"]),
        rows_sum_to_one=False,
    ),
    OpSpec(
        "additive_window",
        {**_AW, "mask": PAIR},
        per_position(),
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
        {**_QKV, **_WINDOW},
        per_position(),
        *_mw_pipeline,
        rows_sum_to_one=False,
    ),
    OpSpec(
        "multiplicative_window_pipeline_segment2",
        {**_QKV, **_WINDOW},
        per_position(),
        *_mw_segment_pipeline,
        rows_sum_to_one=False,
        uses_segments=True,
    ),
    OpSpec("additive_window_pipeline_token", {**_AW, **_WINDOW}, per_position(), *_aw_pipeline),
    OpSpec(
        "additive_window_pipeline_segment3",
        {**_AW, **_WINDOW},
        per_position(),
        *_aw_segment_pipeline,
        uses_segments=True,
    ),
    OpSpec("distance_mask_no_direction", dict(_QKV), per_position(), *_dm_none),
    OpSpec("distance_mask_forward", dict(_QKV), per_position(), *_dm_forward, direction="forward"),
    OpSpec("distance_mask_backward", dict(_QKV), per_position(), *_dm_backward, direction="backward"),
    OpSpec(
        "query_value_interaction",
        {**_QKV, "value_projection": PARAM, "gate_weight": PARAM, "gate_bias": PARAM},
        per_position(),
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
    OpSpec(
        "alibi",
        dict(_QKV),
        per_position(),
        lambda p, pad, c, o: alibi_attention(p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o),
        lambda p, pad, c, o: reference_alibi(p, to_numpy(pad), c, o),
    ),
    OpSpec(
        "t5_bias",
        {**_QKV, "t5_table": PARAM},
        per_position(),
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


# Ops whose mechanism is an additive logit bias also run fused through
# F.scaled_dot_product_attention when need_weights=False and return (out, None).
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
    "softmax_attention": lambda p, pad, c, o: softmax_attention(
        p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o, need_weights=False
    ),
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
    "distance_mask_no_direction": _fused_distance_mask(None),
    "distance_mask_forward": _fused_distance_mask("forward"),
    "distance_mask_backward": _fused_distance_mask("backward"),
    "alibi": lambda p, pad, c, o: alibi_attention(
        p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o, need_weights=False
    ),
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


def fused_variant(op: OpSpec) -> OpSpec:
    fused_run = FUSED_RUNS[op.name]
    plain_reference = op.reference

    def run(params, padding, causal, query_offset):
        out, probs = fused_run(params, padding, causal, query_offset)
        assert probs is None  # need_weights=False returns no probabilities
        return (out,)

    def reference(params, padding, causal, query_offset):
        return (plain_reference(params, padding, causal, query_offset)[0],)

    return replace(
        op,
        name=op.name + "_fused",
        run=run,
        reference=reference,
        output_kinds=("rows",),
        probability_output=None,
        rows_sum_to_one=False,
    )


OPS = OPS + [fused_variant(op) for op in OPS if op.name in FUSED_RUNS]
OPS_BY_NAME = {op.name: op for op in OPS}


def op_case_pairs(cases):
    return [
        pytest.param(op, case, id=f"{op.name}-{case.name}")
        for op in OPS
        for case in cases
        if op.supports_cross or not case.is_cross
    ]


def build(op: OpSpec, case: Case, *labels):
    params = op.make_params(case, generator_for(op.name, case.name, *labels))
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    return params, padding


def visibility(dims, padding, causal, query_offset, direction=None) -> torch.Tensor:
    """[B, 1, Tq, Tk] bool, True where query i may see key j (built with loops); dims = (B, Tq, Tk)."""
    batch, tgt_len, src_len = dims
    visible = torch.zeros(batch, 1, tgt_len, src_len, dtype=torch.bool)
    for b in range(batch):
        for i in range(tgt_len):
            position = query_offset + i
            for j in range(src_len):
                allowed = key_is_visible(padding, causal, b, position, j)
                if direction == "forward":
                    allowed = allowed and j <= position
                elif direction == "backward":
                    allowed = allowed and j >= position
                visible[b, 0, i, j] = allowed
    return visible


def comparable(op: OpSpec, outputs, padding):
    """Segment-based masks are only defined by the paper on real keys (the J matrix
    counts positions from the first real token); pad columns are don't-care."""
    if not (op.uses_segments and op.output_kinds == ("pairs",)) or padding is None:
        return outputs
    real = (~padding)[:, None, None, :].to(DTYPE)
    return tuple(t * real for t in outputs)


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
# 4: properties
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


@pytest.mark.parametrize("sharpness", [-30.0, 30.0])
@pytest.mark.parametrize("weight", [50.0, -50.0])
@pytest.mark.parametrize("causal,query_offset", [(False, 0), (True, 4095)], ids=["first_query", "last_query"])
def test_distance_aware_long_sequence_stays_finite(weight, sharpness, causal, query_offset):
    """Distances up to 4095 with |w| = 50: the naive eq. 5 overflows exp(), the op must not."""
    src_len, dim = 4096, 2
    gen = generator_for("da-long", weight, sharpness, causal)
    q = torch.randn(1, 1, 1, dim, generator=gen).requires_grad_(True)
    k = torch.randn(1, 1, src_len, dim, generator=gen).requires_grad_(True)
    v = torch.randn(1, 1, src_len, dim, generator=gen).requires_grad_(True)
    distance_weight = torch.tensor([weight], requires_grad=True)
    sharpness_t = torch.tensor([sharpness], requires_grad=True)
    padding = torch.zeros(1, src_len, dtype=torch.bool)
    padding[0, :3] = True
    out, probs = distance_aware_attention(
        q, k, v, distance_weight, sharpness_t, key_padding_mask=padding, causal=causal, query_offset=query_offset
    )
    assert out.dtype == torch.float32 and probs.shape == (1, 1, 1, src_len)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    assert_close(probs.sum(-1), torch.ones(1, 1, 1), rtol=1e-5, atol=1e-5)
    assert torch.equal(probs[..., :3], torch.zeros(1, 1, 1, 3))
    (out.sum() + (probs * torch.arange(src_len, dtype=torch.float32)).sum()).backward()
    for tensor in (q, k, v, distance_weight, sharpness_t):
        assert torch.isfinite(tensor.grad).all()


def test_distance_aware_coefficient_matches_eq5_at_moderate_distances():
    """With a single key per query the softmax is trivial, so check f through a
    two-key row: logit ratio = relu(s) f(w|i-j|) / sqrt(d) exactly as eq. 5."""
    dim = 1
    q = torch.tensor([[[[1.0]]]], dtype=DTYPE)
    k = torch.tensor([[[[2.0], [0.0]]]], dtype=DTYPE)  # key 1 has score 0 -> logit 0
    v = torch.zeros(1, 1, 2, dim, dtype=DTYPE)
    for weight, sharpness in [(0.3, -1.0), (-0.8, 2.0), (1.5, 0.0)]:
        w = torch.tensor([weight], dtype=DTYPE)
        s = torch.tensor([sharpness], dtype=DTYPE)
        _, probs = distance_aware_attention(q, k, v, w, s, query_offset=3)
        coefficient = (1 + math.exp(sharpness)) / (1 + math.exp(sharpness - weight * 3))
        logit = 2.0 * coefficient / math.sqrt(dim)
        expected = math.exp(logit) / (math.exp(logit) + 1.0)
        assert_close(probs[0, 0, 0, 0].item(), expected, **TIGHT)


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


def test_query_value_interaction_dropout_keeps_probs_and_refuses_full_dropout():
    op = OPS_BY_NAME["query_value_interaction"]
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


def test_distance_mask_rejects_unknown_direction():
    q = torch.zeros(1, 1, 2, 2, dtype=DTYPE)
    with pytest.raises(ValueError):
        distance_mask_attention(q, q, q, ALPHA, direction="sideways")
