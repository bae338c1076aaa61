"""Cost floors of the mechanisms that form their own attention weights: stick-breaking, PaTH, DAPE.

Each floor is fairseq's own ``transformer`` whose attentions that the mechanism's
row covers (:func:`.configs.mechanism_config`: every layer of every attention kind
the mechanism allows) compute that mechanism's attention written out in stock
torch ops, without any code of this plugin, as the shortest program of its
equations: fairseq's q, k, v and output projections, the scores, the mechanism's
own work, the weights (attention dropout on them) times the values. Unlike the
window's floor (:mod:`.floor`), it is a model: its outputs are the mechanism's, and
``tests/test_benchmarks.py`` checks each attention against the plugin's op.

- ``stick-breaking-floor`` (decoder self-attention): ``z = q k^T / sqrt(D)``,
  ``log A_ij = logsigmoid(z_ij) - sum_{j<l<i} softplus(z_il)`` over the visible
  earlier keys (one reverse cumulative sum), ``A v`` plus the remaining stick on
  the query's own value, as the authors' model; attention dropout on ``A`` where it
  multiplies the values, as the plugin's op.
- ``path-floor`` (decoder self-attention): fla's layer inputs (rank-32 projection of
  ``w``, its causal depthwise convolution of width 3 with SiLU, ``beta = 2
  sigmoid(.)``), ``w`` normalised per head, then every query carried back over the
  key positions one Householder step at a time (the naive O(T^2 D) loop; fla's
  chunked UT-transform kernel is a speed device neither side has), the causal softmax.
- ``dape-floor`` (encoder and decoder self-attention): KERPLE's logarithmic bias
  ``-p log(1 + a |i - j|)`` (p, a clamped to >= 0.01), the MLP ``Linear(2H, 32) ->
  LeakyReLU -> Linear(32, H)`` over the scores and the bias of each pair, its first
  layer split so that the bias's half is computed once for the batch (the plugin
  does the same: a floor without it would be slower than the equations need), the
  softmax.

A mechanism's ratio to its floor is then the plugin's own overhead (or gain): its
module, the per-call contract and the execution path around the same arithmetic.
Floors train only: the speed report has no beam-search row for a mechanism.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

# fla's PaTHAttention defaults and its model's initializer range; DAPE's MLP width (tests check them
# against the plugin's)
PATH_LOW_RANK, PATH_CONV_SIZE, PATH_INIT_STD = 32, 3, 0.02
DAPE_WIDTH, DAPE_SLOPE, KERPLE_FLOOR = 32, 0.01, 1e-2


class MechanismFloorAttention(MultiheadAttention):
    """fairseq's attention with its softmax attention replaced by a mechanism's, in stock ops
    (training and evaluation forwards; no incremental decoding)."""

    mechanism = ""
    causal = True

    def add_mechanism(self, mechanism: str, causal: bool) -> None:
        self.mechanism, self.causal = mechanism, causal
        like = self.q_proj.weight
        build = {"stick-breaking": lambda: None, "path": self._add_path, "dape": self._add_dape}[mechanism]
        build()
        self.to(like)

    def _add_path(self) -> None:  # the plugin's names
        width = self.embed_dim
        self.w_low_rank = nn.Linear(width, PATH_LOW_RANK, bias=False)
        self.w_proj = nn.Linear(PATH_LOW_RANK, width, bias=False)
        self.w_conv = nn.Conv1d(width, width, PATH_CONV_SIZE, groups=width, padding=PATH_CONV_SIZE - 1, bias=False)
        self.beta_proj = nn.Linear(width, self.num_heads)
        for module in (self.w_low_rank, self.w_proj, self.w_conv, self.beta_proj):
            nn.init.normal_(module.weight, std=PATH_INIT_STD)
        nn.init.zeros_(self.beta_proj.bias)

    def _add_dape(self) -> None:  # the plugin's names: a checkpoint's weights load by name
        self.scale = nn.Parameter(torch.rand(self.num_heads) * 2.0)
        self.rate = nn.Parameter(torch.rand(self.num_heads))
        self.hidden = nn.Linear(2 * self.num_heads, DAPE_WIDTH)
        self.output = nn.Linear(DAPE_WIDTH, self.num_heads)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True, **kwargs):
        if incremental_state is not None:
            raise NotImplementedError("a mechanism floor is trained only (the report has no beam row for it)")
        length, batch, _ = query.shape
        q, k, v = (self._heads(proj(x)) for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        padding = None if key_padding_mask is None else key_padding_mask.to(torch.bool)[:, None, None, :]
        out = FLOOR_ATTENTION[self.mechanism](self, q, k, v, padding, query)
        out = out.permute(2, 0, 1, 3).reshape(length, batch, self.embed_dim)
        return self.out_proj(out), None

    def _heads(self, x: Tensor) -> Tensor:
        """[T, B, E] -> [B, H, T, D]."""
        length, batch, _ = x.shape
        return x.view(length, batch, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _hidden(self, tgt_len: int, src_len: int, padding: Optional[Tensor], device) -> Optional[Tensor]:
        """Hidden keys, True = hidden: padding, and the future where causal."""
        hidden = padding
        if self.causal:
            future = torch.ones(tgt_len, src_len, dtype=torch.bool, device=device).triu(1)
            hidden = future if hidden is None else hidden | future
        return hidden

    def _softmax_attention(self, logits: Tensor, v: Tensor, padding: Optional[Tensor]) -> Tensor:
        hidden = self._hidden(logits.size(-2), logits.size(-1), padding, logits.device)
        if hidden is not None:
            logits = logits.masked_fill(hidden, float("-inf"))
        weights = F.dropout(torch.softmax(logits, dim=-1), self.dropout_module.p, self.training)
        return torch.matmul(weights, v)


def stick_breaking_floor(attention, q, k, v, padding, x) -> Tensor:
    z = torch.matmul(q * attention.scaling, k.transpose(-2, -1))
    length = z.size(-1)
    visible = torch.ones(length, length, dtype=torch.bool, device=z.device).tril(-1)
    if padding is not None:
        visible = visible & ~padding
    unbroken = torch.where(visible, -F.softplus(z), 0.0)
    after = unbroken.flip(-1).cumsum(-1).flip(-1)
    after = torch.cat([after[..., 1:], torch.zeros_like(after[..., :1])], dim=-1)
    weights = torch.where(visible, F.logsigmoid(z) + after, float("-inf")).exp()
    remainder = unbroken.sum(-1, keepdim=True).exp()
    if padding is not None:  # no remainder on a padded query's own value
        remainder = remainder.masked_fill(padding[:, :, 0, :, None], 0.0)
    weights = F.dropout(weights, attention.dropout_module.p, attention.training)
    return torch.matmul(weights, v) + remainder * v


def path_floor(attention, q, k, v, padding, x) -> Tensor:
    batch, heads, length, head_dim = q.shape
    raw = attention._heads(attention.w_proj(attention.w_low_rank(x)))
    beta = 2 * torch.sigmoid(attention.beta_proj(x)).permute(1, 2, 0)  # [B, H, T]
    if padding is not None:
        raw = raw.masked_fill(padding[:, :, 0, :, None], 0.0)
    channels = raw.permute(0, 1, 3, 2).reshape(batch, heads * head_dim, length)
    w = F.silu(attention.w_conv(channels)[..., :length]).view(batch, heads, head_dim, length).permute(0, 1, 3, 2)
    w = F.normalize(w, dim=-1)
    if padding is not None:
        w = w.masked_fill(padding[:, :, 0, :, None], 0.0)
        beta = beta.masked_fill(padding[:, :, 0, :], 0.0)
    positions = torch.arange(length, device=q.device)
    carried, columns = q * attention.scaling, [None] * length
    for j in range(length - 1, -1, -1):
        if j + 1 < length:  # H_{j+1} on the queries at positions >= j + 1
            w_t = w[:, :, j + 1, None, :]
            updated = carried - beta[:, :, j + 1, None, None] * (carried * w_t).sum(-1, keepdim=True) * w_t
            carried = torch.where((positions > j)[:, None], updated, carried)
        columns[j] = (carried * k[:, :, j, None, :]).sum(-1)
    return attention._softmax_attention(torch.stack(columns, dim=-1), v, padding)


def dape_floor(attention, q, k, v, padding, x) -> Tensor:
    heads, tgt_len, src_len = q.size(1), q.size(2), k.size(2)
    scores = torch.matmul(q * attention.scaling, k.transpose(-2, -1))
    distance = (torch.arange(tgt_len, device=q.device)[:, None] - torch.arange(src_len, device=q.device)).abs()
    scale, rate = attention.scale.clamp(min=KERPLE_FLOOR), attention.rate.clamp(min=KERPLE_FLOOR)
    bias = -scale[:, None, None] * torch.log1p(rate[:, None, None] * distance)  # [H, Tq, Tk]
    first = attention.hidden.weight
    from_bias = F.linear(bias.permute(1, 2, 0), first[:, heads:], attention.hidden.bias)  # [Tq, Tk, W]
    hidden = F.leaky_relu(torch.matmul(scores.permute(0, 2, 3, 1), first[:, :heads].t()) + from_bias, DAPE_SLOPE)
    adaptive = attention.output(hidden).permute(0, 3, 1, 2)
    return attention._softmax_attention(scores + bias + adaptive, v, padding)


FLOOR_ATTENTION: Dict[str, Callable] = {"stick-breaking": stick_breaking_floor, "path": path_floor, "dape": dape_floor}


def floor_places(mechanism: str) -> Tuple[str, ...]:
    """Where the mechanism's speed row places it, as :func:`.configs.mechanism_config` reads the
    registry: ``"enc"`` and/or ``"dec"`` (self-attention, every layer); the floors have no
    cross-attention form."""
    import fairseq_distattn.mechanisms  # noqa: F401 (discovers the registry)
    from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF

    if mechanism in CROSS.allowed:
        raise ValueError(f"{mechanism} is allowed in cross-attention, which a mechanism floor does not cover")
    return tuple(label for kind, label in ((ENCODER_SELF, "enc"), (DECODER_SELF, "dec")) if mechanism in kind.allowed)


def describe_mechanism_floor(mechanism: str) -> str:
    return f"fairseq `transformer`, {mechanism} in stock ops in {'+'.join(floor_places(mechanism))}, all layers"


def add_mechanism_floor(model, mechanism: str) -> None:
    """Give a freshly built fairseq ``transformer`` ``mechanism``'s floor attention (after its own
    parameters were drawn: the same seed gives vanilla's weights)."""
    for place in floor_places(mechanism):
        for layer in model.encoder.layers if place == "enc" else model.decoder.layers:
            layer.self_attn.__class__ = MechanismFloorAttention
            layer.self_attn.add_mechanism(mechanism, causal=place == "dec")
