"""The machinery the functional tests share (no tests here): the cases, the
padding masks, seeded generators, the naive float64 softmax-attention loop every
reference is built on, the ``OpSpec`` that describes one op under test, and the
functions that turn an op and a case into tensors.

Every reference (here and in the per-mechanism files ``test_functional_<module>.py``,
named for the modules of :mod:`fairseq_distattn.functional`) is written directly
from the papers' equations with explicit Python loops over batch, head, query
and key (numpy only for the D-dimensional dot products), so it shares no
vectorised trick with the implementation.

Conventions (module docstring of the package): query row i sits at position
``query_offset + i``, key j at position j; ``key_padding_mask`` True = pad;
``causal`` hides keys after the query position. Invisible keys must get
probability exactly 0 and a query row without any visible key gives zeros.

The plain softmax baseline (``softmax_attention``, which the package keeps in its
shared ``attention.py``) is described here too; the contract tests over every op
are in ``test_functional_contract.py``.
"""

import math
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pytest
import torch

from fairseq_distattn.functional import softmax_attention

DTYPE = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
PAD_AMOUNTS = (0, 1, 3)  # padding tokens per batch element (cycled)


@pytest.fixture(scope="module", autouse=True)
def single_thread_torch():
    """Every functional test module imports this (autouse, module scope): the
    tensors there are tiny, so intra-op threads only add contention (gradcheck
    runs thousands of small forward passes). Restored after each module."""
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


def as_tensors(*arrays):
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


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


# the per-position tensors an op may take: query side [B,H,Tq,D], key side [B,H,Tk,D]
POSITION_TENSORS = {
    "q": QUERY,
    "q_left": QUERY,
    "q_right": QUERY,
    "q_global": QUERY,
    "q_local": QUERY,
    "k": KEY,
    "v": KEY,
    "k_left": KEY,
    "k_right": KEY,
    "k_global": KEY,
    "k_local": KEY,
}
QKV = {"q": QUERY, "k": KEY, "v": KEY}


def position_tensor(name: str, case: Case, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """The per-position tensor ``name`` for ``case``, N(0, scale^2); an op whose
    only tensors are these uses it as its ``make_param`` (a mechanism with
    parameters of its own wraps it)."""
    length = case.tgt_len if POSITION_TENSORS[name] == QUERY else case.src_len
    return randn(gen, case.batch, case.heads, length, case.dim, scale=scale)


def fused_variant(op: OpSpec, fused_run: Callable) -> OpSpec:
    """``op`` run through its fused ``need_weights=False`` path ``fused_run``
    (same arguments as ``op.run``), checked on the output alone."""
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
# the plain softmax baseline (the package's shared attention.py)
# --------------------------------------------------------------------------


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


SOFTMAX_OPS = [
    OpSpec(
        "softmax_attention",
        dict(QKV),
        position_tensor,
        lambda p, pad, c, o: softmax_attention(p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o),
        lambda p, pad, c, o: reference_softmax_attention(p, to_numpy(pad), c, o),
    ),
]

# Ops whose mechanism is an additive logit bias also run fused through
# F.scaled_dot_product_attention when need_weights=False and return (out, None):
# each per-mechanism file's FUSED_RUNS, op name -> run.
SOFTMAX_FUSED_RUNS = {
    "softmax_attention": lambda p, pad, c, o: softmax_attention(
        p["q"], p["k"], p["v"], key_padding_mask=pad, causal=c, query_offset=o, need_weights=False
    ),
}
