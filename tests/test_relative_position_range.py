"""Relative positions beyond the sequence cost nothing and change nothing.

A clipping distance k larger than any distance in the call must give exactly
the result of k = L - 1 (the rows of the [2k+1, D] tables that no distance
reaches get no gradient), and the work must depend on the sequence, not on k.
"""

import argparse

import pytest
import torch

from fairseq_distattn import functional
from fairseq_distattn.functional.relative_position import rows_within_reach
from fairseq_distattn.registry import DECODER_SELF, ENCODER_SELF
from fairseq_distattn.spec import AttentionOptions, SpecError

from .model_helpers import TINY, translation_model

LENGTH, HEADS, DIM = 7, 2, 4

CASES = [
    # (tgt_len, src_len, query_offset, causal, padded, with values, need_weights)
    pytest.param(LENGTH, LENGTH, 0, False, False, True, True, id="full"),
    pytest.param(LENGTH, LENGTH, 0, False, True, True, True, id="full-padded"),
    pytest.param(LENGTH, LENGTH, 0, True, False, True, True, id="causal"),
    pytest.param(LENGTH, LENGTH, 0, False, False, False, False, id="keys-only-fused"),
    pytest.param(1, LENGTH, LENGTH - 1, True, False, True, True, id="incremental-step"),
    pytest.param(3, LENGTH, LENGTH - 3, True, True, True, True, id="query-block-with-offset"),
]


def run(tgt_len, src_len, query_offset, causal, padded, with_values, need_weights, max_distance, tables):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, HEADS, n, DIM, generator=generator, dtype=torch.float64) for n in (tgt_len, src_len, src_len)
    )
    padding = None
    if padded:
        padding = torch.zeros(2, src_len, dtype=torch.bool)
        padding[1, :2] = True
    rel_keys, rel_values = (table.clone().requires_grad_() for table in tables)
    out, probs = functional.relative_position_attention(
        q,
        k,
        v,
        rel_keys,
        rel_values if with_values else None,
        max_distance,
        key_padding_mask=padding,
        causal=causal,
        query_offset=query_offset,
        need_weights=need_weights,
    )
    (out.square().sum() + (probs.sum() if probs is not None else 0)).backward()
    return out, probs, rel_keys.grad, rel_values.grad


@pytest.mark.parametrize("tgt_len,src_len,query_offset,causal,padded,with_values,need_weights", CASES)
def test_clipping_beyond_the_sequence_equals_clipping_at_its_length(
    tgt_len, src_len, query_offset, causal, padded, with_values, need_weights
):
    small_k, large_k = LENGTH - 1, 10 * LENGTH
    generator = torch.Generator().manual_seed(1)
    large_tables = [torch.randn(2 * large_k + 1, DIM, generator=generator, dtype=torch.float64) for _ in range(2)]
    reached = slice(large_k - small_k, large_k + small_k + 1)
    small_tables = [table[reached] for table in large_tables]
    case = (tgt_len, src_len, query_offset, causal, padded, with_values, need_weights)

    small_out, small_probs, small_key_grad, small_value_grad = run(*case, small_k, small_tables)
    large_out, large_probs, large_key_grad, large_value_grad = run(*case, large_k, large_tables)
    torch.testing.assert_close(large_out, small_out, rtol=0, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(large_probs, small_probs, rtol=0, atol=1e-12)
    torch.testing.assert_close(large_key_grad[reached], small_key_grad, rtol=0, atol=1e-12)
    unreached = torch.ones(2 * large_k + 1, dtype=torch.bool)
    unreached[reached] = False
    assert (large_key_grad[unreached] == 0).all()
    if with_values:
        torch.testing.assert_close(large_value_grad[reached], small_value_grad, rtol=0, atol=1e-12)
        assert (large_value_grad[unreached] == 0).all()


def test_the_tables_are_cut_to_the_longest_distance_of_the_call():
    keys, values = torch.zeros(2 * 1000 + 1, DIM), torch.zeros(2 * 1000 + 1, DIM)
    cut_keys, cut_values, used = rows_within_reach(keys, values, 1000, 30, 30, 0)
    assert used == 29 and cut_keys.shape == cut_values.shape == (59, DIM)
    # an incremental step at position 40 reaches back to key 0
    assert rows_within_reach(keys, None, 1000, 1, 41, 40)[2] == 40
    # k within the sequence: the tables are used whole
    assert rows_within_reach(keys, values, 1000, 2000, 2000, 0)[0] is keys


def test_k_is_checked_against_the_longest_sequence_of_each_stack_that_uses_rpr():
    options = AttentionOptions.from_args(argparse.Namespace(max_relative_position=16), 1024)
    with pytest.raises(SpecError) as error:
        options.check_kind(ENCODER_SELF, ["vanilla", "rpr"], 4, "--max-source-positions")
    message = str(error.value)
    assert message.startswith("argument --max-relative-position: invalid value '16'")
    assert "--encoder-self-attention uses rpr" in message and "(--max-source-positions 4)" in message
    options.check_kind(ENCODER_SELF, ["vanilla", "da"], 4, "--max-source-positions")  # no rpr there
    options.check_kind(DECODER_SELF, ["rpr", "rpr"], 16, "--max-target-positions")  # k = the stack's length
    with pytest.raises(SpecError, match=r"\(--max-target-positions 15\)"):
        options.check_kind(DECODER_SELF, ["rpr", "vanilla"], 15, "--max-target-positions")


def test_a_short_source_side_does_not_bound_k_of_the_decoder():
    """--max-source-positions bounds only the encoder's k: rpr in the decoder alone builds."""
    extra = [*TINY, "--decoder-self-attention", "rpr", "--max-relative-position", "16"]
    model, _ = translation_model(extra=[*extra, "--max-source-positions", "4", "--max-target-positions", "64"])
    assert model.decoder.layers[0].self_attn.mechanism.relative_keys.shape[0] == 2 * 16 + 1


def test_a_short_source_side_bounds_k_of_the_encoder(capsys):
    extra = [*TINY, "--encoder-self-attention", "rpr@1", "--max-relative-position", "16"]
    with pytest.raises(SystemExit) as stop:
        translation_model(extra=[*extra, "--max-source-positions", "4"])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --max-relative-position: invalid value '16'" in line and "--max-source-positions 4" in line


def test_rpr_clipping_benchmark_reports_a_ratio_against_its_target(tmp_path, capsys):
    import json

    from benchmarks.speed import rpr_clipping

    out = tmp_path / "rpr.json"
    assert (
        rpr_clipping.main(
            [
                "--scale",
                "tiny",
                "--length",
                "8",
                "--sentences",
                "2",
                "--repeats",
                "1",
                "--min-time",
                "0.01",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert "throughput k=1024 / k=16" in lines[0] and lines[0].split()[-1] in ("PASS", "MISS")
    result = json.loads(out.read_text())
    assert result["target"] == 0.95 and result["train_ratio"]["median"] > 0 and result["op_ratio"]["n"] == 1


def test_a_checkpoint_with_k_beyond_its_source_positions_trained_before_the_check_still_builds():
    from fairseq.tasks.translation import TranslationTask

    from .model_helpers import dictionary, parse

    args = parse("translation", "distattn_transformer", [*TINY, "--encoder-self-attention", "rpr@1"])
    args.max_relative_position, args.max_source_positions = 16, 4  # as a checkpoint from before the check
    d = dictionary()
    model = TranslationTask(args, d, d).build_model(args)
    assert model.encoder.layers[1].self_attn.mechanism.relative_keys.shape[0] == 2 * 16 + 1
