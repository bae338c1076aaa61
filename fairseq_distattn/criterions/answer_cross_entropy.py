"""``--criterion answer_cross_entropy``: cross-entropy on the answer of each sample only.

A decoder-only task line reads ``SOURCE = ANSWER`` (``--task language_modeling
--sample-break-mode eos``: one line a sample). The papers on length generalization
(Kazemnejad et al. 2023, Ruoss et al. 2023) score the model on the answer alone: the
source is a random string the model cannot predict, and its loss would swamp the
signal of the answer and reward memorising the source distribution. So the loss
sums the targets after the first ``--answer-separator`` of each sample (the answer
and its end of sentence), nothing before it nor the separator itself, and the sample
size is the number of those tokens. A sample without the separator scores nothing.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

DEFAULT_SEPARATOR = "="


@dataclass
class AnswerCrossEntropyConfig(FairseqDataclass):
    answer_separator: str = field(
        default=DEFAULT_SEPARATOR,
        metadata={
            "help": "the token after which a sample's answer starts: only the targets after its first "
            "occurrence in each sample are scored"
        },
    )


def answer_mask(target: torch.Tensor, separator: int, pad: int) -> torch.Tensor:
    """Where ``target`` (batch x time) holds an answer token: after the first ``separator``
    of its row, not the separator itself, not padding."""
    seen = (target == separator).cumsum(dim=1) > 0
    # shifted one step right: the first separator is not part of the answer, what follows it is
    after = F.pad(seen[:, :-1], (1, 0), value=False)
    return after & (target != pad)


@register_criterion("answer_cross_entropy", dataclass=AnswerCrossEntropyConfig)
class AnswerCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, answer_separator=DEFAULT_SEPARATOR):
        super().__init__(task)
        dictionary = task.target_dictionary
        self.separator = dictionary.index(answer_separator)
        if self.separator == dictionary.unk():
            raise ValueError(
                f"--answer-separator {answer_separator!r} is not in the target dictionary: no sample could have "
                "an answer (give the token that separates source and answer in the data)"
            )

    def forward(self, model, sample, reduce=True):
        """The summed answer loss, the number of answer tokens (the sample size), and the logging outputs."""
        net_output = model(**sample["net_input"])
        target = model.get_targets(sample, net_output)
        answer = answer_mask(target, self.separator, self.padding_idx)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        loss = F.nll_loss(
            lprobs.view(-1, lprobs.size(-1)),
            target.masked_fill(~answer, self.padding_idx).view(-1),
            ignore_index=self.padding_idx,
            reduction="sum" if reduce else "none",
        )
        answer_tokens = int(answer.sum())
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": target.size(0),
            "sample_size": answer_tokens,
        }
        return loss, answer_tokens, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """``loss`` (base 2) and ``ppl`` per answer token, as ``cross_entropy`` logs them per token;
        ``ntokens`` (every token of the batch) only feeds fairseq's throughput meters."""
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        # a batch of samples without a separator has no answer: no loss rather than a division by zero
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
