"""DA-Transformer: distance-aware attention (Wu, Wu, Huang 2021).

Sec. 3.1:  R^(h) = w_h * R,  R_ij = |i - j|  (one learnable w per head)
Eq. (5):   f(R^(h); v_h) = (1 + exp(v_h)) / (1 + exp(v_h - R^(h)))
Eq. (6):   O^(h) = softmax( ReLU(Q K^T) * f(R^(h)) / sqrt(d) ) V

f is evaluated as exp(softplus(v) - softplus(v - R)), which is the same
quantity but never overflows for long sequences or large |w|.

The paper's ablations are options of the same op (defaults: the paper's choice).

Sec. 4.3, the mapping f of the weighted distance x = R^(h) (``mapping``):
  ``learnable-sigmoid``  f(x; v_h) = (1 + exp(v_h)) / (1 + exp(v_h - x))   eq. (5), ours
  ``sigmoid``            f(x) = 1 / (1 + exp(-x))
  ``exponent``           f(x) = exp(x)  (overflows, in float32, beyond x ~ 88.7:
                         the "exponent explosion" the paper reports; not guarded)
  ``linear``             f(x) = k_h x + b_h  (k, b learnable per head, as the paper's
                         subscript i, the head index, says)
  ``clip``               f(x) = min(x, T)  (T a fixed threshold on the weighted distance)

Sec. 4.4, how the coefficients R^ = f(R^(h)) adjust the attention (``adjusting``),
with the raw attention weights S = Q K^T / sqrt(d) of sec. 3.3:
  ``early-multiply``  softmax(ReLU(Q K^T) * R^ / sqrt(d))    eq. (6), ours
  ``early-add``       softmax(S + R^)                       (as Transformer-XL adds its terms)
  ``late-multiply``   softmax(S) * R^
  ``late-add``        softmax(S) + R^
The late weights are used as they are, not renormalised: the paper ascribes their
lower scores to exactly this change of "the total amount of attention". Keys a
query may not see (padding, the future of a causal query) get weight 0 in every
variant; the late ones zero R^ there, or a decoder would leak future values.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_op, logit_dtype
from .masking import check_tensor_argument, in_dtype
from .position_tables import OffsetTable, values_by_distance
from .terms import Terms

DA_MAPPINGS = ("learnable-sigmoid", "sigmoid", "exponent", "linear", "clip")
DA_ADJUSTINGS = ("early-multiply", "early-add", "late-multiply", "late-add")
# the per-head parameters of f besides w, by mapping
MAPPING_PARAMETERS = {"learnable-sigmoid": ("sharpness",), "linear": ("linear_slope", "linear_intercept")}


def check_mapping_arguments(
    mapping: str,
    num_heads: int,
    sharpness: Optional[Tensor],
    linear_slope: Optional[Tensor],
    linear_intercept: Optional[Tensor],
    clip_threshold: Optional[float],
) -> None:
    """ValueError unless ``mapping`` is known and gets exactly the parameters it uses."""
    if mapping not in DA_MAPPINGS:
        raise ValueError(f"mapping must be one of {', '.join(DA_MAPPINGS)}, got {mapping!r}")
    used = MAPPING_PARAMETERS.get(mapping, ())
    for name, parameter in (
        ("sharpness", sharpness),
        ("linear_slope", linear_slope),
        ("linear_intercept", linear_intercept),
    ):
        if name in used and parameter is None:
            raise ValueError(f"mapping {mapping!r} needs {name} ([H], one per head)")
        if name not in used and parameter is not None:
            users = " or ".join(repr(m) for m, names in MAPPING_PARAMETERS.items() if name in names)
            raise ValueError(f"{name} is only used by mapping {users}, not {mapping!r}: pass None")
        if parameter is not None and tuple(parameter.shape) != (num_heads,):
            raise ValueError(f"{name} must be [H] = ({num_heads},), one per head, got {tuple(parameter.shape)}")
    if mapping == "clip":
        if (
            isinstance(clip_threshold, bool)
            or not isinstance(clip_threshold, (int, float))
            or not math.isfinite(clip_threshold)
            or clip_threshold <= 0
        ):
            raise ValueError(f"mapping 'clip' needs clip_threshold, a finite number > 0, got {clip_threshold!r}")
    elif clip_threshold is not None:
        raise ValueError(f"clip_threshold is only used by mapping 'clip', not {mapping!r}: pass None")


def map_weighted_distance(
    weighted: Tensor,
    mapping: str = "learnable-sigmoid",
    sharpness: Optional[Tensor] = None,
    linear_slope: Optional[Tensor] = None,
    linear_intercept: Optional[Tensor] = None,
    clip_threshold: Optional[float] = None,
) -> Tensor:
    """f(x) of eq. (5) or sec. 4.3 for the weighted distances ``weighted`` = w_h |i-j|
    ``[H, Tq, Tk]``; the per-head parameters are ``[H]`` (unchecked: see
    :func:`check_mapping_arguments`)."""
    if mapping == "learnable-sigmoid":
        v = sharpness[:, None, None]
        return torch.exp(F.softplus(v) - F.softplus(v - weighted))
    if mapping == "sigmoid":
        return torch.sigmoid(weighted)
    if mapping == "exponent":
        return torch.exp(weighted)
    if mapping == "linear":
        return torch.addcmul(linear_intercept[:, None, None], linear_slope[:, None, None], weighted)
    if mapping == "clip":
        return weighted.clamp(max=clip_threshold)
    raise ValueError(f"mapping must be one of {', '.join(DA_MAPPINGS)}, got {mapping!r}")


def distance_coefficient_table(
    distance_weight: Tensor,
    sharpness: Optional[Tensor],
    tgt_len: int,
    src_len: int,
    query_offset: int,
    mapping: str = "learnable-sigmoid",
    linear_slope: Optional[Tensor] = None,
    linear_intercept: Optional[Tensor] = None,
    clip_threshold: Optional[float] = None,
    combine: str = "add",
) -> OffsetTable:
    """The coefficients of :func:`distance_coefficients` once per head and key
    offset (:class:`OffsetTable`), applied by ``combine``."""
    check_mapping_arguments(mapping, distance_weight.size(0), sharpness, linear_slope, linear_intercept, clip_threshold)

    def mapped(distance: Tensor) -> Tensor:
        weighted = distance_weight[:, None, None] * distance  # [H, 1, W]
        return map_weighted_distance(weighted, mapping, sharpness, linear_slope, linear_intercept, clip_threshold)[:, 0]

    parameters = (distance_weight, sharpness, linear_slope, linear_intercept)
    values = values_by_distance(
        mapped, parameters, (mapping, clip_threshold), tgt_len, src_len, query_offset, distance_weight.dtype
    )
    return OffsetTable(values, tgt_len, combine)


def distance_coefficients(
    distance_weight: Tensor,
    sharpness: Optional[Tensor],
    tgt_len: int,
    src_len: int,
    query_offset: int,
    mapping: str = "learnable-sigmoid",
    linear_slope: Optional[Tensor] = None,
    linear_intercept: Optional[Tensor] = None,
    clip_threshold: Optional[float] = None,
) -> Tensor:
    """Re-scaled coefficients f(w_h |i-j|) as ``[H, Tq, Tk]``: eq. (5) by default,
    or the sec. 4.3 ``mapping``; ``sharpness`` is v of eq. (5) (None for the others)."""
    return distance_coefficient_table(
        distance_weight,
        sharpness,
        tgt_len,
        src_len,
        query_offset,
        mapping,
        linear_slope,
        linear_intercept,
        clip_threshold,
    ).dense()


def _zero_unseen(weights: Tensor, mask: Optional[Tensor], hidden: Optional[Tensor]) -> Tensor:
    """``weights`` with 0 wherever the additive ``mask`` hides a key and on ``hidden`` rows."""
    if mask is not None:
        weights = weights.masked_fill(torch.isneginf(mask), 0.0)
    if hidden is not None:
        weights = weights.masked_fill(hidden, 0.0)
    return weights


def distance_aware_terms(
    q: Tensor,
    k: Tensor,
    distance_weight: Tensor,
    sharpness: Optional[Tensor],
    *,
    mapping: str = "learnable-sigmoid",
    adjusting: str = "early-multiply",
    linear_slope: Optional[Tensor] = None,
    linear_intercept: Optional[Tensor] = None,
    clip_threshold: Optional[float] = None,
    query_offset: int,
) -> Terms:
    """DA's coefficients ``f(w_h |i - j|)`` (:func:`distance_coefficient_table`) as
    ``adjusting`` applies them: eq. 6's score modification ``ReLU(s) * f``, early-add's
    additive bias, or a modification of the weights (the late ones)."""
    for name, parameter in (
        ("distance_weight", distance_weight),
        ("sharpness", sharpness),
        ("linear_slope", linear_slope),
        ("linear_intercept", linear_intercept),
    ):
        if parameter is not None:  # any floating dtype: they are converted to the logits' dtype
            check_tensor_argument(name, parameter, "q", q, dtypes=None)
    if tuple(distance_weight.shape) != (q.size(1),):
        raise ValueError(
            f"distance_weight must be [H] = ({q.size(1)},), one per head, got {tuple(distance_weight.shape)}"
        )
    if adjusting not in DA_ADJUSTINGS:
        raise ValueError(f"adjusting must be one of {', '.join(DA_ADJUSTINGS)}, got {adjusting!r}")
    # ReLU(QK^T) x f reaches (1 + e^v) times the largest logit: formed in float32 for half inputs
    compute = logit_dtype(q.dtype)
    per_head = [None if p is None else in_dtype(p, compute) for p in (sharpness, linear_slope, linear_intercept)]
    table = distance_coefficient_table(
        in_dtype(distance_weight, compute),
        per_head[0],
        q.size(2),
        k.size(2),
        query_offset,
        mapping,
        per_head[1],
        per_head[2],
        clip_threshold,
        # eq. 6 ReLU(QK^T) * f / sqrt(d): ReLU commutes with the positive 1/sqrt(d)
        combine="relu-multiply" if adjusting == "early-multiply" else "add",
    )
    if adjusting in ("early-multiply", "early-add"):  # early-add: softmax(S + R^)
        return Terms(offset_table=table)
    coefficients = table.dense()

    def adjust(weights: Tensor, mask: Optional[Tensor], hidden: Optional[Tensor]) -> Tensor:
        adjusted = weights + coefficients if adjusting == "late-add" else weights * coefficients
        return _zero_unseen(adjusted, mask, hidden)

    return Terms(weight_mod=adjust)


distance_aware_attention = attention_op(
    distance_aware_terms,
    "distance_aware_attention",
    """DA eqs. (5)-(6), or an ablation of sec. 4.3-4.4 (``mapping``, ``adjusting``);
    ``distance_weight`` (w) and the mapping's parameters are ``[H]``: ``sharpness``
    (v) for ``learnable-sigmoid``, ``linear_slope`` (k) and ``linear_intercept``
    (b) for ``linear``, the float ``clip_threshold`` (T) for ``clip``.
    Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``; ``probs`` are the weights
    that multiply the values (for the late adjustments, not a distribution).
    Eq. 6 is a score modification, early-add an additive bias (fused when
    ``need_weights=False``), the late ones a modification of the weights.""",
)


__all__ = ["distance_aware_attention"]
