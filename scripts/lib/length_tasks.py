"""Seeded generators of the length-generalization tasks (scripts/make_length_tasks.py
writes them to files; the harness trains small fairseq models on them).

Pure Python, standard library only: no torch, no fairseq, no numpy, so that the data
can be made and checked anywhere. Every generator takes a ``random.Random`` (never the
global ``random`` state) and a length, and returns one example: ``(source, target)``,
two lists of tokens. Tokens are plain lower-case words, digits or punctuation, joined
by single spaces in the files because fairseq's dictionaries split on whitespace; no
task uses ``|`` or anything a fairseq dictionary treats specially (``<s>``, ``</s>``,
``<pad>``, ``<unk>``), nor ``SEPARATOR``, which the decoder-only form puts between the
source and the target (``decoder_only_line``).

Forms. Every task has the decoder-only form (a language model reads ``source = target``
and is scored on completing the target after ``=``, as in Kazemnejad et al. 2023);
copy, reverse and sort also have the encoder-decoder (translation) form, the setting of
Delétang et al. 2023 and Ruoss et al. 2023, where the target is as long as the source.

Lengths. "Length" counts one unit per task, the one whose growth the task is about
(``LengthTask.length_unit``): input symbols for copy/reverse/sort, bits for parity,
digits of each operand for addition, instructions for flip-flop, filler tokens for
passkey. Training and validation lengths are uniform on ``[min_length, L]`` (validation
is in distribution); test bucket ``xK`` draws lengths uniformly from ``((K/2)·L, K·L]``,
i.e. ``K·L//2 + 1 .. K·L``, so the buckets do not overlap and ``x1`` holds the longer
half of the training range, the in-distribution reference the ``x2``, ``x4``...
buckets are compared with (the convention of Kazemnejad et al., whose test lengths are
``(L, 2L]``, and of Ruoss et al., who train up to 40 and test on 41..500).

Formats, with the work each follows:

copy, reverse, sort
    ``n`` letters drawn uniformly from ``a``..``j``; the target is the same letters,
    reversed, or sorted alphabetically (Kazemnejad et al.'s Copy/Reverse/Sort, and
    Delétang et al.'s Reverse String and Bucket Sort). Ten symbols make a chance
    collision between an ``x1`` test example and a training example negligible
    (``10**9`` strings of 9 letters) while the model still has few embeddings to learn.
addition
    two ``n``-digit decimal operands (no leading zero unless ``n`` is 1), every digit a
    token, ``a + b``; the target is the digits of the sum. All numbers are written
    least-significant digit first (``123`` is ``3 2 1``). Kazemnejad et al. write them
    most-significant first, as in text; Delétang et al. and Ruoss et al. use binary
    little-endian. We reverse, as the latter do and as Lee et al. 2023 ("Teaching
    arithmetic to small transformers") and Zhou et al. 2024 recommend: a left-to-right
    decoder then emits each digit after the carry that determines it, so each answer
    digit is a function of two aligned source digits and the previous step, and a
    failure at longer lengths reflects the attention's handling of position (finding
    digit ``j`` of each operand, at a distance that grows with ``n``) rather than a carry
    look-ahead over the whole number that tiny models do not learn even in
    distribution. Both operands have ``n`` digits (Kazemnejad et al. also vary them
    separately); one length per example keeps the buckets clean.
parity
    ``n`` bits; the target is ``even`` or ``odd``, the parity of the number of ones
    (Kazemnejad et al.'s Parity, asked as "is the number of 1s even?", and Delétang et
    al.'s Parity Check).
flip-flop
    Liu et al. 2023 ("Exposing attention glitches with flip-flop language modeling"),
    FFL(0.8): ``n`` instructions, each an op and a bit, ``w`` (write the bit), ``r`` (read:
    its bit is the last written one) or ``i`` (ignore the bit). The first is ``w``, the
    last ``r``, the others ``i`` with probability 0.8 and ``w`` or ``r`` with 0.1 each;
    intermediate reads carry their (correct) bits. The source stops before the final
    read's bit, which is the target.
passkey
    Mohtashami & Jaggi 2023 (landmark attention), the test YaRN (Peng et al. 2023) and
    LongRoPE (Ding et al. 2024) report: ``n`` tokens of their repeated filler text
    (``the grass is green . the sky is blue . ...``), with the sentence ``the pass key is
    D D D D D . remember it .`` inserted after a uniformly random number of them (0..n,
    at any token, not only at a sentence end), then the question ``what is the pass key
    ?``; the target is the five digits (10000 to 99999). Their preamble is left out
    (constant tokens teach a tiny model nothing) and the key is stated once, so the
    answer is the only run of digits in the source.

Training lengths L, chosen so that a 1-2 layer model trains on one CPU thread in a few
minutes: 16 for copy/reverse/sort/parity (33 tokens per decoder-only line at most),
8 digits for addition (17 source tokens, up to 9 answer digits), 32 instructions for
flip-flop (63 source tokens: reads must reach past several distractors), 64 filler
tokens for passkey (83 source tokens). Buckets go to 4·L: x2 is Kazemnejad et al.'s
test range, x4 one step further, and both stay short enough (at most 256 source tokens)
to evaluate on a CPU. Passkey goes to 32·L (2048 filler tokens) because long-range
retrieval is its point and only five tokens are decoded, so long contexts cost
evaluation time only (a model must accept over 2067 positions: fairseq's default
--max-positions / --tokens-per-sample of 1024 or less will not do).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

# bump when any generator's output for a given rng and length changes (task.json records it)
GENERATOR_VERSION = 1

DECODER_ONLY = "decoder-only"
ENCODER_DECODER = "encoder-decoder"
SEPARATOR = "="

Example = Tuple[List[str], List[str]]

LETTERS = tuple("abcdefghij")
DIGITS = tuple("0123456789")
BITS = ("0", "1")
PARITY_ANSWERS = ("even", "odd")
PLUS = "+"
FLIP_FLOP_OPS = ("w", "r", "i")
# Liu et al.'s FFL(p) with p = 0.8, their main training distribution
FLIP_FLOP_IGNORE_PROBABILITY = 0.8
PASSKEY_FILLER = tuple(
    "the grass is green . the sky is blue . the sun is yellow . here we go . there and back again .".split()
)
PASSKEY_INTRO = ("the", "pass", "key", "is")
PASSKEY_OUTRO = (".", "remember", "it", ".")
PASSKEY_QUESTION = tuple("what is the pass key ?".split())
PASSKEY_DIGITS = 5


def _letters(rng: random.Random, length: int) -> List[str]:
    return [rng.choice(LETTERS) for _ in range(length)]


def copy_example(rng: random.Random, length: int) -> Example:
    source = _letters(rng, length)
    return source, list(source)


def reverse_example(rng: random.Random, length: int) -> Example:
    source = _letters(rng, length)
    return source, source[::-1]


def sort_example(rng: random.Random, length: int) -> Example:
    source = _letters(rng, length)
    return source, sorted(source, key=LETTERS.index)


def parity_example(rng: random.Random, length: int) -> Example:
    bits = [rng.choice(BITS) for _ in range(length)]
    return bits, [PARITY_ANSWERS[bits.count("1") % 2]]


def _little_endian(number: int) -> List[str]:
    return list(str(number))[::-1]


def addition_example(rng: random.Random, length: int) -> Example:
    # a leading zero would make an n-digit operand an (n-1)-digit one; 0 itself is a 1-digit number
    low = 0 if length == 1 else 10 ** (length - 1)
    a = rng.randint(low, 10**length - 1)
    b = rng.randint(low, 10**length - 1)
    return [*_little_endian(a), PLUS, *_little_endian(b)], _little_endian(a + b)


def _flip_flop_op(rng: random.Random) -> str:
    # thresholds on one uniform draw, so that the FFL(0.8) mix reads off the constants
    u = rng.random()
    if u < FLIP_FLOP_IGNORE_PROBABILITY:
        return "i"
    return "w" if u < (1 + FLIP_FLOP_IGNORE_PROBABILITY) / 2 else "r"


def flip_flop_example(rng: random.Random, length: int) -> Example:
    ops = ["w"] + [_flip_flop_op(rng) for _ in range(length - 2)] + ["r"]
    tokens: List[str] = []
    memory = ""
    for op in ops:
        bit = memory if op == "r" else rng.choice(BITS)
        if op == "w":
            memory = bit
        tokens += [op, bit]
    return tokens[:-1], tokens[-1:]


def passkey_example(rng: random.Random, length: int) -> Example:
    filler = [PASSKEY_FILLER[i % len(PASSKEY_FILLER)] for i in range(length)]
    key = list(str(rng.randint(10 ** (PASSKEY_DIGITS - 1), 10**PASSKEY_DIGITS - 1)))
    depth = rng.randint(0, length)
    sentence = [*PASSKEY_INTRO, *key, *PASSKEY_OUTRO]
    return filler[:depth] + sentence + filler[depth:] + list(PASSKEY_QUESTION), key


@dataclass(frozen=True)
class LengthTask:
    """One task: its generator, its lengths and what they count, and its forms."""

    name: str
    generate: Callable[[random.Random, int], Example]
    train_length: int  # L
    min_length: int
    multipliers: Tuple[int, ...]  # the test buckets, x1, x2, x4...
    forms: Tuple[str, ...]
    length_unit: str
    vocabulary: Tuple[str, ...]  # every token any example can hold
    description: str

    def train_range(self) -> Tuple[int, int]:
        """Inclusive range of training (and validation) lengths."""
        return self.min_length, self.train_length

    def bucket_range(self, multiplier: int) -> Tuple[int, int]:
        """Inclusive range of test bucket ``x<multiplier>``: ((K/2)L, KL]."""
        return multiplier * self.train_length // 2 + 1, multiplier * self.train_length

    def buckets(self) -> Dict[str, Tuple[int, int]]:
        return {f"x{k}": self.bucket_range(k) for k in self.multipliers}

    def draw(self, rng: random.Random, low: int, high: int) -> Example:
        """One example of a length drawn uniformly from ``low..high`` (inclusive)."""
        if low < self.min_length or high < low:
            raise ValueError(f"{self.name}: no lengths {low}..{high} (the minimum is {self.min_length})")
        return self.generate(rng, rng.randint(low, high))


def decoder_only_line(source: List[str], target: List[str]) -> str:
    """The decoder-only form of an example: the model reads up to ``=`` and completes the rest."""
    return " ".join([*source, SEPARATOR, *target])


def _task(
    name, generate, train_length, unit, vocabulary, description, min_length=1, multipliers=(1, 2, 4), seq2seq=False
):
    forms = (DECODER_ONLY, ENCODER_DECODER) if seq2seq else (DECODER_ONLY,)
    vocabulary = tuple(dict.fromkeys(vocabulary))
    return LengthTask(
        name, generate, train_length, min_length, tuple(multipliers), forms, unit, vocabulary, description
    )


TASKS: Dict[str, LengthTask] = {
    task.name: task
    for task in (
        _task("copy", copy_example, 16, "input symbols", LETTERS, "repeat n letters", seq2seq=True),
        _task("reverse", reverse_example, 16, "input symbols", LETTERS, "n letters in reverse order", seq2seq=True),
        _task("sort", sort_example, 16, "input symbols", LETTERS, "n letters sorted alphabetically", seq2seq=True),
        _task(
            "addition",
            addition_example,
            8,
            "digits per operand",
            (*DIGITS, PLUS),
            "sum of two n-digit numbers, all digits least significant first",
        ),
        _task(
            "parity", parity_example, 16, "bits", (*BITS, *PARITY_ANSWERS), "whether n bits hold an even number of ones"
        ),
        _task(
            "flip-flop",
            flip_flop_example,
            32,
            "instructions",
            (*FLIP_FLOP_OPS, *BITS),
            "the last written bit at the final read of n write/read/ignore instructions",
            min_length=2,
        ),
        _task(
            "passkey",
            passkey_example,
            64,
            "filler tokens",
            (*PASSKEY_FILLER, *PASSKEY_INTRO, *PASSKEY_OUTRO, *PASSKEY_QUESTION, *DIGITS),
            "the 5-digit pass key hidden at a random depth in n filler tokens",
            multipliers=(1, 2, 4, 8, 16, 32),
        ),
    )
}
