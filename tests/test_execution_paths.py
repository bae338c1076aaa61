"""The execution paths (``fairseq_distattn.functional.paths``): every registered
mechanism's op takes each path its registration declares (``paths=``, where the
declared condition holds for its options) and computes there what the eager path
computes, and it never takes a path it does not declare. The attention module plans
with the same chooser (``Mechanism.path``: what it recomputes in row blocks), so the
path it plans for is one its op takes. On CPU, flex_attention runs only when forced
(``flex="always"``) and without gradients, as it does here."""

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional import paths as P
from fairseq_distattn.registry import registered
from fairseq_distattn.tools.examples import ExampleDraw, example_call
from fairseq_distattn.tools.inspectable import layer_path

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
    """Every path :func:`paths.choose_path` picks for an op, in every module of
    functional/ that asks it."""
    taken = []
    real = P.choose_path

    def spy(call, paths):
        path = real(call, paths)
        taken.append(path)
        return path

    askers = [module for module in vars(functional).values() if getattr(module, "choose_path", None) is real]
    assert {functional.attention, functional.differentiable_window} <= set(askers)
    for module in askers:
        monkeypatch.setattr(module, "choose_path", spy)
    return taken


def declared(info, options):
    """The paths ``info`` declares for ``options``, the eager one included."""
    return {P.Path.EAGER} | {path for path, capability in info.paths.items() if capability.holds(options)}


def run(info, options, **shared):
    """The mechanism's example call, drawn afresh (same seed: same tensors) for each call."""
    return example_call(info, ExampleDraw(B, H, T, T, D), options)(**shared)


@pytest.mark.parametrize("info, label, options", CASES, ids=[f"{info.name}-{label}" for info, label, _ in CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_every_declared_path_is_taken_and_equals_the_eager_path(info, label, options, causal, chosen):
    allowed = declared(info, options)
    # (the path forced, the call's arguments): each declared path is reached by one of these calls
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
            taken = {P.declared_as(each) for each in chosen}
            assert taken <= allowed, f"{info.name} ({label}) took {taken - allowed}, which it does not declare"
            assert (path in taken) == (path in allowed), (info.name, label, path, chosen)
            torch.testing.assert_close(out, eager)
        # no padding: where the op hands over no bias, SDPA's own causal kernel (part of FUSED)
        chosen.clear()
        unpadded, _ = run(info, options, causal=causal, need_weights=False, flex="never")
        reference, _ = run(info, options, causal=causal, flex="never")
        assert {P.declared_as(each) for each in chosen} <= allowed
        torch.testing.assert_close(unpadded, reference)


@pytest.mark.parametrize("info, label, options", CASES, ids=[f"{info.name}-{label}" for info, label, _ in CASES])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("flex", ["never", "always"])
def test_the_attention_module_plans_the_path_its_op_takes(info, label, options, need_weights, flex, chosen):
    """``Mechanism.path`` (what the attention module's recompute decision reads) is
    a path the op takes for the same call, and one the registration declares."""
    example = example_call(info, ExampleDraw(B, H, T, T, D), options)
    mechanism = example.mechanism
    assert set(mechanism.paths()) == declared(info, options)
    with torch.no_grad():  # flex's CPU form: inference only
        example(key_padding_mask=padding(), need_weights=need_weights, flex=flex)
        q = example.queries["query"]
        planned = layer_path(
            mechanism, P.Call.of(q, q, key_padding_mask=padding(), need_weights=need_weights, flex=flex)
        )
    assert planned in {P.declared_as(each) for each in chosen}, (planned, chosen)


def test_the_chooser_takes_flex_first_then_sdpa_without_weights_else_eager():
    q = torch.zeros(1, 1, 4, 16)
    every = {P.Path.EAGER, P.Path.FUSED, P.Path.SDPA_CAUSAL, P.Path.FLEX}

    def path(paths=every, **arguments):
        with torch.no_grad():
            return P.choose_path(P.Call.of(q, q, **arguments), paths)

    assert path(need_weights=False, flex="always") is P.Path.FLEX
    assert path(need_weights=False) is P.Path.FUSED  # auto: flex on CUDA only
    assert path(need_weights=False, causal=True) is P.Path.SDPA_CAUSAL
    assert path(need_weights=False, causal=True, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)) is P.Path.FUSED
    assert path(need_weights=True, flex="always") is P.Path.EAGER
    assert path(need_weights=False, flex="always", dropout_p=0.1) is P.Path.FUSED  # flex has no attention dropout
    assert path({P.Path.EAGER}, need_weights=False) is P.Path.EAGER
    empty = P.Call.of(q[:, :, :0], q, need_weights=False, flex="always")
    assert P.choose_path(empty, every) is not P.Path.FLEX  # no query rows: nothing for flex to run
    with pytest.raises(ValueError, match="flex must be one of auto, always, never"):
        path(flex="sometimes")


def test_a_capability_names_an_option_of_its_own_and_its_words_come_from_the_flag():
    from fairseq_distattn.registry import REGISTRY

    rpr, da = REGISTRY["rpr"], REGISTRY["da"]
    assert rpr.path_condition(P.Path.FUSED) == "`--no-relative-values`, without weights (keys only)"
    assert da.path_condition(P.Path.FUSED) == "`--da-adjusting early-add`, without weights"
    assert REGISTRY["cope"].path_condition(P.Path.FLEX) == ""
    with pytest.raises(ValueError, match="names an option and its values together"):
        P.Capability("da_adjusting")
