"""What attention a built model has, per layer and attention kind.

Two readings of one walk over the model: :func:`attention_log_lines`, one
line per attention kind with each layer's mechanism and hyperparameters
(logged when a model is built, so ``fairseq-train`` shows it at training
start), and :func:`attention_summary`, one entry per layer with what its
mechanism learned (``Mechanism.learned_values``: DA's ``w`` and ``v`` per head,
rpr table norms, any other mechanism's parameters), printed by
``python -m fairseq_distattn.inspect``. Hyperparameters come from
each mechanism's ``extra_repr``, the text the model print shows.
"""

import logging
from dataclasses import dataclass
from typing import List, Optional

from torch import nn

from ..mechanisms import Mechanism
from ..registry import CROSS, DECODER_SELF, ENCODER_SELF, KINDS, AttentionKind

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model: fairseq's ``MultiheadAttention``
    (vanilla) or the plugin's ``MechanismMultiheadAttention``."""

    kind: AttentionKind
    layer: int
    module: nn.Module

    @property
    def mechanism(self) -> Optional[Mechanism]:
        return getattr(self.module, "mechanism", None)

    @property
    def name(self) -> str:
        return "vanilla" if self.mechanism is None else self.mechanism.config.name

    @property
    def hyperparameters(self) -> str:
        return "" if self.mechanism is None else self.mechanism.extra_repr()

    @property
    def slug(self) -> str:
        return f"{self.kind.key}-layer{self.layer}"

    @property
    def title(self) -> str:
        return f"{self.kind.description}, layer {self.layer}: {self.name}"


def every_layer(stack: Optional[nn.Module]) -> List[nn.Module]:
    """The layers of an encoder or decoder, all of them: iterating over fairseq's
    ``LayerDropModuleList`` (``--encoder-layerdrop``) in training mode skips each
    layer with the LayerDrop probability, while indexing it does not."""
    layers = getattr(stack, "layers", None)
    return [] if layers is None else [layers[index] for index in range(len(layers))]


def attention_sites(model: nn.Module) -> List[AttentionSite]:
    """Every attention of a fairseq transformer (translation model or LM),
    encoder self-attention first, then decoder self- and cross-attention."""
    sites = []
    for index, layer in enumerate(every_layer(getattr(model, "encoder", None))):
        sites.append(AttentionSite(ENCODER_SELF, index, layer.self_attn))
    decoder_layers = every_layer(model.decoder)
    for index, layer in enumerate(decoder_layers):
        sites.append(AttentionSite(DECODER_SELF, index, layer.self_attn))
    for index, layer in enumerate(decoder_layers):
        if getattr(layer, "encoder_attn", None) is not None:
            sites.append(AttentionSite(CROSS, index, layer.encoder_attn))
    return sites


def _described(site: AttentionSite) -> str:
    return f"{site.name} ({site.hyperparameters})" if site.hyperparameters else site.name


def _layer_ranges(sites: List[AttentionSite]) -> str:
    """``0-2 window-aw (AW, token-level), 3-5 vanilla``: runs of equal layers joined."""
    runs = []
    for site in sites:
        if runs and runs[-1][1] == _described(site):
            runs[-1][0].append(site.layer)
        else:
            runs.append(([site.layer], _described(site)))
    return ", ".join(
        f"{layers[0]}-{layers[-1]} {text}" if len(layers) > 1 else f"{layers[0]} {text}" for layers, text in runs
    )


def attention_log_lines(model: nn.Module) -> List[str]:
    """One line per attention kind, e.g. ``encoder self-attention (6 layers, 4 heads):
    layers 0-2 window-aw (AW, token-level), 3-5 vanilla``."""
    lines = []
    sites = attention_sites(model)
    for kind in KINDS:
        of_kind = [site for site in sites if site.kind is kind]
        if of_kind:
            heads = of_kind[0].module.num_heads
            lines.append(f"{kind.description} ({len(of_kind)} layers, {heads} heads): layers {_layer_ranges(of_kind)}")
    return lines


def attention_summary(model: nn.Module) -> List[str]:
    """Per attention kind and layer: the mechanism, its hyperparameters and what it learned."""
    lines = []
    encoder = getattr(model, "encoder", None)
    sides = [("encoder", encoder), ("decoder", model.decoder)] if encoder is not None else [("decoder", model.decoder)]
    lines.append(
        "absolute position embeddings: "
        + ", ".join(
            f"{side} {'off' if getattr(part, 'embed_positions', None) is None else 'on'}" for side, part in sides
        )
    )
    sites = attention_sites(model)
    for kind in KINDS:
        of_kind = [site for site in sites if site.kind is kind]
        if not of_kind:
            continue
        module = of_kind[0].module
        lines.append(f"{kind.description}: {len(of_kind)} layers, {module.num_heads} heads of {module.head_dim} dims")
        for site in of_kind:
            lines.append(f"  layer {site.layer}: {_described(site)}")
            if site.mechanism is not None:
                lines.extend(f"      {values.summary_line()}" for values in site.mechanism.learned_values(kind.causal))
    return lines


def log_attention(model: nn.Module) -> None:
    """Log :func:`attention_log_lines` (the models call this when built)."""
    for line in attention_log_lines(model):
        logger.info(line)
