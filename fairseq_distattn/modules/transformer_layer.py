"""Transformer layers whose attention build hooks pick the mechanism of
their layer; everything else is fairseq's layer unchanged."""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..mechanisms import Stack
from ..spec import AttentionOptions
from .multihead_attention import MechanismMultiheadAttention


@dataclass(frozen=True)
class LayerAttentionPlan:
    """Mechanism of each attention in one layer (``vanilla`` = fairseq's own module)."""

    self_attention: str
    cross_attention: str
    options: AttentionOptions
    # the stacks the layer's attentions belong to (what a mechanism shares across layers)
    self_stack: Optional[Stack] = field(default=None, compare=False, repr=False)
    cross_stack: Optional[Stack] = field(default=None, compare=False, repr=False)


def build_mechanism_attention(
    layer,
    mechanism: str,
    options: AttentionOptions,
    embed_dim: int,
    num_heads: int,
    cfg,
    stack: Optional[Stack] = None,
    **kind,
):
    return MechanismMultiheadAttention(
        embed_dim,
        num_heads,
        mechanism,
        options,
        stack=stack,
        dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
        **kind,
    )


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # a checkpointed layer is always FSDP-wrapped, whatever its size (fairseq's rule)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class DistAttnEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, plan: LayerAttentionPlan, return_fc=False):
        # set before fairseq's __init__, which calls the build hooks
        self.plan = plan
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        if self.plan.self_attention == "vanilla":
            return super().build_self_attention(embed_dim, cfg)
        return build_mechanism_attention(
            self,
            self.plan.self_attention,
            self.plan.options,
            embed_dim,
            cfg.encoder.attention_heads,
            cfg,
            stack=self.plan.self_stack,
            self_attention=True,
        )


class DistAttnDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, plan: LayerAttentionPlan, no_encoder_attn=False):
        self.plan = plan
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if self.plan.self_attention == "vanilla":
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        return build_mechanism_attention(
            self,
            self.plan.self_attention,
            self.plan.options,
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            stack=self.plan.self_stack,
            self_attention=True,
            causal=True,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        if self.plan.cross_attention == "vanilla":
            return super().build_encoder_attention(embed_dim, cfg)
        return build_mechanism_attention(
            self,
            self.plan.cross_attention,
            self.plan.options,
            embed_dim,
            cfg.decoder.attention_heads,
            cfg,
            stack=self.plan.cross_stack,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            encoder_decoder_attention=True,
        )
