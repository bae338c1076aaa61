"""``selective``: selective attention (Leviathan, Kalman and Matias 2024)."""

from ..functional.selective import selection_penalty, selective_attention, selective_terms
from ..registry import CROSS_KIND, DECODER_SELF_KIND, ENCODER_SELF_KIND, register_attention
from .base import Mechanism

CAUSAL_ONLY = (
    "a token masks earlier tokens for the tokens after it: defined for causal attention (the paper and "
    "x-transformers' Attend(selective=True) have no bidirectional form)"
)


@register_attention(
    "selective",
    op=selective_attention,
    kinds=frozenset({DECODER_SELF_KIND}),
    unsupported={ENCODER_SELF_KIND: CAUSAL_ONLY, CROSS_KIND: CAUSAL_ONLY},
    # a row's penalty sums the selections of every earlier query: not row-wise
    row_wise=False,
    # it changes which earlier tokens a query attends to, not where they are: the paper's models keep their
    # position encoding beside it, as x-transformers' Attend(selective=True) sits beside any of its encodings
    keeps_position_embeddings=True,
    description="selective attention: head 0's ReLU scores, summed over the earlier queries, are subtracted "
    "from every head's logits (a token masks the earlier tokens it no longer needs); no parameters",
    paper="Leviathan, Kalman and Matias 2024, *Selective Attention Improves Transformer*",
)
class SelectiveAttention(Mechanism):
    """Leviathan et al. 2024, the paper's listing (``functional.selective``: head 0's
    scores, the first token and each token itself never masked, the selections of the
    rows before each query summed). While decoding, the summed selection of the queries
    so far (``[B, 1, Tk]``) is this layer's incremental state, reordered with the beams
    as the cached keys are; each step adds its own row."""

    overrides_terms_because = "a decoding step's penalty is the selections of every earlier query, carried in the cache"

    def terms(self, queries, keys, options, cache=None):
        q, k = queries["query"], keys["key"]
        state = None if cache is None else cache.get("prev_selection_state")
        if cache is not None:
            _, after = selection_penalty(
                q, k, state, key_padding_mask=options.key_padding_mask, query_offset=options.query_offset
            )
            cache["prev_selection_state"] = after
        call = dict(key_padding_mask=options.key_padding_mask, causal=options.causal, query_offset=options.query_offset)
        return selective_terms(q, k, state, **call)
