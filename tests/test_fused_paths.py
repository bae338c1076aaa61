"""The fused ``need_weights=False`` path (F.scaled_dot_product_attention with
an additive bias, or flex_attention on CUDA) computes exactly what the
explicit path computes, values and gradients, including padded rows with no
visible key: for every registered mechanism's op (its module's example call,
tools.examples), at its default options and at every other choice of each of its
options (where a choice decides the path, e.g. rpr's ``--no-relative-values``)."""

import dataclasses

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.registry import option_flag, registered
from fairseq_distattn.tools.examples import ExampleDraw, example_call

B, H, T, D = 3, 2, 6, 4


def option_variants(info):
    """``(label, options)``: the defaults, then each other choice of each option
    that has choices (argparse ``choices``, or a switch)."""
    default = info.default_options()
    variants = [("defaults", default)]
    for field in info.option_fields():
        flag = option_flag(field)
        if flag.argparse.get("action") == "store_true":
            others = [not getattr(default, field.name)]
        else:
            others = [choice for choice in flag.argparse.get("choices", ()) if choice != getattr(default, field.name)]
        for value in others:
            variants.append((f"{field.name}={value}", dataclasses.replace(default, **{field.name: value})))
    return variants


CASES = [(info, label, options) for info in registered() for label, options in option_variants(info)]


def padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, :2] = True  # left padding
    mask[2, -3:] = True  # right padding: with causal, row 2's last queries still see real keys
    return mask


@pytest.mark.parametrize("info, label, options", CASES, ids=[f"{info.name}-{label}" for info, label, _ in CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_path_equals_explicit_path(info, label, options, causal):
    draw = ExampleDraw(B, H, T, T, D, requires_grad=True)
    call = example_call(info, draw, options)
    shared = dict(key_padding_mask=padding(), causal=causal, query_offset=0)
    explicit, probs = call(**shared)
    fused, no_probs = call(need_weights=False, **shared)
    assert probs is not None and no_probs is None
    torch.testing.assert_close(fused, explicit)
    grad = torch.randn_like(explicit)
    explicit_grads = torch.autograd.grad(explicit, draw.leaves, grad, allow_unused=True)
    fused_grads = torch.autograd.grad(fused, draw.leaves, grad, allow_unused=True)
    for a, b in zip(fused_grads, explicit_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_fused_path_gives_zero_for_a_row_with_no_visible_key():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 3, D, generator=generator, dtype=torch.float64) for _ in range(3))
    everything_padded = torch.ones(1, 3, dtype=torch.bool)
    out, _ = functional.softmax_attention(q, k, v, key_padding_mask=everything_padded, need_weights=False)
    assert torch.equal(out, torch.zeros_like(out))
