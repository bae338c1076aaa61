"""The fused ``need_weights=False`` path (F.scaled_dot_product_attention with
an additive bias) computes exactly what the explicit path computes, values
and gradients, including padded rows with no visible key."""

import pytest
import torch

from fairseq_distattn import functional as DF

B, H, T, D = 3, 2, 6, 4


def tensors(seed, *shapes):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True) for shape in shapes]


def padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, :2] = True  # left padding
    mask[2, -3:] = True  # right padding: with causal, row 2's last queries still see real keys
    return mask


def rpr_keys_only(q, k, v, rel_keys, **kw):
    return DF.relative_position_attention(q, k, v, rel_keys, None, 2, **kw)


def distance_mask(q, k, v, **kw):
    return DF.distance_mask_attention(q, k, v, 0.7, direction="forward", **kw)


def additive_window(q, k, v, q_local, k_local, q_left, k_left, q_right, k_right, **kw):
    mask = DF.window_mask(
        q_left,
        k_left,
        q_right,
        k_right,
        2,
        key_padding_mask=kw["key_padding_mask"],
        causal=kw["causal"],
        query_offset=kw["query_offset"],
    )
    return DF.additive_window_attention(q, k, q_local, k_local, v, mask, **kw)


def qvi(q, k, v, value_projection, gate_weight, **kw):
    return DF.query_value_interaction_attention(
        q, k, v, value_projection, gate_weight, torch.zeros(H, dtype=torch.float64), **kw
    )


def alibi(q, k, v, **kw):
    return DF.alibi_attention(q, k, v, **kw)


def t5_bias(q, k, v, table, **kw):
    return DF.t5_bias_attention(q, k, v, table, **kw)


def plain(q, k, v, **kw):
    return DF.softmax_attention(q, k, v, **kw)


OPS = {
    "rpr-keys-only": (rpr_keys_only, [(5, D)]),
    "distance-mask": (distance_mask, []),
    "window-aw-seg": (additive_window, [(B, H, T, D)] * 6),
    "qvi": (qvi, [(H, D, D), (H, 2 * D)]),
    "softmax": (plain, []),
    "alibi": (alibi, []),
    "t5-bias": (t5_bias, [(32, H)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("causal", [False, True])
def test_fused_path_equals_explicit_path(name, causal):
    op, extra_shapes = OPS[name]
    inputs = tensors(0, (B, H, T, D), (B, H, T, D), (B, H, T, D), *extra_shapes)
    options = dict(key_padding_mask=padding(), causal=causal, query_offset=0)
    explicit, probs = op(*inputs, **options)
    fused, no_probs = op(*inputs, need_weights=False, **options)
    assert probs is not None and no_probs is None
    torch.testing.assert_close(fused, explicit)
    grad = torch.randn_like(explicit)
    explicit_grads = torch.autograd.grad(explicit, inputs, grad)
    fused_grads = torch.autograd.grad(fused, inputs, grad)
    for a, b in zip(fused_grads, explicit_grads):
        torch.testing.assert_close(a, b)


def test_fused_path_gives_zero_for_a_row_with_no_visible_key():
    q, k, v = tensors(1, (1, 1, 3, D), (1, 1, 3, D), (1, 1, 3, D))
    everything_padded = torch.ones(1, 3, dtype=torch.bool)
    out, _ = DF.softmax_attention(q, k, v, key_padding_mask=everything_padded, need_weights=False)
    assert torch.equal(out, torch.zeros_like(out))
