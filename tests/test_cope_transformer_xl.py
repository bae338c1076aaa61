"""CoPE (Golovneva et al. 2024) and Transformer-XL's relative attention (Dai
et al. 2019) against float64 references written from the papers' equations in
plain Python floats, beyond the registry-parametrised tests that pick them up
with no edit: the contextual positions (gates summed from the key to the
query, clamped, interpolated), the four terms of sec. 3.3 with sinusoids of
the signed distance, the sharing of u and v, the inspection hook that plots
CoPE's positions for one sentence, and the LM presets."""

import math

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.mechanisms import build_mechanism
from fairseq_distattn.mechanisms.cope import CopeOptions
from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF
from fairseq_distattn.spec import AttentionOptions
from fairseq_distattn.tools import inspection as tool

from .functional_cases import make_padding_mask, naive_attention
from .model_helpers import TINY_LM, language_model, random_tokens, translation_model
from .test_extrapolation_biases import SELF_CASES, TIGHT, draw_qkv, reference

# ----------------------------------------------------------------------------- CoPE


def paper_cope_logit(q, k, table, padding, causal, b, h, i, position, j):
    """Eq. 3-6 as the authors' code computes them: gates sigmoid(q.k / sqrt(d)) on the visible
    keys, p_ij = sum_{t=j}^{i} g_it clamped to npos - 1, e[p] interpolated between the integer
    positions, logit (q.k + q.e[p]) / sqrt(d)."""
    dim, npos = q.shape[-1], table.shape[1]

    def visible(t):
        return not (padding is not None and padding[b, t]) and not (causal and t > position)

    def score(t):
        return float(q[b, h, i] @ k[b, h, t]) / math.sqrt(dim)

    p = sum(1 / (1 + math.exp(-score(t))) for t in range(j, k.shape[2]) if visible(t))
    p = min(p, npos - 1)
    low, high = math.floor(p), math.ceil(p)
    embedding = (p - low) * table[:, high] + (1 - p + low) * table[:, low]
    return (float(q[b, h, i] @ k[b, h, j]) + float(q[b, h, i] @ embedding)) / math.sqrt(dim)


@pytest.mark.parametrize("npos", [3, 16])  # 3: positions beyond 2 are clamped
@pytest.mark.parametrize("case", [case for case in SELF_CASES if case.causal], ids=str)
def test_cope_is_the_papers_attention_with_contextual_positions(npos, case):
    q, k, v = draw_qkv(case)
    g = torch.Generator().manual_seed(11)
    table = torch.randn(case.dim, npos, generator=g, dtype=torch.float64)
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = functional.cope_attention(
        q, k, v, table, key_padding_mask=padding, causal=True, query_offset=case.query_offset
    )
    qn, kn, vn, pad = q.numpy(), k.numpy(), v.numpy(), None if padding is None else padding.numpy()
    tn = table.numpy()
    want_out, want_probs = naive_attention(
        qn,
        kn,
        pad,
        True,
        case.query_offset,
        logit=lambda b, h, i, position, j: paper_cope_logit(qn, kn, tn, pad, True, b, h, i, position, j),
        value=lambda b, h, position, j: vn[b, h, j],
    )
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(probs, want_probs, **TIGHT)


def test_cope_positions_count_tokens_when_every_gate_is_open():
    """With gates of 1 (large scores) p_ij is the number of tokens from j to i: the
    token positions counted backwards, clamped to npos - 1."""
    q = torch.full((1, 1, 6, 2), 10.0, dtype=torch.float64)
    positions = functional.cope_positions(q, q, 4, causal=True)[0, 0]
    for i in range(6):
        for j in range(6):
            want = min(i - j + 1, 3) if j <= i else 0.0
            assert positions[i, j].item() == pytest.approx(want, abs=1e-6)


def test_cope_with_a_zero_table_is_attention_without_positions():
    case = SELF_CASES[4]  # causal
    q, k, v = draw_qkv(case)
    cope = functional.cope_attention(q, k, v, torch.zeros(case.dim, 8, dtype=torch.float64), causal=True)
    plain = functional.softmax_attention(q, k, v, causal=True)
    torch.testing.assert_close(cope[0], plain[0], rtol=0, atol=1e-14)


def test_cope_gradients_reach_the_table_and_through_the_gates():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda *x: functional.cope_attention(*x, causal=True)[0], (q, k, v, table), eps=1e-6, atol=1e-6
    )


def test_cope_is_decoder_only_and_starts_from_a_zero_table():
    assert "cope" in DECODER_SELF.allowed and "cope" not in ENCODER_SELF.allowed and "cope" not in CROSS.allowed
    assert "causal sum" in ENCODER_SELF.disallowed_reason("cope")
    table = build_mechanism("cope", 4, 8, AttentionOptions(CopeOptions(cope_max_positions=7))).position_embeddings
    assert table.shape == (8, 7) and not table.any()


def test_cope_positions_of_one_sentence_are_recorded_and_plotted(tmp_path):
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "cope"])
    model.eval()
    tokens = random_tokens(d, 1, 6, seed=2)
    with tool.AttentionRecorder(model) as recorder, torch.no_grad():
        model(tokens)
        records = recorder.take()
    terms = [record.sentence_term for record in records]
    assert all(term is not None and term.name == "cope-positions" for term in terms)
    positions = terms[0].values  # [H, T, T]
    assert positions.shape[-2:] == (6, 6) and not positions.triu(1).any()
    diagonal = positions.diagonal(dim1=-2, dim2=-1)
    assert ((diagonal > 0) & (diagonal < 1)).all()  # p_ii = g_ii
    assert (positions[..., :, :-1] >= positions[..., :, 1:]).all()  # counts grow towards earlier keys
    kind = records[0].site.kind
    labels = [str(t) for t in tokens[0].tolist()]
    written = []
    tool.plot_sentence(records, {kind: tool.Axes(labels, labels, ("query", "key"))}, tmp_path, written)
    assert any(path.name.startswith("cope-positions-") for path in written)


def test_cope_lm_decodes_as_it_scores():
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", "cope", "--cope-max-positions", "4"])
    for parameter in model.parameters():  # a trained table, not zeros
        torch.nn.init.normal_(parameter, std=0.3)
    tokens = random_tokens(d, 2, 9, seed=4)
    full = model(tokens)[0]
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- Transformer-XL


def paper_sinusoid(distance, width):
    """R_x: [sin(x f_0), ..., sin(x f_{w/2-1}), cos(x f_0), ...], f_i = 10000^(-2i/w)."""
    angles = [distance / 10000 ** (2 * i / width) for i in range(width // 2)]
    return [math.sin(a) for a in angles] + [math.cos(a) for a in angles]


class PaperTransformerXL:
    """Sec. 3.3: A_ij = q_i k_j + q_i W_R R_{i-j} + u k_j + v W_R R_{i-j}, all over sqrt(d)."""

    def __init__(self, heads, dim, width, seed):
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(heads * dim, width, generator=g, dtype=torch.float64) * 0.5
        self.u = torch.randn(heads, dim, generator=g, dtype=torch.float64)
        self.v = torch.randn(heads, dim, generator=g, dtype=torch.float64)
        self.heads, self.dim, self.width = heads, dim, width

    def tensors(self):
        return self.weight, self.u, self.v

    def bias(self, q, k, b, h, i, position, j):
        relative = self.weight.numpy() @ paper_sinusoid(position - j, self.width)
        r = relative[h * self.dim : (h + 1) * self.dim]
        qi, kj = q[b, h, i].numpy(), k[b, h, j].numpy()
        terms = qi @ r + self.u[h].numpy() @ kj + self.v[h].numpy() @ r  # (b) + (c) + (d)
        return float(terms) / math.sqrt(self.dim)


@pytest.mark.parametrize("case", SELF_CASES, ids=str)
def test_transformer_xl_is_the_papers_four_terms(case):
    q, k, v = draw_qkv(case)
    xl = PaperTransformerXL(case.heads, case.dim, 6, seed=5)
    padding = make_padding_mask(case.padding, case.batch, case.src_len)
    out, probs = functional.transformer_xl_attention(
        q, k, v, *xl.tensors(), key_padding_mask=padding, causal=case.causal, query_offset=case.query_offset
    )
    want_out, want_probs = reference(
        q,
        k,
        v,
        padding,
        case.causal,
        case.query_offset,
        lambda b, h, position, j: xl.bias(q, k, b, h, position - case.query_offset, position, j),
    )
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(probs, want_probs, **TIGHT)


def test_transformer_xl_sinusoids_are_the_authors_layout():
    distances = torch.tensor([0.0, 3.0, -2.0], dtype=torch.float64)
    got = functional.relative_sinusoids(distances, 8)
    for row, distance in enumerate(distances.tolist()):
        assert got[row].tolist() == pytest.approx(paper_sinusoid(distance, 8), abs=1e-15)


def test_transformer_xl_gradients_reach_every_parameter():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [t.clone().requires_grad_() for t in PaperTransformerXL(2, 3, 4, seed=7).tensors()]
    mask = torch.tensor([[True, False, False, False], [False] * 4])
    torch.autograd.gradcheck(
        lambda *x: functional.transformer_xl_attention(*x, key_padding_mask=mask)[0],
        (q, k, v, *params),
        eps=1e-6,
        atol=1e-6,
    )


@pytest.mark.parametrize("per_layer", [False, True])
def test_transformer_xl_shares_u_and_v_across_a_stack_unless_per_layer(per_layer):
    extra = ["--encoder-self-attention", "transformer-xl", "--encoder-layers", "2"]
    model, _ = translation_model(extra=extra + (["--transformer-xl-per-layer-biases"] if per_layer else []))
    first, second = (layer.self_attn.mechanism for layer in model.encoder.layers)
    assert (first.content_bias is second.content_bias) is not per_layer
    assert (first.position_bias is second.position_bias) is not per_layer
    assert first.relative_projection is not second.relative_projection
    width = model.encoder.layers[0].self_attn.embed_dim
    assert first.relative_projection.weight.shape == (width, width)


def test_transformer_xl_position_term_is_the_query_free_term_d():
    model, _ = language_model(extra=[*TINY_LM, "--decoder-self-attention", "transformer-xl"])
    mechanism = model.decoder.layers[0].self_attn.mechanism
    term = mechanism.position_term(4, 4, causal=True).values
    heads, dim = mechanism.config.num_heads, mechanism.config.head_dim
    weight = mechanism.relative_projection.weight.detach().double()
    for h in range(heads):
        for i in range(4):
            for j in range(4):
                r = weight.numpy() @ paper_sinusoid(i - j, weight.size(1))
                want = float(mechanism.position_bias[h].detach().double().numpy() @ r[h * dim : (h + 1) * dim])
                assert term[h, i, j].item() == pytest.approx(want / math.sqrt(dim), abs=1e-9)


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("arch,name", [("cope", "cope"), ("transformer_xl", "transformer-xl")])
def test_lm_preset_uses_the_mechanism_in_every_layer_without_positions(arch, name):
    model, _ = language_model(arch=f"distattn_lm_{arch}_gbw", extra=[*TINY_LM])
    assert model.decoder.embed_positions is None
    assert all(layer.self_attn.mechanism.config.name == name for layer in model.decoder.layers)
