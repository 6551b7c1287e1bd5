"""data.passkey_*: some training rows become passkey examples, reproducibly, each one document
with a training key inside and asked for at its end, the answer's digits weighted in the loss;
eval rows stay text."""

import numpy as np

import data
from data.passkey import INTRO, PasskeyMix, held_out

EOS = 1


class Chars:
    eos_id = EOS

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def spec(mix, **fields):
    return data.BatchSpec(**{**dict(seq_len=256, global_batch=8, seed=3, layout="zigzag",
                                    num_seq_shards=2, mask_documents=True, reset_positions=True,
                                    eos_id=EOS, passkey=mix), **fields})


def test_rows_become_whole_documents_that_ask_for_their_key():
    rng = np.random.default_rng(0)
    tokens = rng.integers(ord("a"), ord("z") + 1, 20_000).astype(np.int32)
    tokens[rng.integers(0, len(tokens), 400)] = EOS  # documents of ~50 tokens
    mix = PasskeyMix.build(Chars(), fraction=0.5)
    batch = data.batch_rows(tokens, spec(mix), step=4, rows=np.arange(8))
    again = data.batch_rows(tokens, spec(mix), step=4, rows=np.arange(8))
    np.testing.assert_array_equal(batch["inputs"], again["inputs"])  # a resume sees the same
    natural = np.take_along_axis(batch["inputs"], np.argsort(batch["order"], axis=1), axis=1)
    texts = [Chars().decode(row) for row in natural]
    examples = [i for i, t in enumerate(texts) if t.startswith(INTRO)]
    assert 1 <= len(examples) <= 7
    for i in examples:
        text = texts[i]
        key = text.split("The pass key is ")[1][:5]
        assert text.endswith(f"\nWhat is the pass key? The pass key is {key}\n")
        targets = np.take_along_axis(batch["targets"][i], np.argsort(batch["order"][i]), 0)
        assert targets[-1] == EOS and not held_out(int(key))  # a training key, then EOS
        assert EOS not in natural[i] and len(set(batch["segment_ids"][i])) == 1
        assert (batch["weights"][i] == 1).all()  # weight 1: like any token
    plain = [i for i in range(8) if i not in examples]
    assert all(len(set(batch["segment_ids"][i])) > 1 for i in plain)  # packed text, as before
    evals = data.eval_rows(tokens, spec(mix), 0, np.arange(8))
    assert not any(Chars().decode(r).count(INTRO) for r in evals["inputs"])


def test_rows_cut_into_examples_with_weighted_answers():
    rng = np.random.default_rng(1)
    tokens = rng.integers(ord("a"), ord("z") + 1, 40_000).astype(np.int32)
    mix = PasskeyMix.build(Chars(), fraction=1.0, min_len=300, weight=5.0)
    batch = data.batch_rows(tokens, spec(mix, seq_len=1024, layout="striped"), step=2,
                            rows=np.arange(8))
    back = np.argsort(batch["order"], axis=1)
    inputs, targets, weights = (np.take_along_axis(batch[k], back, axis=1)
                                for k in ("inputs", "targets", "weights"))
    counts = []
    for row_in, row_out, row_w in zip(inputs, targets, weights):
        docs = Chars().decode(np.append(row_in, row_out[-1])).split(chr(EOS))[:-1]
        counts.append(len(docs))
        assert all(d.startswith(INTRO) and len(d) + 1 >= 300 for d in docs)
        keys = [d.split("The pass key is ")[1][:5] for d in docs]
        assert all(d.endswith(f"The pass key is {k}\n") for d, k in zip(docs, keys))
        # weighted targets: each example's ' ' and five digits after its question
        assert Chars().decode(row_out[row_w == 5.0]) == "".join(f" {k}" for k in keys)
        assert set(np.unique(row_w)) == {1.0, 5.0}
    assert min(counts) >= 1 and max(counts) >= 3  # several examples, of many lengths


def test_repeats_sets_the_share_of_keys_with_a_digit_twice_in_a_row():
    import re

    def keys(mix):
        return [Chars().decode(f).split("The pass key is ")[1][:5] for f in mix.facts]

    doubled = re.compile(r"(\d)\1")
    uniform = keys(PasskeyMix.build(Chars(), fraction=1.0))
    share = sum(bool(doubled.search(k)) for k in uniform) / len(uniform)
    assert 0.31 < share < 0.38  # as drawn: 1 - 0.9 ** 4 of five-digit keys
    hard = keys(PasskeyMix.build(Chars(), fraction=1.0, repeats=0.75))
    assert sum(bool(doubled.search(k)) for k in hard) == round(0.75 * len(hard))
    assert not any(held_out(int(k)) for k in hard) and len(set(hard)) > 0.9 * len(hard)
