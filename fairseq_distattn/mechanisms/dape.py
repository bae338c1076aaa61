"""``dape``: data-adaptive positional encoding (Zheng et al. 2024)."""

from dataclasses import dataclass

import torch
from torch import nn

from ..functional.alibi import alibi_table
from ..functional.attention import logit_dtype
from ..functional.dape import DAPE_MLP_WIDTH, dape_attention
from ..functional.kerple import constrained, kerple_table
from ..registry import CROSS_KIND, DIFFERENT_SEQUENCES, SELF_ATTENTION, one_of, option, register_attention
from .base import LearnedValues, Mechanism, MechanismConfig

DAPE_BIASES = ("kerple", "alibi")


@dataclass(frozen=True)
class DapeOptions:
    dape_bias: str = option(
        "kerple",
        "--dape-bias",
        "dape: the static bias the MLP adapts, KERPLE's logarithmic kernel (learned per layer, DAPE-Kerple) or "
        "ALiBi's (DAPE-ALiBi), the authors' kerple_c and alibi_c (default: {default})",
        convert=one_of("--dape-bias", DAPE_BIASES),
        choices=DAPE_BIASES,
        metavar="BIAS",
    )


@register_attention(
    "dape",
    DapeOptions,
    op=dape_attention,
    kinds=SELF_ATTENTION,
    unsupported={CROSS_KIND: DIFFERENT_SEQUENCES},
    description="DAPE: a static bias B (KERPLE's, learned per layer, or ALiBi's: `--dape-bias`) plus an MLP "
    "of the scores and the bias across the heads, logits `A + B + MLP([A; B])` per query-key pair",
    paper="Zheng et al. 2024, *DAPE: Data-Adaptive Positional Encoding for Length Extrapolation*",
)
class Dape(Mechanism):
    """Zheng et al. 2024, as the authors' code runs it (chuanyang-Zheng/DAPE bde344a,
    ``megatron/model/positional_embeddings.py``: ``ParallelKerpleLog_C`` and ``AliBi_C``,
    built inside each attention layer by ``megatron/model/transformer.py``): per layer,
    KERPLE's ``p, a`` (uniform in [0, 2) and [0, 1), clamped to >= 0.01 at each training
    forward, as KERPLE's own code) or no parameters for ALiBi's slopes, and the MLP
    ``Linear(2H, 32) -> LeakyReLU -> Linear(32, H)`` with PyTorch's default
    initialisation. The FIRE base (DAPE-FIRE) is left out: the authors' FIRE inside it
    differs from FIRE's own (a LeakyReLU in its MLP) and is not the ``fire`` here."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        heads = config.num_heads
        self.base = config.options.dape_bias
        if self.base == "kerple":
            self.scale = nn.Parameter(torch.rand(heads) * 2.0)
            self.rate = nn.Parameter(torch.rand(heads))
        self.hidden = nn.Linear(2 * heads, DAPE_MLP_WIDTH)
        self.output = nn.Linear(DAPE_MLP_WIDTH, heads)

    def extra_repr(self) -> str:
        return f"bias={self.base}, heads={self.config.num_heads}, width={DAPE_MLP_WIDTH}"

    def static_bias(self, tgt_len: int, src_len: int, query_offset: int, device, dtype) -> torch.Tensor:
        """``B`` ``[H, Tq, Tk]`` for a call of these lengths."""
        if self.base == "alibi":
            return alibi_table(tgt_len, src_len, self.config.num_heads, query_offset, device, dtype).dense()
        if self.training:
            with torch.no_grad():  # the authors' projection onto the constraints, on the data
                r1, r2 = constrained(self.scale.data, self.rate.data, "log")
                self.scale.data.copy_(r1)
                self.rate.data.copy_(r2)
        return kerple_table(self.scale, self.rate, "log", tgt_len, src_len, query_offset, dtype).dense()

    def op_arguments(self, queries, keys, options):
        q, k = queries["query"], keys["key"]
        bias = self.static_bias(q.size(2), k.size(2), options.query_offset, q.device, logit_dtype(q.dtype))
        return (bias, self.hidden.weight, self.hidden.bias, self.output.weight, self.output.bias), {}

    def learned_values(self, causal):
        found = []
        if self.base == "kerple":
            r1, r2 = constrained(self.scale.detach().double().cpu(), self.rate.detach().double().cpu(), "log")
            found += [LearnedValues("p per head", r1, note="KERPLE's scale"), LearnedValues("a per head", r2)]
        found.append(LearnedValues("MLP output bias per head", self.output.bias.detach().double().cpu()))
        return found
