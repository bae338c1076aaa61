"""ALiBi (Press et al. 2022) and T5's relative attention bias (Raffel et al.
2020) beyond the parametrised tests that pick them up from the registry
(the references in tests/test_functional_alibi.py and test_functional_t5_bias.py,
tests/test_models.py decoding and padding, tests/test_half_precision.py,
tests/test_fused_paths.py): the papers' slopes and buckets, T5's table shared
across a stack or per layer, the ALiBi LM preset, and the options' validation."""

import argparse
import math

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional.t5_bias import relative_position_bucket_table
from fairseq_distattn.registry import DECODER_SELF, ENCODER_SELF
from fairseq_distattn.spec import AttentionOptions, SpecError

from .model_helpers import TINY, TINY_LM, language_model, random_tokens, translation_model
from .test_functional_alibi import paper_alibi_slopes
from .test_functional_t5_bias import t5_relative_position_bucket

TOLERANCE = dict(rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_for_8_heads_are_the_papers():
    """Sec. 3: "For our models with 8 heads, the slopes that we used are the geometric sequence 1/2^1, ..., 1/2^8"."""
    assert functional.alibi_slopes(8) == tuple(2.0**-h for h in range(1, 9))
    assert functional.alibi_slopes(16)[:2] == pytest.approx((2**-0.5, 2**-1.0), rel=1e-15)


@pytest.mark.parametrize("heads", range(1, 33))
def test_alibi_slopes_follow_the_papers_rule_for_any_head_count(heads):
    assert functional.alibi_slopes(heads) == pytest.approx(paper_alibi_slopes(heads), rel=1e-15)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = functional.alibi_bias(3, 5, 4, 2, "cpu", torch.float64)  # queries at positions 2..4
    for h, slope in enumerate(functional.alibi_slopes(4)):
        for i in range(3):
            for j in range(5):
                assert bias[h, i, j] == -slope * abs(2 + i - j)


def test_explicit_slopes_equal_the_default_and_are_checked():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    default = functional.alibi_attention(q, k, v, causal=True)
    explicit = functional.alibi_attention(
        q, k, v, torch.tensor(functional.alibi_slopes(3), dtype=torch.float64), causal=True
    )
    torch.testing.assert_close(explicit[0], default[0], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="slopes"):
        functional.alibi_attention(q, k, v, torch.ones(2))


def test_alibi_has_no_parameters_and_the_lm_preset_drops_positions():
    model, _ = language_model(arch="distattn_lm_alibi_gbw", extra=[*TINY_LM])
    assert model.decoder.embed_positions is None
    assert all(type(layer.self_attn.mechanism).__name__ == "ALiBi" for layer in model.decoder.layers)
    assert not any("mechanism" in name for name, _ in model.named_parameters())


def test_alibi_lm_extrapolates_without_positions_incrementally():
    """The preset model on a sequence longer than anything position-specific: incremental == full."""
    model, d = language_model(arch="distattn_lm_alibi_gbw", extra=[*TINY_LM])
    tokens = random_tokens(d, 2, 9, seed=4)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, **TOLERANCE)


# ----------------------------------------------------------------------------- T5 buckets


def t5_float32_buckets(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket function as the released implementations compute it (float32 logarithm)."""
    ret, n = 0, -relative_position
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    large = (
        max_exact
        + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    )
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 6), (64, 256), (4, 3), (32, 100)])
def test_t5_buckets_are_t5s(bidirectional, num_buckets, max_distance):
    relative = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    want = t5_float32_buckets(relative, bidirectional, num_buckets, max_distance)
    lookup = torch.tensor(relative_position_bucket_table(num_buckets, max_distance, bidirectional))
    got = lookup[relative.clamp(-max_distance, max_distance) + max_distance]
    assert torch.equal(got, want)
    assert [
        t5_relative_position_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative
    ] == got.tolist()


@pytest.mark.parametrize("num_buckets,max_distance", [(5, 16), (7, 20), (33, 128)])
def test_an_odd_bucket_count_leaves_the_last_bucket_unused_only_where_bidirectional(num_buckets, max_distance):
    """T5's formula halves the count per direction (num_buckets //= 2): of an odd count the
    encoder never reaches the last bucket (nor, as with any count, the first of the second half,
    distance 0 being counted on the first side), while the decoder's one direction uses them all."""
    relative = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    half = num_buckets // 2
    for bidirectional in (True, False):
        lookup = torch.tensor(relative_position_bucket_table(num_buckets, max_distance, bidirectional))
        got = lookup[relative.clamp(-max_distance, max_distance) + max_distance]
        assert torch.equal(got, t5_float32_buckets(relative, bidirectional, num_buckets, max_distance))
        unused = set(range(num_buckets)) - set(lookup.tolist())
        assert unused == ({half, num_buckets - 1} if bidirectional else set())


def test_t5_default_buckets_at_a_glance():
    """32 buckets, max distance 128: in the encoder 16 per direction (8 exact, 8
    log-spaced up to 128), in the decoder 32 for the past (16 exact)."""
    encoder = relative_position_bucket_table(32, 128, True)
    decoder = relative_position_bucket_table(32, 128, False)

    def bucket(table, relative):
        return table[max(-128, min(128, relative)) + 128]

    assert [bucket(encoder, -n) for n in range(8)] == list(range(8))  # keys before the query
    assert [bucket(encoder, n) for n in range(1, 8)] == list(range(17, 24))  # after it: the other half
    assert bucket(encoder, -128) == bucket(encoder, -1000) == 15 and bucket(encoder, 1000) == 31
    assert [bucket(decoder, -n) for n in range(16)] == list(range(16))
    assert bucket(decoder, 5) == 0 and bucket(decoder, -100) == 30 and bucket(decoder, -128) == 31


def test_t5_bias_checks_its_arguments():
    q = torch.zeros(1, 2, 3, 4)
    for table, kwargs, name in [
        (torch.zeros(32, 3), {}, "table"),
        (torch.zeros(3, 2), {}, "num_buckets"),
        (torch.zeros(32, 2), dict(max_distance=16), "max_distance"),
        (torch.zeros(32, 2), dict(bidirectional=1), "bidirectional"),
    ]:
        with pytest.raises(ValueError, match=name):
            functional.t5_bias_attention(q, q, q, table, **kwargs)


# ----------------------------------------------------------------------------- T5 table sharing


def t5_tables(stack):
    return [
        layer.self_attn.mechanism.relative_attention_bias
        for layer in stack.layers
        if type(layer.self_attn).__name__ == "MechanismMultiheadAttention"
    ]


def test_t5_table_is_shared_across_a_stack_by_default():
    model, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "t5-bias", "--decoder-self-attention", "t5-bias"]
    )
    encoder, decoder = t5_tables(model.encoder), t5_tables(model.decoder)
    assert len(encoder) == len(decoder) == 2
    assert encoder[0] is encoder[1] and decoder[0] is decoder[1] and encoder[0] is not decoder[0]
    assert tuple(encoder[0].shape) == (32, 2)
    names = [name for name, _ in model.named_parameters() if "relative_attention_bias" in name]
    assert names == [
        "encoder.layers.0.self_attn.mechanism.relative_attention_bias",
        "decoder.layers.0.self_attn.mechanism.relative_attention_bias",
    ]
    # a checkpoint stores the table under each layer's name; loading one keeps the sharing
    state = model.state_dict()
    assert torch.equal(state["encoder.layers.1.self_attn.mechanism.relative_attention_bias"], encoder[0])
    fresh, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "t5-bias", "--decoder-self-attention", "t5-bias"], seed=3
    )
    fresh.load_state_dict(state)
    assert (
        torch.equal(t5_tables(fresh.encoder)[1], encoder[0])
        and t5_tables(fresh.encoder)[0] is t5_tables(fresh.encoder)[1]
    )


def test_t5_per_layer_option_gives_each_layer_its_table():
    model, _ = translation_model(extra=[*TINY, "--encoder-self-attention", "t5-bias", "--t5-bias-per-layer"])
    encoder = t5_tables(model.encoder)
    assert len(encoder) == 2 and encoder[0] is not encoder[1] and not torch.equal(encoder[0], encoder[1])


def test_a_shared_table_gets_the_gradient_of_every_layer():
    model, d = translation_model(extra=[*TINY, "--encoder-self-attention", "t5-bias"])
    per_layer, _ = translation_model(extra=[*TINY, "--encoder-self-attention", "t5-bias", "--t5-bias-per-layer"])
    shared_table = t5_tables(model.encoder)[0]
    with torch.no_grad():
        for table in t5_tables(per_layer.encoder):
            table.copy_(shared_table)
    per_layer.load_state_dict(
        {
            **per_layer.state_dict(),
            **{n: p for n, p in model.state_dict().items() if "relative_attention_bias" not in n},
        }
    )
    src = random_tokens(d, 2, 5, seed=1)
    lengths = torch.tensor([5, 5])
    prev = random_tokens(d, 2, 4, seed=2)
    model(src, lengths, prev)[0].sum().backward()
    per_layer(src, lengths, prev)[0].sum().backward()
    summed = sum(table.grad for table in t5_tables(per_layer.encoder))
    torch.testing.assert_close(shared_table.grad, summed)


@pytest.mark.parametrize("per_layer", [False, True])
def test_t5_language_model_incremental_matches_full_with_every_layer(per_layer):
    model, d = language_model(
        extra=[
            *TINY_LM,
            "--decoder-self-attention",
            "t5-bias",
            "--t5-bias-buckets",
            "8",
            "--t5-bias-max-distance",
            "6",
            *(["--t5-bias-per-layer"] if per_layer else []),
        ]
    )
    tokens = random_tokens(d, 3, 9, seed=5)  # distances up to 8 reach the log-spaced and the last bucket
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, **TOLERANCE)


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "attr,value,flag",
    [
        ("t5_bias_buckets", 3, "--t5-bias-buckets"),
        ("t5_bias_buckets", 0, "--t5-bias-buckets"),
        ("t5_bias_buckets", True, "--t5-bias-buckets"),
        ("t5_bias_max_distance", 0, "--t5-bias-max-distance"),
        ("t5_bias_max_distance", 16, "--t5-bias-max-distance"),  # not beyond the 16 exact buckets of 32
    ],
)
def test_t5_options_refuse_bad_values_with_one_line(attr, value, flag):
    with pytest.raises(SpecError) as error:
        AttentionOptions.from_args(argparse.Namespace(**{attr: value}))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"argument {flag}: invalid value {str(value)!r}")


@pytest.mark.parametrize("buckets", [5, 7, 33])
def test_odd_t5_buckets_are_refused_only_for_a_bidirectional_stack(buckets):
    options = AttentionOptions.from_args(argparse.Namespace(t5_bias_buckets=buckets, t5_bias_max_distance=128))
    options.check_kind(DECODER_SELF, ["vanilla", "t5-bias"])  # causal buckets: every one is used
    options.check_kind(ENCODER_SELF, ["vanilla", "rpr"])  # no t5-bias layer in the encoder
    with pytest.raises(SpecError) as error:
        options.check_kind(ENCODER_SELF, ["vanilla", "t5-bias"])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"argument --t5-bias-buckets: invalid value '{buckets}'")
    assert f"bucket {buckets - 1} would never be used" in message
    AttentionOptions.from_args(argparse.Namespace(t5_bias_buckets=buckets + 1)).check_kind(ENCODER_SELF, ["t5-bias"])


def test_odd_t5_buckets_still_build_a_decoder():
    """A decoder (and so a checkpoint of one) with an odd count uses every bucket and still builds."""
    flags = ["--t5-bias-buckets", "7", "--t5-bias-max-distance", "8"]
    lm, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "t5-bias", *flags])
    assert tuple(lm.decoder.layers[0].self_attn.mechanism.relative_attention_bias.shape) == (7, 2)
    model, _ = translation_model(extra=[*TINY, "--decoder-self-attention", "t5-bias@1", *flags])
    assert tuple(model.decoder.layers[1].self_attn.mechanism.relative_attention_bias.shape) == (7, 2)


def test_t5_options_reach_the_model():
    options = AttentionOptions.from_args(
        argparse.Namespace(t5_bias_buckets=8, t5_bias_max_distance=5, t5_bias_per_layer=True)
    )
    t5 = options.for_mechanism("t5-bias")
    assert (t5.t5_bias_buckets, t5.t5_bias_max_distance, t5.t5_bias_per_layer) == (8, 5, True)
    model, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "t5-bias@1", "--t5-bias-buckets", "8", "--t5-bias-max-distance", "5"]
    )
    mechanism = model.encoder.layers[1].self_attn.mechanism
    assert tuple(mechanism.relative_attention_bias.shape) == (8, 2) and mechanism.max_distance == 5


def test_a_checkpoint_with_odd_encoder_buckets_trained_before_the_check_still_builds():
    """The refusal is for new models (fairseq-train's flags); a model rebuilt from a checkpoint's
    own configuration, as fairseq-generate and a resume do, builds as it was trained."""
    from fairseq.tasks.translation import TranslationTask

    from .model_helpers import dictionary, parse

    args = parse("translation", "distattn_transformer", [*TINY, "--encoder-self-attention", "t5-bias"])
    args.t5_bias_buckets = 7  # as a checkpoint from before the check holds it
    d = dictionary()
    model = TranslationTask(args, d, d).build_model(args)
    assert tuple(model.encoder.layers[0].self_attn.mechanism.relative_attention_bias.shape) == (7, 2)
    # and it runs as trained: the op refuses an odd bidirectional table, so the layer hands it the
    # rows T5's buckets read, and the last row, never read, gets no gradient
    source = random_tokens(d, 2, 9, seed=0)
    out = model.encoder(source, src_lengths=torch.tensor([9, 9]))["encoder_out"][0]
    out.sum().backward()
    table = model.encoder.layers[0].self_attn.mechanism.relative_attention_bias
    assert torch.isfinite(out).all() and table.grad[-1].abs().sum() == 0 and table.grad[:-1].abs().sum() > 0
