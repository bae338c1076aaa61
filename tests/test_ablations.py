"""The papers' ablations, runnable by name.

* Wu et al. 2021 (DA) sec. 4.3: the mapping f of the weighted distance x = w_h |i-j|
  (``--da-mapping``): clip min(x, T), linear k_h x + b_h, exponent e^x, sigmoid
  1/(1+e^-x), learnable sigmoid (1+e^v)/(1+e^(v-x)) (eq. 5, the default);
  sec. 4.4: the adjustment (``--da-adjusting``) with S = QK^T/sqrt(d): late add
  softmax(S) + f, late multiply softmax(S) f, early add softmax(S + f), early
  multiply softmax(ReLU(QK^T) f / sqrt(d)) (eq. 6, the default).
* Wu et al. (QVI) sec. 4.3, Fig. 2: g(Q, V) (``--qvi-interaction``): V, Q^ * VW,
  Q^ * VW + V, gated (eqs. 8-9, the default), Q^ the query mix of eq. 7.
* Nguyen et al. 2020 Tables 2-3: SPEC recipes (benchmarks/quality/ablations.py,
  examples/ablations/README.md).

Every variant is checked against a float64 reference written here from the
papers' formulas with explicit Python loops (no code shared with the
implementation), at 1e-12; decoder variants decode incrementally exactly as
the full forward; every flag is in ``--help``, refused values exit 2 with one
line (the CLI cases are rows of tests/test_bad_inputs.py); a tiny model
trains with each variant; checkpoints without the new options load unchanged.
"""

import argparse
import dataclasses
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck
from torch.testing import assert_close

from benchmarks.quality.ablations import ABLATION_NAMES, REFERENCE_CONFIGS, ablations, partial_layers
from fairseq_distattn import functional
from fairseq_distattn.functional.distance_aware import DA_ADJUSTINGS, DA_MAPPINGS, distance_coefficients
from fairseq_distattn.functional.query_value_interaction import QVI_INTERACTIONS
from fairseq_distattn.mechanisms.differentiable_window import WindowOptions
from fairseq_distattn.mechanisms.distance_aware import DistanceAware
from fairseq_distattn.mechanisms.query_value_interaction import QueryValueInteraction
from fairseq_distattn.mechanisms.relative_position import RelativePositionOptions
from fairseq_distattn.models.arguments import OPTION_DEFAULTS
from fairseq_distattn.spec import AttentionOptions, SpecError

from .conftest import run_cli
from .model_helpers import TINY, left_pad, parse, random_tokens, right_pad, translation_model

TIGHT = dict(rtol=1e-12, atol=1e-12)
# fairseq's own (vanilla) cross-attention takes its softmax in float32 even in a
# float64 model (see tests/test_models.py); a position or cache bug is > 1e-3
MODEL_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
CLIP_THRESHOLD = 0.9  # below the largest |w| d of the inputs, so clipping happens
HEADS, DIM = 3, 4


def dot(a, b):
    return float(sum(float(x) * float(y) for x, y in zip(a, b)))


def naive_softmax(logits, visible):
    """Softmax over the visible entries; all zeros when none is visible."""
    shown = [x for x, seen in zip(logits, visible) if seen]
    if not shown:
        return [0.0] * len(logits)
    top = max(shown)
    exps = [math.exp(x - top) if seen else 0.0 for x, seen in zip(logits, visible)]
    total = sum(exps)
    return [e / total for e in exps]


def key_visible(padding, causal, b, position, j):
    return (padding is None or not padding[b][j]) and (not causal or j <= position)


# ------------------------------------------------------------------ DA (Wu et al. 2021)


def paper_mapping(mapping, x, h, params):
    """f(x) as sec. 3.2 (eq. 5) and sec. 4.3 write it."""
    if mapping == "learnable-sigmoid":
        v = float(params["sharpness"][h])
        return (1.0 + math.exp(v)) / (1.0 + math.exp(v - x))
    if mapping == "sigmoid":
        return 1.0 / (1.0 + math.exp(-x))
    if mapping == "exponent":
        return math.exp(x)
    if mapping == "linear":
        return float(params["linear_slope"][h]) * x + float(params["linear_intercept"][h])
    if mapping == "clip":
        return min(x, CLIP_THRESHOLD)
    raise AssertionError(mapping)


def reference_distance_aware(q, k, v, params, padding, causal, query_offset, mapping, adjusting):
    """Sec. 3.1: R_ij = |i-j|, x = w_h R_ij; sec. 4.4 with S = QK^T / sqrt(d):
    early multiply softmax(ReLU(QK^T) f / sqrt(d)) (eq. 6), early add softmax(S + f),
    late multiply softmax(S) * f, late add softmax(S) + f; invisible keys weigh 0."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.shape[2]
    out, weights = np.zeros((batch, heads, tgt_len, dim)), np.zeros((batch, heads, tgt_len, src_len))
    for b in range(batch):
        for h in range(heads):
            for i in range(tgt_len):
                position = query_offset + i
                visible = [key_visible(padding, causal, b, position, j) for j in range(src_len)]
                products = [dot(q[b, h, i], k[b, h, j]) for j in range(src_len)]
                f = [
                    paper_mapping(mapping, float(params["distance_weight"][h]) * abs(position - j), h, params)
                    for j in range(src_len)
                ]
                if adjusting == "early-multiply":
                    logits = [max(0.0, products[j]) * f[j] / math.sqrt(dim) for j in range(src_len)]
                elif adjusting == "early-add":
                    logits = [products[j] / math.sqrt(dim) + f[j] for j in range(src_len)]
                else:
                    logits = [products[j] / math.sqrt(dim) for j in range(src_len)]
                alpha = naive_softmax(logits, visible)
                for j in range(src_len):
                    if not visible[j]:
                        continue
                    if adjusting == "late-add":
                        weight = alpha[j] + f[j]
                    elif adjusting == "late-multiply":
                        weight = alpha[j] * f[j]
                    else:
                        weight = alpha[j]
                    weights[b, h, i, j] = weight
                    out[b, h, i] += weight * v[b, h, j]
    return torch.from_numpy(out), torch.from_numpy(weights)


def mapping_parameters(mapping, heads, generator, requires_grad=False):
    """The per-head parameters each mapping takes (w always)."""

    def head_values(scale=1.0, shift=0.0):
        values = torch.randn(heads, generator=generator, dtype=torch.float64) * scale + shift
        return values.requires_grad_(requires_grad)

    # w of both signs: heads that prefer short and long distances
    params = {"distance_weight": head_values(0.8)}
    if mapping == "learnable-sigmoid":
        params["sharpness"] = head_values()
    if mapping == "linear":
        params["linear_slope"], params["linear_intercept"] = head_values(0.5, 1.0), head_values(0.5, 1.0)
    return params


def call_distance_aware(q, k, v, params, padding, causal, query_offset, mapping, adjusting):
    return functional.distance_aware_attention(
        q,
        k,
        v,
        params["distance_weight"],
        params.get("sharpness"),
        key_padding_mask=padding,
        causal=causal,
        query_offset=query_offset,
        mapping=mapping,
        adjusting=adjusting,
        linear_slope=params.get("linear_slope"),
        linear_intercept=params.get("linear_intercept"),
        clip_threshold=CLIP_THRESHOLD if mapping == "clip" else None,
    )


# (name, tgt_len, src_len, query_offset, causal, padding amounts per batch row (left))
CASES = [
    ("encoder-padded", 6, 6, 0, False, (0, 2)),
    ("decoder-offset", 3, 6, 3, True, (0, 1)),
    # rows 0-2 of batch 1 see only padding: they must give zeros, in the late variants too
    ("decoder-hidden-rows", 5, 5, 0, True, (0, 3)),
]


def case_inputs(case, seed):
    _, tgt_len, src_len, query_offset, causal, pads = case
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, tgt_len, DIM, generator=generator, dtype=torch.float64)
    k = torch.randn(2, HEADS, src_len, DIM, generator=generator, dtype=torch.float64)
    v = torch.randn(2, HEADS, src_len, DIM, generator=generator, dtype=torch.float64)
    padding = torch.zeros(2, src_len, dtype=torch.bool)
    for row, amount in enumerate(pads):
        padding[row, :amount] = True
    return q, k, v, padding, causal, query_offset, generator


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("adjusting", DA_ADJUSTINGS)
@pytest.mark.parametrize("mapping", DA_MAPPINGS)
def test_distance_aware_variant_matches_the_paper(mapping, adjusting, case):
    q, k, v, padding, causal, query_offset, generator = case_inputs(case, seed=11)
    params = mapping_parameters(mapping, HEADS, generator)
    out, probs = call_distance_aware(q, k, v, params, padding, causal, query_offset, mapping, adjusting)
    expected_out, expected_probs = reference_distance_aware(
        q.numpy(), k.numpy(), v.numpy(), params, padding.tolist(), causal, query_offset, mapping, adjusting
    )
    assert_close(probs, expected_probs, **TIGHT)
    assert_close(out, expected_out, **TIGHT)


def test_the_defaults_are_eq5_and_eq6():
    q, k, v, padding, causal, query_offset, generator = case_inputs(CASES[0], seed=5)
    params = mapping_parameters("learnable-sigmoid", HEADS, generator)
    default = functional.distance_aware_attention(
        q, k, v, params["distance_weight"], params["sharpness"], key_padding_mask=padding
    )
    explicit = call_distance_aware(q, k, v, params, padding, False, 0, "learnable-sigmoid", "early-multiply")
    assert torch.equal(default[0], explicit[0]) and torch.equal(default[1], explicit[1])
    defaults = AttentionOptions()
    da = defaults.for_mechanism("da")
    assert da.da_mapping == "learnable-sigmoid" and da.da_adjusting == "early-multiply"
    assert defaults.for_mechanism("qvi").qvi_interaction == "gated"


@pytest.mark.parametrize("mapping", DA_MAPPINGS)
def test_coefficients_are_the_papers_f(mapping):
    generator = torch.Generator().manual_seed(3)
    params = mapping_parameters(mapping, HEADS, generator)
    coefficients = distance_coefficients(
        params["distance_weight"],
        params.get("sharpness"),
        4,
        7,
        2,
        mapping,
        params.get("linear_slope"),
        params.get("linear_intercept"),
        CLIP_THRESHOLD if mapping == "clip" else None,
    )
    expected = torch.tensor(
        [
            [
                [
                    paper_mapping(mapping, float(params["distance_weight"][h]) * abs(2 + i - j), h, params)
                    for j in range(7)
                ]
                for i in range(4)
            ]
            for h in range(HEADS)
        ],
        dtype=torch.float64,
    )
    assert_close(coefficients, expected, **TIGHT)


# each mapping with eq. 6, each adjustment with eq. 5 (as the paper varies them)
ONE_AT_A_TIME = [(m, "early-multiply") for m in DA_MAPPINGS] + [("learnable-sigmoid", a) for a in DA_ADJUSTINGS[1:]]


@pytest.mark.parametrize("mapping,adjusting", ONE_AT_A_TIME)
def test_distance_aware_variant_gradients(mapping, adjusting):
    q, k, v, padding, causal, query_offset, generator = case_inputs(CASES[1], seed=2)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    params = mapping_parameters(mapping, HEADS, generator, requires_grad=True)
    names = list(params)

    def run(q, k, v, *values):
        given = dict(zip(names, values))
        return call_distance_aware(q, k, v, given, padding, causal, query_offset, mapping, adjusting)[0]

    assert gradcheck(run, (q, k, v, *params.values()), eps=1e-6, atol=1e-7, fast_mode=True)


def da_call(**overrides):
    q, k, v, *_ = case_inputs(CASES[0], seed=1)
    arguments = dict(
        distance_weight=torch.zeros(HEADS, dtype=torch.float64), sharpness=torch.zeros(HEADS, dtype=torch.float64)
    )
    arguments.update(overrides)
    return lambda: functional.distance_aware_attention(q, k, v, **arguments)


ZEROS = torch.zeros(HEADS, dtype=torch.float64)
DA_ERRORS = [
    (dict(mapping="tanh"), "mapping must be one of"),
    (dict(adjusting="late"), "adjusting must be one of"),
    (dict(sharpness=None), "needs sharpness"),
    (dict(mapping="sigmoid"), "sharpness is only used by mapping 'learnable-sigmoid'"),
    (dict(mapping="linear", sharpness=None, linear_slope=ZEROS), "needs linear_intercept"),
    (
        dict(mapping="linear", sharpness=None, linear_slope=ZEROS, linear_intercept=torch.zeros(2)),
        "linear_intercept must be [H]",
    ),
    (dict(mapping="clip", sharpness=None), "needs clip_threshold"),
    (dict(mapping="clip", sharpness=None, clip_threshold=float("nan")), "finite number > 0"),
    (dict(mapping="clip", sharpness=None, clip_threshold=0.0), "finite number > 0"),
    (dict(clip_threshold=2.0), "clip_threshold is only used by mapping 'clip'"),
]


@pytest.mark.parametrize("overrides,message", DA_ERRORS, ids=[m for _, m in DA_ERRORS])
def test_distance_aware_refuses_a_bad_variant_argument(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        da_call(**overrides)()


# ------------------------------------------------------------------ QVI (Wu et al.)


def reference_query_value_interaction(q, k, v, params, padding, causal, query_offset, interaction):
    """Eq. 7 per value j: q^_j = softmax_i(v_j . q_i / sqrt(d)) q over the visible
    queries (not padded, at or before j when causal); x_j = q^_j * (v_j W); g_j is
    v_j (values only), x_j (interactions only), x_j + v_j (summation) or, eqs. 8-9,
    (1 - beta_j) x_j + beta_j v_j with beta_j = sigmoid(u . [x_j; v_j] + h);
    eq. 10: out_i = sum_j softmax_j(q_i . k_j / sqrt(d)) g_j."""
    batch, heads, tgt_len, dim = q.shape
    src_len = k.shape[2]
    values = np.zeros((batch, heads, src_len, dim))
    for b in range(batch):
        for h in range(heads):
            for j in range(src_len):
                if interaction == "values-only":
                    values[b, h, j] = v[b, h, j]
                    continue
                visible = [
                    (padding is None or not padding[b][query_offset + i]) and (not causal or query_offset + i <= j)
                    for i in range(tgt_len)
                ]
                alpha = naive_softmax([dot(v[b, h, j], q[b, h, i]) / math.sqrt(dim) for i in range(tgt_len)], visible)
                query_mix = sum(alpha[i] * q[b, h, i] for i in range(tgt_len))
                projection = params["value_projection"][h].numpy()
                projected = np.array([sum(v[b, h, j, d] * projection[d, e] for d in range(dim)) for e in range(dim)])
                interaction_term = query_mix * projected
                if interaction == "interactions-only":
                    values[b, h, j] = interaction_term
                elif interaction == "summation":
                    values[b, h, j] = interaction_term + v[b, h, j]
                else:
                    gate = dot(params["gate_weight"][h].numpy(), np.concatenate([interaction_term, v[b, h, j]]))
                    beta = 1.0 / (1.0 + math.exp(-(gate + float(params["gate_bias"][h]))))
                    values[b, h, j] = (1.0 - beta) * interaction_term + beta * v[b, h, j]
    out, weights = np.zeros((batch, heads, tgt_len, dim)), np.zeros((batch, heads, tgt_len, src_len))
    for b in range(batch):
        for h in range(heads):
            for i in range(tgt_len):
                position = query_offset + i
                visible = [key_visible(padding, causal, b, position, j) for j in range(src_len)]
                alpha = naive_softmax([dot(q[b, h, i], k[b, h, j]) / math.sqrt(dim) for j in range(src_len)], visible)
                for j in range(src_len):
                    weights[b, h, i, j] = alpha[j]
                    out[b, h, i] += alpha[j] * values[b, h, j]
    return torch.from_numpy(out), torch.from_numpy(weights)


def interaction_parameters(interaction, generator, requires_grad=False):
    def tensor(*shape, scale=0.5):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).requires_grad_(requires_grad)

    params = {"value_projection": None, "gate_weight": None, "gate_bias": None}
    if interaction != "values-only":
        params["value_projection"] = tensor(HEADS, DIM, DIM)
    if interaction == "gated":
        params["gate_weight"], params["gate_bias"] = tensor(HEADS, 2 * DIM), tensor(HEADS)
    return params


# QVI is self-attention: keys are the positions 0..Tk-1, queries the last Tq of them
QVI_CASES = [case for case in CASES if case[1] + case[3] == case[2]]


@pytest.mark.parametrize("case", QVI_CASES, ids=[c[0] for c in QVI_CASES])
@pytest.mark.parametrize("interaction", QVI_INTERACTIONS)
def test_query_value_interaction_variant_matches_the_paper(interaction, case):
    q, k, v, padding, causal, query_offset, generator = case_inputs(case, seed=13)
    params = interaction_parameters(interaction, generator)
    out, probs = functional.query_value_interaction_attention(
        q,
        k,
        v,
        params["value_projection"],
        params["gate_weight"],
        params["gate_bias"],
        key_padding_mask=padding,
        causal=causal,
        query_offset=query_offset,
        interaction=interaction,
    )
    expected_out, expected_probs = reference_query_value_interaction(
        q.numpy(), k.numpy(), v.numpy(), params, padding.tolist(), causal, query_offset, interaction
    )
    assert_close(probs, expected_probs, **TIGHT)
    assert_close(out, expected_out, **TIGHT)


@pytest.mark.parametrize("interaction", QVI_INTERACTIONS)
def test_query_value_interaction_variant_gradients(interaction):
    q, k, v, padding, causal, query_offset, generator = case_inputs(QVI_CASES[0], seed=4)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    params = interaction_parameters(interaction, generator, requires_grad=True)
    names = [name for name, value in params.items() if value is not None]

    def run(q, k, v, *values):
        given = {**params, **dict(zip(names, values))}
        return functional.query_value_interaction_attention(
            q,
            k,
            v,
            given["value_projection"],
            given["gate_weight"],
            given["gate_bias"],
            key_padding_mask=padding,
            causal=causal,
            interaction=interaction,
        )[0]

    assert gradcheck(run, (q, k, v, *(params[name] for name in names)), eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_values_only_is_plain_attention(dtype):
    q, k, v, padding, *_ = case_inputs(CASES[0], seed=6)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out, probs = functional.query_value_interaction_attention(
        q, k, v, None, None, None, key_padding_mask=padding, interaction="values-only"
    )
    plain_out, plain_probs = functional.softmax_attention(q, k, v, key_padding_mask=padding)
    assert torch.equal(out, plain_out) and torch.equal(probs, plain_probs)


W = torch.eye(DIM).repeat(HEADS, 1, 1)
QVI_ERRORS = [
    (dict(interaction="gate"), "interaction must be one of"),
    (dict(interaction="values-only"), "does not use value_projection"),
    (dict(interaction="summation"), "does not use gate_weight"),
    (dict(interaction="gated", value_projection=None), "needs value_projection"),
    (
        dict(interaction="interactions-only", value_projection=None, gate_weight=None, gate_bias=None),
        "needs value_projection",
    ),
]


@pytest.mark.parametrize("overrides,message", QVI_ERRORS, ids=[m for _, m in QVI_ERRORS])
def test_query_value_interaction_refuses_a_bad_variant_argument(overrides, message):
    q, k, v, *_ = case_inputs(CASES[0], seed=1)
    q, k, v = q.float(), k.float(), v.float()
    arguments = dict(value_projection=W, gate_weight=torch.zeros(HEADS, 2 * DIM), gate_bias=torch.zeros(HEADS))
    arguments.update(overrides)
    for call in (
        functional.query_value_interaction_attention,
        lambda q, k, v, **kw: functional.query_aware_values(q, v, **kw),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            call(q, k, v, **arguments)


# ------------------------------------------------------------------ models

DA_VARIANT_FLAGS = [["--da-mapping", m] for m in DA_MAPPINGS] + [["--da-adjusting", a] for a in DA_ADJUSTINGS[1:]]
QVI_VARIANT_FLAGS = [["--qvi-interaction", i] for i in QVI_INTERACTIONS]
# the parameters each variant's module holds
EXPECTED_PARAMETERS = {
    ("da", "learnable-sigmoid"): {"distance_weight", "sharpness"},
    ("da", "sigmoid"): {"distance_weight"},
    ("da", "exponent"): {"distance_weight"},
    ("da", "linear"): {"distance_weight", "linear_slope", "linear_intercept"},
    ("da", "clip"): {"distance_weight"},
    ("qvi", "gated"): {"value_projection", "gate_weight", "gate_bias"},
    ("qvi", "values-only"): set(),
    ("qvi", "interactions-only"): {"value_projection"},
    ("qvi", "summation"): {"value_projection"},
}
MODEL_VARIANTS = [("da", flags) for flags in DA_VARIANT_FLAGS] + [("qvi", flags) for flags in QVI_VARIANT_FLAGS]


def variant_id(variant):
    mechanism, flags = variant
    return f"{mechanism}:{flags[1]}"


def mechanisms_of(model, kind):
    return [m for m in model.modules() if isinstance(m, kind)]


@pytest.mark.parametrize("mechanism,flags", MODEL_VARIANTS, ids=[variant_id(v) for v in MODEL_VARIANTS])
def test_each_variant_holds_only_its_parameters(mechanism, flags):
    model, _ = translation_model(extra=[*TINY, "--encoder-self-attention", mechanism, *flags], perturb=False)
    kind = DistanceAware if mechanism == "da" else QueryValueInteraction
    (first, *_), choice = mechanisms_of(model, kind), flags[1]
    key = (mechanism, choice if choice not in DA_ADJUSTINGS else "learnable-sigmoid")
    assert {name for name, _ in first.named_parameters()} == EXPECTED_PARAMETERS[key]
    assert choice in first.extra_repr() or choice in ("learnable-sigmoid", "early-multiply", "gated")


def test_the_papers_choices_build_the_modules_checkpoints_were_saved_from():
    model, _ = translation_model(extra=[*TINY, "--encoder-self-attention", "da", "--decoder-self-attention", "qvi"])
    (da,) = mechanisms_of(model, DistanceAware)[:1]
    (qvi,) = mechanisms_of(model, QueryValueInteraction)[:1]
    assert da.extra_repr() == "heads=2" and qvi.extra_repr() == "heads=2, head_dim=8"
    explicit, _ = translation_model(
        extra=[
            *TINY,
            "--encoder-self-attention",
            "da",
            "--decoder-self-attention",
            "qvi",
            "--da-mapping",
            "learnable-sigmoid",
            "--da-adjusting",
            "early-multiply",
            "--qvi-interaction",
            "gated",
        ]
    )
    assert model.state_dict().keys() == explicit.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, explicit.state_dict()[name]), name


def test_a_checkpoint_without_the_new_options_builds_the_papers_model():
    """fairseq rebuilds a checkpoint's model from its saved args: those of an
    earlier version lack the new options, which take the papers' choices."""
    args = parse(
        "translation",
        "distattn_transformer",
        [*TINY, "--encoder-self-attention", "da", "--decoder-self-attention", "qvi"],
    )
    for attr in ("da_mapping", "da_adjusting", "da_clip_threshold", "qvi_interaction"):
        delattr(args, attr)
    options = AttentionOptions.from_args(args)
    assert options == AttentionOptions(
        RelativePositionOptions(max_relative_position=3), WindowOptions(window_segment_size=2)
    )
    from fairseq_distattn.models.arguments import set_distattn_defaults

    set_distattn_defaults(args)
    assert {attr: getattr(args, attr) for attr in ("da_mapping", "da_adjusting", "qvi_interaction")} == {
        "da_mapping": "learnable-sigmoid",
        "da_adjusting": "early-multiply",
        "qvi_interaction": "gated",
    }


def source_batch(d, rows):
    lengths = [7, 5, 6, 3][:rows]
    sentences = [random_tokens(d, 1, n, seed=40 + i)[0] for i, n in enumerate(lengths)]
    return left_pad(sentences, d.pad()), torch.tensor(lengths)


@pytest.mark.parametrize("mechanism,flags", MODEL_VARIANTS, ids=[variant_id(v) for v in MODEL_VARIANTS])
def test_incremental_beam_decoding_matches_full_forward(mechanism, flags):
    """Every decoder layer uses the variant; the beam is reordered mid-way."""
    model, d = translation_model(extra=[*TINY, "--decoder-self-attention", mechanism, *flags])
    model.decoder.set_beam_size(2)
    src_tokens, src_lengths = source_batch(d, rows=2)
    src_tokens, src_lengths = src_tokens.repeat_interleave(2, 0), src_lengths.repeat_interleave(2)
    steps, reorder_at, new_order = 6, 3, torch.tensor([1, 1, 3, 2])
    targets = random_tokens(d, 4, steps, seed=7)
    targets[:, 0] = d.eos()
    encoder_out = model.encoder(src_tokens, src_lengths)
    incremental_state, incremental = {}, []
    for step in range(steps):
        if step == reorder_at:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
            incremental = [out[new_order] for out in incremental]
            targets = torch.cat([targets[new_order, :step], targets[:, step:]], dim=1)
        out = model.decoder(targets[:, : step + 1], encoder_out=encoder_out, incremental_state=incremental_state)[0]
        incremental.append(out[:, -1])
    full = model(src_tokens, src_lengths, targets)[0]
    assert_close(torch.stack(incremental, dim=1), full, **MODEL_TOLERANCE)


@pytest.mark.parametrize("mechanism,flags", MODEL_VARIANTS, ids=[variant_id(v) for v in MODEL_VARIANTS])
def test_sentence_output_is_independent_of_batch_padding(mechanism, flags):
    """The late adjustments add or multiply f after the softmax: padding must still weigh 0."""
    model, d = translation_model(
        extra=[*TINY, "--encoder-self-attention", mechanism, "--decoder-self-attention", mechanism, *flags]
    )
    src_tokens, src_lengths = source_batch(d, rows=4)
    targets = [random_tokens(d, 1, n, seed=20 + i)[0] for i, n in enumerate([6, 4, 2, 5])]
    batch = model(src_tokens, src_lengths, right_pad(targets, d.pad()))[0]
    for row in range(len(targets)):
        source = src_tokens[row, src_tokens.size(1) - src_lengths[row] :][None]
        alone = model(source, src_lengths[row : row + 1], targets[row][None])[0]
        assert_close(batch[row, : len(targets[row])], alone[0], **MODEL_TOLERANCE)


@pytest.mark.parametrize("mechanism,flags", MODEL_VARIANTS, ids=[variant_id(v) for v in MODEL_VARIANTS])
def test_a_tiny_model_trains_with_each_variant(mechanism, flags):
    """A few Adam steps on one batch: the loss falls and every parameter of the
    variant moves (DA's v, k and b get no gradient at w = 0, so after step one)."""
    model, d = translation_model(
        extra=[*TINY, "--encoder-self-attention", mechanism, "--decoder-self-attention", mechanism, *flags],
        perturb=False,
    )
    model.train()
    src_tokens, src_lengths = source_batch(d, rows=4)
    targets = right_pad([random_tokens(d, 1, n, seed=60 + i)[0] for i, n in enumerate([6, 4, 3, 5])], d.pad())
    prev_output_tokens = torch.cat([torch.full((4, 1), d.eos()), targets[:, :-1]], dim=1)
    kind = DistanceAware if mechanism == "da" else QueryValueInteraction
    initial = {name: p.detach().clone() for m in mechanisms_of(model, kind) for name, p in m.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        logits = model(src_tokens, src_lengths, prev_output_tokens)[0]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=d.pad()
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.1, losses
    moved = {name: p for m in mechanisms_of(model, kind) for name, p in m.named_parameters()}
    for name, parameter in moved.items():
        assert torch.isfinite(parameter).all() and not torch.equal(parameter, initial[name]), f"{name} did not move"


# ------------------------------------------------------------------ flags


NEW_FLAGS = {
    "--da-mapping": DA_MAPPINGS,
    "--da-adjusting": DA_ADJUSTINGS,
    "--da-clip-threshold": None,
    "--qvi-interaction": QVI_INTERACTIONS,
}


def test_every_option_has_a_default_that_is_the_papers_choice():
    options = AttentionOptions()
    defaults = {**dataclasses.asdict(options.for_mechanism("da")), **dataclasses.asdict(options.for_mechanism("qvi"))}
    for flag in NEW_FLAGS:
        attr = flag[2:].replace("-", "_")
        assert OPTION_DEFAULTS[attr] == defaults[attr]


def test_the_flags_reach_the_model_and_are_absent_unless_given():
    args = parse(
        "translation",
        "distattn_transformer",
        [
            *TINY,
            "--da-mapping",
            "clip",
            "--da-clip-threshold",
            "2.5",
            "--da-adjusting",
            "late-add",
            "--qvi-interaction",
            "summation",
        ],
    )
    options = AttentionOptions.from_args(args)
    da, qvi = options.for_mechanism("da"), options.for_mechanism("qvi")
    assert (da.da_mapping, da.da_clip_threshold, da.da_adjusting, qvi.qvi_interaction) == (
        "clip",
        2.5,
        "late-add",
        "summation",
    )
    plain = parse("translation", "distattn_transformer", [])
    assert plain.da_mapping == "learnable-sigmoid"  # filled in by the architecture
    assert not hasattr(parse("translation", "transformer", []), "da_mapping")


@pytest.mark.parametrize(
    "attr,value,flag",
    [
        ("da_mapping", "tanh", "--da-mapping"),
        ("da_adjusting", None, "--da-adjusting"),
        ("qvi_interaction", "gate", "--qvi-interaction"),
        ("da_clip_threshold", 0.0, "--da-clip-threshold"),
        ("da_clip_threshold", float("inf"), "--da-clip-threshold"),
        ("da_clip_threshold", True, "--da-clip-threshold"),
    ],
)
def test_options_refuse_bad_values_with_one_line(attr, value, flag):
    with pytest.raises(SpecError) as error:
        AttentionOptions.from_args(argparse.Namespace(**{attr: value}))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"argument {flag}: invalid value {str(value)!r}")


@pytest.mark.parametrize(
    "flags",
    [
        ["--da-mapping", "tanh"],
        ["--da-adjusting", "late"],
        ["--qvi-interaction", "gate"],
        ["--da-clip-threshold", "-1"],
        ["--da-clip-threshold", "nan"],
    ],
)
def test_the_parser_refuses_a_bad_value_with_exit_2_and_one_line(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        translation_model(extra=[*TINY, "--encoder-self-attention", "da", *flags])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and flags[0] in errors[0] and flags[1] in errors[0], errors


def test_option_flags_are_accepted_without_their_mechanism_like_every_option():
    """As --distance-mask-alpha or --window-segment-size: an option is a model
    setting, valid (and checked) whether or not a layer uses it."""
    model, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "rpr", "--da-mapping", "clip", "--qvi-interaction", "summation"]
    )
    assert not mechanisms_of(model, DistanceAware) and not mechanisms_of(model, QueryValueInteraction)


def test_bad_input_table_covers_the_new_flags():
    from .test_bad_inputs import BAD_INPUTS

    assert set(NEW_FLAGS) <= {case[2] for case in BAD_INPUTS}


def test_help_lists_the_ablation_flags_and_their_choices():
    proc = run_cli(["fairseq-train", "--user-dir", "fairseq_distattn", "--help"])
    for flag, choices in NEW_FLAGS.items():
        assert flag in proc.stdout, f"{flag} missing from fairseq-train --help"
        if choices is not None:
            assert f"{flag} {{{','.join(choices)}}}" in proc.stdout


# ------------------------------------------------------------------ command line and checkpoints

MT_CLI = ["--user-dir", "fairseq_distattn", "--task", "translation", "--source-lang", "en", "--target-lang", "de"]
CLI_TINY = [
    "--arch",
    "distattn_transformer",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "16",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--encoder-self-attention",
    "da",
    "--decoder-self-attention",
    "qvi",
]


def train_and_generate(data, save_dir: Path, flags):
    train = run_cli(
        [
            "fairseq-train",
            data["bin"],
            *MT_CLI,
            *CLI_TINY,
            *flags,
            "--optimizer",
            "adam",
            "--lr",
            "5e-3",
            "--max-tokens",
            "1024",
            "--max-update",
            "2",
            "--seed",
            "1",
            "--num-workers",
            "0",
            "--disable-validation",
            "--no-epoch-checkpoints",
            "--save-dir",
            save_dir,
        ]
    )
    return train.stdout + train.stderr, generate(data, save_dir / "checkpoint_last.pt")


def generate(data, checkpoint: Path) -> str:
    proc = run_cli(
        [
            "fairseq-generate",
            data["bin"],
            *MT_CLI,
            "--path",
            checkpoint,
            "--gen-subset",
            "test",
            "--beam",
            "2",
            "--batch-size",
            "4",
            "--required-batch-size-multiple",
            "1",
            "--max-len-b",
            "8",
            "--num-workers",
            "0",
        ]
    )
    lines = [line for line in proc.stdout.splitlines() if re.match(r"^[HP]-\d+\t", line)]
    assert len(lines) == 2 * data["n_test"], proc.stdout[-2000:]
    return "\n".join(sorted(lines))


def test_an_ablation_trains_generates_and_reloads_from_the_command_line(mt_data, workdir):
    log, _ = train_and_generate(
        mt_data,
        workdir / "ablation",
        [
            "--da-mapping",
            "clip",
            "--da-clip-threshold",
            "4",
            "--da-adjusting",
            "late-add",
            "--qvi-interaction",
            "summation",
        ],
    )
    # the model summary logged at build names each layer's variant
    assert "da (heads=2, mapping=clip, T=4, adjusting=late-add)" in log, log[-3000:]
    assert "qvi (heads=2, head_dim=8, interaction=summation)" in log, log[-3000:]
    saved = torch.load(workdir / "ablation" / "checkpoint_last.pt", weights_only=True)["cfg"]["model"]
    assert (saved.da_mapping, saved.da_clip_threshold, saved.da_adjusting, saved.qvi_interaction) == (
        "clip",
        4.0,
        "late-add",
        "summation",
    )


def test_a_checkpoint_saved_before_the_options_existed_loads_unchanged(mt_data, workdir):
    """A checkpoint of the papers' model whose saved args lack the new options
    (as every checkpoint of an earlier version) translates exactly as before."""
    _, translations = train_and_generate(mt_data, workdir / "current", [])
    state = torch.load(workdir / "current" / "checkpoint_last.pt", weights_only=True)
    for attr in ("da_mapping", "da_adjusting", "da_clip_threshold", "qvi_interaction"):
        delattr(state["cfg"]["model"], attr)
    older = workdir / "older.pt"
    torch.save(state, older)
    assert generate(mt_data, older) == translations


# ------------------------------------------------------------------ the harness's ablation grid


def test_the_ablation_grid_names_every_variant_once():
    assert len(set(ABLATION_NAMES)) == len(ABLATION_NAMES)
    names = set(ABLATION_NAMES)
    assert {f"da-map-{m}" for m in DA_MAPPINGS[1:]} | {f"da-adjust-{a}" for a in DA_ADJUSTINGS[1:]} <= names
    assert {f"qvi-{i}" for i in QVI_INTERACTIONS[1:]} <= names
    table2 = {f"window-{m}-{k}-{e}" for m in ("aw", "mw") for k in ("enc", "dec", "cross") for e in ("full", "partial")}
    assert table2 <= names
    assert set(REFERENCE_CONFIGS) == {"vanilla", "da", "qvi", "window", "kerple"}
    assert "kerple-per-layer" in names
    for layers in (1, 3, 6):
        assert [a.name for a in ablations(layers)] == list(ABLATION_NAMES)
        # each is read against its own paper's choice (the report's "delta vs it")
        assert all(a.name.startswith(f"{a.reference}-") for a in ablations(layers))
        assert {a.reference for a in ablations(layers)} == set(REFERENCE_CONFIGS) - {"vanilla"}


def test_partial_is_the_lower_half_as_the_papers_first_3_of_6():
    assert [partial_layers(n) for n in (1, 2, 3, 6, 12)] == ["@0", "@0", "@0", "@0-2", "@0-5"]


def flag_values(arguments):
    """``{flag: value}`` of a command line (``True`` for a flag without one)."""
    values, position = {}, 0
    while position < len(arguments):
        flag, rest = arguments[position], arguments[position + 1 :]
        takes_value = bool(rest) and not rest[0].startswith("--")
        values[flag] = rest[0] if takes_value else True
        position += 2 if takes_value else 1
    return values


def layer_mechanisms(model, flag):
    """The mechanism name of every layer of one attention kind."""
    modules = {
        "--encoder-self-attention": [layer.self_attn for layer in model.encoder.layers],
        "--decoder-self-attention": [layer.self_attn for layer in model.decoder.layers],
        "--cross-attention": [layer.encoder_attn for layer in model.decoder.layers],
    }[flag]
    return [module.mechanism.config.name if hasattr(module, "mechanism") else "vanilla" for module in modules]


@pytest.mark.parametrize("layers", [3, 6])
def test_every_ablation_builds_the_model_it_names(layers):
    depth = ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    for ablation in ablations(layers):
        model, _ = translation_model(
            "distattn_transformer_iwslt_de_en", extra=[*TINY, *depth, *ablation.train_args], perturb=False
        )
        flags = flag_values(ablation.train_args)
        for flag in ("--encoder-self-attention", "--decoder-self-attention", "--cross-attention"):
            mechanism, _, layer_range = flags.get(flag, "vanilla").partition("@")
            first, _, last = layer_range.partition("-")
            covered = range(layers) if not layer_range else range(int(first), int(last or first) + 1)
            expected = [mechanism if layer in covered else "vanilla" for layer in range(layers)]
            assert layer_mechanisms(model, flag) == expected, (ablation.name, flag)
        if "--da-mapping" in flags or "--da-adjusting" in flags:
            da = mechanisms_of(model, DistanceAware)[0]
            assert (da.mapping, da.adjusting) == (
                flags.get("--da-mapping", "learnable-sigmoid"),
                flags.get("--da-adjusting", "early-multiply"),
            ), ablation.name
            assert model.encoder.embed_positions is None, ablation.name
        if "--qvi-interaction" in flags:
            assert mechanisms_of(model, QueryValueInteraction)[0].interaction == flags["--qvi-interaction"]


def test_the_listing_prints_every_ablation(capsys):
    from benchmarks.quality.ablations import main

    assert main(["--layers", "6"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(name, flags) for name, flags, _ in lines] == [(a.name, " ".join(a.train_args)) for a in ablations(6)]


# ------------------------------------------------------------------ examples/ablations/README.md

README = Path(__file__).resolve().parent.parent / "examples" / "ablations" / "README.md"


def readme_ablations():
    """``{name: flags}`` of the README's ``ablate NAME FLAGS...`` lines."""
    commands = [
        shlex.split(line) for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("ablate ")
    ]
    names = [command[1] for command in commands]
    assert len(set(names)) == len(names), "a configuration is listed twice"
    return {command[1]: tuple(command[2:]) for command in commands}


def readme_recipe(name, flags):
    """The README's ``ablate`` function as the fairseq-train arguments it runs."""
    text = README.read_text(encoding="utf-8")
    body = text[text.index("fairseq-train $DATA") : text.index("\n}\n")]
    words = []
    for word in shlex.split(body.replace("\\\n", " "))[1:]:
        words.extend(flags if word == "$@" else [word.replace("$DATA", "data").replace("$name", name)])
    user_dir = words.index("--user-dir")
    return words[:user_dir] + words[user_dir + 2 :]  # the plugin is imported already


def test_the_readme_lists_every_ablation_as_the_harness_holds_it():
    listed = readme_ablations()
    for ablation in ablations(6):
        assert listed.get(ablation.name) == ablation.train_args, ablation.name
    assert set(listed) == set(ABLATION_NAMES) | set(REFERENCE_CONFIGS)


def test_every_readme_command_line_parses_with_fairseq_train():
    from fairseq import options

    for name, flags in readme_ablations().items():
        arguments = readme_recipe(name, list(flags))
        args = options.parse_args_and_arch(options.get_training_parser(), arguments)
        assert args.arch == "distattn_transformer_iwslt_de_en" and args.save_dir == f"checkpoints/ablations/{name}"
        for flag, value in flag_values(list(flags)).items():
            attr = flag[2:].replace("-", "_")
            assert getattr(args, attr) == value, (name, flag)
