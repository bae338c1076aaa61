"""Encoder and decoder that hand each layer its attention plan.

A model's plans are read from its configuration once (:class:`ModelAttentionPlans`:
the options converted once, each stack's SPEC parsed once) and handed to the
encoder and decoder. fairseq's ``build_encoder_layer(cfg)`` gets no layer index;
the layers are built in order inside ``__init__``, so each build call takes the
next plan from an iterator prepared beforehand (no layer is ever built twice).
"""

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import SinusoidalPositionalEmbedding

from ..functional.randomized_positions import sample_positions
from ..mechanisms import Stack
from ..registry import CROSS, DECODER_SELF, ENCODER_SELF, REGISTRY
from ..spec import AttentionModuleOptions, AttentionOptions, SpecError, check_no_pruning_in_training, pruned_spec
from .multihead_attention import RANDOMIZED_DECODING, cache_recompute_lengths, filling_a_new_cache
from .transformer_layer import DistAttnDecoderLayer, DistAttnEncoderLayer, LayerAttentionPlan, wrap_layer

SOURCE_POSITIONS, TARGET_POSITIONS = "--max-source-positions", "--max-target-positions"
RANDOMIZED_POSITIONS = "--randomized-positions"


class RandomizedSinusoidalPositionalEmbedding(SinusoidalPositionalEmbedding):
    """fairseq's sinusoidal position embeddings with ``--randomized-positions N``
    (Ruoss et al. 2023's ``NOISY_SIN_COS``): in training, each forward pass draws
    one sorted sample ``p_0 < ... < p_{T-1}`` of ``[0, N)`` for the batch's length
    ``T`` (:func:`functional.randomized_positions.sample_positions`) and embeds the
    token of rank ``t`` in its sentence (after any left padding) at ``p_t``, where
    fairseq embeds it at ``t``; the encoder and the decoder each draw their own (the
    authors' model is one encoder over ``[input; outputs]``, which draws once for
    both). Evaluation and decoding embed ``0..T-1``, as fairseq does (the authors
    randomize at test time too: a decoding step could not draw a sorted sample for
    a length it does not know yet). Its table is fairseq's (the [sin | cos] layout
    of tensor2tensor, as the authors'), built for ``N`` positions; nothing is saved."""

    def __init__(
        self,
        embedding_dim: int,
        padding_idx: int,
        randomized_positions: int,
        init_size: int = 1024,
        at_evaluation: bool = False,
    ):
        super().__init__(embedding_dim, padding_idx, init_size=max(init_size, padding_idx + 1 + randomized_positions))
        self.randomized_positions = randomized_positions
        # --randomized-positions-at-evaluation: evaluation's full-sequence calls draw too
        self.at_evaluation = at_evaluation

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        drawing = self.training or self.at_evaluation
        if not (drawing and self.randomized_positions and positions is None):
            return super().forward(input, incremental_state, timestep, positions)
        if incremental_state is not None:
            if self.training:
                return super().forward(input, incremental_state, timestep, positions)
            raise ValueError(RANDOMIZED_DECODING)
        bsz, seq_len = input.shape
        real = input.ne(self.padding_idx)
        rank = (torch.cumsum(real, dim=1) - 1).clamp_min(0)
        drawn = sample_positions(seq_len, self.randomized_positions, input.device)
        index = torch.where(real, self.padding_idx + 1 + drawn[rank], self.padding_idx)
        return self.weights.index_select(0, index.view(-1)).view(bsz, seq_len, -1).detach()

    def extra_repr(self) -> str:
        at_evaluation = ", at evaluation too" if self.at_evaluation else ""
        return f"randomized_positions={self.randomized_positions}{at_evaluation}"


def randomize_embedded_positions(stack, module: Optional[AttentionModuleOptions]) -> None:
    """Give ``stack`` (an encoder or decoder) randomized sinusoidal position embeddings
    where it has fairseq's sinusoidal ones and ``module.randomized_positions`` is on."""
    embed = getattr(stack, "embed_positions", None)
    if module is not None and module.randomized_positions and type(embed) is SinusoidalPositionalEmbedding:
        stack.embed_positions = RandomizedSinusoidalPositionalEmbedding(
            embed.embedding_dim,
            embed.padding_idx,
            module.randomized_positions,
            init_size=embed.weights.size(0),
            at_evaluation=module.randomized_positions_at_evaluation,
        ).to(embed.weights.device)


def positions_reached(max_positions: Optional[int], flag: str, options: AttentionOptions) -> Tuple[Optional[int], str]:
    """How many positions a self-attention stack's layers turn or read by, and the flag that
    sets it: the model's ``max_positions``, or ``--randomized-positions N`` where training
    draws positions from ``[0, N)`` (N is at least the model's positions: the flag's check)."""
    randomized = options.module.randomized_positions
    if randomized and randomized > (max_positions or 0):
        return randomized, RANDOMIZED_POSITIONS
    return max_positions or None, flag


def randomized_mechanisms():
    """The mechanisms that take ``--randomized-positions`` (:attr:`Mechanism.random_positions`)."""
    return [name for name, info in REGISTRY.items() if info.module.random_positions]


def check_randomized_positions(cfg, plans: "ModelAttentionPlans", decoder_only: bool = False) -> None:
    """Raise SpecError where ``--randomized-positions`` is on and nothing would take it:
    no layer whose mechanism reads positions (:attr:`Mechanism.random_positions`) and no
    sinusoidal position embeddings; learned position embeddings, whose table has only the
    model's positions (the authors' ``NOISY_LEARNT`` learns a table of ``N`` rows); and
    ``--randomized-positions-at-evaluation`` without it, which would draw from nothing."""
    value = plans.options.module.randomized_positions
    if not value:
        if plans.options.module.randomized_positions_at_evaluation:
            raise SpecError(
                "--randomized-positions-at-evaluation",
                True,
                "it draws evaluation's positions from [0, N) of --randomized-positions N, which is 0 (off)",
                "leave it out, or give the model's --randomized-positions N (a trained model: the N it was "
                "trained with)",
            )
        return
    names = plans.mechanisms()
    embedded = not cfg.no_token_positional_embeddings
    sides = ("decoder",) if decoder_only else ("encoder", "decoder")
    learned = [side for side in sides if getattr(cfg, side).learned_pos]
    if embedded and learned:
        raise SpecError(
            RANDOMIZED_POSITIONS,
            value,
            f"--{learned[0]}-learned-pos: learned position embeddings have a row for each of the model's "
            "positions only, not for N (the authors' NOISY_LEARNT learns N rows)",
            "0 (off) with learned position embeddings, or sinusoidal ones (leave out --encoder-learned-pos "
            "and --decoder-learned-pos)",
        )
    reads = [name for name in names if REGISTRY[name].module.random_positions]
    if not reads and not embedded:
        raise SpecError(
            RANDOMIZED_POSITIONS,
            value,
            "no layer's mechanism reads positions and the model has no sinusoidal position embeddings "
            "(--no-token-positional-embeddings), so nothing would be randomized",
            f"0 (off), or a mechanism that reads positions ({', '.join(randomized_mechanisms())}) or the "
            "sinusoidal embeddings",
        )


def mechanism_options(cfg, decoder_only: bool = False, target_flag: str = TARGET_POSITIONS) -> AttentionOptions:
    """The options of a ``TransformerConfig``; ``--max-relative-position`` is
    bounded by the longest sequence the model accepts (a decoder-only model
    has no source side, whatever ``max_source_positions`` says), and each
    stack's checks by its own (:func:`encoder_plans`, :func:`decoder_plans`).
    ``target_flag``: the flag that set ``max_target_positions``."""
    if decoder_only:
        return AttentionOptions.from_args(cfg, cfg.max_target_positions or None, target_flag)
    positions = [cfg.max_source_positions, cfg.max_target_positions]
    return AttentionOptions.from_args(cfg, max(p or 0 for p in positions) or None)


def encoder_plans(
    cfg, options: AttentionOptions, new_model: bool = False, trained_layers: Optional[int] = None
) -> Tuple[LayerAttentionPlan, ...]:
    """Each encoder layer's plan, its SPEC parsed and ``options`` checked against the stack.
    ``new_model``: the plans of a model fairseq-train's flags describe (True), or of one
    being built, which may be a checkpoint's, trained before a check was added (False).
    ``trained_layers``: the stack's layer count before fairseq's pruning (``layers_to_keep``)
    set ``cfg.encoder.layers`` to the kept count (None: ``cfg.encoder.layers`` is it)."""
    spec = getattr(cfg, ENCODER_SELF.attr, None)
    if new_model:
        check_no_pruning_in_training(ENCODER_SELF, cfg.encoder.layers_to_keep)
    layers = pruned_spec(ENCODER_SELF, spec, trained_layers or cfg.encoder.layers, cfg.encoder.layers_to_keep)
    head_dim = cfg.encoder.embed_dim // cfg.encoder.attention_heads
    reach, flag = positions_reached(cfg.max_source_positions, SOURCE_POSITIONS, options)
    options.check_kind(ENCODER_SELF, layers, reach, flag, new_model, head_dim)
    stack = Stack(ENCODER_SELF.description, reach)
    return tuple(LayerAttentionPlan(mechanism, "vanilla", options, self_stack=stack) for mechanism in layers)


def decoder_plans(
    cfg,
    options: AttentionOptions,
    no_encoder_attn: bool,
    target_flag: str = TARGET_POSITIONS,
    new_model: bool = False,
    trained_layers: Optional[int] = None,
) -> Tuple[LayerAttentionPlan, ...]:
    """Each decoder layer's plan, as :func:`encoder_plans`; ``target_flag``: the flag that
    set ``max_target_positions`` (a language model takes it from ``--tokens-per-sample``
    when it is not given)."""
    num_layers, kept = trained_layers or cfg.decoder.layers, cfg.decoder.layers_to_keep
    if new_model:
        check_no_pruning_in_training(DECODER_SELF, kept)
    self_layers = pruned_spec(DECODER_SELF, getattr(cfg, DECODER_SELF.attr, None), num_layers, kept)
    if getattr(cfg, "cross_self_attention", False) and set(self_layers) != {"vanilla"}:
        # fairseq's decoder layer then attends over [source tokens; target prefix] in its self-attention,
        # two sequences with no common position axis for a distance, a rotation or a causal window
        raise SpecError(
            DECODER_SELF.flag,
            getattr(cfg, DECODER_SELF.attr),
            "--cross-self-attention concatenates the source tokens to the decoder's keys, where no distance "
            "between a target and a source position is defined",
            "vanilla with --cross-self-attention (the mechanism may go in --cross-attention and "
            "--encoder-self-attention), or leave out --cross-self-attention",
        )
    head_dim = cfg.decoder.embed_dim // cfg.decoder.attention_heads
    self_reach, self_flag = positions_reached(cfg.max_target_positions, target_flag, options)
    options.check_kind(DECODER_SELF, self_layers, self_reach, self_flag, new_model, head_dim)
    cross_spec = getattr(cfg, CROSS.attr, None)
    if no_encoder_attn:
        if cross_spec not in (None, "vanilla"):
            raise SpecError(
                CROSS.flag,
                cross_spec,
                "the decoder has no cross-attention (--no-cross-attention)",
                "vanilla, or leave out --no-cross-attention",
            )
        cross_spec = None
    cross_layers = pruned_spec(CROSS, cross_spec, num_layers, kept)
    options.check_kind(CROSS, cross_layers, head_dim=head_dim)
    self_stack = Stack(DECODER_SELF.description, self_reach)
    cross_stack = Stack(CROSS.description, cfg.max_source_positions or None)
    return tuple(
        LayerAttentionPlan(mine, cross, options, self_stack=self_stack, cross_stack=cross_stack)
        for mine, cross in zip(self_layers, cross_layers)
    )


@dataclass(frozen=True)
class ModelAttentionPlans:
    """The attention of one model, read from its configuration once: the options, each
    flag converted once, and every layer's plan, each stack's SPEC parsed once."""

    options: AttentionOptions
    encoder: Tuple[LayerAttentionPlan, ...] = ()
    decoder: Tuple[LayerAttentionPlan, ...] = ()

    def mechanisms(self) -> List[str]:
        """The mechanisms some layer uses, sorted (vanilla, fairseq's own, left out)."""
        names = {plan.self_attention for plan in (*self.encoder, *self.decoder)}
        names |= {plan.cross_attention for plan in self.decoder}
        return sorted(names - {"vanilla"})


def translation_plans(
    cfg: TransformerConfig, new_model: bool = False, trained_layers: Tuple[Optional[int], Optional[int]] = (None, None)
) -> ModelAttentionPlans:
    """The plans of an encoder-decoder model (``new_model`` as for :func:`encoder_plans`;
    ``trained_layers``: the encoder's and the decoder's, as there)."""
    options = mechanism_options(cfg)
    encoder_layers, decoder_layers = trained_layers
    plans = ModelAttentionPlans(
        options,
        encoder=encoder_plans(cfg, options, new_model, encoder_layers),
        decoder=decoder_plans(
            cfg, options, no_encoder_attn=cfg.no_cross_attention, new_model=new_model, trained_layers=decoder_layers
        ),
    )
    check_randomized_positions(cfg, plans)
    return plans


def language_model_plans(
    cfg: TransformerConfig, target_flag: str = TARGET_POSITIONS, new_model: bool = False
) -> ModelAttentionPlans:
    """The plans of a decoder-only model (``target_flag`` as for :func:`decoder_plans`)."""
    options = mechanism_options(cfg, decoder_only=True, target_flag=target_flag)
    plans = decoder_plans(cfg, options, no_encoder_attn=True, target_flag=target_flag, new_model=new_model)
    model_plans = ModelAttentionPlans(options, decoder=plans)
    check_randomized_positions(cfg, model_plans, decoder_only=True)
    return model_plans


def _module_options(layer_plans: Sequence[LayerAttentionPlan]) -> Optional[AttentionModuleOptions]:
    return layer_plans[0].options.module if layer_plans else None


class DistAttnTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder whose layers follow ``layer_plans`` (:attr:`ModelAttentionPlans.encoder`)."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False, *, layer_plans: Sequence[LayerAttentionPlan]):
        cfg = TransformerConfig.from_namespace(cfg)
        self.layer_plans = tuple(layer_plans)
        self._plans_to_build = iter(self.layer_plans)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        randomize_embedded_positions(self, _module_options(self.layer_plans))

    def build_encoder_layer(self, cfg):
        return wrap_layer(DistAttnEncoderLayer(cfg, next(self._plans_to_build), return_fc=self.return_fc), cfg)


class DistAttnTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder whose layers follow ``layer_plans`` (:attr:`ModelAttentionPlans.decoder`)."""

    def __init__(
        self,
        cfg,
        dictionary,
        embed_tokens,
        no_encoder_attn=False,
        output_projection=None,
        *,
        layer_plans: Sequence[LayerAttentionPlan],
    ):
        self.args = cfg  # fairseq's legacy decoder exposes its args; some callers read them
        cfg = TransformerConfig.from_namespace(cfg)
        self.layer_plans = tuple(layer_plans)
        self._plans_to_build = iter(self.layer_plans)
        super().__init__(
            cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn, output_projection=output_projection
        )
        randomize_embedded_positions(self, _module_options(self.layer_plans))
        self.cache_recompute_lengths = cache_recompute_lengths(self)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(DistAttnDecoderLayer(cfg, next(self._plans_to_build), no_encoder_attn=no_encoder_attn), cfg)

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        full_context_alignment=False,
        alignment_layer=None,
        alignment_heads=None,
    ):
        features = functools.partial(
            super().extract_features_scriptable,
            encoder_out=encoder_out,
            full_context_alignment=full_context_alignment,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
        )
        # fairseq's decoding protocol: one new token per step, the sequence so far in prev_output_tokens
        if incremental_state is None or prev_output_tokens.size(1) - 1 not in self.cache_recompute_lengths:
            return features(prev_output_tokens, incremental_state=incremental_state)
        # The step crosses a switch (LongRoPE's): every cached key is stale, and so is every hidden state a
        # higher layer's cached keys were made from. As Phi-3's generate() does, the cache is dropped and the
        # whole sequence run once, refilling it; the step's output is the last position's.
        with filling_a_new_cache(self, incremental_state):
            x, extra = features(prev_output_tokens, incremental_state=None)
        attn = [None if weights is None else weights[:, -1:] for weights in extra["attn"]]
        return x[:, -1:], {**extra, "attn": attn, "inner_states": [state[-1:] for state in extra["inner_states"]]}
