"""Transformer-XL's relative attention (Dai, Yang, Yang, Carbonell, Le,
Salakhutdinov 2019, *Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context*, sec. 3.3).

The logit of query i and key j, with the absolute embeddings taken out of the
inputs and the key's position replaced by the relative one:

    A_ij = q_i k_j  +  q_i W_R R_{i-j}  +  u k_j  +  v W_R R_{i-j}
           (a)         (b)                (c)       (d)

``R`` the sinusoids of the distance ``i - j`` (not learned), ``W_R`` a learned
projection of them, ``u`` and ``v`` learned vectors per head that replace the
query in the position-free terms. As the authors' PyTorch code
(kimiyoung/transformer-xl, ``pytorch/mem_transformer.py``,
``RelPartialLearnableMultiHeadAttn``) computes it: ``(a) + (c)`` as
``(q + u) k``, ``(b) + (d)`` as ``(q + v) W_R R``, both scaled by
``1/sqrt(d_head)``; ``R`` is ``[sin(x f), cos(x f)]`` concatenated (not
interleaved), ``f = 10000^(-2i/d_model)``, ``d_model`` wide; ``W_R`` maps it to
every head's ``d_head``. Keys after the query have a negative distance, which
the causal mask hides in the decoder; the encoder uses them (XLNet's
two-stream form: distances from ``klen`` down to ``-qlen``). The paper's
segment-level recurrence is a training scheme, not an attention: not here.

The position terms are formed once per distance the call spans (``Tq + Tk -
1`` of them, ``O((Tq + Tk) d)``), then each (query, key) pair reads its own
(the authors' ``_rel_shift``, here a gather).
"""

from typing import Optional

import torch
from torch import Tensor

from .attention import attention_op, full_precision, logit_dtype
from .masking import check_tensor_argument
from .position_tables import offsets
from .terms import Terms


def relative_sinusoids(distances: Tensor, width: int) -> Tensor:
    """``R`` ``[N, width]`` for the float ``distances`` ``[N]``: sin then cos of
    ``distance * 10000^(-2i/width)``, i = 0..width/2 - 1 (the authors' layout)."""
    inverse_frequencies = 1.0 / (
        10000.0 ** (torch.arange(0, width, 2, device=distances.device, dtype=distances.dtype) / width)
    )
    angles = distances[:, None] * inverse_frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def check_transformer_xl_arguments(relative_weight, content_bias, position_bias, q: Tensor) -> None:
    heads, head_dim = q.size(1), q.size(-1)
    for name, value in (("content_bias", content_bias), ("position_bias", position_bias)):
        check_tensor_argument(name, value, "q", q, dtypes=None)  # any floating dtype: converted
        if tuple(value.shape) != (heads, head_dim):
            raise ValueError(f"{name} must be [H, D] = ({heads}, {head_dim}), got {tuple(value.shape)}")
    check_tensor_argument("relative_weight", relative_weight, "q", q, dtypes=None)
    if relative_weight.dim() != 2 or relative_weight.size(0) != heads * head_dim or relative_weight.size(1) % 2:
        raise ValueError(
            f"relative_weight must be [H * D, width] = ({heads * head_dim}, width) with an even width (the "
            f"sinusoids' sin/cos pairs), got {tuple(relative_weight.shape)}"
        )


def relative_position_scores(
    q: Tensor,
    relative_weight: Tensor,
    position_bias: Tensor,
    src_len: int,
    query_offset: int,
    scale: float = 1.0,
    position_map: Optional[Tensor] = None,
) -> Tensor:
    """``scale * (q_i + v) W_R R_{i-j}`` ``[B, H, Tq, Tk]`` in the logit dtype (float32
    for half ``q``, autocast or not: :func:`attention.full_precision`); with a
    ``position_map`` (randomized distances ``r``, Ruoss et al. 2023's ``NOISY_RELATIVE``),
    ``R`` at ``sign(i - j) r_|i - j|``."""
    with full_precision(q):
        return _relative_position_scores(q, relative_weight, position_bias, src_len, query_offset, scale, position_map)


def _relative_position_scores(q, relative_weight, position_bias, src_len, query_offset, scale, position_map) -> Tensor:
    """:func:`relative_position_scores`, in the region it opens."""
    batch, heads, tgt_len, head_dim = q.shape
    dtype = logit_dtype(q.dtype)
    # distance i - j per diagonal: entry j - i + Tq - 1 holds -(j - (query_offset + i))
    distances = -offsets(tgt_len, src_len, query_offset, q.device, dtype, position_map)
    sinusoids = relative_sinusoids(distances, relative_weight.size(1))
    # scaled here, [N, H * D], rather than the [B, H, Tq, Tk] scores
    relative_keys = torch.nn.functional.linear(sinusoids, relative_weight.to(dtype) * scale)
    relative_keys = relative_keys.view(-1, heads, head_dim).permute(1, 2, 0)  # [H, D, N]
    queries = q.to(dtype) + position_bias.to(dtype)[:, None, :]
    # one [B * Tq, D] x [D, N] product per head: a batch-broadcast matmul would run B * H
    # small ones and reduce W_R's gradient over the batch after (slower on CPU; the timing is in
    # commit 84ef476's message)
    queries = queries.transpose(0, 1).reshape(heads, batch * tgt_len, head_dim)
    # [B, H, Tq, N]; N given, as -1 cannot be inferred from an empty product (Tq = 0)
    by_distance = torch.bmm(queries, relative_keys).view(heads, batch, tgt_len, distances.size(0)).transpose(0, 1)
    rows = torch.arange(tgt_len, device=q.device)[:, None]
    columns = torch.arange(src_len, device=q.device)[None, :]
    index = (columns - rows + tgt_len - 1).expand(batch, heads, tgt_len, src_len)
    return by_distance.gather(-1, index)


def transformer_xl_terms(
    q: Tensor,
    k: Tensor,
    relative_weight: Tensor,
    content_bias: Tensor,
    position_bias: Tensor,
    *,
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """Transformer-XL's terms (b) + (d), ``(q + v) W_R R_{i-j} / sqrt(D)``, as a bias, and
    (a) + (c) as the authors form them, ``(q + u) k``: the queries ``q + u`` (the fused
    call's own product). With a ``position_map``, ``R`` of the randomized distances
    (:mod:`.randomized_positions`)."""
    check_transformer_xl_arguments(relative_weight, content_bias, position_bias, q)
    scale = q.size(-1) ** -0.5
    position = relative_position_scores(q, relative_weight, position_bias, k.size(2), query_offset, scale, position_map)
    return Terms(bias=position, query=q + content_bias.to(q.dtype)[:, None, :])


transformer_xl_attention = attention_op(
    transformer_xl_terms,
    "transformer_xl_attention",
    """``softmax(((q + u) k^T + (q + v) W_R R_{i-j}) / sqrt(D)) v`` (self-attention:
    query row i sits at ``query_offset + i`` of the keys) with ``relative_weight``
    ``W_R`` ``[H * D, width]``, ``content_bias`` ``u`` and ``position_bias`` ``v``
    ``[H, D]``. Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; fused with
    ``need_weights=False`` (``q + u`` as SDPA's queries, the position terms as its
    additive mask).""",
)


__all__ = ["relative_sinusoids", "transformer_xl_attention"]
