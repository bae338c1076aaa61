"""The logits of the weights path (``need_weights=True``) are formed in float32 for
half inputs, QK^T included: float16 queries and keys whose dot products pass 65504
give the float64 answer on the same rounded inputs, not NaN, for every registered
mechanism's op (its module's example call, tools.examples, at its defaults and
at every other choice of each of its options) and for ``softmax_attention``.

Before, QK^T was formed in float16 and widened after: the product was inf already,
and the softmax turned inf - inf into NaN. The fused path (SDPA) never had the
problem, its kernels accumulate in float32."""

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.registry import REGISTRY, registered
from fairseq_distattn.tools.examples import ExampleDraw, example_call

from .functional_cases import single_thread_torch  # noqa: F401 (autouse: one torch thread in this module)
from .test_fused_paths import option_variants

B, H, T, D = 2, 2, 6, 4
# q and k entries of std 2^9: |q . k| / sqrt(D) has std 2^18 = 262144, four times float16's
# largest value (65504) and far inside float32's. A power of two, so scaling the drawn
# (float16-rounded) values is exact in both dtypes and both calls see the same inputs.
SCALE = 2.0**9
# The softmax saturates at such logits: an output row is its largest logit's value row,
# rounded to float16 (2^-11), the weights 0 or 1; a wrong key or a NaN fails by far.
TOLERANCE = dict(rtol=4e-3, atol=4e-3)

CASES = [(info.name, label, options) for info in registered() for label, options in option_variants(info)]
CASES.insert(0, ("vanilla", "softmax_attention", None))


def large_call(name, options, dtype):
    """``(call(**shared) -> (out, probs))`` of mechanism ``name``'s example call (vanilla:
    ``softmax_attention``) with every query- and key-side tensor but the values scaled
    by :data:`SCALE`; drawn rounded to float16, so each dtype gets the same values."""
    draw = ExampleDraw(B, H, T, T, D, dtype=dtype, rounded_to=torch.float16, query_scale=SCALE)
    if name == "vanilla":
        q, k, v = draw.query(), draw.key() * SCALE, draw.key()
        return lambda **shared: functional.softmax_attention(q, k, v, **shared)
    call = example_call(REGISTRY[name], draw, options)
    call.keys.update((key, tensor * SCALE) for key, tensor in call.keys.items() if key != "value")
    return call


def padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, -2:] = True
    return mask


@pytest.mark.parametrize("autocast", [False, True], ids=["no-autocast", "autocast"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name, label, options", CASES, ids=[f"{name}-{label}" for name, label, _ in CASES])
def test_half_weights_path_with_products_beyond_float16_matches_float64(name, label, options, causal, autocast):
    """Under autocast (fairseq's ``--amp``; float16 on the CPU here) too: it would run
    the float32 products in float16 again."""
    shared = dict(key_padding_mask=padding(), causal=causal, need_weights=True)
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        out, probs = large_call(name, options, torch.float16)(**shared)
    exact_out, exact_probs = large_call(name, options, torch.float64)(**shared)
    assert out.dtype == probs.dtype == torch.float16
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(out.double(), exact_out, **TOLERANCE)
    torch.testing.assert_close(probs.double(), exact_probs, **TOLERANCE)


def rpr(q, k, v, table, **shared):
    return functional.relative_position_attention(q, k, v, table, table.flip(0), 2, **shared)


def cope(q, k, v, table, **shared):
    return functional.cope_attention(q, k, v, table.t(), **shared)


@pytest.mark.parametrize("tgt_len", [T, 1], ids=["block", "one-query"])
@pytest.mark.parametrize("op", [rpr, cope], ids=lambda op: op.__name__)
def test_half_position_terms_with_products_beyond_float16_match_float64(op, tgt_len):
    """The position terms that multiply the queries with a table (rpr's q . a^K, eq. 4;
    CoPE's q . e[p], eq. 5) are logit terms as QK^T is: with queries and a table of
    entries near 2^9 they pass 65504 too, while QK^T (keys of entries near 1) does not."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=generator, dtype=torch.float64) for _ in range(3))
    table = torch.randn(5, D, generator=generator, dtype=torch.float64) * SCALE
    q = (q * SCALE)[:, :, T - tgt_len :]
    shared = dict(key_padding_mask=padding(), causal=True, query_offset=T - tgt_len)
    inputs = [t.half() for t in (q, k, v, table)]
    out, probs = op(*inputs, **shared)
    exact_out, exact_probs = op(*(t.double() for t in inputs), **shared)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(out.double(), exact_out, **TOLERANCE)
    torch.testing.assert_close(probs.double(), exact_probs, **TOLERANCE)
