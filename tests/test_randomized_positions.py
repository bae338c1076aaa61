"""``--randomized-positions N`` (Ruoss et al. 2023, google-deepmind/randomized_positional_encodings
at e8c64749): the samplers, the ops against the authors' definitions restated in float64,
the models (training draws, evaluation and decoding are the ordinary model), and the refusals."""

import math
import re

import pytest
import torch
from torch.testing import assert_close

from fairseq_distattn.functional import alibi_attention, alibi_slopes, rotary_attention, softmax_attention
from fairseq_distattn.functional.position_tables import offsets
from fairseq_distattn.functional.randomized_positions import (
    map_offsets,
    sample_distances,
    sample_positions,
)
from fairseq_distattn.modules.transformer import RandomizedSinusoidalPositionalEmbedding, randomized_mechanisms

from .model_helpers import TINY, TINY_LM, language_model, parse, random_tokens, right_pad, translation_model

N = 2048  # the authors' noise_max_length (experiments/example.py:73); >= the tiny models' 1024 positions

# --------------------------------------------------------------------------- (a) the samplers


@pytest.mark.parametrize("length,high", [(0, 5), (1, 1), (5, 5), (7, 40), (64, 2048)])
def test_positions_are_a_sorted_sample_without_replacement_of_0_to_n(length, high):
    drawn = sample_positions(length, high, generator=torch.Generator().manual_seed(length))
    assert drawn.dtype == torch.long and drawn.shape == (length,)
    assert bool((drawn[1:] > drawn[:-1]).all())  # sorted and distinct
    assert length == 0 or (int(drawn.min()) >= 0 and int(drawn.max()) < high)
    if length == high:
        assert drawn.tolist() == list(range(high))


@pytest.mark.parametrize("length,high", [(1, 1), (5, 5), (7, 40), (64, 2048)])
def test_distances_start_at_0_then_a_sorted_sample_of_1_to_n(length, high):
    drawn = sample_distances(length, high, generator=torch.Generator().manual_seed(length))
    assert drawn.shape == (length,) and int(drawn[0]) == 0
    assert bool((drawn[1:] > drawn[:-1]).all())
    assert length == 1 or (int(drawn[1:].min()) >= 1 and int(drawn.max()) < high)


def test_the_draws_follow_torch_s_seed_and_cover_the_range():
    torch.manual_seed(3)
    first = sample_positions(10, 100), sample_distances(10, 100)
    torch.manual_seed(3)
    again = sample_positions(10, 100), sample_distances(10, 100)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    torch.manual_seed(4)
    assert not torch.equal(sample_positions(10, 100), first[0])
    # position 0 itself is drawn (not forced), and every position of [0, N) can be
    seen = torch.zeros(12, dtype=torch.bool)
    for seed in range(200):
        seen[sample_positions(3, 12, generator=torch.Generator().manual_seed(seed))] = True
    assert bool(seen.all())


def test_a_sample_larger_than_the_range_is_refused():
    with pytest.raises(ValueError, match="max_position must be at least 6"):
        sample_positions(6, 5)
    with pytest.raises(ValueError, match="max_position must be at least 6"):
        sample_distances(6, 5)


def test_offsets_read_through_the_distance_map_are_the_authors_sign_mapped_distances():
    """The research note's NOISY_RELATIVE example (r = 1, 6, 7, 8; T = 5): phi(j - i)."""
    r = torch.tensor([0, 1, 6, 7, 8])
    expected = [[0, 1, 6, 7, 8], [-1, 0, 1, 6, 7], [-6, -1, 0, 1, 6], [-7, -6, -1, 0, 1], [-8, -7, -6, -1, 0]]
    table = offsets(5, 5, 0, "cpu", position_map=r)
    dense = torch.stack([table[j - i + 4] for i in range(5) for j in range(5)]).view(5, 5)  # entry j - i + Tq - 1
    assert dense.tolist() == expected
    relative = torch.arange(5)[None, :] - torch.arange(5)[:, None]
    assert map_offsets(relative, r).tolist() == expected
    with pytest.raises(ValueError, match="fewer than the 5 distances"):
        map_offsets(relative, r[:4])


# --------------------------------------------------------------------------- (b) the ops, restated


def _inputs(batch=2, heads=4, length=6, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64) for _ in range(3)]


def _rotated(x, positions, base=10000.0):
    """RoPE (the authors' PE:310-362, GPT-J interleaved pairs): pair (2k, 2k+1) turned by
    ``p * base^(-2k/d)`` at position p."""
    dim = x.size(-1)
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions.to(torch.float64)[:, None] * theta[None, :]  # [T, d/2]
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _reference(q, k, v, logits_extra=None, causal=False, rotate_by=None):
    if rotate_by is not None:
        q, k = _rotated(q, rotate_by), _rotated(k, rotate_by)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if logits_extra is not None:
        logits = logits + logits_extra
    if causal:
        length = q.size(2)
        logits = logits.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    probs = logits.softmax(-1)
    return probs @ v, probs


@pytest.mark.parametrize("causal", [False, True])
def test_rope_rotates_by_the_sampled_positions(causal):
    q, k, v = _inputs()
    positions = sample_positions(6, 50, generator=torch.Generator().manual_seed(1))
    out, probs = rotary_attention(q, k, v, causal=causal, position_map=positions)
    want_out, want_probs = _reference(q, k, v, causal=causal, rotate_by=positions)
    assert_close(probs, want_probs, rtol=1e-12, atol=1e-12)
    assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    # the logit depends on p_j - p_i only: shifting every position changes nothing
    shifted, _ = rotary_attention(q, k, v, causal=causal, position_map=positions + 17)
    assert_close(shifted, out, rtol=1e-10, atol=1e-10)
    # the identity map is the ordinary model
    ordinary, _ = rotary_attention(q, k, v, causal=causal)
    assert_close(rotary_attention(q, k, v, causal=causal, position_map=torch.arange(6))[0], ordinary)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_alibi_reads_the_sampled_distances(causal, need_weights):
    q, k, v = _inputs()
    r = sample_distances(6, 50, generator=torch.Generator().manual_seed(2))
    slopes = torch.tensor(alibi_slopes(4), dtype=torch.float64)
    distance = r[(torch.arange(6)[None, :] - torch.arange(6)[:, None]).abs()].to(torch.float64)
    bias = -slopes[:, None, None] * distance  # the authors' NOISY_ALIBI -m_h r_|j-i| (without their +0.5 m_h)
    want_out, want_probs = _reference(q, k, v, bias, causal=causal)
    out, probs = alibi_attention(q, k, v, causal=causal, need_weights=need_weights, position_map=r)
    assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    if need_weights:
        assert_close(probs, want_probs, rtol=1e-12, atol=1e-12)
    # learned slopes too, and the identity map is the ordinary ALiBi
    out_slopes, _ = alibi_attention(q, k, v, slopes, causal=causal, position_map=r)
    assert_close(out_slopes, want_out, rtol=1e-12, atol=1e-12)
    assert_close(
        alibi_attention(q, k, v, causal=causal, position_map=torch.arange(6))[0],
        alibi_attention(q, k, v, causal=causal)[0],
    )


def _distance_table_cases():
    """(op terms function, its arguments after q and k) for every distance mechanism that
    takes the map besides ALiBi, whose authors' form is restated above."""
    from fairseq_distattn.functional import kerple_attention, sandwich_attention, t5_bias_attention

    generator = torch.Generator().manual_seed(3)
    r1, r2 = torch.rand(4, generator=generator, dtype=torch.float64) + 0.5, torch.rand(4, dtype=torch.float64) + 0.5
    table = torch.randn(32, 4, generator=generator, dtype=torch.float64)
    return {
        "kerple-log": (kerple_attention, (r1, r2), {"kernel": "log"}),
        "kerple-power": (kerple_attention, (r1, r2.clamp(max=1.5)), {"kernel": "power"}),
        "sandwich": (sandwich_attention, (), {}),
        "t5-bias": (t5_bias_attention, (table,), {}),
    }


@pytest.mark.parametrize("case", sorted(_distance_table_cases()))
@pytest.mark.parametrize("causal", [False, True])
def test_a_distance_table_is_its_ordinary_table_read_at_the_sampled_distance(case, causal):
    """Each table read by ``j - i`` takes Ruoss et al.'s randomized distances as ALiBi does:
    its bias at offset ``d`` is its ordinary bias at offset ``sign(d) r_|d|``, read here from
    the ordinary table of one query among keys on both sides of it."""
    from fairseq_distattn.functional import CallOptions

    op, arguments, keywords = _distance_table_cases()[case]

    def table(q, k, query_offset, position_map):
        options = CallOptions(causal=causal, query_offset=query_offset, position_map=position_map)
        return op.terms(q, k, k, arguments, keywords, options).offset_table.dense()

    q, k, _ = _inputs()
    length, reach = q.size(2), 50
    r = sample_distances(length, reach, generator=torch.Generator().manual_seed(4))
    wide_keys = torch.zeros(*k.shape[:2], 2 * reach - 1, k.size(-1), dtype=k.dtype)
    # [H, 2 reach - 1]: the ordinary bias at offsets -(reach - 1) .. reach - 1
    ordinary = table(q[:, :, :1], wide_keys, reach - 1, None)[..., 0, :]
    offset = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    want = ordinary[:, reach - 1 + offset.sign() * r[offset.abs()]]
    assert_close(table(q, k, 0, r), want, rtol=0, atol=0)
    assert_close(table(q, k, 0, torch.arange(length)), table(q, k, 0, None), rtol=0, atol=0)


def _bias(op, q, k, arguments, position_map, query_offset=0, causal=False):
    from fairseq_distattn.functional import CallOptions

    options = CallOptions(causal=causal, query_offset=query_offset, position_map=position_map)
    return op.terms(q, k, k, arguments, {}, options).bias


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_xl_reads_r_at_the_sampled_distance(causal):
    """Transformer-XL's ``(q_i + v) W_R R_{i-j}`` (a bias that depends on the query row) takes
    the sampled distances as the authors' ``NOISY_RELATIVE`` does: row i's bias at offset ``d``
    is its ordinary bias at ``sign(d) r_|d|``, read from that row alone among wide keys."""
    from fairseq_distattn.functional import transformer_xl_attention

    q, k, _ = _inputs()
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(4 * 8, 16, generator=generator, dtype=torch.float64)
    u, v = torch.randn(2, 4, 8, generator=generator, dtype=torch.float64)
    length, reach = q.size(2), 40
    r = sample_distances(length, reach, generator=torch.Generator().manual_seed(7))
    mapped = _bias(transformer_xl_attention, q, k, (weight, u, v), r, causal=causal)
    wide_keys = torch.zeros(*k.shape[:2], 2 * reach - 1, k.size(-1), dtype=k.dtype)
    for row in range(length):
        ordinary = _bias(transformer_xl_attention, q[:, :, row : row + 1], wide_keys, (weight, u, v), None, reach - 1)
        offset = torch.arange(length) - row
        want = ordinary[:, :, 0, reach - 1 + offset.sign() * r[offset.abs()]]
        assert_close(mapped[:, :, row], want, rtol=1e-12, atol=1e-12)
    plain = _bias(transformer_xl_attention, q, k, (weight, u, v), None, causal=causal)
    assert_close(_bias(transformer_xl_attention, q, k, (weight, u, v), torch.arange(length)), plain)


def _rpr_reference(q, k, v, rel_keys, rel_values, k_clip, distance, causal):
    """Shaw et al. eqs. 3-4 with every (i, j) reading the rows of bucket ``clip(distance_ij, -k, k) + k``,
    formed as the ``[Tq, Tk, D]`` tensors a^K_ij and a^V_ij the efficient forms avoid."""
    bucket = distance.clamp(-k_clip, k_clip) + k_clip
    a_k, a_v = rel_keys[bucket], rel_values[bucket]  # [Tq, Tk, D]
    logits = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)) / math.sqrt(q.size(-1))
    if causal:
        logits = logits.masked_fill(distance > 0, float("-inf"))
    probs = logits.softmax(-1)
    return probs @ v + torch.einsum("bhij,ijd->bhid", probs, a_v), probs


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("values", [True, False])
def test_rpr_clips_the_sampled_distance_into_its_buckets(causal, values):
    """rpr (an extension: the authors randomize Transformer-XL's encoding, not Shaw et al.'s) reads
    offset ``d`` at the bucket of ``clip(sign(d) r_|d|, -k, k)``: against eqs. 3-4 formed per (i, j), in
    the output, the weights and the gradients of every input and table; the identity map is the
    ordinary rpr, and a map reaching past k clips into the last buckets."""
    from fairseq_distattn.functional import relative_position_attention

    q, k, v = _inputs(length=7)
    k_clip, length = 3, q.size(2)
    generator = torch.Generator().manual_seed(8)
    rel_keys, rel_values = torch.randn(2, 2 * k_clip + 1, q.size(-1), generator=generator, dtype=torch.float64)
    r = torch.tensor([0, 2, 3, 4, 5, 9, 11])  # r_1 = 2 reads d = +-2's rows; from r_2 on, the clipped ones
    offset = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    mapped_offset = offset.sign() * r[offset.abs()]
    leaves = [t.clone().requires_grad_() for t in (q, k, v, rel_keys, rel_values)]
    q_, k_, v_, keys_, values_ = leaves
    out, probs = relative_position_attention(
        q_, k_, v_, keys_, values_ if values else None, k_clip, causal=causal, position_map=r
    )
    want_out, want_probs = _rpr_reference(
        q_, k_, v_, keys_, values_ if values else torch.zeros_like(values_), k_clip, mapped_offset, causal
    )
    assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    assert_close(probs, want_probs, rtol=1e-12, atol=1e-12)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad, allow_unused=True)
    want = torch.autograd.grad(want_out, leaves, grad, allow_unused=True)
    for name, g, w in zip(("q", "k", "v", "rel_keys", "rel_values"), got, want):
        if name == "rel_values" and not values:
            assert g is None
            continue
        assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
    plain = relative_position_attention(q, k, v, rel_keys, rel_values, k_clip, causal=causal)
    identity = relative_position_attention(
        q, k, v, rel_keys, rel_values, k_clip, causal=causal, position_map=torch.arange(length)
    )
    assert_close(identity[0], plain[0], rtol=1e-12, atol=1e-12)
    unmapped = relative_position_attention(q, k, v, rel_keys, rel_values if values else None, k_clip, causal=causal)
    assert not torch.allclose(out.detach(), unmapped[0])


def test_fire_reads_the_sampled_positions():
    """FIRE reads the query's own position besides the distance, so it takes sampled
    positions: its bias at (i, j) is its ordinary bias at (p_i, p_j)."""
    from fairseq_distattn.functional import fire_attention

    q, k, _ = _inputs()
    generator = torch.Generator().manual_seed(8)
    arguments = (
        torch.tensor(0.7, dtype=torch.float64),
        torch.tensor(3.0, dtype=torch.float64),
        torch.randn(16, generator=generator, dtype=torch.float64),
        torch.randn(16, generator=generator, dtype=torch.float64),
        torch.randn(4, 16, generator=generator, dtype=torch.float64),
        torch.randn(4, generator=generator, dtype=torch.float64),
    )
    p = sample_positions(q.size(2), 30, generator=torch.Generator().manual_seed(9))
    mapped = _bias(fire_attention, q, k, arguments, p)
    long = torch.zeros(*q.shape[:2], int(p[-1]) + 1, q.size(-1), dtype=q.dtype)
    ordinary = _bias(fire_attention, long, long, arguments, None)
    assert_close(mapped, ordinary[:, :, p][:, :, :, p].expand_as(mapped), rtol=1e-12, atol=1e-12)
    assert_close(
        _bias(fire_attention, q, k, arguments, torch.arange(q.size(2))), _bias(fire_attention, q, k, arguments, None)
    )


def test_an_op_that_reads_no_positions_refuses_a_map():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="softmax_attention reads no positions"):
        softmax_attention(q, k, v, position_map=torch.arange(6))


def test_sinusoidal_embeddings_embed_the_sampled_positions_in_training_only():
    pad = 1
    embed = RandomizedSinusoidalPositionalEmbedding(8, pad, N).double()
    tokens = torch.tensor([[5, 6, 7, pad], [5, 6, 7, 8]])
    torch.manual_seed(5)
    embed.train()
    got = embed(tokens)
    torch.manual_seed(5)
    drawn = sample_positions(4, N)
    table = embed.weights
    assert torch.equal(got[1], table[pad + 1 + drawn])
    assert torch.equal(got[0, :3], table[pad + 1 + drawn[:3]]) and torch.equal(got[0, 3], table[pad])
    embed.eval()
    assert torch.equal(embed(tokens)[1], table[pad + 1 + torch.arange(4)])


# --------------------------------------------------------------------------- (c) the models

# rpr's default k = 16 clips nearly every distance of [1, N) alike, so two draws would give one model:
# a k within N lets the draws differ
CASE_OPTIONS = {"rpr": ["--max-relative-position", "1024"]}
# every mechanism that takes the flag (the registry's), and fairseq's sinusoidal embeddings
LM_CASES = {
    **{
        name: ["--decoder-self-attention", name, "--no-token-positional-embeddings", *CASE_OPTIONS.get(name, [])]
        for name in randomized_mechanisms()
    },
    "sinusoidal": [],
}


def _pair(build, extra):
    """The model with the flag and the same weights without it."""
    flagged, d = build([*extra, "--randomized-positions", str(N)])
    plain, _ = build(list(extra))
    plain.load_state_dict(flagged.state_dict())
    return flagged, plain, d


def _lm(extra):
    return language_model(extra=[*TINY_LM, *extra])


def _tokens(d):
    sentences = [random_tokens(d, 1, length, seed=length)[0] for length in (7, 5)]
    return right_pad(sentences, d.pad())


@pytest.mark.parametrize("case", sorted(LM_CASES))
def test_language_model_trains_on_draws_and_evaluates_as_the_ordinary_model(case):
    flagged, plain, d = _pair(_lm, LM_CASES[case])
    tokens = _tokens(d)
    with torch.no_grad():
        evaluated = flagged(tokens)[0]
        if case == "xpos":  # its scales are centred on the middle of [0, N): the same logits up to rounding
            assert_close(evaluated, plain(tokens)[0], rtol=1e-10, atol=1e-10)
        else:
            assert torch.equal(evaluated, plain(tokens)[0])
        flagged.train()
        outputs = []
        for seed in (1, 2, 1):
            torch.manual_seed(seed)
            outputs.append(flagged(tokens)[0])
        plain.train()
        ordinary = plain(tokens)[0]
    assert not torch.allclose(outputs[0], outputs[1])  # two seeds, two draws
    assert torch.equal(outputs[0], outputs[2])  # one seed, one draw
    assert not torch.allclose(outputs[0], ordinary)
    flagged.eval()
    tokens = tokens[:1]  # unpadded: fairseq's own decoding of a right-padded LM batch differs from its forward
    with torch.no_grad():
        full = flagged(tokens)[0]
        state = {}
        steps = [flagged.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    # fairseq's own attention (the vanilla layers) takes another path in decoding: float64 round-off
    assert_close(torch.stack(steps, dim=1), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(LM_CASES))
def test_at_evaluation_the_authors_draws_score_whole_sequences_and_decoding_is_refused(case):
    """--randomized-positions-at-evaluation: an evaluation forward draws as a training one does (the
    tiny models have no dropout: one seed, one output in both modes), as Ruoss et al.'s code draws in
    every call; a decoding step cannot draw, and says so."""
    flagged, _ = _lm([*LM_CASES[case], "--randomized-positions", str(N), "--randomized-positions-at-evaluation"])
    tokens = _tokens(flagged.decoder.dictionary)
    outputs = {}
    with torch.no_grad():
        for mode, seed in (("train", 1), ("eval", 1), ("eval", 2)):
            flagged.train(mode == "train")
            torch.manual_seed(seed)
            outputs[mode, seed] = flagged(tokens)[0]
        assert torch.equal(outputs["eval", 1], outputs["train", 1])
        assert not torch.allclose(outputs["eval", 1], outputs["eval", 2])
        with pytest.raises(ValueError, match="incremental decoding cannot draw randomized positions"):
            flagged.decoder(tokens[:1, :1], incremental_state={})


def test_at_evaluation_without_n_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as refused:
        parse("language_modeling", "distattn_lm", [*TINY_LM, "--randomized-positions-at-evaluation"])
    assert refused.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "argument --randomized-positions-at-evaluation: invalid value" in lines[0]
    assert "--randomized-positions N, which is 0 (off)" in lines[0]


MT_CASES = {
    "rope": [
        "--encoder-self-attention",
        "rope",
        "--decoder-self-attention",
        "rope",
        "--no-token-positional-embeddings",
    ],
    "alibi": ["--encoder-self-attention", "alibi", "--decoder-self-attention", "alibi"],
    "rpr": ["--encoder-self-attention", "rpr", "--decoder-self-attention", "rpr", *CASE_OPTIONS["rpr"]],
    "sinusoidal": [],
}


@pytest.mark.parametrize("case", sorted(MT_CASES))
def test_translation_model_trains_on_draws_and_evaluates_as_the_ordinary_model(case):
    flagged, plain, d = _pair(lambda extra: translation_model(extra=[*TINY, *extra]), MT_CASES[case])
    source, target = _tokens(d), random_tokens(d, 2, 6, seed=9)  # unpadded targets: decoding has none
    lengths = source.ne(d.pad()).sum(-1)
    with torch.no_grad():
        assert torch.equal(flagged(source, lengths, target)[0], plain(source, lengths, target)[0])
        flagged.train()
        torch.manual_seed(1)
        first = flagged(source, lengths, target)[0]
        torch.manual_seed(2)
        second = flagged(source, lengths, target)[0]
    assert not torch.allclose(first, second)
    flagged.eval()
    with torch.no_grad():
        encoder_out = flagged.encoder(source, src_lengths=lengths)
        full = flagged.decoder(target, encoder_out=encoder_out)[0]
        state = {}
        steps = [
            flagged.decoder(target[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1]
            for t in range(target.size(1))
        ]
    # fairseq's own attention (the vanilla layers) takes another path in decoding: float64 round-off
    assert_close(torch.stack(steps, dim=1), full, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- (d) refusals

REFUSALS = [
    ("lm", ["--randomized-positions", "-1"], "must be a non-negative integer"),
    ("lm", ["--randomized-positions", "100"], "smaller than the longest sequence the model accepts"),
    ("lm", ["--no-token-positional-embeddings", "--randomized-positions", str(N)], "no layer's mechanism reads"),
    ("lm", ["--decoder-learned-pos", "--randomized-positions", str(N)], "--decoder-learned-pos"),
    ("mt", ["--max-source-positions", "4096", "--randomized-positions", str(N)], "--max-source-positions"),
]


@pytest.mark.parametrize("model,arguments,message", REFUSALS, ids=[" ".join(c[1][-3:]) for c in REFUSALS])
def test_refusals_are_one_line_spec_errors(model, arguments, message, capsys):
    """fairseq's parser runs the plugin's checks (tests/test_bad_inputs.py runs fairseq-train itself)."""
    with pytest.raises(SystemExit) as refused:
        if model == "lm":
            parse("language_modeling", "distattn_lm", [*TINY_LM, *arguments])
        else:
            parse("translation", "distattn_transformer", [*TINY, *arguments])
    assert refused.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "argument --randomized-positions: invalid value" in lines[0]
    assert re.search(message, lines[0]), lines[0]


def test_xpos_takes_randomized_positions_centred_on_their_range_and_checked_over_it(capsys):
    """xPos turns its training calls by the draw, its scales centred on the middle of [0, N)
    (the positions its layers turn by, not only the model's); a scale base whose factors leave
    float32 over N positions is refused in one line naming N's flag, though it would do over the
    model's own positions; and the op checks a map's positions, not the call's length."""
    from fairseq_distattn.functional import rotary_query_key
    from fairseq_distattn.modules.multihead_attention import MechanismMultiheadAttention

    model, _ = _lm([*LM_CASES["xpos"], "--randomized-positions", str(N)])
    layers = [m for m in model.modules() if isinstance(m, MechanismMultiheadAttention)]
    assert layers and all(layer.mechanism.arguments["xpos_centre"] == (N - 1) / 2 for layer in layers)
    plain, _ = _lm(LM_CASES["xpos"])
    centre = next(m for m in plain.modules() if isinstance(m, MechanismMultiheadAttention)).mechanism.arguments
    assert centre["xpos_centre"] == (1024 - 1) / 2  # the tiny model's positions

    parse("language_modeling", "distattn_lm", [*TINY_LM, "--decoder-self-attention", "xpos", "--xpos-scale-base", "20"])
    with pytest.raises(SystemExit):
        parse(
            "language_modeling",
            "distattn_lm",
            [*TINY_LM, "--decoder-self-attention", "xpos", "--xpos-scale-base", "20", "--randomized-positions", str(N)],
        )
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "--xpos-scale-base" in lines[0] and f"--randomized-positions {N}" in lines[0], lines

    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    far = torch.tensor([0, 1, 2, N - 1])
    rotary_query_key(q, q, xpos_scale_base=512.0, xpos_centre=(N - 1) / 2, position_map=far)
    with pytest.raises(ValueError, match="xpos_scale_base"):
        rotary_query_key(q, q, xpos_scale_base=20.0, xpos_centre=0.0, position_map=far)
    rotary_query_key(q, q, xpos_scale_base=20.0, xpos_centre=0.0)  # 4 positions: within range
    empty = q[:, :, :0]
    assert rotary_query_key(empty, empty, xpos_scale_base=20.0, position_map=far[:0])[0].shape == empty.shape
