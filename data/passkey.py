"""Passkey examples mixed into training rows (config.data.passkey_*): the task the retrieval
probes ask about (training/evaluation/probes.py, scripts/eval_long.py), so that a small model learns to
use its whole context for it.

    mix = PasskeyMix.build(tokenizer, fraction=0.5, min_len=128, weight=4.0, repeats=0.75)
    window, weights = mix.insert(window, windows, seed)   # [R, S+1] rows -> rows, [R, S] weights

The template, one document, as the probes write it (a prompt written by hand this way, given
to sample.py, is what the probes ask):

    There is a pass key hidden inside a lot of irrelevant text. Find it and remember it.
    <filler text ...>
    The pass key is 12345. Remember it. 12345 is the pass key.
    <... filler text>
    What is the pass key? The pass key is 12345

The fact sits at any depth of the filler; the answer is the key's digits after "is ", greedily
decoded. With a tokenizer that splits digits (ours, Llama's, Gemma's), a key is five tokens and
the answer is a copy of them.

Keys: 10000 to 99999, split by a fixed hash into training keys and held-out keys (one in
eight, `held_out(key)`). Training examples only ever state training keys; the probes only
held-out ones, so an answer the model gets right is a copy, never a key it was trained on.
Drawn uniformly, about a third of the keys repeat a digit in a row (30039); `repeats` sets that
share of the training keys instead, as the longer stages of configs/passkey.py do.

A row chosen for examples (by seed and window index: the same on a resume) is cut into
examples of `min_len` tokens or more, each its own document (EOS between them), lengths drawn
uniformly from what is left, the filler of each taken in turn from the row's own text (its EOS
made newlines). min_len 0: the whole row is one example. The targets that are the answer's
digits weigh `weight` in the loss (1: like any token).
"""

from __future__ import annotations

import dataclasses

import numpy as np

INTRO = "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it.\n"
KEYS = (10_000, 100_000)  # the keys' range, [low, high)
_HELD_OUT_SHARE = 8  # one key in this many is held out of training


def passkey_texts(key: str) -> tuple[str, str]:
    """(the fact stating `key`, the question asking for it)."""
    return (f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
            "\nWhat is the pass key? The pass key is")


def held_out(key: int) -> bool:
    """Whether `key` is one the probes ask for and training never states: a fixed
    multiplicative hash (no digit pattern a model could learn) puts one key in eight there."""
    return (int(key) * 2654435761) % (1 << 32) < (1 << 32) // _HELD_OUT_SHARE


def repeats_a_digit(key) -> bool:
    """Whether a digit of `key` comes twice in a row (30039): the keys a copy gets wrong first,
    where the digit just written is followed by two different ones in the key."""
    digits = str(key)
    return any(a == b for a, b in zip(digits, digits[1:]))


def draw_key(rng: np.random.Generator, held: bool, repeat: bool | None = None) -> int:
    """A key drawn uniformly from the held-out keys (held=True) or from the training keys;
    repeat True / False: only among those that do / do not repeat a digit in a row."""
    while True:
        key = int(rng.integers(*KEYS))
        if held_out(key) == held and repeat in (None, repeats_a_digit(key)):
            return key


@dataclasses.dataclass(frozen=True)
class PasskeyMix:
    fraction: float  # share of training rows made examples
    min_len: int  # shortest example in tokens; 0 = one example filling the row
    weight: float  # loss weight of the answer's digits
    intro: tuple[int, ...]
    newline: int  # the filler's EOS tokens become this, so an example is one document
    eos: int
    facts: tuple[tuple[int, ...], ...]  # a bank of encoded facts (training keys only) ...
    endings: tuple[tuple[int, ...], ...]  # ... their question + " KEY\n" ...
    answers: tuple[int, ...]  # ... and where in the ending the key's digits start
    shortest: int  # tokens of the longest fact's example with no filler, its EOS included

    @classmethod
    def build(cls, tokenizer, fraction: float, min_len: int = 0, weight: float = 1.0,
              repeats: float = 0.0, bank: int = 8192, seed: int = 1234):
        rng = np.random.default_rng(seed)
        facts, endings, answers = [], [], []
        # The first `repeats` share of the bank repeats a digit in a row, the rest does not;
        # 0: every key as drawn (the bank as it was before the option).
        with_repeat = round(repeats * bank)
        for i in range(bank):
            key = str(draw_key(rng, held=False, repeat=(i < with_repeat) if repeats else None))
            fact, question = passkey_texts(key)
            question_ids = tokenizer.encode(question)
            answer_ids = tokenizer.encode(f" {key}\n")
            facts.append(tuple(tokenizer.encode(fact)))
            endings.append(tuple(question_ids + answer_ids))
            # The answer's tokens but the newline: with split digits, the space and 5 digits.
            answers.append(len(question_ids))
        newline = tokenizer.encode("\n")
        intro = tuple(tokenizer.encode(INTRO))
        shortest = len(intro) + max(map(len, facts)) + max(map(len, endings)) + 2
        return cls(float(fraction), int(min_len), float(weight), intro, newline[-1],
                   tokenizer.eos_id, tuple(facts), tuple(endings), tuple(answers), shortest)

    def insert(self, window: np.ndarray, windows: np.ndarray,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
        """window [R, S+1] tokens of windows [R] -> (the same, some rows made examples;
        float32 [R, S] loss weights of their targets)."""
        out = window.copy()
        weights = np.ones((window.shape[0], window.shape[1] - 1), np.float32)
        for r, index in enumerate(windows):
            rng = np.random.default_rng([seed, int(index), 7])
            if rng.random() >= self.fraction:
                continue
            text = np.where(window[r] == self.eos, self.newline, window[r])
            start, size = 0, window.shape[1]
            while size - start >= self.shortest + 1:
                left = size - start
                length = left  # the last example takes what is left
                if self.min_len and left >= 2 * self.min_len:
                    length = int(rng.integers(self.min_len, left + 1))
                    if left - length < self.min_len:
                        length = left
                example, answer = self._example(text[start:], length, rng)
                out[r, start:start + length] = example
                # The answer (the space and the digits, not the newline): targets of the slots
                # before its tokens.
                weights[r, start + answer - 1:start + length - 3] = self.weight
                start += length
        return out, weights

    def _example(self, text: np.ndarray, length: int, rng) -> tuple[np.ndarray, int]:
        """One example of exactly `length` tokens, ending in EOS, and where its answer
        starts."""
        pick = int(rng.integers(len(self.facts)))
        fact, ending = self.facts[pick], self.endings[pick]
        room = length - len(self.intro) - len(fact) - len(ending) - 1
        cut = int(round(rng.random() * room))
        example = np.concatenate([self.intro, text[:cut], fact, text[cut:room], ending,
                                  [self.eos]]).astype(text.dtype)
        return example, length - 1 - len(ending) + self.answers[pick]
