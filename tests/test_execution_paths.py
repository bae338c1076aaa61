"""The execution paths (``fairseq_distattn.functional.paths``): every registered
mechanism's op takes each path its terms allow (``functional.terms.candidate_paths``)
and computes there what the eager path computes, and it never takes another. The
attention module plans with the same chooser on the same terms (what it recomputes
in row blocks), so the path it plans for is one its op takes. On CPU, flex_attention
runs only when forced (``flex="always"``) and without gradients, as it does here."""

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional import paths as P
from fairseq_distattn.functional import terms as TM
from fairseq_distattn.registry import REGISTRY, registered
from fairseq_distattn.tools.examples import ExampleDraw, example_call
from fairseq_distattn.tools.path_profile import layer_path, path_condition

from .test_fused_paths import option_variants

B, H, T, D = 3, 2, 6, 8
CASES = [(info, label, options) for info in registered() for label, options in option_variants(info)]


def padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, :2] = True
    mask[2, -3:] = True
    return mask


@pytest.fixture
def chosen(monkeypatch):
    """Every path an op takes (:func:`attention.path_taken`, where :func:`attention.attend`
    picks it)."""
    taken = []
    real = functional.attention.path_taken

    def spy(q, k, terms, options):
        path = real(q, k, terms, options)
        taken.append(path)
        return path

    monkeypatch.setattr(functional.attention, "path_taken", spy)
    return taken


def as_declared(path):
    """SDPA's causal kernel is one form of the fused path."""
    return P.Path.FUSED if path is P.Path.SDPA_CAUSAL else path


def allowed_paths(info, options, causal):
    """The paths the terms of ``info``'s example call allow, SDPA's causal kernel counted as FUSED."""
    example = example_call(info, ExampleDraw(B, H, T, T, D), options)
    with torch.no_grad():
        queries, keys = example.mechanism.encode_positions(example.queries, example.all_keys(), padding(), 0)
        causal = causal or info.causal_only  # as the example call runs it
        terms = example.mechanism.terms(queries, keys, P.CallOptions(padding(), causal, need_weights=False))
    return {as_declared(path) for path in TM.candidate_paths(terms)}


def run(info, options, **shared):
    """The mechanism's example call, drawn afresh (same seed: same tensors) for each call."""
    return example_call(info, ExampleDraw(B, H, T, T, D), options)(**shared)


@pytest.mark.parametrize("info, label, options", CASES, ids=[f"{info.name}-{label}" for info, label, _ in CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_every_path_the_terms_allow_is_taken_and_equals_the_eager_path(info, label, options, causal, chosen):
    allowed = allowed_paths(info, options, causal)
    # (the path forced, the call's arguments): each allowed path is reached by one of these calls
    forcing = {
        P.Path.FUSED: dict(need_weights=False, flex="never", key_padding_mask=padding()),
        P.Path.FLEX: dict(need_weights=False, flex="always", key_padding_mask=padding()),
    }
    with torch.no_grad():
        eager, probs = run(info, options, causal=causal, key_padding_mask=padding(), flex="never")
        assert probs is not None
        for path, arguments in forcing.items():
            chosen.clear()
            out, no_probs = run(info, options, causal=causal, **arguments)
            assert no_probs is None
            taken = {as_declared(each) for each in chosen}
            assert taken <= allowed, f"{info.name} ({label}) took {taken - allowed}, which its terms do not allow"
            assert (path in taken) == (path in allowed), (info.name, label, path, chosen)
            torch.testing.assert_close(out, eager)
        # no padding: where the op hands over no bias, SDPA's own causal kernel (part of FUSED)
        chosen.clear()
        unpadded, _ = run(info, options, causal=causal, need_weights=False, flex="never")
        reference, _ = run(info, options, causal=causal, flex="never")
        assert {as_declared(each) for each in chosen} <= allowed
        torch.testing.assert_close(unpadded, reference)


@pytest.mark.parametrize("info, label, options", CASES, ids=[f"{info.name}-{label}" for info, label, _ in CASES])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("flex", ["never", "always"])
def test_the_attention_module_plans_the_path_its_op_takes(info, label, options, need_weights, flex, chosen):
    """The path the layer's terms give for a call (what the attention module's
    recompute decision reads) is a path the op takes for the same call."""
    example = example_call(info, ExampleDraw(B, H, T, T, D), options)
    with torch.no_grad():  # flex's CPU form: inference only
        example(key_padding_mask=padding(), need_weights=need_weights, flex=flex)
        q = example.queries["query"]
        call = P.Call.of(q, q, P.CallOptions(padding(), need_weights=need_weights, flex=flex))
        planned = layer_path(example.mechanism, call)
    assert planned in chosen, (planned, chosen)


def test_the_chooser_takes_flex_first_then_sdpa_without_weights_else_eager():
    q = torch.zeros(1, 1, 4, 16)
    every = {P.Path.EAGER, P.Path.FUSED, P.Path.SDPA_CAUSAL, P.Path.FLEX}

    def path(paths=every, **arguments):
        with torch.no_grad():
            return P.choose_path(P.Call.of(q, q, P.CallOptions(**arguments)), paths)

    assert path(need_weights=False, flex="always") is P.Path.FLEX
    assert path(need_weights=False) is P.Path.FUSED  # auto: flex on CUDA only
    assert path(need_weights=False, causal=True) is P.Path.SDPA_CAUSAL
    assert path(need_weights=False, causal=True, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)) is P.Path.FUSED
    assert path(need_weights=True, flex="always") is P.Path.EAGER
    assert path(need_weights=False, flex="always", dropout_p=0.1) is P.Path.FUSED  # flex has no attention dropout
    assert path({P.Path.EAGER}, need_weights=False) is P.Path.EAGER
    assert path(need_weights=False, flex="always", flex_from=5) is P.Path.FUSED  # keys short of flex_from
    assert path(need_weights=False, flex="always", flex_from=4) is P.Path.FLEX
    empty = P.Call.of(q[:, :, :0], q, P.CallOptions(need_weights=False, flex="always"))
    assert P.choose_path(empty, every) is not P.Path.FLEX  # no query rows: nothing for flex to run
    with pytest.raises(ValueError, match="flex must be one of auto, always, never"):
        path(flex="sometimes")


def test_terms_that_only_run_eager_take_it_without_a_path_choice_and_the_op_still_checks_flex():
    """RPR's decoding step, PaTH and stick-breaking give logits or a normaliser of their own:
    ``attend`` takes the eager path without describing the call, so the ops check ``flex``
    themselves."""
    logits = torch.zeros(1, 1, 1, 3)
    assert TM.candidate_paths(TM.Terms(logits=logits)) is TM.EAGER_ONLY
    assert TM.candidate_paths(TM.Terms(normaliser=lambda *a: a)) is TM.EAGER_ONLY
    q, k = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 5, 8)
    tables = torch.randn(5, 8), torch.randn(5, 8)
    step = dict(causal=True, query_offset=4, need_weights=False)
    rpr = functional.relative_position_attention
    reference = rpr(torch.cat([k[:, :, :4], q], 2), k, k, *tables, 2, causal=True)[0][:, :, -1:]
    torch.testing.assert_close(rpr(q, k, k, *tables, 2, **step)[0], reference)
    with pytest.raises(ValueError, match="flex must be one of auto, always, never, got 'sometimes'"):
        rpr(q, k, k, *tables, 2, flex="sometimes", **step)


@pytest.mark.parametrize("causal", [False, True])
def test_a_plain_unmasked_decoding_step_runs_sdpa_at_once_as_the_chooser_and_the_masks_would(causal, chosen):
    """attend's shortcut for plain terms (rope's, xpos's and vanilla's decoding steps) takes
    exactly the calls for which the path choice gives the fused path and the masks none."""
    from fairseq_distattn.functional.attention import attend, is_unmasked_step
    from fairseq_distattn.functional.masking import logit_mask

    q, k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    step = P.CallOptions(causal=causal, query_offset=4, need_weights=False)
    assert is_unmasked_step(q, k, step)
    assert P.choose_path(P.Call.of(q, k, step), TM.candidate_paths(TM.PLAIN)) is P.Path.FUSED
    assert logit_mask(None, causal, 4, 1, 5, q.device, q.dtype) == (None, None)
    out, probs = attend(q, k, v, TM.PLAIN, step)
    assert probs is None and chosen == []  # no path was asked for
    weights = attend(q, k, v, TM.PLAIN, step._replace(need_weights=True))
    torch.testing.assert_close(out, weights[0])
    assert len(chosen) == 1
    padding = torch.zeros(2, 5, dtype=torch.bool)
    for other in (
        step._replace(need_weights=True),
        step._replace(key_padding_mask=padding),
        step._replace(query_offset=0),  # a first step, or a full sequence: the chooser's
        step._replace(query_offset=3),  # keys after the query
    ):
        assert not is_unmasked_step(q, k, other)
    assert not is_unmasked_step(torch.randn(2, 3, 2, 8), k, step._replace(query_offset=3))


def test_a_cpu_decoding_step_with_a_mask_takes_the_eager_path_and_everything_else_keeps_sdpa():
    """SDPA's CPU kernel with a mask loses to the eager path on a decoding step's few
    queries (benchmarks.run's beam rows): a step after cached keys, without gradients, on
    the CPU, whose SDPA would take a mask (a bias, a restriction or key padding), runs eager;
    a step with none, a full sequence, a step under gradients and CUDA keep SDPA."""
    biased = {P.Path.EAGER, P.Path.FUSED}  # an additive bias: no causal kernel
    plain = {P.Path.EAGER, P.Path.FUSED, P.Path.SDPA_CAUSAL}
    step = P.Call(False, 16, 1, 5, need_weights=False, query_offset=4, causal=True)
    assert P.choose_path(step, biased) is P.Path.EAGER
    assert P.choose_path(step._replace(key_padding=True), plain) is P.Path.EAGER
    assert P.choose_path(step, plain) is P.Path.FUSED  # no mask at all: SDPA as it is
    assert P.choose_path(step._replace(query_offset=0, tgt_len=5), biased) is P.Path.FUSED
    assert P.choose_path(step._replace(grad_enabled=True), biased) is P.Path.FUSED
    assert P.choose_path(step._replace(on_cuda=True), biased) is P.Path.FUSED
    assert P.choose_path(step._replace(need_weights=True), biased) is P.Path.EAGER


def test_the_mechanism_tables_words_for_a_path_are_read_from_the_terms():
    rpr, da = REGISTRY["rpr"], REGISTRY["da"]
    assert path_condition(rpr, P.Path.FUSED) == "`--no-relative-values`, without weights"
    assert path_condition(rpr, P.Path.FLEX) == "without weights (the value term from flex's log-sum-exp)"
    assert path_condition(da, P.Path.FUSED) == "`--da-adjusting early-add`, without weights"
    assert path_condition(REGISTRY["cope"], P.Path.FLEX) == ""
    assert path_condition(REGISTRY["alibi"], P.Path.FUSED) == "without weights"


def test_rpr_keys_only_keeps_its_per_sentence_key_scores_on_the_fused_path():
    from fairseq_distattn.tools.path_profile import _profile

    assert _profile("rpr")[("relative_values", False)][P.Path.FUSED] is P.Keeps.PER_BATCH


def test_the_paths_and_what_they_keep_follow_from_the_kinds_of_terms():
    table = functional.position_tables.OffsetTable(torch.zeros(2, 7), 4)
    per_batch, per_head = torch.zeros(3, 2, 4, 4), torch.zeros(2, 4, 4)
    window = torch.ones(3, 2, 4, 4)
    every = {P.Path.EAGER, P.Path.FUSED, P.Path.SDPA_CAUSAL}
    assert TM.candidate_paths(TM.PLAIN) == every
    assert TM.candidate_paths(TM.Terms(offset_table=table)) == {P.Path.EAGER, P.Path.FUSED, P.Path.FLEX}
    assert TM.candidate_paths(TM.Terms(bias=per_head)) == {P.Path.EAGER, P.Path.FUSED}
    assert TM.candidate_paths(TM.Terms(window=window)) == {P.Path.EAGER, P.Path.FLEX}
    assert TM.candidate_paths(TM.Terms(score_mod=lambda s, m: s)) == {P.Path.EAGER}
    assert TM.candidate_paths(TM.Terms(bias=per_head, value_term=lambda a: a)) == {P.Path.EAGER}
    assert TM.candidate_paths(TM.Terms(value=per_batch)) == every
    assert TM.kept_for_backward(TM.Terms(bias=per_batch), P.Path.FUSED) is P.Keeps.PER_BATCH
    assert TM.kept_for_backward(TM.Terms(bias=per_head), P.Path.FUSED) is P.Keeps.BIAS
    # a call of one sentence: its [1, H, Tq, Tk] bias is as large as its weights (AW's at batch 1);
    # a call of three: a [1, H, Tq, Tk] bias is shared by its sentences (FIRE's without padding)
    single = per_batch[:1]
    assert TM.kept_for_backward(TM.Terms(bias=single), P.Path.FUSED, batch=1) is P.Keeps.PER_BATCH
    assert TM.kept_for_backward(TM.Terms(bias=single), P.Path.FUSED, batch=3) is P.Keeps.BIAS
    assert TM.kept_for_backward(TM.Terms(bias=per_batch), P.Path.FUSED, batch=3) is P.Keeps.PER_BATCH
    assert TM.kept_for_backward(TM.Terms(offset_table=table), P.Path.FUSED) is P.Keeps.BIAS
    assert TM.kept_for_backward(TM.Terms(offset_table=table), P.Path.FLEX) is P.Keeps.NOTHING
    assert TM.kept_for_backward(TM.Terms(window=window), P.Path.FLEX) is P.Keeps.PER_BATCH
    assert TM.kept_for_backward(TM.PLAIN, P.Path.SDPA_CAUSAL) is P.Keeps.NOTHING
    assert TM.kept_for_backward(TM.PLAIN, P.Path.EAGER) is P.Keeps.PER_BATCH


def test_plain_terms_take_the_paths_their_kinds_give():
    """``candidate_paths`` answers ``PLAIN`` (rope's terms, every decoding step) from a constant:
    the same paths as any empty ``Terms``."""
    from fairseq_distattn.functional.terms import PLAIN, Terms, candidate_paths

    empty = Terms()
    assert empty is not PLAIN and candidate_paths(PLAIN) == candidate_paths(empty)
