"""Masks are exact in half precision: -inf (never a large negative constant
that overflows or leaks mass), so padded batches stay finite in bfloat16 and
float16 and give no probability to padding."""
import pytest
import torch

from fairseq_distattn import functional as DF
from fairseq_distattn.spec import MECHANISMS

from .model_helpers import TINY, left_pad, random_tokens, right_pad, translation_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mechanism", [m for m in MECHANISMS if m != "vanilla"])
def test_model_forward_is_finite_in_half_precision(mechanism, dtype):
    cross = mechanism if mechanism.startswith("window") else "vanilla"
    self_spec = mechanism if not mechanism.endswith("-seg") else "vanilla"
    model, d = translation_model(extra=[*TINY, "--encoder-self-attention", mechanism,
                                        "--decoder-self-attention", self_spec, "--cross-attention", cross])
    model = model.to(dtype)
    sources = [random_tokens(d, 1, n, seed=n)[0] for n in (7, 3)]
    targets = [random_tokens(d, 1, n, seed=10 + n)[0] for n in (2, 5)]
    out = model(left_pad(sources, d.pad()), torch.tensor([7, 3]), right_pad(targets, d.pad()))[0]
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_padding_gets_exactly_zero_probability_in_half_precision(dtype):
    q, k, v = (torch.randn(2, 2, 4, 8).to(dtype) * 30 for _ in range(3))
    padding = torch.tensor([[True, False, False, False], [False, False, False, True]])
    _, probs = DF.distance_mask_attention(q, k, v, 1000.0, key_padding_mask=padding)
    assert torch.isfinite(probs).all()
    assert (probs[0, :, :, 0] == 0).all() and (probs[1, :, :, 3] == 0).all()
