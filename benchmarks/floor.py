"""Cost floor of the LM window preset's beam search.

``lm-window-floor`` is fairseq's own ``transformer_lm`` whose windowed layers
(those of ``distattn_lm_window_gbw``) additionally do, per decoding step, the
tensor work that the multiplicative window of Nguyen et al. 2020 adds there,
written with stock ops on top of fairseq's unchanged attention and without
any code of this plugin:

- eqs. 7-8: four more d x d projections (``W_L^Q, W_L^K, W_R^Q, W_R^K``), the
  two pointer keys cached and reordered with the layer's ``prev_key`` (fairseq's
  own ``torch.cat`` and ``reorder_incremental_state``), the two pointer score
  matmuls and softmaxes;
- eq. 9: the cumulative sums and ``m = f_l g_r + f_r g_l``;
- eq. 12: one multiply of a ``[B, H, 1, T]`` tensor by ``m`` (fairseq's fused
  attention does not expose its weights, so the pointer stands in for them).

Its outputs are vanilla fairseq's, so it is not a model, and it only adds
work in incremental decoding (generation). Its ratio to vanilla is what the
paper's MW decoding step costs when written as plainly as fairseq's own
attention (one op per operation of the equations, no fused kernels); the
preset's distance to it is this plugin's own overhead.
"""
from __future__ import annotations

from typing import Sequence

import torch
from fairseq.modules import MultiheadAttention
from torch import nn

# The layers distattn_lm_window_gbw gives window-mw (tests check they agree).
WINDOW_FLOOR_LAYERS = (0, 1, 2)


class WindowWorkAttention(MultiheadAttention):
    """fairseq's attention plus the MW window's per-step tensor work (see module docstring)."""

    def add_window_projections(self) -> None:
        dim = self.embed_dim
        self.window_projections = nn.ModuleList(nn.Linear(dim, dim) for _ in range(4)).to(self.q_proj.weight)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        out = super().forward(query, key, value, key_padding_mask=key_padding_mask, incremental_state=incremental_state,
                              need_weights=need_weights, static_kv=static_kv, attn_mask=attn_mask,
                              before_softmax=before_softmax, need_head_weights=need_head_weights)
        if incremental_state is not None:
            self._window_step(query, incremental_state)
        return out

    def _window_step(self, query, incremental_state) -> None:
        length, bsz, _ = query.shape

        def heads(x):
            return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

        left_query, right_query, left_key, right_key = (heads(proj(query)) for proj in self.window_projections)
        state = self._get_input_buffer(incremental_state)
        if "prev_left_key" in state:
            left_key = torch.cat([state["prev_left_key"], left_key], dim=2)
            right_key = torch.cat([state["prev_right_key"], right_key], dim=2)
        state["prev_left_key"], state["prev_right_key"] = left_key, right_key
        self._set_input_buffer(incremental_state, state)
        left = torch.softmax(torch.matmul(left_query * self.scaling, left_key.transpose(-2, -1)), dim=-1)
        right = torch.softmax(torch.matmul(right_query * self.scaling, right_key.transpose(-2, -1)), dim=-1)
        left_f, right_f = left.cumsum(-1), right.cumsum(-1)
        left_g = (left.sum(-1, keepdim=True) - left_f).add_(left)
        right_g = (right.sum(-1, keepdim=True) - right_f).add_(right)
        torch.addcmul(left_f * right_g, right_f, left_g).mul_(left)


def add_window_work(model, layers: Sequence[int] = WINDOW_FLOOR_LAYERS) -> None:
    """Turn the self-attention of ``layers`` of a fairseq ``transformer_lm`` into :class:`WindowWorkAttention`."""
    for index in layers:
        attention = model.decoder.layers[index].self_attn
        attention.__class__ = WindowWorkAttention
        attention.add_window_projections()
