"""Retrieval probes (training/evaluation/probes.py): prompts of exactly the asked length with the fact at
its depth, and exact scoring."""

import numpy as np
import pytest

from data.passkey import held_out
from training.evaluation import probes


class Chars:
    """A tokenizer of one id per character (ord), enough to see where things land."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


FILLER = np.array([ord("~")] * 5000)  # a character no probe text has


@pytest.mark.parametrize("name", list(probes.PROBES))
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_has_its_length_and_the_fact_at_its_depth(name, depth):
    probe = probes.PROBES[name]
    prompt, answer = probe.make(Chars(), FILLER, 1000, depth, np.random.default_rng(0))
    text = Chars().decode(prompt)
    assert len(prompt) == 1000 and text.startswith(probe.intro)
    assert text.rstrip().endswith(" is") and answer in text and len(answer) == 5
    hay = text.count("~")
    before = text[len(probe.intro):text.index("\n", len(probe.intro))].count("~")
    assert before == round(depth * hay)  # the fact starts at depth x the filler


def test_answers_are_scored_exactly():
    assert probes.answered(" 48213. Remember", "48213") and probes.reply(" the key") == ""
    assert not probes.answered(" 4821 3", "48213") and not probes.answered(" 482130", "48213")
    assert not probes.answered(" the key", "48213")


def test_a_grid_and_its_accuracy():
    cells = probes.grid(probes.PROBES["passkey"], Chars(), FILLER, [300, 600], [0.0, 1.0],
                        samples=3, seed=1)
    assert [(n, d) for n, d, _, _ in cells] == [(300, 0.0), (300, 1.0), (600, 0.0), (600, 1.0)]
    answers = {tuple(p): a for _, _, prompts, ans in cells for p, a in zip(prompts, ans)}

    def oracle(prompts):  # a model that finds every key but the first prompt's of each cell
        wrong = {tuple(cell[2][0]) for cell in cells}
        def say(key, right):  # a wrong reply: the key with its last digit changed
            return key if right else key[:-1] + str((int(key[-1]) + 1) % 10)
        return [p + Chars().encode(" " + say(answers[tuple(p)], tuple(p) not in wrong) + ".")
                for p in prompts]

    said = probes.replies(cells, oracle, Chars())
    assert probes.accuracy(cells, said) == [2 / 3] * 4
    assert said[0][1] == cells[0][3][1] and said[0][0] != cells[0][3][0]
    assert probes.accuracy(cells, probes.replies(cells, lambda ps: [p + [ord("7")] for p in ps],
                                                 Chars())) == [0.0] * 4
    # The keys asked for are never ones training states.
    assert all(held_out(int(a)) for *_, keys in cells for a in keys)
    with pytest.raises(ValueError, match="fewer than"):
        probes.PROBES["needle"].make(Chars(), FILLER[:100], 1000, 0.5, np.random.default_rng(0))
