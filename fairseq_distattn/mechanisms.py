"""One small module per mechanism: its parameters and a call into the pure
functional op. Registry in the style of xformers' attention registry.

Every mechanism sees per-head tensors ``[B, H, T, D]``: ``queries`` holds
``"query"`` plus any extra query-side projections it declares, ``keys`` holds
``"key"``, ``"value"`` and its extra key-side projections (these are cached
by :class:`~fairseq_distattn.attention.DistanceAwareMultiheadAttention`
exactly like fairseq caches ``prev_key``).
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from . import functional as DF
from .functional.distance_aware import distance_coefficients
from .spec import MechanismOptions


@dataclass(frozen=True)
class MechanismConfig:
    name: str
    num_heads: int
    head_dim: int
    options: MechanismOptions


class Mechanism(nn.Module):
    """Base: extra projections the attention module must compute per head."""

    extra_queries: Tuple[str, ...] = ()
    extra_keys: Tuple[str, ...] = ()

    def __init__(self, config: MechanismConfig):
        super().__init__()
        self.config = config

    def recompute_saves_memory(self, need_weights: bool) -> bool:
        """Whether backward would keep [B, H, Tq, Tk] tensors that the attention
        module may instead recompute in blocks of query rows; only for
        mechanisms whose every query row depends on that row's queries alone."""
        return True

    def forward(
        self,
        queries: Dict[str, Tensor],
        keys: Dict[str, Tensor],
        key_padding_mask: Optional[Tensor],
        causal: bool,
        query_offset: int,
        dropout_p: float,
        need_weights: bool,
        cache: Optional[Dict[str, Optional[Tensor]]],
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None when not need_weights)``;
        ``cache`` is the layer's incremental state (batch-first tensors), or None."""
        raise NotImplementedError


class RelativePosition(Mechanism):
    """Shaw et al. 2018: [2k+1, D] key (and value) tables shared across heads."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        buckets = 2 * config.options.max_relative_position + 1
        self.relative_keys = nn.Parameter(torch.empty(buckets, config.head_dim))
        nn.init.xavier_uniform_(self.relative_keys)
        if config.options.relative_values:
            self.relative_values = nn.Parameter(torch.empty(buckets, config.head_dim))
            nn.init.xavier_uniform_(self.relative_values)
        else:
            self.register_parameter("relative_values", None)

    def extra_repr(self) -> str:
        options = self.config.options
        return f"k={options.max_relative_position}, relative_values={options.relative_values}"

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        return DF.relative_position_attention(
            queries["query"], keys["key"], keys["value"], self.relative_keys, self.relative_values,
            self.config.options.max_relative_position, key_padding_mask, causal, query_offset, dropout_p, need_weights,
        )


class DistanceAware(Mechanism):
    """Wu et al. 2021: per-head w and v. Both start at 0, where f = 1 for every
    distance, so training starts from ReLU attention and learns each head's
    preference for short or long distances (the paper gives no initialisation).

    The sec. 4.3-4.4 ablations (``--da-mapping``, ``--da-adjusting``) hold only
    the parameters their f uses: v for the learnable sigmoid, k and b for the
    linear map (starting at k = b = 1, so f = 1 at w = 0 as for eq. 5), none
    besides w for sigmoid, exponent and clip."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        options, heads = config.options, config.num_heads
        self.mapping, self.adjusting = options.da_mapping, options.da_adjusting
        self.clip_threshold = options.da_clip_threshold if self.mapping == "clip" else None
        self.distance_weight = nn.Parameter(torch.zeros(heads))
        self.sharpness = nn.Parameter(torch.zeros(heads)) if self.mapping == "learnable-sigmoid" else None
        linear = self.mapping == "linear"
        self.linear_slope = nn.Parameter(torch.ones(heads)) if linear else None
        self.linear_intercept = nn.Parameter(torch.ones(heads)) if linear else None

    def extra_repr(self) -> str:
        # only the ablations are named: the paper's choices (eq. 5, eq. 6) go without saying
        parts = [f"heads={self.config.num_heads}"]
        if self.mapping != "learnable-sigmoid":
            parts.append(f"mapping={self.mapping}" + (f", T={self.clip_threshold:g}" if self.mapping == "clip" else ""))
        if self.adjusting != "early-multiply":
            parts.append(f"adjusting={self.adjusting}")
        return ", ".join(parts)

    def _mapping_arguments(self):
        return dict(mapping=self.mapping, linear_slope=self.linear_slope, linear_intercept=self.linear_intercept,
                    clip_threshold=self.clip_threshold)

    def coefficients(self, tgt_len: int, src_len: int, query_offset: int = 0) -> Tensor:
        """This layer's f(w_h |i-j|) per head, ``[H, Tq, Tk]``."""
        return distance_coefficients(self.distance_weight, self.sharpness, tgt_len, src_len, query_offset,
                                    **self._mapping_arguments())

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        return DF.distance_aware_attention(
            queries["query"], keys["key"], keys["value"], self.distance_weight, self.sharpness,
            key_padding_mask, causal, query_offset, dropout_p, adjusting=self.adjusting, **self._mapping_arguments(),
        )


class DifferentiableWindow(Mechanism):
    """Nguyen et al. 2020: left/right boundary pointers (eqs. 7-8) give the soft
    mask (eq. 9, or eq. 11 with segments); MW multiplies it into the attention
    weights, AW adds masked local scores from their own projections."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.additive = config.name.startswith("window-aw")
        self.segment_size = config.options.window_segment_size if config.name.endswith("-seg") else 0
        local = ("local",) if self.additive else ()
        self.extra_queries = tuple(f"{side}_query" for side in ("left", "right") + local)
        self.extra_keys = tuple(f"{side}_key" for side in ("left", "right") + local)

    def extra_repr(self) -> str:
        segments = f"segment_size={self.segment_size}" if self.segment_size else "token-level"
        return f"{'AW' if self.additive else 'MW'}, {segments}"

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        mask = DF.window_mask(
            queries["left_query"], keys["left_key"], queries["right_query"], keys["right_key"],
            self.segment_size, key_padding_mask, causal, query_offset,
        )
        if self.additive:
            return DF.additive_window_attention(
                queries["query"], keys["key"], queries["local_query"], keys["local_key"], keys["value"], mask,
                key_padding_mask, causal, query_offset, dropout_p, need_weights,
            )
        return DF.multiplicative_window_attention(
            queries["query"], keys["key"], keys["value"], mask, key_padding_mask, causal, query_offset, dropout_p,
        )


class QueryValueInteraction(Mechanism):
    """Wu et al. QVI (self-attention only). W starts as the identity and the
    gate at beta = 0.5, an even mix of values and query-aware values.

    In incremental decoding, eq. 7 for a new value needs every earlier query
    and g(Q, V) of an old value never changes (it only sees queries at or
    before its position), so both are cached, batch-first.

    The sec. 4.3 variants (``--qvi-interaction``) hold only the parameters
    their g uses: W for interactions-only and summation, none for values-only."""

    def recompute_saves_memory(self, need_weights):
        return False  # eq. 7 mixes every query into each value: no row-wise blocks

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        heads, dim = config.num_heads, config.head_dim
        self.interaction = config.options.qvi_interaction
        gated = self.interaction == "gated"
        projects = self.interaction != "values-only"
        self.value_projection = nn.Parameter(torch.eye(dim).repeat(heads, 1, 1)) if projects else None
        self.gate_weight = nn.Parameter(torch.zeros(heads, 2 * dim)) if gated else None
        self.gate_bias = nn.Parameter(torch.zeros(heads)) if gated else None

    def extra_repr(self) -> str:
        # only an ablation is named: the paper's gated g (eq. 8-9) goes without saying
        interaction = "" if self.interaction == "gated" else f", interaction={self.interaction}"
        return f"heads={self.config.num_heads}, head_dim={self.config.head_dim}{interaction}"

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        query = queries["query"]
        if cache is None or self.interaction == "values-only":  # g_1 = V depends on no query: nothing to cache
            return DF.query_value_interaction_attention(
                query, keys["key"], keys["value"], self.value_projection, self.gate_weight, self.gate_bias,
                key_padding_mask, causal, query_offset, dropout_p, need_weights, self.interaction,
            )
        seen_queries = cache.get("prev_qvi_query")
        all_queries = query if seen_queries is None else torch.cat([seen_queries, query], dim=2)
        new_values = DF.query_aware_values(
            all_queries, keys["value"][:, :, query_offset:], self.value_projection, self.gate_weight, self.gate_bias,
            None, causal, 0, query_offset, self.interaction,
        )
        seen_values = cache.get("prev_qvi_value")
        values = new_values if seen_values is None else torch.cat([seen_values, new_values], dim=2)
        cache["prev_qvi_query"] = all_queries
        cache["prev_qvi_value"] = values
        return DF.softmax_attention(query, keys["key"], values, key_padding_mask, causal, query_offset, dropout_p, need_weights)


class DistanceMask(Mechanism):
    """Im & Cho 2017: fixed -alpha |i-j| bias, optional directional mask."""

    def recompute_saves_memory(self, need_weights):
        return need_weights  # the fused path keeps only the [Tq, Tk] bias

    def extra_repr(self) -> str:
        options = self.config.options
        return f"alpha={options.distance_mask_alpha}, direction={options.distance_mask_direction or 'none'}"

    def forward(self, queries, keys, key_padding_mask, causal, query_offset, dropout_p, need_weights, cache):
        options = self.config.options
        return DF.distance_mask_attention(
            queries["query"], keys["key"], keys["value"], options.distance_mask_alpha,
            key_padding_mask, causal, query_offset, options.distance_mask_direction, dropout_p, need_weights,
        )


MECHANISM_REGISTRY = {
    "rpr": RelativePosition,
    "da": DistanceAware,
    "window-mw": DifferentiableWindow,
    "window-aw": DifferentiableWindow,
    "window-mw-seg": DifferentiableWindow,
    "window-aw-seg": DifferentiableWindow,
    "qvi": QueryValueInteraction,
    "distance-mask": DistanceMask,
}


def build_mechanism(config: MechanismConfig) -> Mechanism:
    return MECHANISM_REGISTRY[config.name](config)
