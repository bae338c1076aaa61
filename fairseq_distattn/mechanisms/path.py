"""``path``: PaTH attention (Yang et al. 2025)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.attention import logit_dtype
from ..functional.path_attention import path_attention
from ..registry import CROSS_KIND, DECODER_SELF_KIND, ENCODER_SELF_KIND, option, register_attention
from .base import Mechanism, MechanismConfig

CAUSAL_ONLY = (
    "a key is transformed by the Householder matrices of the positions between it and a later query, an order "
    "only causal attention has (flash-linear-attention defines no bidirectional form)"
)
# fla's PaTHAttention defaults (use_low_rank_w, conv_size) and its model's initializer_range
LOW_RANK = 32
CONV_SIZE = 3
INIT_STD = 0.02


@dataclass(frozen=True)
class PathOptions:
    path_forget_gate: bool = option(
        False,
        "--path-forget-gate",
        "path: PaTH-FoX, a forget gate per head and position on top of the Householder products (fla's "
        "use_forget_gate; default: off, as fla's layer)",
        action="store_true",
    )


@register_attention(
    "path",
    PathOptions,
    op=path_attention,
    kinds=frozenset({DECODER_SELF_KIND}),
    unsupported={ENCODER_SELF_KIND: CAUSAL_ONLY, CROSS_KIND: CAUSAL_ONLY},
    layer_inputs=("path_w", "path_beta", "log_forget"),
    description="PaTH: logits `q_i^T H_i ... H_{j+1} k_j` with data-dependent Householder matrices `H_t = I - "
    "beta_t w_t w_t^T` (w from a low-rank projection and a short convolution of the input, beta = 2 "
    "sigmoid(.)), as flash-linear-attention's layer; `--path-forget-gate` adds FoX's gate (PaTH-FoX)",
    paper="Yang et al. 2025, *PaTH Attention: Position Encoding via Accumulating Householder Transformations*",
)
class PaTH(Mechanism):
    """Yang et al. 2025, as flash-linear-attention's layer builds it (fla-org/
    flash-linear-attention bc3b101, ``fla/layers/path_attn.py``, ``PaTHAttention`` with
    its defaults): ``w = ShortConv(W_2 W_1 x)`` (a rank-32 projection to the key width, a
    causal depthwise convolution of width 3 with SiLU, no bias), normalised per head by
    the op; ``beta = 2 sigmoid(b x)`` per head (``bt_proj``, with bias); with
    ``--path-forget-gate`` FoX's ``log f = logsigmoid(g x)`` (``g_proj``). Every weight
    is drawn N(0, 0.02) and every bias 0, as fla's model initialises them.

    The projections of each position are this layer's ``layer_inputs``, cached with the
    keys; the convolution runs over the cached sequence at each call (a padded position's
    projection set to 0 first, so a left-padded sentence starts as fla's unpadded one),
    and the op forms every query's products from the cached keys, where fla's decoding
    updates the cached keys in place with each new token's H: the same logits."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        heads, head_dim = config.num_heads, config.head_dim
        width = heads * head_dim
        self.w_low_rank = nn.Linear(width, LOW_RANK, bias=False)
        self.w_proj = nn.Linear(LOW_RANK, width, bias=False)
        self.w_conv = nn.Conv1d(width, width, CONV_SIZE, groups=width, padding=CONV_SIZE - 1, bias=False)
        self.beta_proj = nn.Linear(width, heads)
        self.forget_gate = nn.Linear(width, heads) if config.options.path_forget_gate else None
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d)):
                nn.init.normal_(module.weight, std=INIT_STD)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def extra_repr(self) -> str:
        return f"heads={self.config.num_heads}, forget_gate={self.forget_gate is not None}"

    def _per_head(self, x, width):
        length, batch, _ = x.shape
        return x.view(length, batch, self.config.num_heads, width).permute(1, 2, 0, 3)  # [B, H, T, width]

    def inputs_from_layer(self, x):
        found = {
            "path_w": self._per_head(self.w_proj(self.w_low_rank(x)), self.config.head_dim),
            # fla: beta in float32, 2 sigmoid (eigenvalues of H in (-1, 1))
            "path_beta": self._per_head(2 * torch.sigmoid(self.beta_proj(x).to(logit_dtype(x.dtype))), 1),
        }
        if self.forget_gate is not None:
            logits = self.forget_gate(x).to(logit_dtype(x.dtype))
            found["log_forget"] = self._per_head(torch.nn.functional.logsigmoid(logits), 1)
        return found

    def directions(self, raw, key_padding_mask):
        """``w`` ``[B, H, Tk, D]``: the short convolution (with SiLU) of the projections,
        causal, a padded position's projection 0."""
        if key_padding_mask is not None:
            raw = raw.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        batch, heads, length, head_dim = raw.shape
        if length == 0:
            return raw
        channels = raw.permute(0, 1, 3, 2).reshape(batch, heads * head_dim, length)  # fla's (h d) channels
        convolved = torch.nn.functional.silu(self.w_conv(channels)[..., :length])
        return convolved.view(batch, heads, head_dim, length).permute(0, 1, 3, 2)

    def op_arguments(self, queries, keys, options):
        gates = keys.get("log_forget")
        w = self.directions(keys["path_w"], options.key_padding_mask)
        return (w, keys["path_beta"][..., 0], None if gates is None else gates[..., 0]), {}
