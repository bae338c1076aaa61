"""DA-Transformer (Wu et al. 2021, eqs. 5-6): the naive reference, the op the
contract tests run (test_functional_contract.py), and the mechanism's own
properties: finite results and gradients at long distances where the naive eq. 5
overflows, and eq. 5's coefficient at moderate distances."""

import math

import pytest
import torch
from torch.testing import assert_close

from fairseq_distattn.functional import distance_aware_attention

from .functional_cases import (
    DTYPE,
    PARAM,
    QKV,
    TIGHT,
    Case,
    OpSpec,
    dot,
    generator_for,
    naive_attention,
    position_tensor,
    randn,
    single_thread_torch,  # noqa: F401 (autouse: one torch thread in this module)
    to_numpy,
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


# --------------------------------------------------------------------------
# the ops under the contract tests (test_functional_contract.py)
# --------------------------------------------------------------------------


def make_param(name: str, case: Case, gen: torch.Generator) -> torch.Tensor:
    if name == "distance_weight":
        return randn(gen, case.heads, scale=0.6)
    if name == "sharpness":
        return randn(gen, case.heads)
    return position_tensor(name, case, gen)


OPS = [
    OpSpec(
        "distance_aware",
        {**QKV, "distance_weight": PARAM, "sharpness": PARAM},
        make_param,
        lambda p, pad, c, o: distance_aware_attention(
            p["q"], p["k"], p["v"], p["distance_weight"], p["sharpness"], key_padding_mask=pad, causal=c, query_offset=o
        ),
        lambda p, pad, c, o: reference_distance_aware(p, to_numpy(pad), c, o),
    ),
]

# no fused path: the coefficient multiplies ReLU(QK^T), it is not an additive logit bias
FUSED_RUNS = {}


# --------------------------------------------------------------------------
# properties of the mechanism
# --------------------------------------------------------------------------


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


def test_distance_coefficients_are_read_from_a_memo_without_gradients_until_a_parameter_changes():
    """Without gradients (decoding) the coefficients come from a table over distances kept
    per parameter (position_tables.values_by_distance), sliced per call; it gives what the
    call's own evaluation gives, grows as the offsets reach further, and is rebuilt once
    a parameter changes in place (an optimizer step, a checkpoint loaded into it) or the
    tables are forgotten."""
    from fairseq_distattn.functional.distance_aware import distance_coefficient_table
    from fairseq_distattn.functional.position_tables import forget_tables_by_distance

    weight = torch.tensor([0.3, -0.2], requires_grad=True)
    sharpness = torch.tensor([1.0, 0.5], requires_grad=True)

    def table(tgt_len, src_len, query_offset):
        return distance_coefficient_table(weight, sharpness, tgt_len, src_len, query_offset).values

    evaluated = table(1, 9, 8)  # with gradients: evaluated for the call
    assert evaluated.requires_grad
    with torch.no_grad():
        step = table(1, 9, 8)
        assert_close(step, evaluated.detach())
        assert step.data_ptr() == table(1, 9, 8).data_ptr()  # the same memo, sliced again
        assert table(1, 10, 9).untyped_storage().data_ptr() == step.untyped_storage().data_ptr()
        far = table(1, 200, 199)  # beyond the memo's reach: grown
        with torch.enable_grad():
            assert_close(far, table(1, 200, 199).detach())
        assert_close(table(3, 6, 0), distance_coefficient_table(weight.detach(), sharpness.detach(), 3, 6, 0).values)
        weight.mul_(2.0)
        with torch.enable_grad():
            changed = table(1, 9, 8).detach()
        assert not torch.allclose(changed, evaluated.detach())
        assert_close(table(1, 9, 8), changed)
        # fairseq's optimizers write through .data, which moves no version counter: the memo
        # cannot see that, and is rebuilt once forgotten (as every model.train()/eval() does)
        weight.data.mul_(2.0)
        assert_close(table(1, 9, 8), changed)
        forget_tables_by_distance()
        with torch.enable_grad():
            stepped = table(1, 9, 8).detach()
        assert not torch.allclose(stepped, changed)
        assert_close(table(1, 9, 8), stepped)
