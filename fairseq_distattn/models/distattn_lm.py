"""Language model ``distattn_lm`` and its architectures."""

import dataclasses
import functools
from argparse import Namespace

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models import transformer_lm as fairseq_lm
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from ..modules.summary import log_attention
from ..modules.transformer import DistAttnTransformerDecoder, ModelAttentionPlans, language_model_plans
from ..patches.checkpoint_upgrade import record_arithmetic
from ..patches.lm_decoder import language_model_decoder
from ..registry import on_register
from ..spec import SpecError
from .arguments import (
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    add_distattn_args,
    build_or_exit,
    check_attention_heads,
    check_blocks_fit_the_model,
    register_architecture,
    set_distattn_defaults,
)


@register_model("distattn_lm")
class DistAttnLanguageModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` with a distance-aware mechanism chosen per decoder layer."""

    @classmethod
    def add_args(cls, parser):
        # registered without a dataclass (its flags go through argparse), so
        # fairseq's LM options are added here from transformer_lm's dataclass
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_distattn_args(parser, (DECODER_SELF,))

    @classmethod
    def check_attention_args(cls, args, new_model: bool = True) -> ModelAttentionPlans:
        """Raise SpecError for any bad attention flag (what building would find), else return the
        plans; ``new_model``: False where the model is built, maybe from a checkpoint trained before
        a check was added."""
        check_attention_heads(args, ("decoder",))
        set_distattn_defaults(args)
        for kind in (ENCODER_SELF, CROSS):  # listed by --help for every model, but the LM has neither
            spec = getattr(args, kind.attr)
            if spec != "vanilla":
                raise SpecError(
                    kind.flag,
                    spec,
                    f"distattn_lm is decoder-only and has no {kind.description}",
                    "vanilla (or leave it out)",
                )
        # fairseq's LM build_model takes the positions from --tokens-per-sample when not given
        max_target_positions = getattr(args, "max_target_positions", None)
        positions_flag = "--max-target-positions"
        if not max_target_positions:
            max_target_positions, positions_flag = getattr(args, "tokens_per_sample", None), "--tokens-per-sample"
        # decoder_layers_to_keep: the plans take each kept layer's mechanism from the trained layers,
        # which args still counts (fairseq's LM build_model sets decoder_layers to the kept count after this)
        geometry = {"max_target_positions": max_target_positions}
        cfg = TransformerConfig.from_namespace(Namespace(**{**vars(args), **geometry}))
        return language_model_plans(cfg, target_flag=positions_flag, new_model=new_model)

    @classmethod
    def build_model(cls, args, task):
        def build():
            plans = cls.check_attention_args(args, new_model=False)
            check_blocks_fit_the_model(args, task)
            record_arithmetic(args, plans.mechanisms())
            # the decoder fairseq builds takes the plans just read (and checked) instead of reading them again
            decoder = functools.partial(DistAttnTransformerDecoder, layer_plans=plans.decoder)
            with language_model_decoder(decoder):
                return super(DistAttnLanguageModel, cls).build_model(args, task)

        model = build_or_exit(build, args)
        log_attention(model)
        return model


def architecture(name, fairseq_architecture, **attention):
    return register_architecture("distattn_lm", name, fairseq_architecture, **attention)


def transformer_lm_architecture(args):
    """The defaults of fairseq's ``--arch transformer_lm``: its dataclass's fields as they are
    (fairseq registers that architecture as a no-op). Not ``base_lm_architecture``, which only the
    named architectures (``transformer_lm_gbw``, ...) apply and which builds another model: pre-norm
    with a final layer norm, and input/output widths that follow ``--decoder-embed-dim`` where
    ``transformer_lm`` keeps 512 unless ``--decoder-input-dim``/``--decoder-output-dim`` say otherwise."""
    for name, default in dataclasses.asdict(TransformerLanguageModelConfig()).items():
        if isinstance(default, str) and default.startswith("${"):
            continue  # interpolated from the task's options (tokens_per_sample, ...), which args holds
        if getattr(args, name, None) is None:
            setattr(args, name, default)


transformer_lm_architecture.__name__ = "transformer_lm"
architecture("distattn_lm", transformer_lm_architecture)
architecture("distattn_lm_gbw", fairseq_lm.transformer_lm_baevski_gbw)


def preset_name(mechanism: str) -> str:
    """The LM preset of a mechanism: ``distattn_lm_<name>_gbw``."""
    return f"distattn_lm_{mechanism.replace('-', '_')}_gbw"


def register_mechanism_preset(info) -> None:
    """``distattn_lm_<name>_gbw``: fairseq's gbw LM with the mechanism in every decoder
    layer, without the position embeddings it replaces (kept where its papers keep
    them, ``keeps_position_embeddings``). Derived for every mechanism that applies to
    decoder self-attention, except one whose papers place it in named layers (their
    presets are below)."""
    if DECODER_SELF.key not in info.kinds or info.papers_place_it:
        return
    architecture(
        preset_name(info.name),
        fairseq_lm.transformer_lm_baevski_gbw,
        decoder_self=info.name,
        no_absolute_positions=not info.keeps_position_embeddings,
    )


on_register(register_mechanism_preset)
# Haviv et al. 2022: no position information at all; the causal mask alone lets an LM infer positions.
architecture("distattn_lm_nope_gbw", fairseq_lm.transformer_lm_baevski_gbw, no_absolute_positions=True)
# Nguyen et al. 2020 LM: multiplicative window in the first 3 decoder layers.
architecture("distattn_lm_window_gbw", fairseq_lm.transformer_lm_baevski_gbw, decoder_self="window-mw@0-2")
