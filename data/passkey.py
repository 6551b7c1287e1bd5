"""Passkey examples mixed into training rows (config.data.passkey_fraction): the task the
retrieval probes ask about (training/probes.py), so that a small model can learn to use its
whole context for it.

    mix = PasskeyMix.build(tokenizer, fraction=0.1)        # at data preparation
    window = mix.insert(window, windows, seed)              # [R, S+1] rows, some made examples

A row chosen (by seed and window index: the same on a resume) becomes one document:

    INTRO  text of the window (its EOS made newlines)  FACT at a random depth  ...  QUESTION key\\n

where FACT states a 5-digit key and QUESTION asks for it; the row's own text is the filler, so
the example is as long as the sequence and the key can sit anywhere in it. The texts are the
probes' own, encoded piece by piece as the probes encode them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

INTRO = "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it.\n"


def passkey_texts(key: str) -> tuple[str, str]:
    """(the fact stating `key`, the question asking for it)."""
    return (f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n",
            "\nWhat is the pass key? The pass key is")


@dataclasses.dataclass(frozen=True)
class PasskeyMix:
    fraction: float
    intro: tuple[int, ...]
    newline: int  # a row's EOS tokens become this, so the row is one document
    eos: int
    facts: tuple[tuple[int, ...], ...]  # a bank of encoded facts ...
    endings: tuple[tuple[int, ...], ...]  # ... and their question + " KEY\n"

    @classmethod
    def build(cls, tokenizer, fraction: float, bank: int = 2048, seed: int = 1234):
        rng = np.random.default_rng(seed)
        facts, endings = [], []
        for key in rng.integers(10_000, 100_000, bank):
            fact, question = passkey_texts(str(key))
            facts.append(tuple(tokenizer.encode(fact)))
            endings.append(tuple(tokenizer.encode(question) + tokenizer.encode(f" {key}\n")))
        newline = tokenizer.encode("\n")
        return cls(float(fraction), tuple(tokenizer.encode(INTRO)), newline[-1],
                   tokenizer.eos_id, tuple(facts), tuple(endings))

    def insert(self, window: np.ndarray, windows: np.ndarray, seed: int) -> np.ndarray:
        """window [R, S+1] tokens of windows [R] -> the same, some rows made examples."""
        out = window.copy()
        for r, index in enumerate(windows):
            rng = np.random.default_rng([seed, int(index), 7])
            if rng.random() >= self.fraction:
                continue
            pick = int(rng.integers(len(self.facts)))
            fact, ending = self.facts[pick], self.endings[pick]
            room = window.shape[1] - len(self.intro) - len(fact) - len(ending)
            if room < 1:
                continue  # sequences too short for an example stay text
            text = np.where(window[r, :room] == self.eos, self.newline, window[r, :room])
            cut = int(round(rng.random() * room))
            out[r] = np.concatenate([self.intro, text[:cut], fact, text[cut:], ending])
        return out
