"""Retrieval probes: can a model find a fact placed anywhere in a long context?

    prompt, answer = PROBES["passkey"].make(tokenizer, filler, length=4096, depth=0.5, rng=rng)
    rows = grid(PROBES["needle"], tokenizer, filler, lengths, depths, samples, seed)

- passkey: a 5-digit key stated in one place of the filler text, asked for at the end ("What
  is the pass key? The pass key is"), as in the long-context papers' passkey retrieval; the
  template data/passkey.py documents, and always a key training never states (held out).
- needle: a sentence naming a city's "special magic number" at a depth of the haystack, the
  question naming the city at the end (needle in a haystack).

The filler is held-out text of the run's own corpus (its token stream, never anything the model
could not have seen the like of), so only the fact is out of place. `depth` is where the fact
starts, as a fraction of the filler (0: right after the instruction, 1: just before the
question). A probe's prompt is exactly `length` tokens, and they are the encoding of its text:
the text written to a file and given to sample.py is the same prompt. The answer is scored
exactly: the first digits of the greedy continuation must be the fact's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np

from data.passkey import INTRO as PASSKEY_INTRO, draw_key, passkey_texts

_TRIES = 8  # attempts at a prompt of the exact length (the filler re-encoded each time)
CITIES = ("Lisbon", "Nairobi", "Osaka", "Quito", "Tromso", "Hanoi", "Perth", "Tbilisi",
          "Cusco", "Dakar", "Bergen", "Oaxaca", "Kazan", "Hobart", "Izmir", "Lyon")


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    intro: str  # before the haystack
    fact: Callable[[np.random.Generator], tuple[str, str, str]]  # rng -> (fact, question, answer)

    def make(self, tokenizer, filler: np.ndarray, length: int, depth: float,
             rng: np.random.Generator) -> tuple[list[int], str]:
        """(prompt ids of exactly `length` tokens, the answer's digits). The ids are the
        encoding of the prompt's text (`tokenizer.decode(ids)`), so that text written to a file
        and given to sample.py is this very prompt."""
        fact, question, answer = self.fact(rng)
        fixed = len(tokenizer.encode(self.intro + fact + question))
        room = length - fixed
        if room < 1:
            raise ValueError(f"a {self.name} prompt needs more than {length} tokens")
        for _ in range(_TRIES):  # the filler's tokens, decoded and encoded again, may merge
            if len(filler) < room:
                raise ValueError(f"{len(filler):,} tokens of filler text are fewer than the "
                                 f"{room:,} a {length:,}-token {self.name} prompt needs")
            start = int(rng.integers(0, len(filler) - room + 1))
            hay = [int(t) for t in filler[start:start + room]]
            cut = int(round(depth * room))
            text = (self.intro + tokenizer.decode(hay[:cut]) + fact + tokenizer.decode(hay[cut:])
                    + question)
            ids = tokenizer.encode(text)
            if len(ids) == length:
                return ids, answer
            room += length - len(ids)
        raise ValueError(f"could not make a {length:,}-token {self.name} prompt from this "
                         f"filler in {_TRIES} tries: its text does not re-encode stably")


def _passkey(rng):  # the template training examples use, with a key they never state
    key = str(draw_key(rng, held=True))
    return (*passkey_texts(key), key)


def _needle(rng):
    city, number = CITIES[int(rng.integers(len(CITIES)))], str(draw_key(rng, held=True))
    return (f"\nThe special magic number for {city} is {number}.\n",
            f"\nWhat is the special magic number for {city}? The special magic number for "
            f"{city} is", number)


PROBES = {
    "passkey": Probe("passkey", PASSKEY_INTRO, _passkey),
    "needle": Probe("needle", "A special magic number is hidden in this text. Find it.\n",
                    _needle),
}


def reply(text: str) -> str:
    """The answer a continuation gives: its first run of digits ('' when it has none)."""
    found = re.search(r"\d+", text)
    return found.group() if found else ""


def answered(text: str, answer: str) -> bool:
    """Whether a continuation gives the answer: its first run of digits is exactly it."""
    return reply(text) == answer


def grid(probe: Probe, tokenizer, filler, lengths, depths, samples: int, seed: int = 0):
    """[(length, depth, prompts, answers)] for every cell of the grid, `samples` prompts each,
    drawn reproducibly from `seed` (the keys, the filler's offsets)."""
    rng = np.random.default_rng(seed)
    cells = []
    for length in lengths:
        for depth in depths:
            made = [probe.make(tokenizer, filler, length, depth, rng) for _ in range(samples)]
            cells.append((length, depth, [m[0] for m in made], [m[1] for m in made]))
    return cells


def replies(cells, generate, tokenizer, progress=None) -> list[list[str]]:
    """Each prompt's reply (`reply` of its greedy continuation), cell by cell, for `grid`'s
    output. generate(prompts) -> each row's prompt + continuation; progress(done, total) after
    each cell."""
    out, eos = [], getattr(tokenizer, "eos_id", None)
    for i, (_, _, prompts, _) in enumerate(cells):
        said = []
        for row, prompt in zip(generate(prompts), prompts):
            new = [int(t) for t in row[len(prompt):]]
            new = new[:new.index(eos)] if eos in new else new  # where sample.py stops too
            said.append(reply(tokenizer.decode(new)))
        out.append(said)
        if progress is not None:
            progress(i + 1, len(cells))
    return out


def accuracy(cells, cell_replies) -> list[float]:
    """The share of exact answers in each cell: a reply counts when it is the key's digits."""
    return [sum(r == a for r, a in zip(got, answers)) / len(answers)
            for (_, _, _, answers), got in zip(cells, cell_replies)]
