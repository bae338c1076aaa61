"""``fox``: Forgetting Attention (Lin, Nikishin, He and Courville 2025)."""

import torch
from torch import nn

from ..functional.attention import logit_dtype
from ..functional.forgetting import forgetting_attention
from ..registry import CROSS_KIND, SELF_ATTENTION, register_attention
from .base import LearnedValues, Mechanism, MechanismConfig

# the authors' initialisation of every linear layer (initializer_range), the forget gate's included
GATE_WEIGHT_STD = 0.02


@register_attention(
    "fox",
    op=forgetting_attention,
    kinds=SELF_ATTENTION,
    unsupported={
        CROSS_KIND: "a forget gate decays a key by the gates of the positions between it and the query, which "
        "cross-attention's keys (another sequence) do not have"
    },
    layer_inputs=("log_forget",),
    description="Forgetting Attention: a learned forget gate `f_t = sigmoid(w_h x_t + b_h)` per head and "
    "position; the logits get `sum_{l=j+1}^{i} log f_l` (FoX, the authors' gate); the encoder takes "
    "x-transformers' bidirectional form (a second gate for the keys after the query)",
    paper="Lin, Nikishin, He and Courville 2025, *Forgetting Transformer: Softmax Attention with a Forget Gate*",
)
class ForgettingAttention(Mechanism):
    """Lin et al. 2025, the "full" forget gate of the authors' code
    (zhixuan-lin/forgetting-transformer 883f260,
    ``src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py``:
    ``fgate_proj = nn.Linear(hidden_size, num_heads, bias=True)`` on the layer's input,
    ``log_fgate = logsigmoid(fgate_logit.float())``, weights drawn N(0, 0.02) and the
    bias 0 by their initialiser; x-transformers' ``DataDependentAlibi`` starts its bias
    at 5 instead, gates near 1). The gates are this layer's ``layer_inputs``: made from
    each new position's input and cached with the keys, so a decoding step adds one
    gate per head. Their FoX (Pro) adds an output gate, QK-norm and a data-dependent
    token shift of the keys and values to the layer: other parts of a block, not the
    forget gate, and not here.

    In encoder self-attention (``config.causal`` False) the gate has a second set of
    heads for the keys after the query, x-transformers' bidirectional
    ``DataDependentAlibi`` (9252ed7: ``nn.Linear(dim, heads * 2)``, the first half
    forward); a layer built without knowing its causality (``causal`` None: a lone
    module) has both and uses the first half in a causal call."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.directions = 1 if config.causal else 2
        embed_dim = config.num_heads * config.head_dim
        self.gate = nn.Linear(embed_dim, config.num_heads * self.directions)
        nn.init.normal_(self.gate.weight, std=GATE_WEIGHT_STD)
        nn.init.zeros_(self.gate.bias)

    def extra_repr(self) -> str:
        return f"heads={self.config.num_heads}, {'causal' if self.directions == 1 else 'both directions'}"

    def inputs_from_layer(self, x):
        length, batch, _ = x.shape
        logits = self.gate(x).to(logit_dtype(x.dtype))  # the authors cast the logits to float32 first
        log_forget = torch.nn.functional.logsigmoid(logits).view(length, batch, self.directions, self.config.num_heads)
        return {"log_forget": log_forget.permute(1, 3, 0, 2)}  # [B, H, T, directions]

    def op_arguments(self, queries, keys, options):
        gates = keys["log_forget"]
        if not options.causal and self.directions == 1:
            raise ValueError(
                "this fox layer was built for causal attention: it has no gates for the keys after a query"
            )
        return (gates[..., 0], None if options.causal else gates[..., 1]), {}

    def learned_values(self, causal):
        bias = self.gate.bias.detach().double().cpu().view(self.directions, -1)
        found = [LearnedValues("gate bias per head", bias[0], note="b_h: the forget gate's logit bias")]
        if self.directions == 2 and not causal:
            found.append(LearnedValues("backward gate bias per head", bias[1], note="the keys after the query"))
        norms = self.gate.weight.detach().double().cpu().view(self.directions, -1, self.gate.in_features)
        found.append(LearnedValues("gate weight norm per head", norms[0].norm(dim=-1), note="|w_h|"))
        return found
