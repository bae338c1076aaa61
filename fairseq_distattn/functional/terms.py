"""What a mechanism adds to ``softmax(q k^T / sqrt(D)) v`` for one call:
:class:`Terms`, and what follows from them alone: the paths the call may take
(:func:`candidate_paths`), what each path keeps for backward
(:func:`kept_for_backward`) and whether the attention module recomputes the call
in blocks of query rows (:func:`recomputes_in_row_blocks`).

A mechanism's terms function returns only what it adds, as attention-gym's
``score_mod`` s and x-transformers' ``Attend`` take them; :func:`attention.attend`
composes them with the masks and runs them on the path
:func:`paths.choose_path` picks among :func:`candidate_paths`. Nothing here is
declared per mechanism: the paths follow from the kinds of terms (a table read
by ``j - i`` runs in flex_attention, an additive bias alone in SDPA).
"""

from typing import Callable, FrozenSet, NamedTuple, Optional, Tuple

from torch import Tensor

from .paths import Call, Keeps, Path, choose_path
from .position_tables import ScoreTable

# score_mod(raw scores q k^T / sqrt(D) in logit_dtype, the additive mask that will be added
# after it or None) -> logits: the mask is passed so a mod that reads which keys are visible
# (CoPE's gates) does not build it a second time
ScoreMod = Callable[[Tensor, Optional[Tensor]], Tensor]
# weight_mod(softmax weights, additive mask, hidden rows) -> the weights that multiply the values
WeightMod = Callable[[Tensor, Optional[Tensor], Optional[Tensor]], Tensor]
# value_term(the (dropped) weights, the output so far) -> the output with a [B, H, Tq, D] term added
# (in place where it can: a decoding step's term is one addmm_ into the fresh output)
ValueTerm = Callable[[Tensor, Tensor], Tensor]
# normaliser(masked logits, additive mask, hidden rows) -> (weights, the share of each query's own
# value [B, H, Tq] or None): what replaces the softmax (stick-breaking's weights and remaining stick)
Normaliser = Callable[[Tensor, Optional[Tensor], Optional[Tensor]], Tuple[Tensor, Optional[Tensor]]]


class Terms(NamedTuple):
    """What one call adds to plain attention (every field optional; none: vanilla):

    - ``bias``: added to the logits, broadcastable to ``[B, H, Tq, Tk]``, in the logit dtype;
    - ``score_mod``: a function of the raw scores (:data:`ScoreMod`);
    - ``offset_table``: a bias or score modification read from a table by ``j - i``
      (:mod:`.position_tables`), given instead of ``bias`` and ``score_mod``; flex_attention
      reads it inside its kernel, the other paths its ``dense()``;
    - ``weight_mod``: a function of the normalised weights (:data:`WeightMod`);
    - ``window``: a ``[B, H, Tq, Tk]`` soft window M that multiplies the weights (MW's
      ``(softmax(s) * M) v``), which flex_attention runs as two calls;
    - ``value_term``: a ``[B, H, Tq, D]`` term of the dropped weights added to the output
      (:data:`ValueTerm`; flex only where it can be rebuilt from flex's log-sum-exp);
    - ``allowed``: a bool ``[Tq, Tk]`` visibility the masks add (a direction);
    - ``query``, ``key``, ``value``: the call's tensors replaced (Transformer-XL's
      ``q + u``, QVI's query-aware values); replacements in float32 for half inputs are
      attended with autocast off, and the output rounded back once;
    - ``logits``: the scaled logits themselves ``[B, H, Tq, Tk]`` in the logit dtype, in
      place of ``q k^T / sqrt(D)`` (PaTH's, which transform the queries per key);
    - ``normaliser``: what replaces the softmax (:data:`Normaliser`: stick-breaking), with
      the share of the mass it leaves on each query's own value (the key at the query's
      position, ``query_offset + i``).

    The last two run on the eager path only.
    """

    bias: Optional[Tensor] = None
    score_mod: Optional[ScoreMod] = None
    offset_table: Optional[ScoreTable] = None
    weight_mod: Optional[WeightMod] = None
    window: Optional[Tensor] = None
    value_term: Optional[ValueTerm] = None
    allowed: Optional[Tensor] = None
    query: Optional[Tensor] = None
    key: Optional[Tensor] = None
    value: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    normaliser: Optional[Normaliser] = None


PLAIN = Terms()
# the paths of terms that only the eager path runs (one object: attend tests it by identity)
EAGER_ONLY = frozenset({Path.EAGER})


def _rebuilt_from_log_normaliser(value_term: Optional[ValueTerm]) -> bool:
    return value_term is None or hasattr(value_term, "from_log_normaliser")


def candidate_paths(terms: Terms) -> FrozenSet[Path]:
    """The paths ``terms`` allow besides the eager one: flex for a table (with no
    weight modification, and a value term only if it can be rebuilt from flex's
    log-sum-exp) or a soft window alone; SDPA for an additive bias alone (a table that
    combines by addition is one), and its causal kernel where there is neither a bias
    nor ``allowed``. Logits or a normaliser of their own run eager only."""
    if terms is PLAIN:  # rope's, xpos's, every decoding step of every layer: answered once
        return _PLAIN_PATHS
    if terms.logits is not None or terms.normaliser is not None:
        return EAGER_ONLY
    paths = {Path.EAGER}
    table = terms.offset_table
    modifies = terms.score_mod is not None or terms.weight_mod is not None
    if table is not None and not modifies and terms.window is None:
        if _rebuilt_from_log_normaliser(terms.value_term):
            paths.add(Path.FLEX)
    if terms.window is not None and table is None and terms.bias is None and not modifies:
        if terms.value_term is None:
            paths.add(Path.FLEX)
    additive = table is None or table.combine == "add"
    if not modifies and terms.value_term is None and terms.window is None and additive:
        paths.add(Path.FUSED)
        if terms.bias is None and table is None and terms.allowed is None:
            paths.add(Path.SDPA_CAUSAL)
    return frozenset(paths)


# what the kinds of terms give an empty Terms, formed once by the rule above (not typed beside it)
_PLAIN_PATHS = candidate_paths(Terms())


def _per_batch(tensor: Tensor, batch: int) -> bool:
    """Whether a bias is as large as the call's weights: one ``[H, Tq, Tk]`` matrix per
    sentence of the call's ``batch`` (at batch 1, any ``[1, H, Tq, Tk]`` bias; 0: the batch
    is not known, and only a batch dimension of more than one sentence counts)."""
    return tensor.dim() == 4 and (tensor.size(0) == batch if batch else tensor.size(0) > 1)


def kept_for_backward(terms: Terms, path: Path, batch: int = 0) -> Keeps:
    """What ``path`` keeps for backward of the ``[Tq, Tk]`` size on ``terms``: the eager
    path its weights; SDPA its bias (per batch, or not: T5's table is ``[H, Tq, Tk]``;
    FIRE's, which depends on each sentence's length, ``[B, H, Tq, Tk]``, or ``[1, H, Tq,
    Tk]`` without padding; AW's, which depends on the queries, ``[B, H, Tq, Tk]`` at every
    batch size: for a call of ``batch`` sentences, :func:`_per_batch`), nothing without
    one; flex nothing, but a soft window (which has a batch dimension)."""
    if path is Path.EAGER:
        return Keeps.PER_BATCH
    if path is Path.FLEX:
        return Keeps.NOTHING if terms.window is None else Keeps.PER_BATCH
    if terms.bias is not None:
        return Keeps.PER_BATCH if _per_batch(terms.bias, batch) else Keeps.BIAS
    if terms.offset_table is None:
        return Keeps.NOTHING
    return Keeps.PER_BATCH if terms.offset_table.per_batch else Keeps.BIAS


def recomputes_in_row_blocks(call: Call, terms: Callable[[], Terms], row_wise: bool) -> bool:
    """Whether the attention module runs a training call in blocks of query rows
    under activation checkpointing: keys from the recompute length on, gradients
    wanted, a mechanism whose every query row depends on that row's queries alone
    (``row_wise``), and a path that would keep ``[B, H, Tq, Tk]`` tensors for
    backward (:func:`kept_for_backward` of the path :func:`paths.choose_path` takes
    among the :func:`candidate_paths` of the call's terms). ``terms`` makes them on
    demand: the call's own conditions are checked first, and most calls (decoding,
    evaluation, short keys) need none."""
    if not (call.keys_reach_recompute_length and call.grad_enabled and call.query_requires_grad and row_wise):
        return False
    made = terms()
    return kept_for_backward(made, choose_path(call, candidate_paths(made)), call.batch) is Keeps.PER_BATCH


__all__ = ["PLAIN", "Terms", "candidate_paths", "kept_for_backward"]
