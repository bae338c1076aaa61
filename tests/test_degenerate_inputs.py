"""Degenerate inputs to every registered mechanism's op (its module's example
call, tools.examples): empty sequences give what vanilla attention (and
``F.scaled_dot_product_attention``) gives, and NaN or infinite inputs come out
as NaN, never as a traceback from inside an op.

- No queries (``Tq = 0``, with or without keys): an empty ``[B, H, 0, D]``
  output and ``[B, H, 0, Tk]`` weights.
- No keys under non-empty queries (``Tk = 0``): every row sees no key, which
  gives 0 as a row hidden by the masks does, and ``[B, H, Tq, 0]`` weights; or,
  for an op whose queries must be among its keys (FIRE's self-attention), a
  ValueError that names the keys.
- A NaN query makes its own output row NaN (and whatever else the mechanism's
  math lets it reach in its sequence), and leaves the other sequences of the
  batch alone; an infinite key too. A diverging model (fairseq-train with a huge
  --lr) is where this matters: NaN must reach fairseq's own overflow/NaN check.
- ``cope_positions``' ``npos`` follows the command line's
  ``--cope-max-positions`` rule, by the same converter.
"""

import pytest
import torch

import fairseq_distattn.mechanisms  # noqa: F401 (registers every mechanism)
from fairseq_distattn import functional
from fairseq_distattn.functional import position_tables
from fairseq_distattn.registry import REGISTRY, OptionContext, SpecError, option_flag, registered
from fairseq_distattn.tools.examples import ExampleDraw, example_call

B, H, D = 2, 2, 4
# longer than any CPU vector of float64 lanes: the fused path's CPU kernel turns a NaN row shorter
# than one vector into 0 (softmax_attention's docstring), which is not what is tested here
T = 17
INFOS = registered()
IDS = [info.name for info in INFOS]
SHARED = {
    "plain": dict(),
    "causal": dict(causal=True),
    "padding": dict(key_padding_mask=True),  # a [B, Tk] mask hiding nothing, made per call
}


def example(info, tgt_len, src_len, seed=0):
    """``(call, q, k, v)``: ``info``'s example call (tools.examples) and its q, k, v,
    which the call reads when it runs (so a value set in them after this is seen)."""
    call = example_call(info, ExampleDraw(B, H, tgt_len, src_len, D, seed=seed))
    return call, call.queries["query"], call.keys["key"], call.keys["value"]


def shared_arguments(label, src_len, need_weights):
    shared = dict(SHARED[label], need_weights=need_weights)
    if shared.get("key_padding_mask"):
        shared["key_padding_mask"] = torch.zeros(B, src_len, dtype=torch.bool)
    return shared


def test_every_registered_op_is_tested():
    assert len(INFOS) == len(REGISTRY) > 0


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("label", list(SHARED))
@pytest.mark.parametrize("tgt_len, src_len", [(0, 0), (0, 5)], ids=["Tq=Tk=0", "Tq=0,Tk=5"])
@pytest.mark.parametrize("info", INFOS, ids=IDS)
def test_no_queries_give_an_empty_output_as_vanilla_attention(info, tgt_len, src_len, label, need_weights):
    call, q, k, v = example(info, tgt_len, src_len)
    shared = shared_arguments(label, src_len, need_weights)
    out, probs = call(**shared)
    vanilla, vanilla_probs = functional.softmax_attention(q, k, v, **shared)
    assert out.shape == vanilla.shape == (B, H, 0, D)
    assert out.dtype == q.dtype
    if need_weights:
        assert probs.shape == vanilla_probs.shape == (B, H, 0, src_len)
    else:
        assert probs is None


def no_key_cases():
    for info in INFOS:
        for label in SHARED:
            yield pytest.param(info, label, id=f"{info.name}-{label}")


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("info, label", list(no_key_cases()))
def test_no_keys_give_zero_rows_as_vanilla_attention_or_a_value_error_naming_the_keys(info, label, need_weights):
    tgt_len, src_len = 5, 0
    call, q, k, v = example(info, tgt_len, src_len)
    shared = shared_arguments(label, src_len, need_weights)
    vanilla, vanilla_probs = functional.softmax_attention(q, k, v, **shared)
    assert vanilla.shape == (B, H, tgt_len, D) and (vanilla == 0).all()
    try:
        out, probs = call(**shared)
    except ValueError as error:  # an op whose queries must be among its keys says so
        assert "keys" in str(error) and "src_len" in str(error), str(error)
        return
    torch.testing.assert_close(out, vanilla)
    if need_weights:
        assert probs.shape == vanilla_probs.shape == (B, H, tgt_len, 0)
    else:
        assert probs is None


def test_empty_sequences_still_reach_the_parameters_of_an_op():
    """The empty output is part of the graph: a backward gives the parameters a zero
    gradient (as for any other output that does not depend on them), not an error."""
    info = REGISTRY["kerple"]
    for tgt_len, src_len in ((0, 0), (0, 5), (5, 0)):
        call = example_call(info, ExampleDraw(B, H, tgt_len, src_len, D, requires_grad=True))
        out, _ = call()
        parameters = list(call.mechanism.parameters())
        assert len(parameters) == 2  # r1, r2
        grads = torch.autograd.grad(out.sum(), parameters)
        assert all(grad is not None and (grad == 0).all() for grad in grads)


@pytest.mark.parametrize(
    "tgt_len, src_len, query_offset", [(0, 0, 0), (0, 5, 0), (0, 5, 2), (5, 0, 0), (3, 5, 2), (1, 1, 0)]
)
def test_offset_tables_of_empty_sequences_are_empty_matrices(tgt_len, src_len, query_offset):
    """The shared helpers every offset-table mechanism builds on: the table's width
    gives ``Tk`` for any lengths, so ``dense()`` is the ``[H, Tq, Tk]`` matrix."""
    relative = position_tables.offsets(tgt_len, src_len, query_offset, "cpu")
    table = position_tables.OffsetTable(relative[None].double(), tgt_len)
    dense = table.dense()
    assert dense.shape == (1, tgt_len, src_len)
    expected = functional.relative_distance(tgt_len, src_len, query_offset, "cpu")
    assert dense[0].long().tolist() == expected.tolist()
    assert functional.alibi_bias(tgt_len, src_len, 4, query_offset, "cpu", torch.float32).shape == (4, tgt_len, src_len)
    assert functional.sandwich_bias(tgt_len, src_len, 2, D, query_offset, "cpu", torch.float32).shape == (
        2,
        tgt_len,
        src_len,
    )
    t5_table = torch.zeros(8, 2)
    assert functional.t5_relative_bias(t5_table, tgt_len, src_len, 6, True, query_offset).shape == (2, tgt_len, src_len)
    r = torch.ones(2)
    assert functional.kerple_bias(r, r, "log", tgt_len, src_len, query_offset).shape == (2, tgt_len, src_len)


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("label", list(SHARED))
@pytest.mark.parametrize("info", INFOS, ids=IDS)
def test_a_nan_query_gives_nan_in_its_row_not_a_traceback(info, label, need_weights):
    call, q, _, _ = example(info, T, T)
    row = 3
    q[0, 0, row] = float("nan")
    shared = shared_arguments(label, T, need_weights)
    out, probs = call(**shared)  # no RuntimeError from inside the op
    assert out.shape == (B, H, T, D)
    assert out[0, 0, row].isnan().all(), out[0, 0, row]
    assert torch.isfinite(out[1]).all(), "NaN leaked into another sequence of the batch"
    if need_weights:
        assert probs[0, 0, row].isnan().any()


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("label", list(SHARED))
@pytest.mark.parametrize("info", INFOS, ids=IDS)
def test_an_infinite_key_gives_nan_out_not_a_traceback(info, label, need_weights):
    call, _, k, _ = example(info, T, T)
    k[0, 0, 2] = float("inf")
    shared = shared_arguments(label, T, need_weights)
    out, _ = call(**shared)  # no RuntimeError from inside the op
    assert out.shape == (B, H, T, D)
    assert out[0, 0].isnan().any()  # q . inf is +-inf or NaN: at least one row meets inf - inf
    assert torch.isfinite(out[1]).all(), "NaN leaked into another sequence of the batch"


def test_a_diverging_cope_gives_nan_forward_and_backward():
    """What fairseq-train with --lr 1e30 meets: NaN scores, or an overflowed position
    table. The op lets NaN through, forward and backward (fairseq's own NaN check then
    stops training with its FloatingPointError), instead of raising from inside."""
    info = REGISTRY["cope"]
    for bad in ("query", "table"):
        call = example_call(info, ExampleDraw(B, H, T, T, D, requires_grad=True))
        q, table = call.queries["query"], call.mechanism.position_embeddings
        with torch.no_grad():
            if bad == "query":
                q[0, 0, 3] = float("nan")
            else:
                table[:, 1] = float("inf")
        out, _ = call(causal=True)
        loss = out.sum()
        assert loss.isnan(), bad
        loss.backward()
        assert q.grad.isnan().any() and table.grad.isnan().any(), bad
        if bad == "query":  # the table is shared by the batch; a query is its sequence's own
            assert torch.isfinite(q.grad[1]).all()


# --------------------------------------------------------------------------- cope_positions' npos

COPE_POSITIONS_FLAG = next(
    option_flag(field) for field in REGISTRY["cope"].option_fields() if field.name == "cope_max_positions"
)
NPOS_VALUES = [0, -1, 2.5, True, None, "8", 1, 2, 64]


def command_line_refuses(value) -> bool:
    try:
        COPE_POSITIONS_FLAG.convert(value, OptionContext())
    except SpecError:
        return True
    return False


@pytest.mark.parametrize("npos", NPOS_VALUES, ids=[repr(value) for value in NPOS_VALUES])
def test_cope_positions_refuses_the_npos_the_command_line_refuses(npos):
    _, q, k, _ = example(REGISTRY["cope"], 4, 4)
    if command_line_refuses(npos):
        with pytest.raises(ValueError) as error:
            functional.cope_positions(q, k, npos)
        assert str(error.value).startswith("npos "), str(error.value)
    else:
        positions = functional.cope_positions(q, k, npos)
        assert positions.shape == (B, H, 4, 4)
        assert ((positions >= 0) & (positions <= npos - 1)).all()


def test_cope_positions_0_is_refused_not_a_table_of_minus_one():
    """The reported case: ``npos = 0`` gave positions of -1."""
    _, q, k, _ = example(REGISTRY["cope"], 4, 4)
    assert command_line_refuses(0)
    with pytest.raises(ValueError, match=r"^npos must be a positive integer"):
        functional.cope_positions(q, k, 0)


def test_qvi_queries_beyond_its_keys_with_padding_are_refused_naming_the_keys():
    """QVI reads its queries' padding from the keys' (eq. 7); queries past the last key have
    none, which the error names instead of an internal slice."""
    info = next(info for info in INFOS if info.name == "qvi")
    call, _, _, _ = example(info, 5, 3)
    with pytest.raises(ValueError, match=r"queries are among its keys.*src_len 3 keys"):
        call(key_padding_mask=torch.zeros(B, 3, dtype=torch.bool))
