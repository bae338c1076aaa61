"""Translation model ``distattn_transformer`` and its architectures."""

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Optional, Tuple

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer import transformer_legacy as fairseq_transformer

from ..modules.summary import log_attention
from ..modules.transformer import (
    DistAttnTransformerDecoder,
    DistAttnTransformerEncoder,
    ModelAttentionPlans,
    translation_plans,
)
from ..patches.checkpoint_upgrade import record_arithmetic, set_config_value
from .arguments import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    add_distattn_args,
    build_or_exit,
    check_attention_heads,
    register_architecture,
    set_distattn_defaults,
)


@dataclass
class _ModelBuild:
    """A model build_model is building. fairseq's build_model hands build_encoder and build_decoder
    nothing but the configuration it prepared, so the first of them to ask reads the plans of both
    stacks from it and the other finds them here."""

    plans: Optional[ModelAttentionPlans] = None
    # the encoder's and decoder's layer counts before fairseq's build_model sets them to the kept ones
    trained_layers: Tuple[Optional[int], Optional[int]] = (None, None)


_MODEL_BUILD: ContextVar[Optional[_ModelBuild]] = ContextVar("distattn_model_build", default=None)


@register_model("distattn_transformer")
class DistAttnTransformerModel(TransformerModel):
    """fairseq's ``transformer`` with a distance-aware mechanism chosen per
    layer for encoder self-, decoder self- and cross-attention."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_distattn_args(parser, (ENCODER_SELF, DECODER_SELF, CROSS))

    @classmethod
    def check_attention_args(cls, args, new_model: bool = True) -> ModelAttentionPlans:
        """Raise SpecError for any bad attention flag (what building would find), else return the
        plans; ``new_model``: False for a model built from a checkpoint, maybe trained before a
        check was added."""
        check_attention_heads(args, ("encoder", "decoder"))
        set_distattn_defaults(args)
        return translation_plans(TransformerConfig.from_namespace(args), new_model=new_model)

    @classmethod
    def build_model(cls, args, task):
        set_distattn_defaults(args)
        keep_the_other_stack_whole(args)
        build = _ModelBuild(
            trained_layers=(getattr(args, "encoder_layers", None), getattr(args, "decoder_layers", None))
        )
        token = _MODEL_BUILD.set(build)
        try:
            model = build_or_exit(lambda: super(DistAttnTransformerModel, cls).build_model(args, task), args)
        finally:
            _MODEL_BUILD.reset(token)
        record_arithmetic(args, build.plans.mechanisms())
        log_attention(model)
        return model

    @classmethod
    def attention_plans(cls, cfg) -> ModelAttentionPlans:
        """The plans of the model being built, read from ``cfg`` (the configuration fairseq's
        build_model prepared: its default positions, its kept layers) once per build; made
        anew where build_encoder or build_decoder is called outside build_model."""
        build = _MODEL_BUILD.get()
        if build is not None and build.plans is not None:
            return build.plans
        plans = translation_plans(
            TransformerConfig.from_namespace(cfg), trained_layers=(build or _ModelBuild()).trained_layers
        )
        if build is not None:
            build.plans = plans
        return plans

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return DistAttnTransformerEncoder(args, src_dict, embed_tokens, layer_plans=cls.attention_plans(args).encoder)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return DistAttnTransformerDecoder(
            args,
            tgt_dict,
            embed_tokens,
            no_encoder_attn=getattr(args, "no_cross_attention", False),
            layer_plans=cls.attention_plans(args).decoder,
        )


def keep_the_other_stack_whole(args) -> None:
    """Where ``--model-overrides`` prunes one stack only (``encoder_layers_to_keep``), keep every
    layer of the other: fairseq's ``prune_state_dict`` copies a layer's parameters only where a
    pruning of its stack names it, so the other stack's would all be dropped (docs/fairseq-traps.md)."""
    sides = ("encoder", "decoder")
    pruned = [side for side in sides if getattr(args, f"{side}_layers_to_keep", None)]
    if len(pruned) != 1:
        return
    whole = next(side for side in sides if side not in pruned)
    layers = getattr(args, f"{whole}_layers", None)
    if layers:
        set_config_value(args, f"{whole}_layers_to_keep", ",".join(str(layer) for layer in range(layers)))


def architecture(name, fairseq_architecture, **attention):
    return register_architecture("distattn_transformer", name, fairseq_architecture, **attention)


distattn_transformer = architecture("distattn_transformer", fairseq_transformer.base_architecture)
architecture("distattn_transformer_iwslt_de_en", fairseq_transformer.transformer_iwslt_de_en)
architecture("distattn_transformer_wmt_en_de", fairseq_transformer.transformer_wmt_en_de)
architecture("distattn_transformer_vaswani_wmt_en_de_big", fairseq_transformer.transformer_vaswani_wmt_en_de_big)


def shaw_base(args):
    # Shaw et al. 2018 sec. 4.1: the base model's feed-forward layers are 1024 wide
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    fairseq_transformer.transformer_wmt_en_de(args)


# Shaw et al. 2018 base: k = 16, key and value tables, every self-attention
# layer, relative positions replace the sinusoidal absolute ones.
architecture("distattn_rpr_wmt_en_de", shaw_base, encoder_self="rpr", decoder_self="rpr", no_absolute_positions=True)
# Wu et al. 2021: real distances re-scale attention instead of position embeddings.
architecture(
    "distattn_da_wmt_en_de",
    fairseq_transformer.transformer_wmt_en_de,
    encoder_self="da",
    decoder_self="da",
    no_absolute_positions=True,
)
# Su et al. 2021: rotary positions in encoder and decoder self-attention replace the sinusoidal ones
# (cross-attention has no shared position axis to rotate by).
architecture(
    "distattn_rope_wmt_en_de",
    fairseq_transformer.transformer_wmt_en_de,
    encoder_self="rope",
    decoder_self="rope",
    no_absolute_positions=True,
)
# Nguyen et al. 2020 best model, Enc(AW)-Cr(AW,Seg)-Dec(MW) in the first 3 layers, b = 5.
architecture(
    "distattn_window_wmt_en_de",
    fairseq_transformer.transformer_wmt_en_de,
    encoder_self="window-aw@0-2",
    decoder_self="window-mw@0-2",
    cross="window-aw-seg@0-2",
)
