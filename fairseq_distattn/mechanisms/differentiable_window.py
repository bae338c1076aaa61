"""``window-mw``, ``window-aw``, ``window-mw-seg``, ``window-aw-seg``: the
differentiable window (Nguyen, Nguyen, Joty, Li 2020)."""

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from ..functional.differentiable_window import differentiable_window_attention, window_mask
from ..functional.masking import logit_mask, masked_softmax
from ..registry import (
    ALL_KINDS,
    DECODER_SELF_KIND,
    EVALUATION,
    option,
    positive_integer,
    register_attention,
)
from .base import Mechanism, MechanismConfig, SoftWindow


@dataclass(frozen=True)
class WindowOptions:
    window_segment_size: int = option(
        5,
        "--window-segment-size",
        "window-*-seg: segment size b (default: {default})",
        convert=positive_integer("--window-segment-size"),
        applies_to=lambda name: name.endswith("-seg"),
        type=int,
        metavar="B",
        role=EVALUATION,
    )
    # off by default: eq. 9 as written is the paper's equation, and trained checkpoints depend on it
    window_expected_mask: bool = option(
        False,
        "--window-expected-mask",
        "window-*: M = E[1{{min(l,r) <= j <= max(l,r)}}] = eq. 9 - p_l(j) p_r(j): the paper's stated m_hat in "
        "[0, 1] (sec. 3.2), departing from eq. 9 as written, which counts a key twice where both pointers fall "
        "on it (M up to 2); with segments, eq. 11 - P_l(seg j) P_r(seg j)",
        action="store_true",
        role=EVALUATION,
    )


PAPER = "Nguyen, Nguyen, Joty and Li 2020, *Differentiable Window for Dynamic Local Attention*"
POINTERS = ("left", "right")
# Nguyen et al. sec. 5.2: the decoder cannot point to unfinished segments.
UNFINISHED_SEGMENTS = {DECODER_SELF_KIND: "segments are undefined for keys that are still being generated"}


def _window(name, additive, segments, description):
    sides = POINTERS + (("local",) if additive else ())
    return register_attention(
        name,
        WindowOptions,
        op=differentiable_window_attention,
        kinds=ALL_KINDS - set(UNFINISHED_SEGMENTS) if segments else ALL_KINDS,
        unsupported=UNFINISHED_SEGMENTS if segments else {},
        # AW: its masked local scores are an additive bias; MW: the weights' product with M through flex
        # (log M in score_mod, the row mass from two log-sum-exps), where M and its pointers are
        # [B, H, Tq, Tk] all the same: long sequences keep their recomputation in row blocks
        extra_queries=tuple(f"{side}_query" for side in sides),
        extra_keys=tuple(f"{side}_key" for side in sides),
        description=description,
        paper=PAPER,
        keeps_position_embeddings=True,  # the paper adds windows to the Transformer with its positions
        papers_place_it=True,  # Nguyen et al.'s models have windows in named layers (the first three)
    )


@_window("window-aw-seg", True, True, "AW with segment-based windows of `--window-segment-size` tokens")
@_window("window-mw-seg", False, True, "MW with segment-based windows of `--window-segment-size` tokens")
@_window("window-aw", True, False, "differentiable window, additive (AW): masked local scores on the logits")
@_window("window-mw", False, False, "differentiable window, multiplicative (MW): the soft window times the weights")
class DifferentiableWindow(Mechanism):
    """Nguyen et al. 2020: left/right boundary pointers (eqs. 7-8) give the soft
    mask (eq. 9, or eq. 11 with segments); MW multiplies it into the attention
    weights, AW adds masked local scores from their own projections."""

    def __init__(self, config: MechanismConfig):
        super().__init__(config)
        self.additive = config.name.startswith("window-aw")
        self.segment_size = config.options.window_segment_size if config.name.endswith("-seg") else 0
        self.expected_mask = config.options.window_expected_mask

    def extra_repr(self) -> str:
        segments = f"segment_size={self.segment_size}" if self.segment_size else "token-level"
        expected = ", expected_mask=True (departs from eq. 9 as written)" if self.expected_mask else ""
        return f"{'AW' if self.additive else 'MW'}, {segments}{expected}"

    def soft_window(self, queries, keys, key_padding_mask, causal, query_offset):
        mask = window_mask(
            queries["left_query"],
            keys["left_key"],
            queries["right_query"],
            keys["right_key"],
            self.segment_size,
            key_padding_mask=key_padding_mask,
            causal=causal,
            query_offset=query_offset,
            expected=self.expected_mask,
        )
        pointers = [
            boundary_pointer(queries[f"{side}_query"], keys[f"{side}_key"], key_padding_mask, causal, query_offset)
            for side in POINTERS
        ]
        return SoftWindow(*pointers, mask.double(), "eq. 11" if self.segment_size else "eq. 9")

    def op_arguments(self, queries, keys, options):
        local = (queries["local_query"], keys["local_key"]) if self.additive else ()
        pointers = (queries["left_query"], keys["left_key"], queries["right_query"], keys["right_key"])
        return (*pointers, *local), {"segment_size": self.segment_size, "expected": self.expected_mask}


def boundary_pointer(
    query: Tensor, key: Tensor, key_padding_mask: Optional[Tensor], causal: bool, query_offset: int
) -> Tensor:
    """Eqs. 7-8 in float64: ``softmax(q W^Q (K W^K)^T / sqrt d)`` over the keys a
    query may see (not padding, not in the future when causal), ``[B, H, Tq, Tk]``,
    masked as :func:`~fairseq_distattn.functional.window_mask` masks its pointers."""
    scores = query.double() @ key.double().transpose(-2, -1) / query.size(-1) ** 0.5
    tgt_len, src_len = scores.shape[-2:]
    mask, hidden = logit_mask(key_padding_mask, causal, query_offset, tgt_len, src_len, scores.device, scores.dtype)
    return masked_softmax(scores if mask is None else scores + mask, hidden)
