"""A mechanism is its op plus one declaration (issue 48): the base class's ``terms``
hands the registered op's terms function what the layer's ``op_arguments`` supplies and
its ``forward`` runs the one ``attend`` on them, so what the model computes is what the op
computes with those arguments, and a mechanism overrides ``terms`` only where it says why."""

import pytest
import torch

import fairseq_distattn.mechanisms  # noqa: F401 (registers every mechanism)
from fairseq_distattn.functional.paths import CallOptions
from fairseq_distattn.mechanisms import build_mechanism
from fairseq_distattn.mechanisms.base import Mechanism
from fairseq_distattn.registry import DECODER_SELF_KIND, ENCODER_SELF_KIND, registered
from fairseq_distattn.spec import AttentionOptions
from fairseq_distattn.tools.examples import ExampleDraw, example_call

INFOS = registered()
HEADS, HEAD_DIM, LENGTH, BATCH = 2, 16, 7, 2


def projections(names, generator):
    shape = (BATCH, HEADS, LENGTH, HEAD_DIM)
    return {name: torch.randn(*shape, generator=generator, dtype=torch.float64) for name in names}


def call(info):
    """A self-attention call of ``info``'s layer: its module, the projections (with the
    extras it declares), whether causal, and a padding mask."""
    torch.manual_seed(0)
    module = build_mechanism(info.name, HEADS, HEAD_DIM, AttentionOptions()).double().eval()
    generator = torch.Generator().manual_seed(1)
    queries = projections(("query", *info.extra_queries), generator)
    keys = projections(("key", "value", *info.extra_keys), generator)
    layer_input = torch.randn(LENGTH, BATCH, HEADS * HEAD_DIM, generator=generator, dtype=torch.float64)
    keys.update(module.inputs_from_layer(layer_input))
    assert set(keys) <= {"key", "value", *info.extra_keys, *info.layer_inputs}
    causal = ENCODER_SELF_KIND not in info.kinds
    assert causal or ENCODER_SELF_KIND in info.kinds or DECODER_SELF_KIND in info.kinds
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[1, -2:] = True
    return module, queries, keys, causal, padding


@pytest.mark.parametrize("info", INFOS, ids=[info.name for info in INFOS])
def test_the_layer_computes_its_registered_op_with_its_op_arguments(info):
    module, queries, keys, causal, padding = call(info)
    options = CallOptions(padding, causal)
    positional, own = module.op_arguments(queries, keys, options)
    with torch.no_grad():
        expected = info.op(queries["query"], keys["key"], keys["value"], *positional, **own, **options.op_keywords())
        # the attention module hands forward what encode_positions made of the projections (rope rotates them)
        encoded_queries, encoded_keys = module.encode_positions(queries, keys, padding, 0)
        out, probs = module(encoded_queries, encoded_keys, options)
    torch.testing.assert_close(out, expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(probs, expected[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("info", INFOS, ids=[info.name for info in INFOS])
def test_the_example_call_of_the_tests_and_benchmarks_is_the_layer_on_drawn_parameters(info):
    """What the tests and benchmarks that run every mechanism call (tools.examples) is
    its layer, with each parameter one of the draw's leaves, in the draw's dtype, so that
    gradient checks reach every parameter and a half call sees half parameters."""
    draw = ExampleDraw(dtype=torch.float32, requires_grad=True)
    example = example_call(info, draw)
    parameters = list(example.mechanism.parameters())
    assert type(example.mechanism) is info.module and example.mechanism.config.name == info.name
    layer_input = 1 if info.layer_inputs else 0
    assert len(draw.leaves) == 3 + len(info.extra_queries) + len(info.extra_keys) + len(parameters) + layer_input
    assert all(any(parameter is leaf for leaf in draw.leaves) for parameter in parameters)
    assert all(leaf.dtype == torch.float32 and leaf.requires_grad for leaf in draw.leaves)
    out, _ = example(causal=ENCODER_SELF_KIND not in info.kinds)
    out.square().sum().backward()
    assert all(parameter.grad is not None for parameter in parameters), info.name


@pytest.mark.parametrize("info", INFOS, ids=[info.name for info in INFOS])
def test_a_mechanism_overrides_terms_only_where_it_says_why(info):
    assert info.module.forward is Mechanism.forward, f"{info.name}: one attend for every mechanism"
    overrides = info.module.terms is not Mechanism.terms
    assert overrides == bool(info.module.overrides_terms_because), (
        f"{info.name}: terms of its own need overrides_terms_because (and op_arguments alone needs none)"
    )


def test_the_mechanisms_that_override_terms_are_few():
    """Today: kerple (its constraint projection), qvi and selective (their decoding caches),
    rope and xpos (their rotation happens before the keys are cached)."""
    assert {info.name for info in INFOS if info.module.terms is not Mechanism.terms} == {
        "kerple",
        "qvi",
        "rope",
        "selective",
        "xpos",
    }
