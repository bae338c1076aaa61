"""A checkpoint records what its mechanisms computed (``distattn_revisions``); one made
by an earlier revision is converted exactly or refused in one line, never run as
another model. ``rope-rotate-half.checkpoint`` was made by the plugin at 5a4b114, when
rope paired dimension i with i + d/2 (``make_fixture.py``, 2 heads of 16 dimensions,
``--rope-fraction 0.5``); today's code pairs neighbouring dimensions."""

import argparse
from pathlib import Path

import pytest
import torch

import fairseq_distattn.mechanisms  # noqa: F401 (registers the mechanisms)
from fairseq_distattn.patches.checkpoint_upgrade import (
    REVISIONS_ATTR,
    CheckpointRefused,
    arithmetic_record,
    inferred_revision,
    parse_record,
)
from fairseq_distattn.registry import REGISTRY, registered

from .model_helpers import TINY_LM, old_checkpoint_log_probabilities, parse

FIXTURES = Path(__file__).resolve().parent / "data" / "old_checkpoints"


def test_the_fixture_is_from_the_rotate_half_revision():
    assert (FIXTURES / "rope-rotate-half.revision").read_text().strip() == "5a4b114"
    state = torch.load(FIXTURES / "rope-rotate-half.checkpoint", weights_only=False)
    config = state["cfg"]["model"]
    assert getattr(config, REVISIONS_ATTR, None) is None and getattr(config, "kerple_kernel", None) is None


def test_a_checkpoint_that_cannot_tell_its_revision_is_refused_naming_the_override(capsys):
    with pytest.raises(SystemExit) as exit_info:
        old_checkpoint_log_probabilities("rope-rotate-half")
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1
    assert "rotate-half" in message and "'distattn_revisions': 'rope:N'" in message


def test_the_rotate_half_revision_is_converted_exactly():
    """Named as revision 1, its query and key projection rows are permuted to neighbouring
    pairs: what 5a4b114 computed, to float32 rounding (the models are float32); named as
    revision 2 it would run as another model."""
    expected = torch.load(FIXTURES / "rope-rotate-half.logprobs")
    converted = old_checkpoint_log_probabilities("rope-rotate-half", {REVISIONS_ATTR: "rope:1"})
    torch.testing.assert_close(converted, expected, rtol=0, atol=1e-5)
    unconverted = old_checkpoint_log_probabilities("rope-rotate-half", {REVISIONS_ATTR: "rope:2"})
    assert (unconverted - expected).abs().max() > 0.1


def test_a_model_built_now_records_its_revisions():
    args = parse("language_modeling", "distattn_lm", [*TINY_LM, "--decoder-self-attention", "rope@0,alibi@1"])
    assert arithmetic_record(args, "distattn_lm") == "alibi:1,rope:2"
    from fairseq.tasks.language_modeling import LanguageModelingTask

    from .model_helpers import dictionary

    task = LanguageModelingTask(args, dictionary())
    task.build_model(args)
    assert getattr(args, REVISIONS_ATTR) == "alibi:1,rope:2"


def test_a_checkpoint_without_a_record_is_read_from_the_options_it_records():
    """kerple_kernel came 2.5 hours after rope's neighbouring pairs: a checkpoint recording
    it pairs neighbours; one without it could be from either revision."""
    rope = REGISTRY["rope"]
    assert inferred_revision(argparse.Namespace(kerple_kernel="log"), rope) == 2
    assert inferred_revision(argparse.Namespace(), rope) is None


@pytest.mark.parametrize("text", ["rope:3", "rope:0", "rope", "nosuch:1", "rope:x"])
def test_a_record_naming_no_revision_is_refused(text):
    with pytest.raises(CheckpointRefused, match=REVISIONS_ATTR):
        parse_record(text)


def test_every_revision_after_the_first_says_how_to_tell_it_or_convert_to_it():
    for info in registered():
        assert [r.number for r in info.revisions] == list(range(1, len(info.revisions) + 1))
        for revision in info.revisions[1:]:
            assert revision.recorded_after or revision.query_key_rows_from_previous, info.name
