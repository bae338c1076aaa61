"""FIRE: functional interpolation for relative positions (Li, You, Guruganesh,
Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar, Bhojanapalli 2024, *Functional
Interpolation for Relative Positions Improves Long Context Transformers*,
sec. 3).

Eq. (4)-(5): a bias on the logits of query position i and key position j,

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1),

f_theta a small MLP from the normalised distance to one value per head, c > 0
and the threshold L learned. Normalising by the query's own position
(progressive interpolation) maps every distance a query can see into [0, 1]
whatever the length, and the threshold keeps short contexts from being
stretched over that whole range.

As the paper's reference listing (its appendix) writes it: positions are
0-based; ``psi`` is taken of ``|c (i - j)|`` and ``|c max(L, i)|`` (so the
sign of c does not matter), with 1e-6 added to the denominator's logarithm;
L is ``|m L0|``, a learned multiplier m (initially 1) of a fixed initial
threshold L0 (512); c starts at 0.1; f is Linear(1, 32), ReLU,
Linear(32, H). The listing's distance is symmetric, so the encoder gets the
same bias both ways; the causal mask hides keys after the query in the
decoder. The bias is added to the scaled scores.

A sentence's positions count from its first real token (fairseq left-pads
sources), so its bias is the same alone and in a padded batch; that makes
the normaliser, and so the bias, depend on the sentence where the batch has
left padding: ``[B, H, Tq, Tk]`` then, ``[1, H, Tq, Tk]`` without padding.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_op, full_precision, logit_dtype
from .masking import check_tensor_argument, sequence_positions
from .position_tables import check_position_arguments
from .randomized_positions import map_positions
from .terms import Terms

FIRE_EPS = 1e-6
FIRE_INITIAL_C = 0.1
FIRE_INITIAL_THRESHOLD = 512.0
FIRE_MLP_WIDTH = 32


def check_fire_arguments(c, threshold, hidden_weight, hidden_bias, output_weight, output_bias, num_heads=None):
    for name, value in (("c", c), ("threshold", threshold)):
        check_tensor_argument(name, value)
        if value.dim() != 0:
            raise ValueError(f"{name} must be a scalar (0-d) tensor, got shape {tuple(value.shape)}")
    for name, value, dims in (
        ("hidden_weight", hidden_weight, 1),
        ("hidden_bias", hidden_bias, 1),
        ("output_weight", output_weight, 2),
        ("output_bias", output_bias, 1),
    ):
        check_tensor_argument(name, value)
        if value.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimension(s), got shape {tuple(value.shape)}")
    width = hidden_weight.size(0)
    if hidden_bias.size(0) != width or output_weight.size(1) != width:
        raise ValueError(
            f"the MLP's widths disagree: hidden_weight [{width}], hidden_bias [{hidden_bias.size(0)}], "
            f"output_weight [H, {output_weight.size(1)}]"
        )
    if output_bias.size(0) != output_weight.size(0):
        raise ValueError(f"output_bias must be [H] = ({output_weight.size(0)},), got {tuple(output_bias.shape)}")
    if num_heads is not None and output_weight.size(0) != num_heads:
        raise ValueError(f"output_weight must be [H, width] with H = {num_heads}, got {tuple(output_weight.shape)}")


def check_self_attention_lengths(tgt_len: int, src_len: int, query_offset: int) -> None:
    if src_len < tgt_len + query_offset:
        raise ValueError(
            f"self-attention keys: src_len ({src_len}) must be at least tgt_len + query_offset "
            f"({tgt_len} + {query_offset})"
        )


def normalized_distance(
    c: Tensor, threshold: Tensor, query_positions: Tensor, key_positions: Tensor, eps: float = FIRE_EPS
) -> Tensor:
    """``psi(i - j) / psi(max(L, i))`` for ``query_positions`` ``[B|1, Tq]`` and
    ``key_positions`` ``[B|1, Tk]`` (0-based): ``[B|1, Tq, Tk]`` in ``c``'s dtype."""
    query = query_positions.to(c.dtype)
    distance = query[:, :, None] - key_positions.to(c.dtype)[:, None, :]
    numerator = torch.log1p((c * distance).abs())
    denominator = torch.log1p((c * torch.maximum(query, threshold)).abs()) + eps
    return numerator / denominator[:, :, None]


def fire_bias(
    c: Tensor,
    threshold: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
    tgt_len: int,
    src_len: int,
    query_offset: int = 0,
    key_padding_mask: Optional[Tensor] = None,
    dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """``f_theta(psi(i - j) / psi(max(L, i)))`` as ``[B|1, H, Tq, Tk]`` (``B`` where
    ``key_padding_mask`` is given: positions count from each sequence's first
    real key), computed in ``dtype`` (None: the parameters'). The MLP is
    ``output_weight [H, W] relu(hidden_weight [W] x + hidden_bias) + output_bias``."""
    check_fire_arguments(c, threshold, hidden_weight, hidden_bias, output_weight, output_bias)
    check_position_arguments(tgt_len, src_len, query_offset)
    check_self_attention_lengths(tgt_len, src_len, query_offset)
    return _fire_bias(
        c,
        threshold,
        hidden_weight,
        hidden_bias,
        output_weight,
        output_bias,
        tgt_len,
        src_len,
        query_offset,
        key_padding_mask,
        dtype,
    )


def _fire_bias(
    c,
    threshold,
    hidden_weight,
    hidden_bias,
    output_weight,
    output_bias,
    tgt_len,
    src_len,
    query_offset,
    key_padding_mask,
    dtype,
    position_map=None,
) -> Tensor:
    """:func:`fire_bias` unchecked; with a ``position_map`` (randomized positions ``p``,
    :mod:`.randomized_positions`), the bias of the query and key at ``p_i`` and ``p_j``."""
    dtype = dtype or c.dtype
    device = c.device
    mlp = (c, threshold, hidden_weight, hidden_bias, output_weight, output_bias, dtype)

    def placed(positions: Tensor) -> Tensor:
        return positions if position_map is None else map_positions(positions, position_map)

    key_positions = sequence_positions(key_padding_mask, src_len, 0, device)
    query_positions = key_positions[:, query_offset : query_offset + tgt_len]
    rows = query_offset + tgt_len  # every position a padded row's query can have: 0 .. rows - 1
    if key_padding_mask is None or rows >= key_positions.size(0) * tgt_len:
        return _fire_mlp(*mlp, placed(query_positions), placed(key_positions))
    # A padded row's (query, key) positions are a pair of the unpadded rows: the MLP runs
    # once over those [rows, Tk] pairs and each row gathers its own, instead of running
    # over [B, Tq, Tk] (W times the attention's elements per layer)
    unpadded = torch.arange(src_len, device=device)[None]
    table = _fire_mlp(*mlp, placed(unpadded[:, :rows]), placed(unpadded))[0].flatten(1)  # [H, rows * Tk]
    pairs = query_positions[:, :, None] * src_len + key_positions[:, None, :]  # [B, Tq, Tk]
    return table[:, pairs].transpose(0, 1)


def _fire_mlp(
    c, threshold, hidden_weight, hidden_bias, output_weight, output_bias, dtype, query_positions, key_positions
):
    """The bias ``[B|1, H, Tq, Tk]`` at these ``[B|1, Tq]`` query and ``[B|1, Tk]`` key positions."""
    x = normalized_distance(c.to(dtype), threshold.to(dtype), query_positions, key_positions)
    hidden = F.relu(x[..., None] * hidden_weight.to(dtype) + hidden_bias.to(dtype))
    bias = F.linear(hidden, output_weight.to(dtype), output_bias.to(dtype))  # [B|1, Tq, Tk, H]
    return bias.permute(0, 3, 1, 2)


def fire_terms(
    q: Tensor,
    k: Tensor,
    c: Tensor,
    threshold: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
    *,
    key_padding_mask: Optional[Tensor],
    query_offset: int,
    position_map: Optional[Tensor],
) -> Terms:
    """FIRE's bias ``f_theta(psi(i - j) / psi(max(L, i)))``, ``[B, H, Tq, Tk]``: L is
    each sentence's length, so the bias has a batch dimension. With a ``position_map``
    (randomized positions ``p``), ``psi(p_i - p_j) / psi(max(L, p_i))``: FIRE reads the
    query's own position as well as the distance, so it takes sampled positions, as RoPE
    does, not the sampled distances of the tables read by ``j - i`` (Ruoss et al. have
    no FIRE)."""
    check_fire_arguments(c, threshold, hidden_weight, hidden_bias, output_weight, output_bias, q.size(1))
    check_self_attention_lengths(q.size(2), k.size(2), query_offset)
    for name, value in (("c", c), ("output_weight", output_weight)):
        check_tensor_argument(name, value, "q", q, dtypes=None)  # any floating dtype: converted
    # the MLP's F.linear in the logit dtype: autocast would round it to half
    with full_precision(q):
        bias = _fire_bias(
            c,
            threshold,
            hidden_weight,
            hidden_bias,
            output_weight,
            output_bias,
            q.size(2),
            k.size(2),
            query_offset,
            key_padding_mask,
            logit_dtype(q.dtype),
            position_map,
        )
    return Terms(bias=bias)


fire_attention = attention_op(
    fire_terms,
    "fire_attention",
    """``softmax(q k^T / sqrt(D) + f_theta(psi(i - j) / psi(max(L, i)))) v``
    (self-attention: query row i sits at ``query_offset + i`` of the keys).
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; fused with ``need_weights=False``.""",
)


__all__ = ["fire_attention", "fire_bias"]
