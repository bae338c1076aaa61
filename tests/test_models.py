"""Model-level guarantees: incremental (beam) decoding equals the full forward
pass, padding never changes a sentence's output (and a mask without padding
changes nothing), a vanilla SPEC is exactly fairseq's transformer, and a model
build reads each stack's SPEC and the options once.

The decoding and padding guarantees run on every device this machine has
(CUDA is skipped without one), and a CUDA model must compute what the float64
CPU model computes, outputs and gradients."""

import collections
import copy
import sys

import pytest
import torch

from fairseq_distattn.modules.multihead_attention import MechanismMultiheadAttention
from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF
from fairseq_distattn.registry import REGISTRY as MECHANISM_REGISTRY
from fairseq_distattn.spec import MECHANISMS, AttentionOptions, parse_spec

from .model_helpers import (
    TINY,
    TINY_LM,
    dictionary,
    everywhere,
    language_model,
    left_pad,
    parse,
    random_tokens,
    right_pad,
    translation_model,
)

# fairseq's own (vanilla) layers take their softmax in float32 even in a float64
# model, and its full and incremental paths differ (fast path vs. manual), so
# exact agreement is only possible to ~1e-7; a position or cache bug is >1e-3.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)

CASES = [
    (kind, mechanism)
    for kind in (ENCODER_SELF, DECODER_SELF, CROSS)
    for mechanism in MECHANISMS
    if mechanism in kind.allowed and mechanism != "vanilla"
]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def spec_flags(kind, mechanism):
    # mechanism on layer 0 only, layer 1 stays vanilla: checks per-layer wiring too
    return [*TINY, kind.flag, f"{mechanism}@0"]


def full_decoder_output(model, src_tokens, src_lengths, prev_output_tokens):
    return model(src_tokens, src_lengths, prev_output_tokens)[0]


def source_batch(d, rows=4, seed=0):
    lengths = [7, 5, 7, 3][:rows]
    sentences = [random_tokens(d, 1, n, seed + i)[0] for i, n in enumerate(lengths)]
    return left_pad(sentences, d.pad()), torch.tensor(lengths)


def beam_decoded(model, d, device, steps, seed, orders):
    """``(incremental, full)``: the decoder's outputs over ``steps`` target positions of two
    sentences x two hypotheses (rows 2k and 2k+1 share a source), decoded one step at a
    time with fairseq's reorder before the steps ``orders`` names (step -> new hypothesis
    order), and the full forward pass over the targets as reordered."""
    model.decoder.set_beam_size(2)  # what fairseq's SequenceGenerator does before decoding
    src_tokens, src_lengths = source_batch(d, rows=2)
    src_tokens, src_lengths = src_tokens.repeat_interleave(2, 0).to(device), src_lengths.repeat_interleave(2).to(device)
    targets = random_tokens(d, 4, steps, seed=seed).to(device)
    targets[:, 0] = d.eos()
    encoder_out = model.encoder(src_tokens, src_lengths)
    incremental_state, incremental = {}, []
    for step in range(steps):
        if step in orders:
            order = torch.tensor(orders[step], device=device)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            model.decoder.reorder_incremental_state_scripting(incremental_state, order)
            incremental = [out[order] for out in incremental]
            targets = torch.cat([targets[order, :step], targets[:, step:]], dim=1)
        out = model.decoder(targets[:, : step + 1], encoder_out=encoder_out, incremental_state=incremental_state)[0]
        incremental.append(out[:, -1])
    return torch.stack(incremental, dim=1), full_decoder_output(model, src_tokens, src_lengths, targets)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,mechanism", CASES, ids=[f"{k.flag[2:]}:{m}" for k, m in CASES])
def test_incremental_beam_decoding_matches_full_forward(kind, mechanism, device):
    model, d = translation_model(extra=spec_flags(kind, mechanism))
    # at step 3, hypothesis 0 continues hypothesis 1, etc.
    incremental, full = beam_decoded(model.to(device), d, device, steps=6, seed=7, orders={3: [1, 1, 3, 2]})
    torch.testing.assert_close(incremental, full, **TOLERANCE)


DECODER_MECHANISMS = sorted(DECODER_SELF.allowed - {"vanilla"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mechanism", DECODER_MECHANISMS)
def test_beam_decoding_without_grad_appends_into_the_reorders_room(mechanism, device, monkeypatch):
    """As fairseq-generate decodes (no autograd, a reorder before every step): each step's
    keys go into the room its reorder left (modules/decoding_cache.py), and the steps
    still equal the full forward pass."""
    from fairseq_distattn.modules import decoding_cache, multihead_attention

    into_room = []

    def spied(cached, new):
        into_room.append(getattr(cached, decoding_cache.ROOM, 0) >= new.size(2))
        return decoding_cache.appended(cached, new)

    monkeypatch.setattr(multihead_attention, "appended", spied)
    model, d = translation_model(extra=spec_flags(DECODER_SELF, mechanism))
    orders = {1: [1, 0, 2, 3], 2: [1, 1, 3, 2], 3: [0, 0, 2, 2], 4: [1, 0, 3, 3]}
    with torch.no_grad():
        incremental, full = beam_decoded(model.to(device).eval(), d, device, steps=5, seed=11, orders=orders)
    torch.testing.assert_close(incremental, full, **TOLERANCE)
    assert into_room and all(into_room)  # every append after the first step, of every cached tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,mechanism", CASES, ids=[f"{k.flag[2:]}:{m}" for k, m in CASES])
def test_sentence_output_is_independent_of_batch_padding(kind, mechanism, device):
    model, d = translation_model(extra=spec_flags(kind, mechanism))
    model = model.to(device)
    src_tokens, src_lengths = (t.to(device) for t in source_batch(d))
    targets = [random_tokens(d, 1, n, seed=20 + i)[0].to(device) for i, n in enumerate([6, 4, 2, 5])]
    prev_output_tokens = right_pad(targets, d.pad())
    batch_encoder = model.encoder(src_tokens, src_lengths)["encoder_out"][0]
    batch_decoder = full_decoder_output(model, src_tokens, src_lengths, prev_output_tokens)
    for row in range(len(targets)):
        real_source = src_tokens[row, src_tokens.size(1) - src_lengths[row] :][None]
        alone_encoder = model.encoder(real_source, src_lengths[row : row + 1])["encoder_out"][0]
        torch.testing.assert_close(batch_encoder[-src_lengths[row] :, row], alone_encoder[:, 0], **TOLERANCE)
        alone_decoder = full_decoder_output(model, real_source, src_lengths[row : row + 1], targets[row][None])
        torch.testing.assert_close(batch_decoder[row, : len(targets[row])], alone_decoder[0], **TOLERANCE)


LM_MECHANISMS = sorted(DECODER_SELF.allowed - {"vanilla"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mechanism", LM_MECHANISMS)
def test_language_model_incremental_matches_full(mechanism, device):
    model, d = language_model(extra=[*TINY_LM, "--decoder-self-attention", f"{mechanism}@1"])
    model = model.to(device)
    tokens = random_tokens(d, 3, 6, seed=3).to(device)
    full = model(tokens)[0]
    incremental_state = {}
    steps = [
        model.decoder(tokens[:, : t + 1], incremental_state=incremental_state)[0][:, -1] for t in range(tokens.size(1))
    ]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, **TOLERANCE)


@pytest.mark.parametrize("mechanism", sorted(set(MECHANISMS) - {"vanilla"}))
def test_a_validation_after_a_fairseq_optimizer_step_computes_with_the_stepped_parameters(mechanism):
    """fairseq's trainer validates with model.eval() and no gradients, then trains with
    model.train() and its own Adam, which writes every parameter through ``p.data`` (no
    version counter moves): the next validation must compute what a fresh copy of the
    stepped model computes, not read anything kept from the parameters before the step."""
    from fairseq.optim.adam import Adam

    model, d = translation_model(extra=[*TINY, *everywhere(mechanism)])
    src_tokens, src_lengths = source_batch(d)
    targets = [random_tokens(d, 1, n, seed=30 + i)[0] for i, n in enumerate([6, 4, 2, 5])]
    prev_output_tokens = right_pad(targets, d.pad())

    def validate(trained):
        trained.eval()
        with torch.no_grad():
            return full_decoder_output(trained, src_tokens, src_lengths, prev_output_tokens)

    before = validate(model)
    model.train()
    full_decoder_output(model, src_tokens, src_lengths, prev_output_tokens).square().sum().backward()
    Adam(model.parameters(), lr=0.05).step()
    after = validate(model)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, validate(copy.deepcopy(model)), rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("kind,mechanism", CASES, ids=[f"{k.flag[2:]}:{m}" for k, m in CASES])
def test_a_float32_cuda_model_computes_what_the_float64_cpu_model_computes(kind, mechanism):
    """Outputs and every parameter's gradient, with TF32 off (it rounds
    matmul inputs to 10 bits): a tensor built on the wrong device, or a
    kernel that differs from its CPU twin, shows here."""
    model, d = translation_model(extra=spec_flags(kind, mechanism))
    src_tokens, src_lengths = source_batch(d)
    targets = right_pad([random_tokens(d, 1, n, seed=40 + i)[0] for i, n in enumerate([6, 4, 2, 5])], d.pad())

    def output_and_gradients(m, device):
        m.zero_grad()
        out = m(src_tokens.to(device), src_lengths.to(device), targets.to(device))[0]
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        (out.double() * weights.to(device)).sum().backward()
        return out.double().cpu(), {n: p.grad.double().cpu() for n, p in m.named_parameters() if p.grad is not None}

    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        expected, expected_grads = output_and_gradients(model, "cpu")
        got, got_grads = output_and_gradients(copy.deepcopy(model).float().cuda(), "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_vanilla_spec_is_fairseq_transformer():
    ours, d = translation_model(
        extra=[*TINY, "--encoder-self-attention", "vanilla", "--cross-attention", "vanilla@0-1"], perturb=False
    )
    reference, _ = translation_model(
        arch="transformer", extra=TINY[:-8] + ["--dropout", "0", "--attention-dropout", "0"], perturb=False
    )
    assert list(ours.state_dict()) == list(reference.state_dict())
    reference.load_state_dict(ours.state_dict())
    src_tokens, src_lengths = source_batch(d)
    targets = right_pad([random_tokens(d, 1, n, seed=30 + i)[0] for i, n in enumerate([6, 4, 2, 5])], d.pad())
    torch.testing.assert_close(
        ours(src_tokens, src_lengths, targets)[0], reference(src_tokens, src_lengths, targets)[0], rtol=0, atol=0
    )


@pytest.mark.parametrize(
    "ours_arch, fairseq_arch", [("distattn_lm", "transformer_lm"), ("distattn_lm_gbw", "transformer_lm_gbw")]
)
def test_vanilla_language_model_is_fairseqs(ours_arch, fairseq_arch):
    """``--arch distattn_lm`` takes ``--arch transformer_lm``'s defaults: post-norm, and token embeddings
    512 wide (projected to --decoder-embed-dim) unless --decoder-input-dim says otherwise, quirks included,
    as the gbw presets take transformer_lm_gbw's (pre-norm, widths following --decoder-embed-dim)."""

    def without(*names):
        pairs = zip(TINY_LM[::2], TINY_LM[1::2])
        return [item for flag, value in pairs if flag not in names for item in (flag, value)]

    # both without the embedding widths, whose defaults differ; fairseq's without the plugin's own flag
    ours_flags = without("--decoder-input-dim", "--decoder-output-dim")
    fairseq_flags = without("--decoder-input-dim", "--decoder-output-dim", "--max-relative-position")
    ours, d = language_model(arch=ours_arch, extra=ours_flags)
    reference, _ = language_model(arch=fairseq_arch, extra=fairseq_flags)
    shapes = {name: tuple(tensor.shape) for name, tensor in ours.state_dict().items()}
    assert shapes == {name: tuple(tensor.shape) for name, tensor in reference.state_dict().items()}
    reference.load_state_dict(ours.state_dict())
    tokens = random_tokens(d, 3, 7, seed=5)
    torch.testing.assert_close(ours(tokens)[0], reference(tokens)[0], rtol=0, atol=0)
    # the two configurations really differ, so the comparison above would catch a swap
    post_norm = ours_arch == "distattn_lm"
    assert (ours.decoder.project_in_dim is not None) == post_norm
    assert ours.decoder.layers[0].normalize_before != post_norm


def test_distattn_lm_keeps_what_its_flags_or_an_older_checkpoint_say():
    """transformer_lm's defaults fill only what is unset: --decoder-normalize-before (or the
    pre-norm args saved in a checkpoint trained before distattn_lm took them) still builds pre-norm."""
    model, _ = language_model(extra=[*TINY_LM, "--decoder-normalize-before"])
    assert model.decoder.layers[0].normalize_before and model.decoder.layer_norm is not None
    assert model.decoder.embed_tokens.weight.shape[1] == 16


def test_mechanisms_land_on_the_named_layers_only():
    model, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "rpr@1", "--cross-attention", "window-aw-seg@0"]
    )
    encoder_kinds = [type(layer.self_attn).__name__ for layer in model.encoder.layers]
    cross_kinds = [type(layer.encoder_attn).__name__ for layer in model.decoder.layers]
    assert encoder_kinds == ["MultiheadAttention", "MechanismMultiheadAttention"]
    assert cross_kinds == ["MechanismMultiheadAttention", "MultiheadAttention"]
    assert model.decoder.layers[0].encoder_attn.mechanism.segment_size == 2


@pytest.mark.parametrize("mechanism", sorted(MECHANISM_REGISTRY))
def test_a_carried_all_false_padding_mask_reaches_the_mechanism_as_none(mechanism, monkeypatch):
    """Once a decoding step passed a key padding mask, fairseq extends it at
    every later step, also when no row has padding (left). The module hands
    the mechanism None then (its position encoding too), and caches none, so
    that later steps carry no mask to extend, reorder and read positions through;
    none of it may change a single value. A mask with padding still arrives, is
    still cached and still masks."""
    module = MechanismMultiheadAttention(8, 2, mechanism, AttentionOptions(), causal=True, self_attention=True)
    module = module.double().eval()
    received = []
    real_forward = module.mechanism.forward
    monkeypatch.setattr(
        module.mechanism,
        "forward",
        lambda q, k, options, cache: received.append(options.key_padding_mask) or real_forward(q, k, options, cache),
    )
    encoded, cached = [], []
    real_encode = module.mechanism.encode_positions

    def encode_positions(queries, keys, key_padding_mask, *args, **kwargs):
        encoded.append(key_padding_mask)
        return real_encode(queries, keys, key_padding_mask, *args, **kwargs)

    monkeypatch.setattr(module.mechanism, "encode_positions", encode_positions)
    steps = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def decode(first_step_padding):
        received.clear(), encoded.clear(), cached.clear()
        state, outputs = {}, []
        with torch.no_grad():
            for t in range(len(steps)):
                padding = first_step_padding if t == 0 else None
                step = module(steps[t : t + 1], None, None, incremental_state=state, key_padding_mask=padding)
                outputs.append(step[0])
                cached.append(module._get_input_buffer(state)["prev_key_padding_mask"])
        return torch.cat(outputs), list(received)

    unmasked, _ = decode(None)
    masked_nothing, received_nothing = decode(torch.zeros(3, 1, dtype=torch.bool))
    assert received_nothing == [None] * len(steps)
    assert encoded == [None] * len(steps) and cached == [None] * len(steps)
    torch.testing.assert_close(masked_nothing, unmasked, rtol=0, atol=0)
    masked, received_masks = decode(torch.tensor([[False], [True], [False]]))
    for masks in (received_masks, encoded, cached):
        assert all(pad is not None and pad[1, 0] and pad.sum() == 1 for pad in masks)
    assert not torch.allclose(masked, unmasked), "the padded key was not masked"


@pytest.fixture
def readings(monkeypatch):
    """How often each SPEC flag is parsed (``spec.parse_spec``, wherever the package calls it)
    and the options are read from the flags (``AttentionOptions.from_args``)."""
    counts = collections.Counter()

    def counting_parse(kind, spec, num_layers):
        counts[kind.flag] += 1
        return parse_spec(kind, spec, num_layers)

    for name, module in list(sys.modules.items()):
        if name.startswith("fairseq_distattn") and getattr(module, "parse_spec", None) is parse_spec:
            monkeypatch.setattr(module, "parse_spec", counting_parse)
    read_options = AttentionOptions.from_args.__func__

    def counting_read(cls, *args, **kwargs):
        counts["options"] += 1
        return read_options(cls, *args, **kwargs)

    monkeypatch.setattr(AttentionOptions, "from_args", classmethod(counting_read))
    return counts


def test_a_translation_model_build_reads_each_spec_and_the_options_once(readings):
    from fairseq.tasks.translation import TranslationTask

    specs = [ENCODER_SELF.flag, "rpr", DECODER_SELF.flag, "alibi@1", CROSS.flag, "window-aw@0"]
    args = parse("translation", "distattn_transformer", [*TINY, *specs])  # fairseq-train's flag check reads them too
    readings.clear()
    d = dictionary()
    model = TranslationTask(args, d, d).build_model(args)
    assert readings == {ENCODER_SELF.flag: 1, DECODER_SELF.flag: 1, CROSS.flag: 1, "options": 1}
    assert [plan.self_attention for plan in model.encoder.layer_plans] == ["rpr", "rpr"]
    assert [(plan.self_attention, plan.cross_attention) for plan in model.decoder.layer_plans] == [
        ("vanilla", "window-aw"),
        ("alibi", "vanilla"),
    ]
    assert model.encoder.layer_plans[0].options is model.decoder.layer_plans[0].options
    assert args.distattn_revisions == "alibi:1,rpr:1,window-aw:1"


def test_a_language_model_build_reads_its_spec_and_the_options_once(readings):
    from fairseq.tasks.language_modeling import LanguageModelingTask

    args = parse("language_modeling", "distattn_lm", [*TINY_LM, "--decoder-self-attention", "rope@0,alibi@1"])
    readings.clear()
    model = LanguageModelingTask(args, dictionary()).build_model(args)
    # the decoder's plans say its cross-attention is vanilla, read from no SPEC (the LM has none)
    assert readings == {DECODER_SELF.flag: 1, CROSS.flag: 1, "options": 1}
    assert [plan.self_attention for plan in model.decoder.layer_plans] == ["rope", "alibi"]


def test_a_model_and_its_options_survive_copy_and_pickle():
    """The window diagnostics deep-copy a model, fairseq's checkpoints pickle what they hold: the
    immutable options must rebuild through their constructor."""
    import pickle

    from fairseq_distattn.mechanisms.kerple import KerpleOptions

    options = AttentionOptions(KerpleOptions(kerple_kernel="log"))
    for rebuilt in (copy.copy(options), copy.deepcopy(options), pickle.loads(pickle.dumps(options))):
        assert rebuilt == options and rebuilt.of(KerpleOptions).kerple_kernel == "log"
    model, d = translation_model(extra=["--encoder-self-attention", "kerple", "--decoder-self-attention", "rpr"])
    twin = copy.deepcopy(model)
    assert twin.encoder.layer_plans[0].options == model.encoder.layer_plans[0].options
    tokens = random_tokens(d, 2, 5, seed=0)
    lengths = torch.full((2,), 5)
    with torch.no_grad():
        torch.testing.assert_close(twin(tokens, lengths, tokens)[0], model(tokens, lengths, tokens)[0])


def test_a_pruned_language_model_builds_each_kept_layer_as_its_trained_layer():
    """fairseq's LM build keeps ``decoder_layers_to_keep`` of ``--decoder-layers`` (LayerDrop's
    pruning, a ``--model-overrides`` of a trained model): the SPEC describes the trained layers,
    and each kept layer is built as the trained layer whose parameters it loads. fairseq-train
    refuses the pruning itself (tests/test_fairseq_features.py has the rest)."""
    from fairseq.tasks.language_modeling import LanguageModelingTask

    trained = [*TINY_LM, "--decoder-layers", "4", "--decoder-self-attention", "rope@0,alibi@2"]
    args = parse("language_modeling", "distattn_lm", trained)
    args.decoder_layers_to_keep = "0,2"
    model = LanguageModelingTask(args, dictionary()).build_model(args)
    assert [plan.self_attention for plan in model.decoder.layer_plans] == ["rope", "alibi"]
    assert len(model.decoder.layers) == 2
    with pytest.raises(SystemExit):
        parse("language_modeling", "distattn_lm", [*trained, "--decoder-layers-to-keep", "0,2"])
