"""The flex_attention path (``fairseq_distattn.functional.flex``): every
mechanism that hands the core an :class:`OffsetTable` gives the same output
through flex_attention as through the eager path, with causal, key-padding and
direction masks; the routing takes flex only where it applies; on CUDA the
compiled kernel matches the eager path in the forward and backward pass."""

import importlib

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional import flex, paths, position_tables
from fairseq_distattn.tools.path_profile import may_take_flex_path

# the core's module (functional.attend is the function the package exports under its name)
CORE = importlib.import_module("fairseq_distattn.functional.attention")

pytestmark = pytest.mark.skipif(flex._flex_module() is None, reason="this torch has no flex_attention")

HEADS = 4


def _inputs(batch, length, head_size, dtype, device="cpu", seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, length, head_size, generator=generator, dtype=dtype).to(device) for _ in range(3)]


def _ops(device, dtype, head_size=8):
    """name -> op(q, k, v, **shared) for every mechanism with an offset table."""
    generator = torch.Generator().manual_seed(1)

    def per_head(scale=1.0):
        return (torch.randn(HEADS, generator=generator, dtype=dtype) * scale).to(device)

    distance_weight, sharpness = per_head(0.5), per_head()
    t5_table = torch.randn(32, HEADS, generator=generator, dtype=dtype).to(device)
    slopes = per_head(0.3).abs()
    kerple_scale, kerple_rate = per_head().abs() + 0.1, per_head(0.5).abs() + 0.1
    relative_keys, relative_values = (
        torch.randn(2 * 3 + 1, head_size, generator=generator, dtype=dtype).to(device) for _ in range(2)
    )
    # k beyond the sequence: the tables are cut to the distances that occur (rows_within_reach)
    far_keys, far_values = (
        torch.randn(2 * 40 + 1, head_size, generator=generator, dtype=dtype).to(device) for _ in range(2)
    )

    def window(segment_size):
        def op(q, k, v, **kw):
            # pointer projections of their own: scaled copies of q and k
            positions = {name: kw[name] for name in ("key_padding_mask", "causal", "query_offset") if name in kw}
            mask = functional.window_mask(q * 0.5, k * 0.3, q * -0.4, k * 0.7, segment_size, **positions)
            return functional.multiplicative_window_attention(q, k, v, mask, **kw)

        return op

    return {
        "window-mw": window(0),
        "window-mw-seg": window(3),
        "rpr-keys-only": lambda q, k, v, **kw: functional.relative_position_attention(
            q, k, v, relative_keys, None, 3, **kw
        ),
        "rpr": lambda q, k, v, **kw: functional.relative_position_attention(
            q, k, v, relative_keys, relative_values, 3, **kw
        ),
        "rpr-k-beyond-the-sequence": lambda q, k, v, **kw: functional.relative_position_attention(
            q, k, v, far_keys, far_values, 40, **kw
        ),
        "alibi": lambda q, k, v, **kw: functional.alibi_attention(q, k, v, **kw),
        "alibi-learned-slopes": lambda q, k, v, **kw: functional.alibi_attention(q, k, v, slopes, **kw),
        "distance-mask": lambda q, k, v, **kw: functional.distance_mask_attention(q, k, v, 0.7, **kw),
        "distance-mask-forward": lambda q, k, v, **kw: functional.distance_mask_attention(
            q, k, v, 0.7, direction="forward", **kw
        ),
        "distance-mask-backward": lambda q, k, v, **kw: functional.distance_mask_attention(
            q, k, v, 0.7, direction="backward", **kw
        ),
        "t5-bias": lambda q, k, v, **kw: functional.t5_bias_attention(q, k, v, t5_table, **kw),
        "da": lambda q, k, v, **kw: functional.distance_aware_attention(q, k, v, distance_weight, sharpness, **kw),
        "da-early-add": lambda q, k, v, **kw: functional.distance_aware_attention(
            q, k, v, distance_weight, sharpness, adjusting="early-add", **kw
        ),
        "da-sigmoid": lambda q, k, v, **kw: functional.distance_aware_attention(
            q, k, v, distance_weight, None, mapping="sigmoid", **kw
        ),
        "kerple-log": lambda q, k, v, **kw: functional.kerple_attention(q, k, v, kerple_scale, kerple_rate, **kw),
        "kerple-power": lambda q, k, v, **kw: functional.kerple_attention(
            q, k, v, kerple_scale, kerple_rate, kernel="power", **kw
        ),
        "sandwich": lambda q, k, v, **kw: functional.sandwich_attention(q, k, v, **kw),
    }


OP_NAMES = list(_ops("cpu", torch.float64))


@pytest.fixture
def flex_calls(monkeypatch):
    """The ``min_offset`` of every call of :func:`flex.flex_attend` that applies a
    mechanism's table, made by the core or by MW (rpr's extra call for the keys
    clipped to +k is recorded as k; MW's plain call, which has no table, not at all)."""
    calls = []
    real = flex.flex_attend

    def spy(q, k, v, table, **kwargs):
        if table is not None:
            calls.append(kwargs.get("min_offset"))
        return real(q, k, v, table, **kwargs)

    for module in (CORE, flex):  # flex: MW's two calls (flex_windowed_attend)
        monkeypatch.setattr(module, "flex_attend", spy)
    return calls


@pytest.fixture
def block_mask_builds(monkeypatch):
    """The ``(Tq, Tk)`` of every block mask flex's ``create_block_mask`` builds,
    from an empty block-mask cache."""
    builds = []
    module = flex._flex_module()
    real = module.create_block_mask

    def spy(mask_mod, batch, heads, tgt_len, src_len, **kwargs):
        builds.append((tgt_len, src_len))
        return real(mask_mod, batch, heads, tgt_len, src_len, **kwargs)

    monkeypatch.setattr(module, "create_block_mask", spy)
    flex._BLOCK_MASKS.clear()
    yield builds
    flex._BLOCK_MASKS.clear()


def _padding(batch, length, device="cpu"):
    padding = torch.zeros(batch, length, dtype=torch.bool, device=device)
    padding[1, :3] = True  # left padding, as fairseq's source side
    padding[2, -2:] = True
    return padding


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", OP_NAMES)
def test_flex_forward_equals_the_eager_path_on_cpu(name, causal, padded):
    q, k, v = _inputs(3, 11, 8, torch.float64)
    shared = dict(causal=causal, key_padding_mask=_padding(3, 11) if padded else None, need_weights=False)
    op = _ops("cpu", torch.float64)[name]
    with torch.no_grad():
        eager, _ = op(q, k, v, **shared, flex="never")
        fused, _ = op(q, k, v, **shared, flex="always")
    torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)


def test_a_block_mask_is_built_once_per_mask_tensor_and_again_after_it_changes(block_mask_builds):
    builds = block_mask_builds
    q, k, v = _inputs(3, 11, 8, torch.float64)
    padding = _padding(3, 11)

    def attend(**masks):
        with torch.no_grad():
            return flex.flex_attend(q, k, v, None, **masks)

    def eager(padding):
        with torch.no_grad():
            options = paths.CallOptions(padding, need_weights=False, flex="never")
            return functional.attend(q, k, v, functional.PLAIN, options)[0]

    first = attend(key_padding_mask=padding)
    again = attend(key_padding_mask=padding)
    assert len(builds) == 1
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    padding[0, -4:] = True  # in place: the cached block mask no longer describes it
    changed = attend(key_padding_mask=padding)
    assert len(builds) == 2
    torch.testing.assert_close(changed, eager(padding), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(changed, first)
    attend(key_padding_mask=padding.clone())  # equal contents, another tensor
    attend(key_padding_mask=padding, min_offset=2)
    attend(key_padding_mask=padding, causal=True)
    assert len(builds) == 5
    with torch.inference_mode():  # no version counter: never cached
        unversioned = _padding(3, 11)
        for _ in range(2):
            flex.flex_attend(q, k, v, None, key_padding_mask=unversioned)
    assert len(builds) == 7
    for _ in range(2 * flex.BLOCK_MASK_CACHE_ENTRIES):
        attend(key_padding_mask=_padding(3, 11))
    assert len(flex._BLOCK_MASKS) == flex.BLOCK_MASK_CACHE_ENTRIES


def _dense_flex(q, k, v, score_mod=None, block_mask=None, return_lse=False, return_aux=None):
    """flex_attention's definition written out densely, with autograd: the
    score_mod and mask_mod evaluated on broadcast index grids, and the
    log-sum-exp that the kernel returns (-inf on a row with no visible key)."""
    batch, heads, tgt_len, head_size = q.shape
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q_idx, kv_idx = torch.arange(tgt_len)[:, None], torch.arange(k.size(2))[None, :]
    scores = torch.matmul(q, k.transpose(-2, -1)) * head_size**-0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if block_mask is not None:
        scores = scores.masked_fill(~block_mask.mask_mod(b, h, q_idx, kv_idx), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    visible = torch.isfinite(lse)[..., None]
    out = torch.where(visible, torch.exp(scores - torch.where(visible, lse[..., None], 0.0)), 0.0) @ v
    if return_aux is not None:
        return out, type("AuxOutput", (), {"lse": lse})()
    return (out, lse) if return_lse else out


@pytest.fixture
def dense_flex_kernel(monkeypatch):
    """The flex path with :func:`_dense_flex` as its kernel, taken under
    ``flex="always"`` (or ``"auto"``) with gradients on CPU too."""
    monkeypatch.setattr(flex, "_flex", lambda q, variant: _dense_flex)
    # flex_attention serves every call that paths.choose_path would otherwise refuse for its gradients
    monkeypatch.setattr(paths, "_flex_serves", lambda call: call.flex != "never")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", OP_NAMES)
def test_flex_path_gradients_equal_the_eager_path(name, causal, dense_flex_kernel, flex_calls):
    """The backward of everything around the kernel (tables, score_mod, block
    mask, rpr's value term rebuilt from the log-sum-exp) against the eager path,
    on CPU: flex's kernel replaced by its dense definition, since flex has no
    CPU backward (the compiled kernel's own backward is tested on CUDA)."""
    calls = flex_calls
    inputs = _inputs(3, 11, 8, torch.float64)
    op = _ops("cpu", torch.float64)[name]
    shared = dict(causal=causal, key_padding_mask=_padding(3, 11), need_weights=False)
    results = {}
    for mode in ("never", "always"):
        q, k, v = (t.clone().requires_grad_() for t in inputs)
        out, _ = op(q, k, v, **shared, flex=mode)
        results[mode] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))
    assert calls, "the flex path did not run"
    for fused, eager in zip(results["always"], results["never"]):
        torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)


def test_relative_values_from_the_log_sum_exp_take_every_parameter_gradient(dense_flex_kernel):
    """rpr's key and value tables get the eager path's gradients through the
    rebuilt value term, including both clipped buckets (k = 3 < length 11) and
    a padded row (a hidden causal row gives 0 either way)."""
    generator = torch.Generator().manual_seed(3)
    tables = [torch.randn(7, 8, generator=generator, dtype=torch.float64) for _ in range(2)]
    inputs = _inputs(3, 11, 8, torch.float64)
    for causal in (False, True):
        results = {}
        for mode in ("never", "always"):
            relative_keys, relative_values = (t.clone().requires_grad_() for t in tables)
            out, _ = functional.relative_position_attention(
                *inputs,
                relative_keys,
                relative_values,
                3,
                causal=causal,
                key_padding_mask=_padding(3, 11),
                need_weights=False,
                flex=mode,
            )
            results[mode] = torch.autograd.grad(out.square().sum(), (relative_keys, relative_values))
        for fused, eager in zip(results["always"], results["never"]):
            assert float(eager.abs().max()) > 0
            torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lengths", [(11, 11), (3, 9), (9, 3), (4, 4)])
def test_relative_values_for_each_clipping_case(lengths, dense_flex_kernel, flex_calls):
    """k = 3: keys clipped on both sides of most queries (11, 11: one more flex
    call for j - i >= k); on one side only, where the other clipped bucket holds
    one key per query, a diagonal (3, 9) and (9, 3); or nowhere (4, 4)."""
    offsets = flex_calls
    tgt_len, src_len = lengths
    (q, _, _), (_, k, v) = _inputs(3, tgt_len, 8, torch.float64), _inputs(3, src_len, 8, torch.float64, seed=2)
    op = _ops("cpu", torch.float64)["rpr"]
    padding = torch.zeros(3, src_len, dtype=torch.bool)
    padding[1, :2] = True
    results = {}
    for mode in ("never", "always"):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = op(*inputs, key_padding_mask=padding, need_weights=False, flex=mode)
        results[mode] = (out, *torch.autograd.grad(out.square().sum(), inputs))
    assert offsets == ([None, 3] if lengths == (11, 11) else [None])
    for fused, eager in zip(results["always"], results["never"]):
        torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_window_that_underflows_to_zero_keeps_its_gradient(dtype, dense_flex_kernel):
    """MW through flex reads log M: where M is 0 (a sharp pointer) or below the
    floor, the weights and the gradient of M (the pull that widens the window,
    nonzero here) are eq. 13's, not 0 from a clamp nor NaN from log 0."""
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 2, 6, 8, generator=generator, dtype=dtype) for _ in range(3)]
    window = torch.rand(2, 2, 6, 6, generator=generator, dtype=dtype)
    window[0, 0, 2, :4] = 0.0
    window[1, 1, 3, 3] = 1e-30
    results = {}
    for mode in ("never", "always"):
        q, k, v, mask = (t.clone().requires_grad_() for t in (*inputs, window))
        out, _ = functional.multiplicative_window_attention(q, k, v, mask, need_weights=False, flex=mode)
        results[mode] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v, mask)))
    assert float(results["never"][-1][0, 0, 2, :4].abs().min()) > 1e-3
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for fused, eager in zip(results["always"], results["never"]):
        torch.testing.assert_close(fused, eager, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_log_window_of_half_inputs_is_formed_in_float32(dtype):
    """Flex scores half inputs in float32; log M must be floored at float32's
    limit too, not at float16's sqrt(tiny) = 0.0078, which would lift every
    window tail below it; its gradient comes back in M's dtype."""
    mask = torch.tensor([1.0, 0.5, 1e-3, 1e-5, 0.0], dtype=dtype, requires_grad=True)
    log_mask = flex._FlooredLog.apply(mask)
    floor = torch.finfo(torch.float32).tiny ** 0.5
    assert log_mask.dtype == torch.float32
    torch.testing.assert_close(log_mask, mask.detach().float().clamp_min(floor).log(), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(log_mask, mask, grad_outputs=mask.detach().float().clamp_min(floor))
    assert grad.dtype == dtype
    torch.testing.assert_close(grad, torch.ones_like(grad), rtol=1e-6, atol=0)


def test_cross_attention_lengths_and_a_hidden_row():
    """Tq != Tk, and a causal row whose keys are all padding gives 0, as eagerly."""
    q, _, _ = _inputs(3, 5, 8, torch.float64)
    _, k, v = _inputs(3, 9, 8, torch.float64, seed=4)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, :4] = True  # query 0 of sentence 0 may see key 0 only under causal: padding
    op = _ops("cpu", torch.float64)["da"]
    with torch.no_grad():
        for causal in (False, True):
            shared = dict(causal=causal, key_padding_mask=padding, need_weights=False)
            eager, _ = op(q, k, v, **shared, flex="never")
            fused, _ = op(q, k, v, **shared, flex="always")
            torch.testing.assert_close(fused, eager, rtol=1e-10, atol=1e-10)
    assert float(fused[0, :, 0].abs().max()) == 0.0


def test_routing(flex_calls):
    calls = flex_calls
    q, k, v = _inputs(2, 6, 8, torch.float32)
    op = _ops("cpu", torch.float32)["alibi"]
    with torch.no_grad():
        op(q, k, v, need_weights=False)  # auto: CUDA only
        assert calls == []
        op(q, k, v, need_weights=False, flex="always")
        assert len(calls) == 1
        op(q, k, v, need_weights=True, flex="always")  # the weights need the eager path
        op(q, k, v, need_weights=False, dropout_p=0.1, flex="always")  # flex has no attention dropout
        op(q[:, :, -1:], k, v, need_weights=False, query_offset=5, flex="always")  # a decoding step
        assert len(calls) == 1
    op(q, k, v, need_weights=False, flex="always")  # gradients on CPU: flex has no CPU backward
    assert len(calls) == 1
    for bad_call in (op, functional.softmax_attention):  # an op that builds no table refuses it too
        with pytest.raises(ValueError, match="flex must be one of auto, always, never, got 'sometimes'"):
            bad_call(q, k, v, need_weights=False, flex="sometimes")


def test_a_kernel_that_cannot_be_compiled_names_the_way_off_the_flex_path(monkeypatch):
    import torch._dynamo.exc as dynamo_errors

    def compile_fails(*args, **kwargs):
        raise dynamo_errors.BackendCompilerFailed(
            "inductor",
            RuntimeError("Found NVIDIA Tesla K80 which is too old to be supported by the triton GPU compiler"),
            None,
        )

    monkeypatch.setattr(flex, "_compiled_flex", lambda variant, backend: compile_fails)
    q, k, v = _inputs(1, 4, 16, torch.float32)
    with pytest.raises(RuntimeError) as refused:
        flex._compiled_kernel((), q, k, v)
    message = str(refused.value)
    assert message.startswith("flex_attention could not be compiled for cpu (BackendCompilerFailed: ")
    assert "train with --attention-flex never" in message
    # the flag fairseq-generate would refuse is not what generation is told to use
    assert "--model-overrides \"{'attention_flex': 'never'}\"" in message and "flex='never'" in message

    def runtime_error(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(flex, "_compiled_flex", lambda variant, backend: runtime_error)
    with pytest.raises(torch.OutOfMemoryError):  # not a compile failure: left as it is
        flex._compiled_kernel((), q, k, v)


def test_offset_table_dense_is_the_toeplitz_matrix():
    values = torch.arange(2 * 7, dtype=torch.float64).reshape(2, 7)  # Tq = 3, Tk = 5
    table = position_tables.OffsetTable(values, 3)
    dense = table.dense()
    assert dense.shape == (2, 3, 5)
    for i in range(3):
        for j in range(5):
            assert dense[1, i, j] == values[1, j - i + 2]
    assert position_tables.offsets(3, 5, 2, "cpu").tolist() == [-4, -3, -2, -1, 0, 1, 2]
    with pytest.raises(ValueError, match="combine must be one of add, relu-multiply"):
        position_tables.OffsetTable(values, 3, combine="multiply")
    with pytest.raises(ValueError, match=r"values must be \[H or 1, Tq \+ Tk - 1\]"):
        position_tables.OffsetTable(values[0], 3)


def _captured_numbers(function, seen=None):
    """Every int or float (bools aside) that ``function`` or a function it
    closes over captures, with its name."""
    seen = set() if seen is None else seen
    if id(function) in seen or not callable(function) or getattr(function, "__closure__", None) is None:
        return []
    seen.add(id(function))
    found = []
    for name, cell in zip(function.__code__.co_freevars, function.__closure__):
        value = cell.cell_contents
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append((function.__code__.co_name, name, value))
        elif callable(value):
            found.extend(_captured_numbers(value, seen))
    return found


@pytest.mark.parametrize("name", OP_NAMES)
def test_score_mods_capture_tensors_not_python_numbers(name, monkeypatch):
    """The kernel is compiled with dynamic shapes, so a Python int that a score_mod
    closes over becomes a symbol inside flex's lowering, which torch 2.11's
    inductor could not compile (rpr's clipping distance, found on an H200:
    "'ShapeAsConstantBuffer' object has no attribute 'dtype'", and every rpr
    model failed to train on CUDA). Numbers reach a score_mod as 0-d tensors."""
    score_mods = []
    real = flex.flex_attend

    def spy(q, k, v, table, **kwargs):
        if table is not None:
            score_mods.append(table.score_mod())
        return real(q, k, v, table, **kwargs)

    for module in (CORE, flex):  # flex: MW's two calls (flex_windowed_attend)
        monkeypatch.setattr(module, "flex_attend", spy)
    q, k, v = _inputs(3, 11, 8, torch.float64)
    with torch.no_grad():
        _ops("cpu", torch.float64)[name](q, k, v, key_padding_mask=_padding(3, 11), need_weights=False, flex="always")
    assert score_mods
    for score_mod in score_mods:
        assert _captured_numbers(score_mod) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled flex kernel runs on CUDA")
@pytest.mark.parametrize("name", OP_NAMES)
def test_compiled_flex_matches_the_eager_path_on_cuda(name):
    q, k, v = (t.requires_grad_() for t in _inputs(4, 100, 64, torch.float32, device="cuda"))
    op = _ops("cuda", torch.float32, head_size=64)[name]
    for causal in (False, True):
        shared = dict(causal=causal, key_padding_mask=_padding(4, 100, "cuda"), need_weights=False)
        results = {}
        for mode in ("never", "auto"):
            out, _ = op(q, k, v, **shared, flex=mode)
            grads = torch.autograd.grad(out.square().sum(), (q, k, v))
            results[mode] = (out, *grads)
        for fused, eager in zip(results["auto"], results["never"]):
            torch.testing.assert_close(fused, eager, rtol=2e-4, atol=2e-4)


def test_a_translation_model_gives_the_same_logits_through_flex(flex_calls, block_mask_builds):
    """Every layer's self-attention through flex (forced, inference) against the
    eager path, in a model that puts a different mechanism in each layer; the
    layers of one stack share one block mask."""
    from .model_helpers import TINY, flex_setting, left_pad, random_tokens, translation_model

    calls = flex_calls
    model, d = translation_model(
        extra=[
            *TINY,
            *("--attention-flex", "always"),
            "--encoder-self-attention",
            "alibi@0,distance-mask@1",
            "--decoder-self-attention",
            "da@0,t5-bias@1",
        ]
    )
    sentences = [random_tokens(d, 1, length, seed)[0] for seed, length in enumerate((7, 4, 6))]
    src_tokens = left_pad(sentences, d.pad())
    src_lengths = torch.tensor([len(s) for s in sentences])
    prev_output_tokens = random_tokens(d, 3, 5, seed=9)
    with torch.no_grad():
        with flex_setting(model, "never"):
            eager, _ = model(src_tokens, src_lengths, prev_output_tokens)
        assert calls == []
        with flex_setting(model, on_cpu=True):
            fused, _ = model(src_tokens, src_lengths, prev_output_tokens)
    assert len(calls) == 4  # the four self-attention layers; cross-attention is vanilla
    assert block_mask_builds == [(7, 7), (5, 5)]  # the encoder's padding; the decoder's causal mask
    torch.testing.assert_close(fused, eager, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled flex kernel runs on CUDA"),
        ),
    ],
)
def test_a_training_step_through_flex_gives_every_parameter_the_eager_paths_gradient(device, request, flex_calls):
    """What training on CUDA relies on: the mechanisms' own parameters (rpr's
    tables, DA's w and v, T5's bucket table, MW's pointer projections) are read
    inside score_mod or rebuilt from the log-sum-exp, and must receive the
    eager path's gradients, not none (a table captured without its autograd
    history would train nothing and still give the right forward). On CPU,
    flex's kernel is its dense definition (no CPU backward) in float64; on
    CUDA, the compiled kernel in float32, heads of 32 (a size flex compiles for)."""
    from .model_helpers import TINY, flex_setting, left_pad, random_tokens, translation_model

    calls = flex_calls
    if device == "cpu":
        request.getfixturevalue("dense_flex_kernel")
    dtype, mode, tolerance = (torch.float64, "always", 1e-9) if device == "cpu" else (torch.float32, "auto", 2e-4)
    model, d = translation_model(
        extra=[
            *TINY,
            *("--attention-flex", "always"),
            *("--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "64"),
            *("--decoder-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"),
            *("--encoder-self-attention", "rpr@0,da@1,alibi@2"),
            *("--decoder-self-attention", "t5-bias@0,window-mw@1,distance-mask@2"),
            *("--cross-attention", "window-mw@0-1"),
        ]
    )
    model = model.to(device=device, dtype=dtype).train()
    sentences = [random_tokens(d, 1, length, seed)[0] for seed, length in enumerate((9, 5, 7))]
    src_tokens = left_pad(sentences, d.pad()).to(device)
    src_lengths = torch.tensor([len(s) for s in sentences], device=device)
    prev_output_tokens = random_tokens(d, 3, 6, seed=9).to(device)
    target = random_tokens(d, 3, 6, seed=10).to(device)
    gradients = {}
    for run_mode in ("never", mode):
        model.zero_grad()
        with flex_setting(model, "never" if run_mode == "never" else None):
            logits, _ = model(src_tokens, src_lengths, prev_output_tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
        gradients[run_mode] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert len(calls) >= 6, "the flex path did not run in every mechanism layer"
    assert gradients[mode].keys() == gradients["never"].keys()
    for needle in (
        "mechanism.relative_keys",
        "mechanism.relative_values",
        "mechanism.distance_weight",
        "mechanism.sharpness",
        "mechanism.relative_attention_bias",
        "self_attn.extra_query_proj.left_query",
        "encoder_attn.extra_key_proj.right_key",
    ):
        assert any(needle in name for name in gradients["never"]), f"no {needle} parameter in the model"
    for name, eager in gradients["never"].items():
        assert gradients[mode][name].abs().sum() > 0 or eager.abs().sum() == 0, f"{name} got no gradient"
        torch.testing.assert_close(gradients[mode][name], eager, rtol=tolerance, atol=tolerance, msg=name)


def test_the_compiled_kernel_is_not_recompiled_per_batch_and_never_falls_back(monkeypatch):
    """torch.compile keeps at most 8 compiled entries per function and runs flex
    uncompiled beyond them (on CUDA: every score materialised). Through a model
    with many kinds of flex call (padding and causal masks, rpr's extra call,
    MW's two calls, additive and multiplicative tables) and batches of varying
    shape, every kernel call runs a compiled graph, and after the second batch
    nothing compiles again, under a limit of 2 entries per function. On CPU, with a backend that counts instead of
    inductor (dynamo's guards, which decide recompiles, are the same), and
    without gradients (flex has no CPU backward)."""
    import functools
    import random

    import torch._dynamo

    from .model_helpers import TINY, flex_setting, left_pad, random_tokens, translation_model

    compiles, compiled_runs, kernel_calls = [], [], []

    def counting_backend(graph_module, example_inputs):
        compiles.append(graph_module)

        def run(*args):
            compiled_runs.append(1)
            return graph_module.forward(*args)

        return run

    def compiled_kernel_on_any_device(q, variant):
        kernel_calls.append(variant)
        return functools.partial(flex._compiled_kernel, variant)

    torch._dynamo.reset()
    flex._compiled_flex.cache_clear()
    monkeypatch.setattr(flex, "COMPILE_BACKEND", counting_backend)
    monkeypatch.setattr(flex, "_flex", compiled_kernel_on_any_device)
    model, d = translation_model(
        extra=[
            *TINY,
            *("--attention-flex", "always"),
            "--encoder-layers",
            "3",
            "--decoder-layers",
            "3",
            "--encoder-self-attention",
            "window-aw@0,rpr@1,t5-bias@2",
            "--decoder-self-attention",
            "window-mw@0,da@1,alibi@2",
            "--cross-attention",
            "window-aw-seg@0",
        ]
    )
    model.eval()
    lengths = random.Random(0)
    compiles_after = []
    # this model's variants would fit one function's default 8 entries; a model with
    # more of them, or training and validation (grad mode is a guard), would not
    limit_of_two = torch._dynamo.config.patch(recompile_limit=2)
    try:
        with limit_of_two, torch.no_grad(), flex_setting(model, on_cpu=True):
            for batch in range(5):
                batch_size = lengths.randint(2, 5)
                source_lengths = [lengths.randint(3, 20) for _ in range(batch_size)]
                sentences = [random_tokens(d, 1, n, 10 * batch + i)[0] for i, n in enumerate(source_lengths)]
                prev_output_tokens = random_tokens(d, batch_size, lengths.randint(3, 20), seed=99 + batch)
                batch_inputs = (left_pad(sentences, d.pad()), torch.tensor(source_lengths), prev_output_tokens)
                compiled_logits, _ = model(*batch_inputs)
                compiles_after.append(len(compiles))
            with flex_setting(model, "never"):
                eager_logits, _ = model(*batch_inputs)
    finally:
        torch._dynamo.reset()
        flex._compiled_flex.cache_clear()
    variants = set(kernel_calls)
    assert len(variants) == 7  # rpr's two calls, MW's two, da, t5-bias, alibi
    assert len(compiled_runs) == len(kernel_calls)  # no call ran uncompiled
    assert compiles_after[1:] == [compiles_after[1]] * 4  # shapes vary; nothing compiles after batch 2
    assert compiles_after[-1] <= 2 * len(variants)
    torch.testing.assert_close(compiled_logits, eager_logits)  # the per-variant wrapper passes every argument on


def _flex_declared(name):
    from fairseq_distattn.functional.paths import Path
    from fairseq_distattn.registry import REGISTRY
    from fairseq_distattn.tools.path_profile import may_take

    return may_take(REGISTRY[name], Path.FLEX)


def _registered_self_attention():
    import fairseq_distattn.mechanisms  # noqa: F401 (discovers the registry)
    from fairseq_distattn.registry import ENCODER_SELF, registered

    return [info.name for info in registered() if info.name in ENCODER_SELF.allowed]


@pytest.mark.parametrize("mechanism", [*_registered_self_attention(), "rpr --no-relative-values"])
def test_the_registry_declares_which_mechanisms_take_the_flex_path(mechanism, flex_calls):
    """A mechanism runs through flex exactly when it declares ``flex`` (forced
    flex, inference), with the same logits as the eager path either way."""
    from .model_helpers import TINY, flex_setting, left_pad, random_tokens, translation_model

    name, *options = mechanism.split()
    model, d = translation_model(
        extra=[*TINY, "--attention-flex", "always", "--encoder-self-attention", name, *options]
    )
    sentences = [random_tokens(d, 1, length, seed)[0] for seed, length in enumerate((6, 3))]
    src_tokens, src_lengths = left_pad(sentences, d.pad()), torch.tensor([6, 3])
    prev_output_tokens = random_tokens(d, 2, 4, seed=5)
    with torch.no_grad():
        with flex_setting(model, "never"):
            eager, _ = model(src_tokens, src_lengths, prev_output_tokens)
        with flex_setting(model, on_cpu=True):
            fused, _ = model(src_tokens, src_lengths, prev_output_tokens)
    takes_flex = may_take_flex_path(model.encoder.layers[0].self_attn.mechanism)
    assert not takes_flex or _flex_declared(name)
    # every mechanism that declares flex takes it with its default options
    assert takes_flex == _flex_declared(name)
    # one call per encoder layer (rpr's extra call for the keys clipped to +k not counted), or none
    assert flex_calls.count(None) == (2 if takes_flex else 0)
    torch.testing.assert_close(fused, eager, rtol=1e-9, atol=1e-9)


def test_da_late_adjustments_stay_eager():
    from .model_helpers import TINY, translation_model

    for adjusting, offset_table in (("early-add", True), ("late-add", False), ("late-multiply", False)):
        model, _ = translation_model(
            extra=[*TINY, "--encoder-self-attention", "da", "--da-adjusting", adjusting], perturb=False
        )
        mechanism = model.encoder.layers[0].self_attn.mechanism
        assert may_take_flex_path(mechanism) is offset_table


def test_layers_on_the_flex_path_are_not_recomputed(monkeypatch):
    """Recomputing in row blocks would move the calls off flex (query_offset > 0)
    and saves nothing: flex keeps no [B, H, Tq, Tk] tensor for backward."""
    from .model_helpers import TINY, translation_model

    model, _ = translation_model(
        extra=[*TINY, "--encoder-self-attention", "da", "--decoder-self-attention", "rpr@0,window-mw@1"]
    )
    da = model.encoder.layers[0].self_attn.mechanism
    rpr, window = (model.decoder.layers[layer].self_attn.mechanism for layer in (0, 1))
    query = torch.zeros(2, 2, 5, 8, dtype=next(model.parameters()).dtype, requires_grad=True)
    options = paths.CallOptions(need_weights=False)
    call = paths.Call.of(query, query, options, recompute_length=4)

    def recomputes(mechanism):
        queries = {name: query for name in ("query", *mechanism.extra_queries)}
        keys = {name: query.detach() for name in ("key", "value", *mechanism.extra_keys)}
        return mechanism.recomputes_in_row_blocks(call, queries, keys, options)

    for mechanism in (da, rpr, window):
        assert recomputes(mechanism)
    monkeypatch.setattr(paths, "_flex_serves", lambda call: True)
    assert not recomputes(da)
    assert not recomputes(rpr)
    assert recomputes(window)  # its M is [B, H, Tq, Tk] on either path


def test_attention_flex_takes_flex_from_the_recompute_length_on_in_auto(flex_calls):
    """--attention-flex: always takes flex on every qualifying call, never on none,
    auto only where the keys reach --attention-recompute-length (on shorter keys the
    eager path trained faster on an H100), so a recompute length of 0 keeps auto off it.
    Encoder keys are 5 long, decoder keys 4: four self-attention layers in all."""
    from .model_helpers import TINY, flex_setting, random_tokens, translation_model

    calls = flex_calls
    for setting, recompute_length, expected in (
        ("always", 256, 4),
        ("never", 1, 0),
        ("auto", 256, 0),
        ("auto", 5, 2),  # the encoder's keys only
        ("auto", 4, 4),
        ("auto", 0, 0),
    ):
        model, d = translation_model(
            extra=[
                *TINY,
                *("--encoder-self-attention", "alibi", "--decoder-self-attention", "distance-mask"),
                *("--attention-flex", setting, "--attention-recompute-length", str(recompute_length)),
            ]
        )
        assert model.encoder.layers[0].self_attn.attention_flex == setting
        src_tokens, prev_output_tokens = random_tokens(d, 2, 5, seed=1), random_tokens(d, 2, 4, seed=2)
        calls.clear()
        with torch.no_grad(), flex_setting(model, on_cpu=True):
            model(src_tokens, torch.tensor([5, 5]), prev_output_tokens)
        assert len(calls) == expected, (setting, recompute_length)


def test_the_functional_ops_keep_no_mode_of_their_own():
    """The flex choice is each call's argument: no module of functional/ rebinds a
    global (the flex_mode context manager did, so one caller's choice leaked into others')."""
    import ast
    from pathlib import Path

    folder = Path(functional.__file__).parent
    rebinding = [
        f"{path.name}:{node.lineno}"
        for path in sorted(folder.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    ]
    assert not rebinding, rebinding
