"""DAPE: data-adaptive positional encoding (Zheng, Gao, Shi, Huang, Li, Xiong,
Ren, Ng, Jiang, Li, Li 2024, *DAPE: Data-Adaptive Positional Encoding for
Length Extrapolation*, NeurIPS 2024).

A static position bias ``B`` (ALiBi's, KERPLE's, FIRE's: one value per head
and query-key pair) is made data-adaptive by a small MLP ``f`` that reads the
attention scores together with it, per query-key pair, across the heads:

    logits_ij = A_ij + B_ij + f([A_ij; B_ij]),    A = q k^T / sqrt(D)

where ``A_ij`` and ``B_ij`` are the ``H`` values of the pair (i, j), stacked to
``2H`` channels (scores first, then the bias), and

    f(x) = W2 LeakyReLU(W1 x + b1) + b2,    W1 [W, 2H], W2 [H, W]

maps them back to one value per head. ``B`` stays in the logits as a
residual term next to the MLP's correction.

As the authors' code has it (github chuanyang-Zheng/DAPE, commit
bde344a844f2bd1f498b2bac70240dcda41c50c1, ``megatron/model/positional_embeddings.py``:
``AliBi_C``, ``ParallelKerpleLog_C``, ``FIRE_C``, the ``pos_emb`` settings
``alibi_c``, ``kerple_c``, ``fire_c`` that the README names DAPE-ALiBi,
DAPE-Kerple and DAPE-FIRE; the same classes, as ``*_DAPE``, in its top-level
``DAPE.py``; called from ``megatron/model/transformer.py``):

* ``A`` is the scaled score ``q k^T / sqrt(D)`` (``baddbmm`` with ``alpha = 1 /
  norm_factor``; query-key layer scaling is off by default), before any mask:
  the MLP reads the raw scores, and the causal mask (and padding) are applied
  to the finished logits afterwards by the masked softmax. As ``f`` acts on
  each pair (i, j) alone, the entries that the mask hides never reach a
  visible one; here :func:`attention.attend` adds its ``-inf`` mask to the
  finished logits likewise.
* ``f`` is ``nn.Sequential(Linear(2H, W), LeakyReLU(), Linear(W, H))``: both
  layers with biases, LeakyReLU's default negative slope 0.01, width ``W`` the
  config's ``mlp_width``, 32 in every DAPE config (``configs/125M/512/*_c.yml``,
  12 heads); the input channels are ``cat((scores, bias), dim=heads)``.
* The result is ``scores + bias + f(cat(scores, bias))``.
* The static biases: ALiBi's ``-m_h (i - j)`` with the usual slopes
  (:func:`alibi.alibi_bias`), KERPLE's logarithmic ``-p_h log(1 + a_h (i - j))``
  with ``p, a`` clamped to >= 1e-2 (:func:`kerple.kerple_bias` with ``r1 = p``,
  ``r2 = a``; initialised uniform in [0, 2) and [0, 1)), or FIRE's. The code
  takes ``tril`` of the distance, which only changes entries the causal mask
  hides. The caller forms ``bias`` here; the op takes any static bias.

What differs:

* The code is a causal language model. Nothing in ``f`` needs causality (it
  reads one pair at a time), so the op also runs bidirectionally (an encoder,
  cross-attention): the same arithmetic without the causal mask, on whatever
  ``bias`` the caller gives (e.g. ALiBi's symmetric ``-m |i - j|``).
* The authors' fp16 model runs the MLP in half precision; here, as for every
  term of the logits, half inputs form the scores, the bias and ``f`` in
  float32 (:func:`attention.logit_dtype`), with autocast off for it.
* The code's DAPE-FIRE bias uses a LeakyReLU inside FIRE's own MLP too, where
  :func:`fire.fire_bias` has FIRE's ReLU: a caller after DAPE-FIRE exactly forms
  that bias itself.
* The paper's text was not at hand to re-check against the code; the
  combination above (scores, bias as a residual, and the MLP's correction)
  is the code's.

The first layer is split as ``W1 [A; B] = W1_A A + W1_B B``: the bias's half,
which has no batch axis, is computed once instead of once per sequence (the
same sum, rounded differently only in its last bits).
"""

import numbers
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_op, full_precision
from .masking import check_tensor_argument
from .terms import Terms

DAPE_MLP_WIDTH = 32  # the authors' mlp_width in every DAPE config
DAPE_NEGATIVE_SLOPE = 0.01  # nn.LeakyReLU's default, as the authors' MLP uses it


def check_dape_arguments(
    q: Tensor,
    k: Tensor,
    bias: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
    negative_slope: float,
) -> None:
    """ValueError naming the argument unless ``bias`` broadcasts to ``[B, H, Tq,
    Tk]`` (3 or 4 dims) and the MLP is ``[W, 2H]``, ``[W]``, ``[H, W]``, ``[H]``;
    every tensor floating point on ``q``'s device (any floating dtype: converted)."""
    batch, heads, tgt_len, src_len = q.size(0), q.size(1), q.size(2), k.size(2)
    for name, value in (
        ("bias", bias),
        ("hidden_weight", hidden_weight),
        ("hidden_bias", hidden_bias),
        ("output_weight", output_weight),
        ("output_bias", output_bias),
    ):
        check_tensor_argument(name, value, "q", q, dtypes=None)
    target = (batch, heads, tgt_len, src_len)
    if bias.dim() not in (3, 4) or any(size not in (1, wanted) for size, wanted in zip(bias.shape[::-1], target[::-1])):
        raise ValueError(
            f"bias must be [H, Tq, Tk] or [B, H, Tq, Tk] = {target} (or 1 where it broadcasts), got {tuple(bias.shape)}"
        )
    if hidden_weight.dim() != 2 or hidden_weight.size(1) != 2 * heads:
        raise ValueError(
            f"hidden_weight must be [W, 2H] = [W, {2 * heads}] (scores and bias of every head), "
            f"got {tuple(hidden_weight.shape)}"
        )
    width = hidden_weight.size(0)
    if tuple(hidden_bias.shape) != (width,):
        raise ValueError(f"hidden_bias must be [W] = ({width},), got {tuple(hidden_bias.shape)}")
    if tuple(output_weight.shape) != (heads, width):
        raise ValueError(f"output_weight must be [H, W] = {(heads, width)}, got {tuple(output_weight.shape)}")
    if tuple(output_bias.shape) != (heads,):
        raise ValueError(f"output_bias must be [H] = ({heads},), got {tuple(output_bias.shape)}")
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, numbers.Real):
        raise ValueError(f"negative_slope must be a real number, got {negative_slope!r}")


def dape_logits(
    scores: Tensor,
    bias: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
    negative_slope: float = DAPE_NEGATIVE_SLOPE,
) -> Tensor:
    """``A + B + f([A; B])`` for the scores ``A`` ``[B, H, Tq, Tk]`` and the
    bias ``B`` broadcastable to them, in the scores' dtype (unchecked)."""
    heads, dtype = scores.size(1), scores.dtype
    bias = bias.to(dtype)
    if bias.dim() == 3:
        bias = bias[None]
    bias = bias.expand(bias.size(0), heads, scores.size(2), scores.size(3))
    first = hidden_weight.to(dtype)
    # W1 [A; B] + b1 = W1_A A + (W1_B B + b1): the bias's term once, broadcast over the batch
    from_bias = F.linear(bias.permute(0, 2, 3, 1), first[:, heads:], hidden_bias.to(dtype))  # [1|B, Tq, Tk, W]
    hidden = torch.matmul(scores.permute(0, 2, 3, 1), first[:, :heads].t()) + from_bias  # [B, Tq, Tk, W]
    hidden = F.leaky_relu(hidden, negative_slope)
    adaptive = F.linear(hidden, output_weight.to(dtype), output_bias.to(dtype)).permute(0, 3, 1, 2)
    return scores + bias + adaptive


def dape_terms(
    q: Tensor,
    k: Tensor,
    bias: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    output_weight: Tensor,
    output_bias: Tensor,
    *,
    negative_slope: float = DAPE_NEGATIVE_SLOPE,
) -> Terms:
    """DAPE's score modification ``A -> A + B + f([A; B])`` (:func:`dape_logits`)."""
    check_dape_arguments(q, k, bias, hidden_weight, hidden_bias, output_weight, output_bias, negative_slope)
    mlp = (hidden_weight, hidden_bias, output_weight, output_bias, float(negative_slope))

    def adapted(scaled_scores: Tensor, mask: Optional[Tensor]) -> Tensor:
        # the MLP's products in the logit dtype: autocast would round them to half
        with full_precision(q):
            return dape_logits(scaled_scores, bias, *mlp)

    return Terms(score_mod=adapted)


dape_attention = attention_op(
    dape_terms,
    "dape_attention",
    """``softmax(A + B + f([A; B])) v`` with ``A = q k^T / sqrt(D)``, the static
    position ``bias`` ``B`` (``[H|1, Tq, Tk]`` or ``[B|1, H|1, Tq, Tk]`` for these
    queries, e.g. :func:`kerple.kerple_bias` or :func:`alibi.alibi_bias` with
    ``query_offset``) and the MLP ``f(x) = output_weight LeakyReLU(hidden_weight x
    + hidden_bias) + output_bias`` over the ``2H`` channels (scores, then bias) of
    each query-key pair: ``hidden_weight`` ``[W, 2H]``, ``hidden_bias`` ``[W]``,
    ``output_weight`` ``[H, W]``, ``output_bias`` ``[H]`` (the authors' W is 32).
    The masks apply to the finished logits; causal and bidirectional alike.
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])`` (``probs`` None unless
    ``need_weights``); no fused path: the MLP needs the scores.""",
)


__all__ = ["dape_attention"]
