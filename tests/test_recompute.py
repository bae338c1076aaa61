"""--attention-recompute-length: from that key length on, a training forward
keeps no [B, H, Tq, Tk] tensor for backward and recomputes the mechanism in
blocks of query rows. Values and gradients must not change, dropout included."""

import copy

import pytest
import torch

from fairseq_distattn.modules import multihead_attention as attention
from fairseq_distattn.registry import CROSS, DECODER_SELF, ENCODER_SELF, registered
from fairseq_distattn.tools.path_profile import recomputed_in_row_blocks

from .model_helpers import TINY, left_pad, random_tokens, right_pad, translation_model

# what the terms say: not qvi (not row-wise in the queries), nor the mechanisms whose fused
# path (a training step needs no weights) keeps only a bias without a batch dimension, or none
RECOMPUTED = sorted(info.name for info in registered() if recomputed_in_row_blocks(info) == "yes")
SOURCE_LENGTHS, TARGET_LENGTHS = [9, 6, 9], [8, 5, 3]


def model_flags(mechanism, recompute_length, dropout=0.0):
    """``mechanism`` in every attention kind that allows it, on both layers."""
    flags = [*TINY, "--attention-recompute-length", str(recompute_length)]
    for kind in (ENCODER_SELF, DECODER_SELF, CROSS):
        if mechanism in kind.allowed:
            flags += [kind.flag, mechanism]
    if dropout:
        flags += ["--attention-dropout", str(dropout)]
    return flags


def batch(d):
    sources = [random_tokens(d, 1, n, seed=i)[0] for i, n in enumerate(SOURCE_LENGTHS)]
    targets = [random_tokens(d, 1, n, seed=10 + i)[0] for i, n in enumerate(TARGET_LENGTHS)]
    return left_pad(sources, d.pad()), torch.tensor(SOURCE_LENGTHS), right_pad(targets, d.pad())


def loss_and_gradients(model, d, seed=0):
    src_tokens, src_lengths, prev_output_tokens = batch(d)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(src_tokens, src_lengths, prev_output_tokens)[0]
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
    loss.backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture
def small_chunks(monkeypatch):
    # blocks of 2 query rows at these sizes, so every layer runs several blocks
    monkeypatch.setattr(attention, "RECOMPUTE_CHUNK_ELEMENTS", 2 * 3 * 2 * 9)


@pytest.fixture
def blocks(monkeypatch):
    """One entry per recomputed block that runs."""
    calls = []
    real_checkpoint = attention.checkpoint
    monkeypatch.setattr(
        attention, "checkpoint", lambda *args, **kwargs: calls.append(1) or real_checkpoint(*args, **kwargs)
    )
    return calls


@pytest.mark.parametrize("mechanism", RECOMPUTED)
def test_recomputed_blocks_give_the_same_values_and_gradients(mechanism, small_chunks, blocks):
    kept, d = translation_model(extra=model_flags(mechanism, 0))
    recomputed, _ = translation_model(extra=model_flags(mechanism, 4))
    recomputed.load_state_dict(kept.state_dict())
    kept_out, kept_grads = loss_and_gradients(kept.train(), d)
    assert blocks == []
    out, grads = loss_and_gradients(recomputed.train(), d)
    assert len(blocks) > 2 * len(SOURCE_LENGTHS), "the query rows were not split into recomputed blocks"
    torch.testing.assert_close(out, kept_out, rtol=1e-9, atol=1e-10)
    assert grads.keys() == kept_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], kept_grads[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("mechanism", ["da", "window-mw"])
def test_recomputation_replays_the_same_attention_dropout(mechanism, small_chunks, monkeypatch):
    """With dropout the blocks draw their own masks; backward must replay
    exactly those masks. Reference: the same blocks without checkpointing."""
    flags = model_flags(mechanism, 4, dropout=0.3)
    recomputed, d = translation_model(extra=flags)
    out, grads = loss_and_gradients(recomputed.train(), d, seed=5)
    monkeypatch.setattr(attention, "checkpoint", lambda fn, *args, use_reentrant: fn(*args))
    plain_out, plain_grads = loss_and_gradients(recomputed, d, seed=5)
    torch.testing.assert_close(out, plain_out, rtol=0, atol=0)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-9, atol=1e-10, msg=name)
    no_dropout_out = recomputed.eval()(*batch(d))[0]
    assert not torch.allclose(out, no_dropout_out), "attention dropout was not applied"


def saved_tensor_sizes(module, query, key):
    """Numbers of elements of the tensors autograd keeps for backward of one
    attention call (a checkpointed block keeps none: it is recomputed)."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(query, key, key, need_weights=False)
    return sizes


@pytest.mark.parametrize("rows", [2, 1])  # one sentence: AW's bias [1, H, Tq, Tk] is as large as the weights
@pytest.mark.parametrize("mechanism", ["rpr", "da", "window-aw", "window-aw-seg", "window-mw"])
def test_no_score_sized_tensor_is_kept_for_backward(mechanism, rows):
    length, embed_dim, heads = 12, 16, 2
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(length, rows, embed_dim, generator=generator, dtype=torch.float64, requires_grad=True)
    scores = rows * heads * length * length  # one [B, H, Tq, Tk] tensor; the largest other tensor is T*B*E
    for recompute_length, keeps_scores in ((0, True), (length, False)):
        model, _ = translation_model(extra=model_flags(mechanism, recompute_length))
        modules = [m for m in model.modules() if isinstance(m, attention.MechanismMultiheadAttention)]
        assert modules
        for module in modules:
            largest = max(saved_tensor_sizes(module.train(), inputs, inputs))
            assert (largest >= scores) == keeps_scores, (module, recompute_length, largest, scores)


def test_generation_and_short_inputs_never_recompute(monkeypatch):
    calls = []
    monkeypatch.setattr(
        attention, "checkpoint", lambda *args, **kwargs: calls.append(1) or (_ for _ in ()).throw(AssertionError)
    )
    model, d = translation_model(extra=model_flags("rpr", max(SOURCE_LENGTHS) + 1))
    loss_and_gradients(model.train(), d)  # every key sequence is shorter than the threshold
    long_model, _ = translation_model(extra=model_flags("rpr", 2))
    with torch.no_grad():
        long_model.train()(*batch(d))
    assert calls == []


def test_recompute_inside_fairseq_checkpoint_activations(small_chunks):
    """fairseq's own --checkpoint-activations reruns whole layers in backward;
    the attention blocks nested in them must still give the same gradients."""
    kept, d = translation_model(extra=model_flags("window-aw", 0))
    nested, _ = translation_model(extra=[*model_flags("window-aw", 4), "--checkpoint-activations"])
    nested.load_state_dict(kept.state_dict())
    _, kept_grads = loss_and_gradients(kept.train(), d)
    _, grads = loss_and_gradients(nested.train(), d)
    assert grads.keys() == kept_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], kept_grads[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("mechanism", ["window-mw", "rpr"])
def test_a_long_sequence_runs_at_most_recompute_max_blocks_per_layer(mechanism, blocks, monkeypatch):
    """Each block costs tens of kernel launches three times over: one block per few query rows
    (what RECOMPUTE_CHUNK_ELEMENTS alone gives a long sequence) made an H100 launch-bound, 53x
    vanilla's time. Blocks grow instead, and the values and gradients stay those of one block."""
    monkeypatch.setattr(attention, "RECOMPUTE_CHUNK_ELEMENTS", 1)  # alone: one query row per block
    length, rows, embed_dim = 5 * attention.RECOMPUTE_MAX_BLOCKS + 3, 2, 16
    inputs = torch.randn(length, rows, embed_dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model, _ = translation_model(extra=model_flags(mechanism, 0))
    kept = next(m for m in model.modules() if isinstance(m, attention.MechanismMultiheadAttention)).train()
    recomputed = copy.deepcopy(kept)
    recomputed.recompute_length = length
    results = []
    for module in (kept, recomputed):
        query = inputs.clone().requires_grad_()
        out = module(query, query, query, need_weights=False)[0]
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        results.append((out.detach(), query.grad))
    assert len(blocks) == attention.RECOMPUTE_MAX_BLOCKS
    for kept_tensor, recomputed_tensor in zip(*results):
        torch.testing.assert_close(recomputed_tensor, kept_tensor, rtol=1e-9, atol=1e-10)
