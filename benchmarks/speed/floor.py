"""Cost floors of the window presets: fairseq's own models doing the window's tensor work in stock ops.

A floor is fairseq's own model (``transformer`` or ``transformer_lm``) whose
windowed layers, those the preset windows, additionally do the tensor work of
Nguyen et al. 2020's Differentiable Window, written with stock torch ops on
top of fairseq's unchanged ``MultiheadAttention`` and without any code of this
plugin. It is not a model: its outputs are exactly vanilla fairseq's.

``window-floor`` (translation, the layers of ``distattn_window_wmt_en_de``:
encoder self AW, decoder self MW and cross AW-seg with b = 5 in layers 0-2)
does, per windowed attention and on every forward (training, and the encoder
pass of generation):

- eqs. 7-8: the extra d x d projections of the pointers, left and right query
  and key (AW: also the local query and key, six in all; MW: four), as
  ``nn.Linear`` layers with parameters (so the Adam step updates as many
  parameters as the preset's), the two pointer score matmuls over
  ``[B, H, Tq, Tk]``, one ``masked_fill`` of each (padding; decoder self: and
  fairseq's future mask) and the two softmaxes;
- eq. 9: the cumulative sums ``f = cumsum(p)``, ``g = sum(p) - f + p`` and
  ``m = f_l g_r + f_r g_l``; AW-seg (eqs. 10-11): the segment index of every
  key counted from the first real token, the pointers pooled per segment
  (``scatter_add``), cumulative sums over segments read back per key (``gather``);
- eqs. 14-17 (AW): the local score matmul ``Q_l K_l^T`` and its product with
  ``m``; eqs. 12-13 (MW): one product of a ``[B, H, Tq, Tk]`` tensor with
  ``m`` (the left pointer stands in for the attention weights, which fairseq's
  fused attention does not expose);
- backward: ``0 * sum(window tensor)`` is added to the attention output, so
  autograd runs the backward of all of the above (stock autograd formulas) and
  the projections get (zero) gradients.

In incremental decoding (beam search) it does, per step: the pointer (and
local) query projections of the new position; decoder self MW: the two pointer
key projections of the new position, cached and reordered with fairseq's
``prev_key``; cross AW-seg: the three key projections and the segment index of
the encoder output once per sentence, cached like fairseq's ``prev_key`` (one
copy per sentence under beam search); then the same pointer scores, softmaxes,
sums, segment pooling and products over ``[B, H, 1, Tk]``.

What it does not do, so that a preset's distance to its floor is not all
overhead of the plugin's own making:

- the window does not change the attention: AW's ``local * m`` is not added to
  the logits inside the softmax and MW's ``m`` does not multiply the softmax
  weights, so fairseq keeps its fused attention (the paper's window needs the
  bias inside the softmax, or the weights out of it); one ``sum`` and one scalar
  add per windowed attention are done instead (not work of the paper);
- no closed-form backward: the plugin's hand-written backward of eq. 9 does in
  fewer passes what autograd's formulas for ``cumsum`` and the products do here,
  so for training the floor is the paper's work in stock ops, not a bound below
  every implementation.

``lm-window-floor`` is the same for ``transformer_lm`` and the MW window of
``distattn_lm_window_gbw`` (decoder self MW in layers 0-2). It is measured in
beam search only (the harness does not train it).

A floor's ratio to vanilla is what the paper's window costs when written as
plainly as fairseq's own attention (one op per operation of the equations, no
fused kernels); the preset's ratio to its floor is the plugin's own overhead
(or gain). The harness reports both (targets.py, report.py).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

# The layers distattn_lm_window_gbw gives window-mw (tests check they agree).
WINDOW_FLOOR_LAYERS = (0, 1, 2)
# distattn_window_wmt_en_de: {attention: (window kind, layers)}; tests check it against the preset's plans.
TRANSLATION_WINDOW_FLOOR = {
    "encoder_self": ("aw", (0, 1, 2)),
    "decoder_self": ("mw", (0, 1, 2)),
    "cross": ("aw-seg", (0, 1, 2)),
}
# Segment size b of the -seg windows (the plugin's --window-segment-size default; tests check it).
WINDOW_SEGMENT_SIZE = 5


def _layout(kind: str, layers: Sequence[int]) -> str:
    return (
        f"{kind}@{layers[0]}-{layers[-1]}"
        if list(layers) == list(range(layers[0], layers[-1] + 1))
        else f"{kind}@{','.join(map(str, layers))}"
    )


def describe_floor(task: str) -> str:
    """The layout column of the benchmark tables for the floor of ``task`` ("translation" or "language_modeling")."""
    if task == "translation":
        parts = [
            f"{label} {_layout(*TRANSLATION_WINDOW_FLOOR[name])}"
            for name, label in (("encoder_self", "enc"), ("decoder_self", "dec"), ("cross", "cross"))
        ]
        return "vanilla + window tensor work: " + "; ".join(parts)
    return "vanilla + window-mw tensor work in dec layers " + ",".join(map(str, WINDOW_FLOOR_LAYERS))


class WindowWorkAttention(MultiheadAttention):
    """fairseq's attention plus the window's tensor work (see the module docstring).

    ``window_kind``: "mw" (pointers, eq. 9, one product with ``m``), "aw"
    (also the local scores times ``m``) or "aw-seg" (AW with segment pooling)."""

    window_kind = "mw"
    segment_size = 0

    def add_window_projections(self, kind: str = "mw", segment_size: int = WINDOW_SEGMENT_SIZE) -> None:
        if kind not in ("mw", "aw", "aw-seg"):
            raise ValueError(f"window kind must be mw, aw or aw-seg, not {kind!r}")
        self.window_kind = kind
        self.segment_size = segment_size if kind.endswith("-seg") else 0
        names = ("left", "right", "local") if kind.startswith("aw") else ("left", "right")
        like = self.q_proj.weight
        self.window_query_proj = nn.ModuleDict({n: self._projection(self.embed_dim) for n in names}).to(like)
        self.window_key_proj = nn.ModuleDict({n: self._projection(self.kdim) for n in names}).to(like)

    def _projection(self, input_dim: int) -> nn.Linear:
        # the plugin's initialisation (scale only matters for the values the softmaxes see)
        layer = nn.Linear(input_dim, self.embed_dim)
        nn.init.xavier_uniform_(layer.weight, gain=2**-0.5)
        nn.init.zeros_(layer.bias)
        return layer

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ):
        out, weights = super().forward(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            incremental_state=incremental_state,
            need_weights=need_weights,
            static_kv=static_kv,
            attn_mask=attn_mask,
            before_softmax=before_softmax,
            need_head_weights=need_head_weights,
        )
        if before_softmax:
            return out, weights
        work = self._window_work(query, key, key_padding_mask, attn_mask, incremental_state)
        # outputs stay vanilla's (0 * a finite sum; nan_to_num guards a fully masked row), gradients flow
        return out + torch.nan_to_num(work * 0.0), weights

    # ----------------------------------------------------------------- the work

    def _heads(self, x: Tensor) -> Tensor:
        """[T, B, E] -> [B, H, T, D], the layout of fairseq's ``prev_key``."""
        length, bsz, _ = x.shape
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _window_work(
        self,
        query: Tensor,
        key: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        incremental_state,
    ) -> Tensor:
        keys, segments, hidden = self._window_keys(query, key, key_padding_mask, attn_mask, incremental_state)
        queries = {name: self._heads(proj(query)) for name, proj in self.window_query_proj.items()}
        rows = query.size(1) // keys["left"].size(0)
        if rows > 1:
            # beam search: the r hypotheses of a sentence share its cached cross-attention keys; fold them into
            # the query positions, [B' r, H, T, D] -> [B', H, r T, D] (one small copy of the queries, as
            # fairseq's einsum does, not r copies of the keys)
            queries = {
                name: q.view(-1, rows, *q.shape[1:]).transpose(1, 2).flatten(2, 3) for name, q in queries.items()
            }
        left = self._pointer(queries["left"], keys["left"], hidden)
        right = self._pointer(queries["right"], keys["right"], hidden)
        if segments is not None:
            mask = self._segment_window(left, right, segments)
        else:
            left_f, right_f = left.cumsum(-1), right.cumsum(-1)
            left_g = (left.sum(-1, keepdim=True) - left_f).add_(left)
            right_g = (right.sum(-1, keepdim=True) - right_f).add_(right)
            mask = torch.addcmul(left_f * right_g, right_f, left_g)
        if "local" in queries:  # AW: the local scores times m (eqs. 15-16)
            return (self._scores(queries["local"], keys["local"]) * mask).sum()
        return (left * mask).sum()  # MW: a [B, H, Tq, Tk] tensor times m (eq. 12)

    def _window_keys(self, query, key, key_padding_mask, attn_mask, incremental_state):
        """Pointer (and local) keys ``{name: [B', H, Tk, D]}``, the segment index of every key
        ``[B', 1, 1, Tk]`` (AW-seg, else None) and the mask of hidden keys (or None)."""
        state = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        cross = self.encoder_decoder_attention
        if state is not None and cross and "prev_left_key" in state:
            # static keys, projected once per sentence (fairseq: key is None from the second step on)
            keys = {name: state[f"prev_{name}_key"] for name in self.window_key_proj}
            padding = state.get("prev_window_padding")
            return keys, state.get("prev_window_segments"), None if padding is None else padding[:, None, None]
        if self.self_attention:
            key = query
        if state is not None and cross and self.beam_size > 1 and key.size(1) == query.size(1):
            # fairseq keeps one copy of the encoder keys per sentence under beam search
            key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
        if state is not None and not cross:
            key_padding_mask = None  # a decoding step's mask covers its own position only (fairseq's, likewise)
        keys = {name: self._heads(proj(key)) for name, proj in self.window_key_proj.items()}
        if state is not None and "prev_left_key" in state:  # decoder self-attention: the earlier positions' keys
            keys = {name: torch.cat([state[f"prev_{name}_key"], k], dim=2) for name, k in keys.items()}
        padding = key_padding_mask.to(torch.bool) if key_padding_mask is not None else None
        segments = None
        if self.segment_size:
            if padding is not None:  # counted from each sentence's first real token
                rank = (torch.cumsum((~padding).long(), dim=-1) - 1).clamp_(min=0)
            else:
                rank = torch.arange(key.size(0), device=key.device).expand(key.size(1), -1)
            segments = (rank // self.segment_size)[:, None, None, :]
        if state is not None:
            state.update((f"prev_{name}_key", k) for name, k in keys.items())
            if cross:
                if segments is not None:
                    state["prev_window_segments"] = segments
                if padding is not None:
                    state["prev_window_padding"] = padding
            self._set_input_buffer(incremental_state, state)
        hidden = None if padding is None else padding[:, None, None]
        if attn_mask is not None:  # fairseq's future mask, -inf above the diagonal
            future = torch.isinf(attn_mask)
            hidden = future if hidden is None else hidden | future
        return keys, segments, hidden

    def _scores(self, queries: Tensor, keys: Tensor) -> Tensor:
        """``[B', H, Tq, D] x [B', H, Tk, D] -> [B', H, Tq, Tk]``."""
        return torch.matmul(queries * self.scaling, keys.transpose(-2, -1))

    def _pointer(self, queries: Tensor, keys: Tensor, hidden: Optional[Tensor]) -> Tensor:
        scores = self._scores(queries, keys)
        if hidden is not None:
            scores = scores.masked_fill(hidden, float("-inf"))
        return torch.softmax(scores, dim=-1)

    def _segment_window(self, left: Tensor, right: Tensor, segments: Tensor) -> Tensor:
        """Eq. 11: cumulative sums over whole segments of b keys, read back per key, then eq. 9's product."""
        index = segments.expand_as(left)
        count = (segments.size(-1) + self.segment_size - 1) // self.segment_size

        def sums(pointer: Tensor) -> Tuple[Tensor, Tensor]:
            pooled = pointer.new_zeros(pointer.shape[:-1] + (count,)).scatter_add(-1, index, pointer)
            f = pooled.cumsum(-1)
            g = (pooled.sum(-1, keepdim=True) - f).add_(pooled)
            return f.gather(-1, index), g.gather(-1, index)

        (left_f, left_g), (right_f, right_g) = sums(left), sums(right)
        return torch.addcmul(left_f * right_g, right_f, left_g)


def _make_window_work(attention: MultiheadAttention, kind: str) -> None:
    attention.__class__ = WindowWorkAttention
    attention.add_window_projections(kind)


def add_window_work(model, layers: Sequence[int] = WINDOW_FLOOR_LAYERS) -> None:
    """Turn the self-attention of ``layers`` of a fairseq ``transformer_lm`` into MW :class:`WindowWorkAttention`."""
    for index in layers:
        _make_window_work(model.decoder.layers[index].self_attn, "mw")


def add_translation_window_work(model) -> None:
    """Give a fairseq ``transformer`` the window work of ``distattn_window_wmt_en_de``
    (:data:`TRANSLATION_WINDOW_FLOOR`), after its own parameters were drawn."""
    where = {
        "encoder_self": lambda i: model.encoder.layers[i].self_attn,
        "decoder_self": lambda i: model.decoder.layers[i].self_attn,
        "cross": lambda i: model.decoder.layers[i].encoder_attn,
    }
    for name, (kind, layers) in TRANSLATION_WINDOW_FLOOR.items():
        for index in layers:
            _make_window_work(where[name](index), kind)


def add_floor_work(model, task: str) -> None:
    """The floor of ``task`` ("translation" or "language_modeling") on a freshly built fairseq model."""
    if task == "translation":
        add_translation_window_work(model)
    else:
        add_window_work(model)
