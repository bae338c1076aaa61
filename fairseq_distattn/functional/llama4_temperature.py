"""Llama 4's attention temperature tuning, the query scaling of its NoPE layers (Meta AI
2025, *The Llama 4 herd*).

Restated from Hugging Face transformers 4.57.1,
``transformers/models/llama4/modeling_llama4.py``, ``Llama4TextAttention.forward``: in a
layer without rope (``config.no_rope_layers[layer_idx] == 0``) and with
``config.attn_temperature_tuning``, the projected query of the token at ``cache_position``
``p`` is multiplied, before the attention's ``1/sqrt(head_dim)``, by

    1 + attn_scale * log1p(floor((p + 1) / floor_scale))

(:func:`.rotary_scaling.llama4_attention_scales`), and the attention is then the plain
causal softmax attention; the keys and values are untouched. ``p`` is the query's 0-based
index among the keys (``past_seen_tokens + i``): ``query_offset + i`` here, the same for
every sentence of a batch. HF's defaults (``configuration_llama4.py``,
``Llama4TextConfig``) are ``floor_scale`` 8192 and ``attn_scale`` 0.1: the factor is 1
up to position 8190. HF forms the factor in float32 and rounds the product back to the
query's dtype (``(query_states * attn_scales).to(query_states.dtype)``); here the factor
is formed in float64 and the product taken in the logit dtype (float32 for half inputs,
else the query's) before the same rounding. ``attn_scale`` 0 gives the factor 1:
HF's ``attn_temperature_tuning=False``.
"""

import torch
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import position_tensor
from .rotary_scaling import llama4_attention_scales
from .terms import Terms

# HF transformers 4.57.1, configuration_llama4.py, Llama4TextConfig's defaults
FLOOR_SCALE = 8192.0
ATTN_SCALE = 0.1


def llama4_query_scales(
    tgt_len: int, query_offset: int, floor_scale: float, attn_scale: float, device, dtype
) -> Tensor:
    """The factor of each of ``tgt_len`` queries at ``query_offset + i`` as ``[Tq, 1]``
    in ``dtype`` (formed in float64 on the CPU, exactly as the peer test restates HF's
    arithmetic). Shared: a decoding step asks for the same factors in every NoPE layer,
    so they are formed and copied to the device once (:func:`masking.position_tensor`)."""
    return _query_scales(tgt_len, 1, query_offset, float(floor_scale), float(attn_scale), torch.device(device), dtype)


@position_tensor
def _query_scales(tgt_len: int, _, query_offset: int, floor_scale: float, attn_scale: float, device, dtype) -> Tensor:
    positions = torch.arange(query_offset, query_offset + tgt_len, dtype=torch.int64)
    return llama4_attention_scales(positions, floor_scale, attn_scale).to(device=device, dtype=dtype)[:, None]


def llama4_temperature_terms(
    q: Tensor, k: Tensor, floor_scale: float = FLOOR_SCALE, attn_scale: float = ATTN_SCALE, *, query_offset: int
) -> Terms:
    """The query scaled per position (``Terms(query=...)``), in ``q``'s dtype."""
    dtype = logit_dtype(q.dtype)
    scales = llama4_query_scales(q.size(2), query_offset, floor_scale, attn_scale, q.device, dtype)
    return Terms(query=(q.to(dtype) * scales).to(q.dtype))


llama4_temperature_attention = attention_op(
    llama4_temperature_terms,
    "llama4_temperature_attention",
    """``softmax((s_i q_i) k^T / sqrt(D)) v`` with ``s_i = 1 + attn_scale *
    log1p(floor((query_offset + i + 1) / floor_scale))``, Llama 4's NoPE layers
    (HF's defaults ``floor_scale`` 8192, ``attn_scale`` 0.1). Returns ``(out [B,H,Tq,D],
    probs [B,H,Tq,Tk] or None)``; the plain attention runs fused with
    ``need_weights=False``.""",
)


__all__ = ["llama4_temperature_attention"]
