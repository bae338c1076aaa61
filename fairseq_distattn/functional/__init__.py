"""Pure tensor implementations of every mechanism (no fairseq imports).

Shapes: ``q`` ``[B,H,Tq,D]``, ``k``/``v`` ``[B,H,Tk,D]``, unscaled (each op
applies 1/sqrt(D)); ``key_padding_mask`` ``[B,Tk]`` bool, True = padding;
``causal`` hides keys after the query; query row i sits at position
``query_offset + i`` and key j at position j. Returned probabilities/weights
are ``[B,H,Tq,Tk]``.
"""
from .differentiable_window import additive_window_attention, multiplicative_window_attention, window_mask
from .distance_aware import distance_aware_attention
from .distance_mask import distance_mask_attention
from .masking import logit_mask, masked_softmax, relative_distance, softmax_attention
from .query_value_interaction import query_aware_values, query_value_interaction_attention
from .relative_position import relative_position_attention

__all__ = [
    "additive_window_attention",
    "distance_aware_attention",
    "distance_mask_attention",
    "logit_mask",
    "masked_softmax",
    "multiplicative_window_attention",
    "query_aware_values",
    "query_value_interaction_attention",
    "relative_distance",
    "relative_position_attention",
    "softmax_attention",
    "window_mask",
]
