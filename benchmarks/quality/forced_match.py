"""Greedy exact match by teacher forcing: ``python -m benchmarks.quality.forced_match``.

A language model's greedy completion of ``PROMPT`` is exactly the answer ``A`` iff, fed
``</s> PROMPT A`` in one forward pass, its argmax after the prompt is each next token of
``A`` and then ``</s>``: given the right prefix, greedy decoding takes these same argmaxes,
one a step, and stops at the first ``</s>``. The rules of fairseq's ``SequenceGenerator``
that can change an argmax are applied: ``<pad>`` is never chosen, NaN scores count as
-inf. The length limit cannot cut a completion short here: the harness leaves room for
the longest answer and a margin.

Why: fairseq's generation forces a language model's prompt one token a step, so a
2000-token prompt costs 2000 incremental steps; one forward pass scores it at once
(``tests/test_length_generalization.py`` checks the two agree per prompt on a trained
model). What forcing cannot tell is how long a wrong completion would have run, so it
counts the ``empty`` completions (``</s>`` straight after the prompt) and not the
over-long ones.

Writes ``--out`` (JSON: ``correct`` and ``empty``, one boolean per prompt, in the order of
``--prompts``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

import torch

# at most this many padded tokens a forward pass, and this many sequences
MAX_TOKENS = 16384
MAX_SENTENCES = 64


def example_tokens(dictionary, prompt: str, answer: str) -> Tuple[torch.Tensor, int]:
    """``</s> PROMPT ANSWER </s>`` as ids, and the answer's token count; an answer token the
    dictionary lacks is ``<unk>``, which greedy decoding would print as ``<unk>``: never a
    match (see :func:`scores`)."""

    def encode(line):
        return dictionary.encode_line(line, add_if_not_exist=False, append_eos=False).long()

    eos, answer_ids = torch.tensor([dictionary.eos()]), encode(answer)
    return torch.cat([eos, encode(prompt), answer_ids, eos]), len(answer_ids)


def batches(lengths: Sequence[int], max_tokens: int, max_sentences: int) -> List[List[int]]:
    """Example indices, longest first, in batches of at most ``max_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, current = [], []
    for index in order:
        width = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1 > max_sentences or (len(current) + 1) * width > max_tokens):
            groups.append(current)
            current = []
        current.append(index)
    return groups + [current] if current else groups


@torch.no_grad()
def scores(model, dictionary, prompts: Sequence[str], answers: Sequence[str], max_tokens: int = MAX_TOKENS) -> Dict:
    """``{"correct": [...], "empty": [...]}``: per prompt, whether greedy decoding completes it
    with exactly its answer, and whether it would stop at once."""
    if not prompts:
        return {"correct": [], "empty": []}
    examples, answer_lengths = zip(*(example_tokens(dictionary, p, a) for p, a in zip(prompts, answers)))
    correct, empty = [False] * len(examples), [False] * len(examples)
    pad, unk = dictionary.pad(), dictionary.unk()
    for group in batches([len(e) for e in examples], max_tokens, MAX_SENTENCES):
        width = len(examples[group[0]]) - 1
        inputs = torch.full((len(group), width), pad, dtype=torch.long)
        for row, index in enumerate(group):  # right-padded: a causal model's earlier positions never see it
            inputs[row, : len(examples[index]) - 1] = examples[index][:-1]
        logits = model(inputs)[0].float()
        logits = logits.masked_fill(torch.isnan(logits), float("-inf"))
        logits[..., pad] = float("-inf")
        chosen = logits.argmax(-1)
        for row, index in enumerate(group):
            targets = examples[index][1:]
            span = slice(len(targets) - answer_lengths[index] - 1, len(targets))
            wanted, got = targets[span], chosen[row, span]
            correct[index] = bool(got.eq(wanted).all()) and not bool(wanted[:-1].eq(unk).any())
            empty[index] = int(got[0]) == dictionary.eos()
    return {"correct": correct, "empty": empty}


def read_lines(path: Path) -> List[str]:
    return path.read_text(encoding="utf-8").splitlines()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.forced_match", description=__doc__.split("\n\n")[0])
    p.add_argument("--path", type=Path, required=True, help="the language model's checkpoint")
    p.add_argument("--data", type=Path, required=True, help="its fairseq-preprocess directory (dict.txt)")
    p.add_argument("--prompts", type=Path, required=True, help="one prompt a line")
    p.add_argument("--answers", type=Path, required=True, help="the answer of each prompt, one a line")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="padded tokens a batch (default: %(default)s)")
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        help="torch's seed: the draws of a model that randomizes its positions in evaluation "
        "(--randomized-positions-at-evaluation; default: %(default)s)",
    )
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import fairseq_distattn  # noqa: F401  (registers the plugin's models; allow-lists checkpoint loading)
    from fairseq_distattn.tools.inspection import load_model

    loaded = load_model(args.path, SimpleNamespace(data=args.data, device="cpu", source_lang=None, target_lang=None))
    prompts, answers = read_lines(args.prompts), read_lines(args.answers)
    if len(prompts) != len(answers):
        raise SystemExit(f"error: {len(prompts)} prompts for {len(answers)} answers")
    torch.manual_seed(args.seed)
    result = scores(loaded.model, loaded.source_dictionary, prompts, answers, args.max_tokens)
    args.out.write_text(json.dumps(result) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
