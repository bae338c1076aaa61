"""``--criterion answer_cross_entropy`` (fairseq_distattn/criterions): the loss of the
decoder-only length-generalization tasks is the cross-entropy of each sample's answer,
what follows its first separator, and nothing else. Checked on a tiny LM and hand-made
batches against the cross-entropy computed by hand, through the logits' gradients, and
with padding."""

from __future__ import annotations

import math

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.logging import metrics
from fairseq.tasks.language_modeling import LanguageModelingTask

from fairseq_distattn.criterions.answer_cross_entropy import AnswerCrossEntropyCriterion, answer_mask

from .model_helpers import TINY_LM, parse

SEPARATOR = "="
WORDS = [f"w{i}" for i in range(8)]


def build(separator: str = SEPARATOR):
    """A tiny LM, its dictionary (holding ``=``) and the criterion as fairseq builds it from the flags."""
    torch.manual_seed(0)
    args = parse(
        "language_modeling",
        "distattn_lm",
        [*TINY_LM, "--criterion", "answer_cross_entropy", "--answer-separator", separator],
    )
    dictionary = Dictionary()
    for word in [*WORDS, SEPARATOR]:
        dictionary.add_symbol(word)
    task = LanguageModelingTask(args, dictionary)
    model = task.build_model(args).double().eval()
    return model, dictionary, task.build_criterion(args)


def lines_batch(dictionary: Dictionary, lines):
    """A language-modelling batch of whole lines as ``--sample-break-mode eos`` makes it: each
    target the line and its end of sentence, its source the same shifted right after an eos,
    right-padded."""
    pad, eos = dictionary.pad(), dictionary.eos()
    targets = [[dictionary.index(word) for word in line.split()] + [eos] for line in lines]
    width = max(len(t) for t in targets)
    target = torch.tensor([t + [pad] * (width - len(t)) for t in targets])
    source = torch.tensor([[eos] + t[:-1] + [pad] * (width - len(t)) for t in targets])
    return {
        "id": torch.arange(len(lines)),
        "net_input": {"src_tokens": source, "src_lengths": torch.tensor([len(t) for t in targets])},
        "target": target,
        "ntokens": sum(len(t) for t in targets),
        "nsentences": len(lines),
    }


def answer_positions(line: str):
    """The target positions of a line's answer, by hand: past its first separator, and its eos."""
    words = line.split()
    return list(range(words.index(SEPARATOR) + 1, len(words) + 1))


def hand_loss(model, sample, lines) -> float:
    """fairseq's log-probabilities are float32 whatever the model's dtype: the sums agree to float32's precision."""
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
    target = sample["target"]
    return -sum(float(lprobs[row, i, target[row, i]]) for row, line in enumerate(lines) for i in answer_positions(line))


class FixedOutput(torch.nn.Module):
    """The model with its logits made a leaf: the criterion's gradient with respect to each
    position's logits is then readable."""

    def __init__(self, model, sample):
        super().__init__()
        self.model = model
        with torch.no_grad():
            logits, extra = model(**sample["net_input"])
        self.logits = logits.clone().requires_grad_(True)
        self.extra = extra

    def forward(self, **net_input):
        return self.logits, self.extra

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return self.model.get_normalized_probs(net_output, log_probs, sample)

    def get_targets(self, sample, net_output):
        return self.model.get_targets(sample, net_output)


def test_the_loss_is_the_cross_entropy_of_the_answer_tokens_alone():
    model, dictionary, criterion = build()
    assert isinstance(criterion, AnswerCrossEntropyCriterion)
    lines = ["w1 w2 w3 = w3 w2 w1", "w4 = w4"]
    sample = lines_batch(dictionary, lines)
    loss, sample_size, logging_output = criterion(model, sample)
    assert sample_size == sum(len(answer_positions(line)) for line in lines) == 6
    assert math.isclose(loss.item(), hand_loss(model, sample, lines), rel_tol=1e-6)
    assert logging_output["sample_size"] == 6 and logging_output["nsentences"] == 2
    assert logging_output["ntokens"] == sample["ntokens"] == 12  # every token: fairseq's throughput meters


def test_tokens_before_and_at_the_separator_get_no_gradient():
    model, dictionary, criterion = build()
    lines = ["w1 w2 w3 = w3 w2 w1"]
    sample = lines_batch(dictionary, lines)
    fixed = FixedOutput(model, sample)
    loss, _, _ = criterion(fixed, sample)
    loss.backward()
    per_position = fixed.logits.grad.abs().sum(dim=-1)[0]
    separator_at = lines[0].split().index(SEPARATOR)
    assert not per_position[: separator_at + 1].any()  # the source and the separator
    assert per_position[separator_at + 1 :].gt(0).all()  # the answer and its eos


def test_a_padded_batch_scores_each_line_as_alone_and_its_padding_not_at_all():
    model, dictionary, criterion = build()
    # the second separator of the last line is part of its answer: only the first one starts it
    lines = ["w1 w2 w3 w4 w5 = w5", "w6 = w6 w6 w6 w6", "w7 w7 = = w7"]
    sample = lines_batch(dictionary, lines)
    assert sample["target"].eq(dictionary.pad()).any()
    loss, sample_size, _ = criterion(model, sample)
    alone = [criterion(model, lines_batch(dictionary, [line])) for line in lines]
    assert sample_size == sum(size for _, size, _ in alone) == 2 + 5 + 3
    assert math.isclose(loss.item(), sum(line_loss.item() for line_loss, _, _ in alone), rel_tol=1e-6)
    assert math.isclose(loss.item(), hand_loss(model, sample, lines), rel_tol=1e-6)
    fixed = FixedOutput(model, sample)
    criterion(fixed, sample)[0].backward()
    padded = sample["target"].eq(dictionary.pad())
    assert not fixed.logits.grad.abs().sum(dim=-1)[padded].any()


def test_the_answer_mask_starts_after_the_first_separator():
    sep, pad = 9, 1
    target = torch.tensor([[5, 9, 6, 2], [5, 6, 2, 1], [9, 9, 2, 1]])
    expected = [[False, False, True, True], [False, False, False, False], [False, True, True, False]]
    assert answer_mask(target, sep, pad).tolist() == expected


def test_the_logged_loss_is_per_answer_token_in_bits():
    model, dictionary, criterion = build()
    sample = lines_batch(dictionary, ["w1 w2 = w2 w1", "w3 = w3"])
    loss, sample_size, logging_output = criterion(model, sample)
    with metrics.aggregate(new_root=True) as aggregated:
        AnswerCrossEntropyCriterion.reduce_metrics([logging_output])
        logged = aggregated.get_smoothed_values()
    assert logged["loss"] == round(loss.item() / sample_size / math.log(2), 3)
    assert math.isclose(logged["ppl"], 2 ** logged["loss"], rel_tol=1e-2)


def test_a_separator_outside_the_dictionary_is_refused_when_the_criterion_is_built():
    with pytest.raises(ValueError, match="--answer-separator '#' is not in the target dictionary"):
        build("#")
