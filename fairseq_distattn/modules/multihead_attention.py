"""The one fairseq attention module that composes a mechanism.

It subclasses fairseq's ``MultiheadAttention`` (same ``q_proj``/``k_proj``/
``v_proj``/``out_proj``, same incremental-state buffer and reordering) and
overrides ``forward`` completely: fairseq's fast path
(``F.multi_head_attention_forward``) would bypass any hook.
"""

import contextlib
import functools
from typing import Dict, FrozenSet, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..functional.paths import Call, CallOptions, module_flex
from ..functional.position_tables import forget_tables_by_distance
from ..functional.randomized_positions import sample_distances, sample_positions
from ..mechanisms import Stack, build_mechanism
from ..spec import AttentionOptions
from .decoding_cache import appended, reordered_with_room

RANDOMIZED_DECODING = (
    "--randomized-positions-at-evaluation: incremental decoding cannot draw randomized positions (a step does "
    "not know the sequence's final length); score whole sequences (fairseq-eval-lm, teacher forcing), or "
    "decode without it (--model-overrides \"{'randomized_positions_at_evaluation': False}\")"
)

# Elements of one [B, H, rows, Tk] tensor of a recomputed query chunk (1 MiB in
# float32): small beside a layer's activations, large enough to keep matmuls efficient.
RECOMPUTE_CHUNK_ELEMENTS = 2**18
# Each block launches the mechanism's tens of kernels three times (its forward, then in
# backward its forward again and its backward), so on a GPU the block count, not the
# arithmetic, sets the time of a long pass (benchmarks/results/speed/gpu-nvidia-h100-recompute).
# Blocks grow past RECOMPUTE_CHUNK_ELEMENTS to keep at most this many per layer, each then an
# eighth of the [B, H, Tq, Tk] scores.
RECOMPUTE_MAX_BLOCKS = 8


class MechanismMultiheadAttention(MultiheadAttention):
    """fairseq's multi-head attention running one registered mechanism of one layer (any of
    them, vanilla included): the projections, the incremental state and the execution path are
    its own, the arithmetic the mechanism's."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mechanism: str,
        options: AttentionOptions,
        causal: bool = False,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        dropout: float = 0.0,
        self_attention: bool = False,
        encoder_decoder_attention: bool = False,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
        stack: Optional[Stack] = None,
    ):
        super().__init__(
            embed_dim,
            num_heads,
            kdim=kdim,
            vdim=vdim,
            dropout=dropout,
            self_attention=self_attention,
            encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        self.causal = causal
        # stack: the layers of this attention kind, across which a mechanism may share parameters
        self.mechanism = build_mechanism(mechanism, num_heads, self.head_dim, options, stack, causal)
        # the attention module's own options (the mechanism gets only its own options dataclass)
        self.attention_flex = options.module.attention_flex
        self.recompute_length = options.module.attention_recompute_length
        # --randomized-positions N (0: off): the range this module's training calls draw positions from
        self.randomized_positions = options.module.randomized_positions
        # --randomized-positions-at-evaluation: its evaluation calls draw too, as the authors' code does
        self.randomized_at_evaluation = options.module.randomized_positions_at_evaluation
        # --attention-flex leaves the CPU alone; tests set this to run flex's eager CPU form where it takes flex
        self.flex_on_cpu = False

        def projection(input_dim):
            layer = nn.Linear(input_dim, embed_dim)
            nn.init.xavier_uniform_(layer.weight, gain=2**-0.5)
            nn.init.zeros_(layer.bias)
            return quant_noise(layer, q_noise, qn_block_size)

        self.extra_query_proj = nn.ModuleDict({name: projection(embed_dim) for name in self.mechanism.extra_queries})
        self.extra_key_proj = nn.ModuleDict({name: projection(self.kdim) for name in self.mechanism.extra_keys})
        # read at every call (a decoding step's Python costs as much as its arithmetic): plain attributes
        self.has_extra_queries = bool(self.mechanism.extra_queries)
        self.has_extra_keys = bool(self.mechanism.extra_keys)
        # the incremental state's entries that hold keys (appended at each step of self-attention)
        key_names = ("key", "value", *self.extra_key_proj, *self.mechanism.info.layer_inputs)
        self.cached_key_names = frozenset(f"prev_{name}" for name in key_names)

    def train(self, mode: bool = True):
        # fairseq's optimizers step through p.data, unseen by the tables memoised for
        # decoding; its trainer switches mode around every validation step, so that is when
        # they are dropped (position_tables.forget_tables_by_distance)
        forget_tables_by_distance()
        return super().train(mode)

    def set_beam_size(self, beam_size):
        # Stock cross-attention keeps one key copy per sentence and skips reordering
        # once beam_size > 1; this module caches keys per hypothesis, so the
        # plain per-hypothesis reorder (beam_size 1) is the correct one.
        pass

    def reorder_incremental_state(
        self, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]], new_order: Tensor
    ):
        """fairseq's reorder (beam search, before every step), but the keys a self-attention
        step appends to are reordered into a buffer with room for the next step's
        (:mod:`.decoding_cache`): that step then copies one position, not the whole cache."""
        if not self.self_attention:
            return super().reorder_incremental_state(incremental_state, new_order)
        buffer = self._get_input_buffer(incremental_state)
        for name, cached in buffer.items():
            if cached is None:
                continue
            appends = self._is_cached_key(name) and cached.dim() == 4
            buffer[name] = reordered_with_room(cached, new_order) if appends else cached.index_select(0, new_order)
        return self._set_input_buffer(incremental_state, buffer)

    def _heads(self, x: Tensor) -> Tensor:
        """[T, B, E] -> [B, H, T, D]."""
        length, bsz, _ = x.shape
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _project_keys(self, key: Tensor, value: Tensor) -> Dict[str, Tensor]:
        keys = {"key": self._heads(self.k_proj(key)), "value": self._heads(self.v_proj(value))}
        if self.has_extra_keys:
            keys.update((name, self._heads(proj(key))) for name, proj in self.extra_key_proj.items())
        keys.update(self.mechanism.inputs_from_layer(key))
        return keys

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if before_softmax:
            raise NotImplementedError(f"{self.mechanism.config.name} attention has no single pre-softmax score")
        if attn_mask is not None and not self.causal:
            # Decoder self-attention passes fairseq's future mask, which `causal`
            # reproduces exactly; any other mask has no meaning for these mechanisms.
            raise ValueError("MechanismMultiheadAttention supports attn_mask only as the causal future mask")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.shape

        saved_state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        queries = {"query": self._heads(self.q_proj(query))}
        if self.has_extra_queries:
            queries.update((name, self._heads(proj(query))) for name, proj in self.extra_query_proj.items())

        query_offset = 0
        position_map: Optional[Tensor] = None
        if saved_state is not None and static_kv and "prev_key" in saved_state:
            keys = {name[len("prev_") :]: tensor for name, tensor in saved_state.items() if self._is_cached_key(name)}
            key_padding_mask = saved_state.get("prev_key_padding_mask")
        else:
            if self.self_attention:
                key = value = query
            keys = self._project_keys(key, value)
            if saved_state is not None:
                query_offset, key_padding_mask = self._offset_and_padding(
                    saved_state, key_padding_mask, bsz, keys["key"].size(2), static_kv
                )
            position_map = self._draw_position_map(saved_state, tgt_len, keys["key"].size(2))
            queries, keys = self.mechanism.encode_positions(
                queries, keys, key_padding_mask, query_offset, position_map=position_map
            )
            if saved_state is not None:
                keys = self._cached(saved_state, keys, key_padding_mask)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(torch.bool)

        out, probs = self._attend(
            queries, keys, self._call_options(key_padding_mask, query_offset, need_weights, position_map), saved_state
        )
        if saved_state is not None:
            self._set_input_buffer(incremental_state, saved_state)

        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim))
        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs.transpose(0, 1)  # [H, B, Tq, Tk], fairseq's per-head layout
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def _offset_and_padding(
        self, saved_state, key_padding_mask: Optional[Tensor], bsz: int, new_keys: int, static_kv: bool
    ) -> Tuple[int, Optional[Tensor]]:
        """(where this call's queries start in the cached sequence, that whole sequence's key
        padding mask): fairseq's extension of the cached mask by the call's."""
        query_offset = saved_state["prev_key"].size(2) if "prev_key" in saved_state else 0
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=bsz,
            src_len=query_offset + new_keys,
            static_kv=static_kv,
        )
        if key_padding_mask is not None and not bool(key_padding_mask.any()):
            # fairseq keeps extending a key padding mask once one was passed, also after beam
            # reordering has dropped every padded row. An all-False mask masks nothing, so it is
            # neither used nor cached: the later steps then carry none, and skip its extension,
            # its reordering and the positions read through it (as fairseq's encoder drops it)
            key_padding_mask = None
        return query_offset, key_padding_mask

    def _cached(self, saved_state, keys: Dict[str, Tensor], key_padding_mask: Optional[Tensor]) -> Dict[str, Tensor]:
        """The call's (position-encoded) keys cached after those already cached: the keys the call attends to."""
        appends = "prev_key" in saved_state
        for name in keys:
            if appends:
                keys[name] = appended(saved_state[f"prev_{name}"], keys[name])
            saved_state[f"prev_{name}"] = keys[name]
        saved_state["prev_key_padding_mask"] = key_padding_mask
        return keys

    def _call_options(
        self, key_padding_mask: Optional[Tensor], query_offset: int, need_weights: bool, position_map
    ) -> CallOptions:
        # fairseq's protocol: --retain-dropout (FairseqDropout.apply_during_inference) keeps it in eval mode
        dropout = self.dropout_module
        dropout_p = dropout.p if self.training or dropout.apply_during_inference else 0.0
        # the path is chosen by functional.paths.choose_path on the mechanism's terms, for the call and for
        # the recompute decision alike
        flex, flex_from = module_flex(self.attention_flex, self.recompute_length, self.flex_on_cpu)
        return CallOptions(
            key_padding_mask,
            self.causal,
            query_offset,
            dropout_p,
            need_weights,
            flex,
            position_map=position_map,
            flex_from=flex_from,
        )

    def _attend(self, queries, keys, options: CallOptions, saved_state) -> Tuple[Tensor, Optional[Tensor]]:
        """The mechanism on the call: in recomputed row blocks where it decides so (full sequences only)."""
        if saved_state is None and self._recomputes_in_row_blocks(queries, keys, options):
            return self._attend_in_recomputed_chunks(queries, keys, options)
        return self.mechanism(queries, keys, options, saved_state)

    def _draw_position_map(self, saved_state, tgt_len: int, src_len: int) -> Optional[Tensor]:
        """This call's randomized positions (``--randomized-positions N``, Ruoss et al. 2023):
        in training only, for a mechanism that reads them (:attr:`Mechanism.random_positions`),
        one draw per call and so per layer, as the authors draw in every attention layer, shared
        by the batch and by the row blocks of a recomputed call: sorted positions of ``[0, N)``
        for a mechanism that rotates by positions (``"positions"``), sorted distances of
        ``[1, N)`` for one read by ``j - i`` (``"distances"``; :mod:`functional.randomized_positions`).
        None in evaluation, which takes the ordinary positions, unless
        ``--randomized-positions-at-evaluation``: then its full-sequence calls draw too, as
        the authors' code does in every call. A decoding step cannot draw a sorted sample
        for a length it does not know yet: decoding with that option is refused."""
        kind = self.mechanism.random_positions
        drawing = self.training or self.randomized_at_evaluation
        if not (drawing and self.randomized_positions and kind):
            return None
        if saved_state is not None:
            if self.training:
                return None
            raise ValueError(RANDOMIZED_DECODING)
        length = max(tgt_len, src_len)
        device = self.q_proj.weight.device
        if kind == "positions":
            return sample_positions(length, self.randomized_positions, device)
        return sample_distances(length, self.randomized_positions, device)

    def _recomputes_in_row_blocks(self, queries, keys, options: CallOptions) -> bool:
        """Whether this full-sequence call runs in recomputed row blocks (the
        mechanism decides, from the call and its terms: :func:`functional.terms.recomputes_in_row_blocks`)."""
        call = Call.of(queries["query"], keys["key"], options, self.recompute_length)
        return self.mechanism.recomputes_in_row_blocks(call, queries, keys, options)

    def _attend_in_recomputed_chunks(
        self, queries: Dict[str, Tensor], keys: Dict[str, Tensor], options: CallOptions
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The mechanism over blocks of query rows, each under activation
        checkpointing: backward recomputes one block at a time, so no
        [B, H, Tq, Tk] tensor outlives the forward pass. Only for full
        sequences (no incremental state), so block rows start at position 0."""
        bsz, heads, tgt_len, _ = queries["query"].shape
        src_len = keys["key"].size(2)
        rows = max(1, RECOMPUTE_CHUNK_ELEMENTS // (bsz * heads * src_len), -(-tgt_len // RECOMPUTE_MAX_BLOCKS))
        outputs, weights = [], []
        for start in range(0, tgt_len, rows):
            end = min(start + rows, tgt_len)
            chunk_keys, chunk_padding = keys, options.key_padding_mask
            if options.causal and not options.need_weights:
                # keys after the block's last query are invisible to all of it
                chunk_keys = {name: tensor[:, :, :end] for name, tensor in keys.items()}
                chunk_padding = None if chunk_padding is None else chunk_padding[:, :end]
            out, probs = checkpoint(
                self.mechanism,
                {name: tensor[:, :, start:end] for name, tensor in queries.items()},
                chunk_keys,
                options._replace(key_padding_mask=chunk_padding, query_offset=start),
                None,
                use_reentrant=False,
            )
            outputs.append(out)
            weights.append(probs)
        return torch.cat(outputs, dim=2), torch.cat(weights, dim=2) if options.need_weights else None

    def _is_cached_key(self, name: str) -> bool:
        return name in self.cached_key_names


def cache_recompute_lengths(decoder: nn.Module) -> FrozenSet[int]:
    """The lengths at which some attention of ``decoder`` makes its cached keys stale
    (:attr:`Mechanism.cache_recompute_length`)."""
    return frozenset(
        module.mechanism.cache_recompute_length
        for module in decoder.modules()
        if isinstance(module, MechanismMultiheadAttention) and module.mechanism.cache_recompute_length is not None
    )


def _forward_into(forward, cache, *args, **kwargs):
    kwargs["incremental_state"] = cache
    return forward(*args, **kwargs)


@contextlib.contextmanager
def filling_a_new_cache(decoder: nn.Module, incremental_state: Dict[str, Dict[str, Optional[Tensor]]]):
    """Every attention of ``decoder`` (fairseq's and this module alike) with its cache in
    ``incremental_state`` emptied, and, inside, caching into it whatever a full-sequence pass
    (which fairseq's decoder runs without a state) computes: one call then refills the cache
    of a whole sequence, as a decoding step that starts from an empty cache would."""
    attentions = [module for module in decoder.modules() if isinstance(module, MultiheadAttention)]
    for attention in attentions:
        attention._set_input_buffer(incremental_state, {})
        attention.forward = functools.partial(_forward_into, attention.forward, incremental_state)
    try:
        yield
    finally:
        for attention in attentions:
            del attention.forward
