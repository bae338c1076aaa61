"""Query-value interaction attention (Wu, Wu, Qi, Huang), dot-product form.

Eq. (7)   Q^ = softmax(V Q^T / sqrt d) Q
Eq. (8)   g(Q, V) = (1 - beta) * (Q^ * (V W)) + beta * V
Eq. (9)   beta = sigmoid([Q^ * (V W); V] u + h)
Eq. (10)  O = softmax(Q K^T / sqrt d) g(Q, V)

The paper leaves the shapes of u and h open. We implement, per head:
W in R^{d x d} (``value_projection``, [H, D, D]), u in R^{2d}
(``gate_weight``, [H, 2D]) and h a scalar bias (``gate_bias``, [H]), so beta
is one gate per value position: beta_j = sigmoid(u . [q^_j * W v_j ; v_j] + h).

Eq. (7) mixes queries into each value, which is only defined for
self-attention (queries and values are the same positions). Value j at
position ``value_offset + j`` only uses queries at positions <= its own when
``causal`` (no future leak in a decoder), and never padded queries.

Sec. 4.3 (Fig. 2) compares g(Q, V) with its variants (``interaction``):
  ``gated``              eq. 8-9 (ours)
  ``values-only``        g_1 = V  (plain attention: the layer has no QVI parameters)
  ``interactions-only``  g_2 = Q^ * (V W)
  ``summation``          g_3 = Q^ * (V W) + V
The paper writes Q * W V in g_2 and g_3; we read Q there as the query mix Q^
of eq. 7, as eq. 8 uses it. g_2 and g_3 are then eq. 8 without its gate, so the
variants differ from ours only in how the two terms are combined, which is what
the ablation studies.
"""

from typing import Optional

import torch
from torch import Tensor

from .attention import HALF_DTYPES, attend, attention_op
from .masking import autocast_enabled, check_attention_arguments, check_tensor_argument
from .paths import CallOptions
from .terms import PLAIN, Terms

QVI_INTERACTIONS = ("gated", "values-only", "interactions-only", "summation")
# the parameters each g(Q, V) uses: W (value_projection), u (gate_weight), h (gate_bias)
INTERACTION_PARAMETERS = {
    "gated": ("value_projection", "gate_weight", "gate_bias"),
    "values-only": (),
    "interactions-only": ("value_projection",),
    "summation": ("value_projection",),
}


def float32_only(like: Tensor) -> torch.autocast:
    """A region where autocast (fairseq's --amp) is off on ``like``'s device: the float32
    recomputation of half inputs would otherwise run its matmuls in half again."""
    return torch.autocast(like.device.type, enabled=False)


def check_interaction_arguments(
    interaction: str,
    value_projection: Optional[Tensor],
    gate_weight: Optional[Tensor],
    gate_bias: Optional[Tensor],
    like_name: Optional[str] = None,
    like: Optional[Tensor] = None,
) -> None:
    """ValueError unless ``interaction`` is known and gets exactly the parameters it
    uses; given ``like`` (the ``[B, H, T, D]`` tensor they multiply), each is a
    floating tensor of ``[H, D, D]``, ``[H, 2D]`` or ``[H]`` on its device, in its
    dtype unless the op recomputes half inputs in float32 or autocast is on."""
    if interaction not in QVI_INTERACTIONS:
        raise ValueError(f"interaction must be one of {', '.join(QVI_INTERACTIONS)}, got {interaction!r}")
    used = INTERACTION_PARAMETERS[interaction]
    if like is not None:
        heads, dim = like.size(1), like.size(-1)
        shapes = {
            "value_projection": ("[H, D, D]", (heads, dim, dim)),
            "gate_weight": ("[H, 2D]", (heads, 2 * dim)),
            "gate_bias": ("[H]", (heads,)),
        }
        # eq. 8's einsum meets like with W: one dtype, unless the op or autocast converts them
        dtypes = None if like.dtype in HALF_DTYPES or autocast_enabled(like.device) else ()
    for name, parameter in (
        ("value_projection", value_projection),
        ("gate_weight", gate_weight),
        ("gate_bias", gate_bias),
    ):
        if name in used and parameter is None:
            raise ValueError(f"interaction {interaction!r} needs {name}")
        if name not in used and parameter is not None:
            raise ValueError(f"interaction {interaction!r} does not use {name}: pass None")
        if like is not None and parameter is not None:
            check_tensor_argument(name, parameter, like_name, like, dtypes)
            layout, shape = shapes[name]
            if tuple(parameter.shape) != shape:
                raise ValueError(f"{name} must be {layout} = {shape}, got {tuple(parameter.shape)}")


def query_aware_values(
    queries: Tensor,
    v: Tensor,
    value_projection: Optional[Tensor],
    gate_weight: Optional[Tensor],
    gate_bias: Optional[Tensor],
    *,
    query_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    query_offset: int = 0,
    value_offset: int = 0,
    interaction: str = "gated",
) -> Tensor:
    """g(Q, V) of eqs. 7-9 as ``[B, H, Tv, D]``, in the dtype of ``v``. ``queries``
    are at positions ``query_offset + i``, values at ``value_offset + j``.

    For half inputs g is computed in float32 and rounded once: in bfloat16 the
    product Q^ * (V W), the gate and the mix each round to 8 bits, which made
    a QVI model's output several times less exact than a vanilla one's
    (``python -m benchmarks.diagnostics.precision``). It is [B, H, Tv, D] work, small
    beside the attention. ``interaction`` picks g of sec. 4.3 (default: eq. 8-9)."""
    # eq. 7 attends from values over queries: the queries are its keys
    names = ("v", "queries", None, "query_padding_mask")
    check_attention_arguments(v, queries, None, query_padding_mask, causal, query_offset, names=names)
    if isinstance(value_offset, bool) or not isinstance(value_offset, int) or value_offset < 0:
        raise ValueError(f"value_offset must be an integer >= 0, got {value_offset!r}")
    check_interaction_arguments(interaction, value_projection, gate_weight, gate_bias, "v", v)
    if interaction == "values-only":
        return v  # g_1 = V
    if v.dtype in HALF_DTYPES:
        full = [None if t is None else t.float() for t in (queries, v, value_projection, gate_weight, gate_bias)]
        with float32_only(v):
            values = query_aware_values(
                *full,
                query_padding_mask=query_padding_mask,
                causal=causal,
                query_offset=query_offset,
                value_offset=value_offset,
                interaction=interaction,
            )
        return values.to(v.dtype)
    # values are the rows and queries the keys here: causal = query position <= value position
    values_over_queries = CallOptions(query_padding_mask, causal, value_offset - query_offset, need_weights=False)
    query_mix, _ = attend(v, queries, queries, PLAIN, values_over_queries)  # eq. 7
    # one [B*T, D] x [D, D] product per head (matmul would run B*H small ones)
    interaction_term = query_mix * torch.einsum("bhtd,hde->bhte", v, value_projection)
    if interaction == "interactions-only":
        return interaction_term  # g_2
    if interaction == "summation":
        return interaction_term + v  # g_3
    # eq. 9 with u split into its halves: [a; b] u = a u_1 + b u_2 needs no [.., 2D] copy
    dim = v.size(-1)
    gate_on_interaction, gate_on_values = gate_weight[:, None, :dim], gate_weight[:, None, dim:]
    gate = (interaction_term * gate_on_interaction).sum(-1, keepdim=True) + (v * gate_on_values).sum(-1, keepdim=True)
    beta = torch.sigmoid(gate + gate_bias[:, None, None])
    # lerp takes one dtype; under autocast the einsum's term is half beside float32 v and beta
    interaction_term, beta = interaction_term.to(v.dtype), beta.to(v.dtype)
    return torch.lerp(interaction_term, v, beta)  # eq. 8: (1 - beta) interaction + beta v


def query_value_interaction_terms(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    value_projection: Optional[Tensor],
    gate_weight: Optional[Tensor],
    gate_bias: Optional[Tensor],
    *,
    interaction: str = "gated",
    key_padding_mask: Optional[Tensor],
    causal: bool,
    query_offset: int,
) -> Terms:
    """Eq. 10's values: the query-aware values g(Q, V) of eqs. 7-9 replace ``v``. For
    half inputs the whole of eqs. 7-10 runs in float32: g(Q, V) grows with the queries
    (Q^ is a mix of them), and with large queries eq. 10's backward (dO g^T) overflows
    float16."""
    tgt_len, src_len = q.size(2), k.size(2)
    if src_len == 0:  # nothing to attend to: vanilla's zero rows, with no values to mix
        return PLAIN
    query_padding_mask = None
    if key_padding_mask is not None:
        if query_offset + tgt_len > src_len:
            raise ValueError(
                f"QVI's queries are among its keys (eq. 7 mixes the values with the queries' padding), but "
                f"query_offset {query_offset} + Tq {tgt_len} exceeds the src_len {src_len} keys"
            )
        query_padding_mask = key_padding_mask[:, query_offset : query_offset + tgt_len]
    check_interaction_arguments(interaction, value_projection, gate_weight, gate_bias, "q", q)
    if q.dtype in HALF_DTYPES and interaction != "values-only":
        q, k, v, value_projection, gate_weight, gate_bias = (
            None if t is None else t.float() for t in (q, k, v, value_projection, gate_weight, gate_bias)
        )
        with float32_only(q):
            values = query_aware_values(
                q,
                v,
                value_projection,
                gate_weight,
                gate_bias,
                query_padding_mask=query_padding_mask,
                causal=causal,
                query_offset=query_offset,
                interaction=interaction,
            )
        return Terms(query=q, key=k, value=values)
    values = query_aware_values(
        q,
        v,
        value_projection,
        gate_weight,
        gate_bias,
        query_padding_mask=query_padding_mask,
        causal=causal,
        query_offset=query_offset,
        interaction=interaction,
    )
    return Terms(value=values)


query_value_interaction_attention = attention_op(
    query_value_interaction_terms,
    "query_value_interaction_attention",
    """QVI self-attention, eqs. 7-10. ``q`` holds the queries at positions
    ``query_offset..`` and ``k``/``v`` the keys and values at ``0..Tk-1``;
    eq. 7 uses the queries given here (in incremental decoding the module
    passes all cached queries). ``interaction`` picks g of sec. 4.3 (default:
    eq. 8-9). Returns ``(out [B,H,Tq,D], probs [B,H,Tq,Tk])``.""",
)


__all__ = ["query_aware_values", "query_value_interaction_attention"]
