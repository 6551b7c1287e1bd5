"""data.passkey_fraction: some training rows become passkey examples, reproducibly, each one
document with the key inside and asked for at its end; eval rows stay text."""

import numpy as np

import data
from data.passkey import INTRO, PasskeyMix

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
        assert text.endswith(f"\nWhat is the pass key? The pass key is {key}")  # then '\n'
        assert natural[i, -1] == ord(key[-1])  # the input ends with the key's last digit
        assert EOS not in natural[i] and len(set(batch["segment_ids"][i])) == 1
    plain = [i for i in range(8) if i not in examples]
    assert all(len(set(batch["segment_ids"][i])) > 1 for i in plain)  # packed text, as before
    evals = data.eval_rows(tokens, spec(mix), 0, np.arange(8))
    assert not any(Chars().decode(r).count(INTRO) for r in evals["inputs"])
