"""Retrieval probes: can a model find a fact placed anywhere in a long context?

    prompt, answer = PROBES["passkey"].make(tokenizer, filler, length=4096, depth=0.5, rng=rng)
    rows = grid(PROBES["needle"], tokenizer, filler, lengths, depths, samples, seed)

- passkey: a 5-digit key stated once inside filler text, asked for at the end ("What is the
  pass key? The pass key is"), as in the long-context papers' passkey retrieval.
- needle: a sentence naming a city's "special magic number" at a depth of the haystack, the
  question naming the city at the end (needle in a haystack).

The filler is held-out text of the run's own corpus (its token stream, never anything the model
could not have seen the like of), so only the fact is out of place. `depth` is where the fact
starts, as a fraction of the filler (0: right after the instruction, 1: just before the
question). A probe's prompt is exactly `length` tokens; the answer is scored exactly: the digits
of the greedy continuation must be the fact's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np

from data.passkey import INTRO as PASSKEY_INTRO, passkey_texts

CITIES = ("Lisbon", "Nairobi", "Osaka", "Quito", "Tromso", "Hanoi", "Perth", "Tbilisi",
          "Cusco", "Dakar", "Bergen", "Oaxaca", "Kazan", "Hobart", "Izmir", "Lyon")


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    intro: str  # before the haystack
    fact: Callable[[np.random.Generator], tuple[str, str, str]]  # rng -> (fact, question, answer)

    def make(self, tokenizer, filler: np.ndarray, length: int, depth: float,
             rng: np.random.Generator) -> tuple[list[int], str]:
        """(prompt ids of exactly `length` tokens, the answer's digits)."""
        fact, question, answer = self.fact(rng)
        intro, fact_ids, question_ids = (tokenizer.encode(t) for t in (self.intro, fact,
                                                                        question))
        room = length - len(intro) - len(fact_ids) - len(question_ids)
        if room < 1:
            raise ValueError(f"a {self.name} prompt needs more than {length} tokens")
        if len(filler) < room:
            raise ValueError(f"{len(filler):,} tokens of filler text are fewer than the "
                             f"{room:,} a {length:,}-token {self.name} prompt needs")
        start = int(rng.integers(0, len(filler) - room + 1))
        hay = [int(t) for t in filler[start:start + room]]
        cut = int(round(depth * room))
        return intro + hay[:cut] + fact_ids + hay[cut:] + question_ids, answer


def _passkey(rng):  # the texts the training examples use (data.passkey_fraction)
    key = str(int(rng.integers(10_000, 100_000)))
    return (*passkey_texts(key), key)


def _needle(rng):
    city, number = CITIES[int(rng.integers(len(CITIES)))], str(int(rng.integers(10_000, 100_000)))
    return (f"\nThe special magic number for {city} is {number}.\n",
            f"\nWhat is the special magic number for {city}? The special magic number for "
            f"{city} is", number)


PROBES = {
    "passkey": Probe("passkey", PASSKEY_INTRO, _passkey),
    "needle": Probe("needle", "A special magic number is hidden in this text. Find it.\n",
                    _needle),
}


def answered(text: str, answer: str) -> bool:
    """Whether a continuation gives the answer: its first run of digits is exactly it."""
    found = re.search(r"\d+", text)
    return bool(found) and found.group() == answer


def grid(probe: Probe, tokenizer, filler, lengths, depths, samples: int, seed: int = 0):
    """[(length, depth, prompts, answers)] for every cell of the grid, `samples` prompts each,
    drawn reproducibly from `seed`."""
    rng = np.random.default_rng(seed)
    cells = []
    for length in lengths:
        for depth in depths:
            made = [probe.make(tokenizer, filler, length, depth, rng) for _ in range(samples)]
            cells.append((length, depth, [m[0] for m in made], [m[1] for m in made]))
    return cells


def accuracy(cells, generate, tokenizer, progress=None) -> list[float]:
    """The share of exact answers in each cell of `grid`'s output. generate(prompts) -> each
    row's prompt + greedy continuation; progress(done, total) after each cell."""
    out = []
    for i, (_, _, prompts, answers) in enumerate(cells):
        rows = generate(prompts)
        right = [answered(tokenizer.decode([int(t) for t in row[len(prompt):]]), answer)
                 for row, prompt, answer in zip(rows, prompts, answers)]
        out.append(sum(right) / len(right))
        if progress is not None:
            progress(i + 1, len(cells))
    return out
