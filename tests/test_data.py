"""data/: sources, tokenizer, token cache, step-indexed batches in layout order, global arrays."""

import dataclasses
import glob
import itertools
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import data
import parallel
from data import batches as batches_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 400


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small text corpus: this repository's parallel/*.py plus two prose files (~30 kB)."""
    root = tmp_path_factory.mktemp("corpus")
    for path in sorted(glob.glob(os.path.join(ROOT, "parallel", "*.py"))):
        shutil.copy(path, root / os.path.basename(path))
    (root / "notes.txt").write_text(
        "The quick brown fox jumps over the lazy dog.\n\n    Indented line with 12345 digits.\n"
        * 20)
    (root / "unicode.md").write_text("# Überschrift\n\nnaïve café, 漢字, emoji 🙂.\n" * 10)
    return str(root)


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tok.model"
    return data.train_tokenizer(data.iter_documents(corpus), str(out), vocab_size=VOCAB,
                                max_bytes=0)


def spec(**overrides):
    fields = dict(seq_len=16, global_batch=4, seed=0, layout="striped", num_seq_shards=4,
                  mask_documents=False, reset_positions=False, eos_id=None)
    fields.update(overrides)
    return data.BatchSpec(**fields)


def natural(batch, s):
    """Un-permutes every field of a batch back to natural order, by the batch's own 'order'
    (then 'order' itself reads 0 .. S-1)."""
    inv = np.argsort(batch["order"], axis=1)
    return {name: np.take_along_axis(value, inv, axis=1) for name, value in batch.items()}


# --- sources -------------------------------------------------------------------------------------


def test_directory_sorted_skips_hidden_and_binary(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.py").write_text("x = 1\n")
    (tmp_path / ".hidden").write_text("secret")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("git")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00\x80binary")
    assert list(data.iter_documents(str(tmp_path))) == ["bee", "x = 1\n"]  # b.txt < sub/a.py
    assert list(data.iter_documents(str(tmp_path / "b.txt"))) == ["bee"]
    assert list(data.iter_documents(str(tmp_path / "**" / "*.py"))) == ["x = 1\n"]


def test_describe_source_changes_with_files(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    before = data.describe_source(str(tmp_path))
    assert data.describe_source(str(tmp_path)) == before
    (tmp_path / "a.txt").write_text("one more")
    assert data.describe_source(str(tmp_path)) != before


def test_stdlib_source():
    docs = list(itertools.islice(data.iter_documents("stdlib"), 3))
    assert len(docs) == 3 and all(isinstance(d, str) and d for d in docs)
    description = data.describe_source("stdlib")
    assert description.startswith("stdlib:python 3.") and " files, " in description
    assert data.describe_source("stdlib") == description


@pytest.mark.parametrize("source, words", [
    ("/no/such/dir", "no such file or directory"),
    ("/no/such/*.txt", "matches no files"),
    ("tfds:no_such_dataset_xyz", "no TFDS dataset"),
    ("", "non-empty string"),
])
def test_bad_sources(source, words):
    with pytest.raises(data.DataError, match=words):
        data.iter_documents(source)


def test_empty_directory(tmp_path):
    with pytest.raises(data.DataError, match="holds no files"):
        data.iter_documents(str(tmp_path))
    (tmp_path / "x.bin").write_bytes(b"\xff\xff")
    with pytest.raises(data.DataError, match="no utf-8 text"):
        list(data.iter_documents(str(tmp_path)))


# --- tokenizer -----------------------------------------------------------------------------------


def test_tokenizer_round_trip(tokenizer):
    text = "  def f(x):\n\treturn x + 12345  \n\n# naïve 漢字 🙂 \r\n end "
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text                  # whitespace and unicode kept exactly
    assert all(0 <= i < VOCAB for i in ids)
    assert tokenizer.encode_batch([text, "abc"]) == [ids, tokenizer.encode("abc")]
    assert tokenizer.vocab_size == VOCAB and tokenizer.eos_id == 1
    assert tokenizer.eos_id not in ids


def test_tokenizer_files_and_fingerprint(tokenizer, corpus, tmp_path):
    assert len(tokenizer.fingerprint) == 16
    assert data.load_tokenizer(tokenizer.path).fingerprint == tokenizer.fingerprint
    folder = os.path.dirname(tokenizer.path)
    assert sorted(os.listdir(folder)) == ["tok.model", "tok.vocab"]   # no .tmp left behind
    # Training is deterministic: the same text gives the same model bytes.
    again = data.train_tokenizer(data.iter_documents(corpus), str(tmp_path / "again.model"),
                                 vocab_size=VOCAB, max_bytes=0)
    assert again.fingerprint == tokenizer.fingerprint
    other = data.train_tokenizer(data.iter_documents(corpus), str(tmp_path / "other.model"),
                                 vocab_size=VOCAB - 50, max_bytes=0)
    assert other.fingerprint != tokenizer.fingerprint


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(data.DataError, match="cannot read"):
        data.load_tokenizer(str(tmp_path / "missing.model"))
    for content in (b"", b"not a sentencepiece model"):
        (tmp_path / "bad.model").write_bytes(content)
        with pytest.raises(data.DataError, match="not a valid sentencepiece model"):
            data.load_tokenizer(str(tmp_path / "bad.model"))


def test_tokenizer_vocab_too_small(corpus, tmp_path):
    with pytest.raises(data.DataError, match="could not train a vocab of 50"):
        data.train_tokenizer(data.iter_documents(corpus), str(tmp_path / "t.model"),
                             vocab_size=50, max_bytes=0)
    assert os.listdir(tmp_path) == []                     # no temporary files left


def test_get_tokenizer_trains_once(corpus, tokenizer, tmp_path):
    config = ml_collections.ConfigDict({"source": corpus, "vocab_size": VOCAB,
                                        "tokenizer_path": "", "tokenizer_model_type": "bpe",
                                        "max_bytes": 0})
    calls = []
    cache_dir = str(tmp_path / "cache")
    with pytest.raises(data.DataError, match="cannot read"):      # process 1 never trains
        data.get_tokenizer(config, cache_dir, process_index=1, barrier=lambda: calls.append(1))
    first = data.get_tokenizer(config, cache_dir, barrier=lambda: calls.append(0))
    assert first.fingerprint == tokenizer.fingerprint and calls == [1, 0]
    assert os.path.basename(first.path).startswith("tokenizer-")
    mtime = os.stat(first.path).st_mtime_ns
    second = data.get_tokenizer(config, cache_dir, process_index=1)
    assert second.path == first.path and os.stat(first.path).st_mtime_ns == mtime
    config.tokenizer_path = tokenizer.path
    assert data.get_tokenizer(config, cache_dir).path == tokenizer.path


# --- token cache ---------------------------------------------------------------------------------


def test_token_cache_contents(tokenizer, corpus, tmp_path):
    cache = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.1)
    expected = []
    for doc in data.iter_documents(corpus):
        expected += tokenizer.encode(doc) + [tokenizer.eos_id]
    full = np.concatenate([cache.train, cache.eval])
    np.testing.assert_array_equal(full, expected)
    assert cache.train.dtype == np.uint16 and not cache.train.flags.writeable
    assert cache.num_tokens == len(expected) and cache.eos_id == 1
    assert len(cache.eval) == int(len(expected) * 0.1)
    assert cache.num_documents == len(list(data.iter_documents(corpus)))
    meta = json.load(open(cache.path[:-len(".npy")] + ".json"))
    assert meta["tokenizer_fingerprint"] == tokenizer.fingerprint
    assert meta["num_tokens"] == len(expected) and meta["dtype"] == "uint16"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_token_cache_built_once_and_per_tokenizer(tokenizer, corpus, tmp_path):
    first = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.0)
    stamps = {f: os.stat(tmp_path / f).st_mtime_ns for f in os.listdir(tmp_path)}
    calls = []
    again = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.0,
                                   barrier=lambda: calls.append(1))
    assert again.path == first.path and calls == [1]
    assert {f: os.stat(tmp_path / f).st_mtime_ns for f in os.listdir(tmp_path)} == stamps
    other_tok = data.train_tokenizer(data.iter_documents(corpus), str(tmp_path / "o.model"),
                                     vocab_size=360, max_bytes=0)
    other = data.build_token_cache(other_tok, corpus, str(tmp_path), eval_fraction=0.0)
    assert other.path != first.path
    assert len(other.train) != len(first.train)           # really tokenized with the other vocab


def test_token_cache_checks(tokenizer, corpus, tmp_path):
    with pytest.raises(data.DataError, match="missing or unreadable"):  # process 1 never builds
        data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.0,
                               process_index=1)
    cache = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.0,
                                   max_bytes=500)
    assert cache.num_documents == 1                       # the first file, cut at 500 bytes
    json_path = cache.path[:-len(".npy")] + ".json"
    meta = json.load(open(json_path))
    meta["tokenizer_fingerprint"] = "0" * 16
    json.dump(meta, open(json_path, "w"))
    with pytest.raises(data.DataError, match="was built with tokenizer"):
        data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.0,
                               max_bytes=500)
    with pytest.raises(data.DataError, match="eval_fraction"):
        data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=1.0)


def test_eval_never_overlaps_train(tokenizer, corpus, tmp_path):
    cache = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.25)
    lo_train, hi_train = np.lib.array_utils.byte_bounds(cache.train)
    lo_eval, hi_eval = np.lib.array_utils.byte_bounds(cache.eval)
    assert hi_train == lo_eval and lo_train < hi_train < hi_eval     # adjacent, disjoint
    # Same split on a stream whose tokens are their own indices: windows read from the train
    # part over two epochs, and every eval batch, stay on their own side of the split.
    index = np.arange(cache.num_tokens)
    train, held_out = index[:len(cache.train)], index[len(cache.train):]
    s = spec(seq_len=32, global_batch=4, num_seq_shards=2)
    steps = 2 * data.num_windows(train, 32) // 4 + 1
    seen = np.concatenate([data.batch_rows(train, s, t, range(4))["targets"] for t in range(steps)])
    assert seen.max() < len(cache.train)
    for batch in data.eval_batches(held_out, s, 1000):
        assert batch["inputs"].min() >= len(cache.train)


# --- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("shards", [1, 2, 4])
def test_fields_round_trip_the_permutation(layout, shards):
    tokens = np.arange(1000, dtype=np.uint16)             # each token is its own index
    s = spec(layout=layout, num_seq_shards=shards, mask_documents=True, reset_positions=True,
             eos_id=7)
    batch = data.process_batch(tokens, s, step=3, process_index=0, process_count=1)
    assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
        "inputs": (np.int32, (4, 16)), "targets": (np.int32, (4, 16)),
        "weights": (np.float32, (4, 16)), "positions": (np.int32, (4, 16)),
        "segment_ids": (np.int32, (4, 16)), "order": (np.int32, (4, 16))}
    nat = natural(batch, s)
    np.testing.assert_array_equal(nat["order"], np.broadcast_to(np.arange(16), (4, 16)))
    if not parallel.get_layout(layout).data_dependent:  # the layout's permutation in every row
        perm = parallel.permutation(layout, 16, shards)
        np.testing.assert_array_equal(batch["order"], np.broadcast_to(perm, (4, 16)))
    for row in batch["order"]:  # every shard's original indices increase
        assert (np.diff(row.reshape(shards, -1), axis=1) > 0).all()
    starts = nat["inputs"][:, 0]
    assert np.all(starts % 16 == 0)
    np.testing.assert_array_equal(nat["inputs"], starts[:, None] + np.arange(16))
    np.testing.assert_array_equal(nat["targets"], starts[:, None] + np.arange(1, 17))
    np.testing.assert_array_equal(nat["targets"][:, :-1], nat["inputs"][:, 1:])
    # Token 7 is the only EOS below 16: row starting at 0 has segments 0 to slot 7, then 1.
    for segments, positions, start in zip(nat["segment_ids"], nat["positions"], starts):
        after_eos = (start == 0) * (np.arange(16) > 7)
        np.testing.assert_array_equal(segments, after_eos)
        np.testing.assert_array_equal(positions, np.arange(16) - 8 * after_eos)


def test_segments_and_positions_worked_example():
    # EOS = 1. One window of S+1 = 9 tokens: documents [5 6 EOS] [7 8 9 EOS] [3 4 ...
    tokens = np.array([5, 6, 1, 7, 8, 9, 1, 3, 4])
    s = spec(seq_len=8, global_batch=1, layout="ring", num_seq_shards=1, mask_documents=True,
             reset_positions=True, eos_id=1)
    batch = data.batch_rows(tokens, s, 0, [0])
    np.testing.assert_array_equal(batch["inputs"], [[5, 6, 1, 7, 8, 9, 1, 3]])
    np.testing.assert_array_equal(batch["targets"], [[6, 1, 7, 8, 9, 1, 3, 4]])
    np.testing.assert_array_equal(batch["segment_ids"], [[0, 0, 0, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(batch["positions"], [[0, 1, 2, 0, 1, 2, 3, 0]])
    # Striped over 2 shards, perm [0 2 4 6 1 3 5 7]: the same values, in layout order.
    striped = data.batch_rows(tokens, dataclasses.replace(s, layout="striped", num_seq_shards=2),
                              0, [0])
    np.testing.assert_array_equal(striped["inputs"], [[5, 1, 8, 1, 6, 7, 9, 3]])
    np.testing.assert_array_equal(striped["positions"], [[0, 2, 1, 3, 1, 0, 2, 0]])
    np.testing.assert_array_equal(striped["segment_ids"], [[0, 0, 1, 1, 0, 1, 1, 2]])
    # Consecutive EOS tokens: each ends a (possibly empty) document of its own.
    s2 = dataclasses.replace(s, seq_len=6)
    batch = data.batch_rows(np.array([5, 1, 7, 1, 1, 3, 9]), s2, 0, [0])
    np.testing.assert_array_equal(batch["segment_ids"], [[0, 0, 1, 1, 2, 3]])
    np.testing.assert_array_equal(batch["positions"], [[0, 1, 0, 1, 0, 0]])
    # Each switch on its own.
    only_seg = data.batch_rows(tokens, dataclasses.replace(s, reset_positions=False), 0, [0])
    np.testing.assert_array_equal(only_seg["segment_ids"], [[0, 0, 0, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(only_seg["positions"], [np.arange(8)])
    only_pos = data.batch_rows(tokens, dataclasses.replace(s, mask_documents=False), 0, [0])
    np.testing.assert_array_equal(only_pos["segment_ids"], np.zeros((1, 8)))
    np.testing.assert_array_equal(only_pos["positions"], [[0, 1, 2, 0, 1, 2, 3, 0]])
    plain = data.batch_rows(tokens, dataclasses.replace(s, mask_documents=False,
                                                      reset_positions=False, eos_id=None), 0, [0])
    np.testing.assert_array_equal(plain["segment_ids"], np.zeros((1, 8)))
    np.testing.assert_array_equal(plain["positions"], [np.arange(8)])
    np.testing.assert_array_equal(plain["weights"], np.ones((1, 8)))


def test_batches_are_a_function_of_the_step():
    tokens = np.random.default_rng(0).integers(0, 500, 5000).astype(np.uint16)
    s = spec(global_batch=8)
    in_order = [data.process_batch(tokens, s, t, 0, 1) for t in range(8)]
    for t in (5, 2):                                       # out of order, fresh epoch cache
        batches_module._epoch_order.cache_clear()
        for name, value in data.process_batch(tokens, s, t, 0, 1).items():
            np.testing.assert_array_equal(value, in_order[t][name])
    assert not np.array_equal(in_order[0]["inputs"], in_order[1]["inputs"])
    for processes in (2, 4):
        parts = [data.process_batch(tokens, s, 6, p, processes) for p in range(processes)]
        for name in data.FIELDS:
            np.testing.assert_array_equal(np.concatenate([x[name] for x in parts]),
                                          in_order[6][name])
    # Seed changes the order.
    other = data.process_batch(tokens, dataclasses.replace(s, seed=1), 0, 0, 1)
    assert not np.array_equal(other["inputs"], in_order[0]["inputs"])


def test_every_window_once_per_epoch():
    tokens = np.arange(16 * 12 + 1)                        # W = 12 windows
    s = spec(global_batch=4)
    def starts(step):
        return natural(data.batch_rows(tokens, s, step, range(4)), s)["inputs"][:, 0]
    epoch0 = np.concatenate([starts(t) for t in range(3)])
    epoch1 = np.concatenate([starts(t) for t in range(3, 6)])
    np.testing.assert_array_equal(np.sort(epoch0), np.arange(12) * 16)
    np.testing.assert_array_equal(np.sort(epoch1), np.arange(12) * 16)
    assert not np.array_equal(epoch0, epoch1)
    # global_batch not dividing W: a batch straddles two epochs.
    s5 = spec(global_batch=5)
    rows = natural(data.batch_rows(tokens, s5, 2, range(5)), s5)["inputs"][:, 0]
    order0 = np.random.default_rng([0, 0]).permutation(12)
    order1 = np.random.default_rng([0, 1]).permutation(12)
    np.testing.assert_array_equal(rows, 16 * np.array([*order0[10:], *order1[:3]]))


def test_eval_batches_in_order():
    tokens = np.arange(16 * 10 + 1)                        # 10 windows: 2 full batches of 4
    s = spec()
    got = data.eval_batches(tokens, s, num_batches=5)
    assert len(got) == 2
    for b, batch in enumerate(got):
        starts = natural(batch, s)["inputs"][:, 0]
        np.testing.assert_array_equal(starts, (b * 4 + np.arange(4)) * 16)
    assert len(data.eval_batches(tokens, s, num_batches=1)) == 1
    with pytest.raises(data.DataError, match="fewer than one batch"):
        data.eval_batches(tokens[:16 * 3 + 1], s, num_batches=1)


def test_bad_batch_inputs():
    tokens = np.arange(100)
    with pytest.raises(data.DataError, match="corpus of 16 tokens is smaller than one sequence "
                                             "of 17: use a larger corpus or a smaller seq_len"):
        data.batch_rows(tokens[:16], spec(), 0, range(4))
    with pytest.raises(data.DataError, match="global_batch 4 is not divisible by the 3 processes"):
        data.process_batch(tokens, spec(), 0, 0, 3)
    with pytest.raises(data.DataError, match="seq_len 12 is not divisible by 8"):
        data.batch_rows(tokens, spec(seq_len=12, layout="zigzag"), 0, range(4))
    with pytest.raises(data.DataError, match="unknown attention layout"):
        data.batch_rows(tokens, spec(layout="spiral"), 0, range(4))
    with pytest.raises(data.DataError, match="eos_id"):
        data.batch_rows(tokens, spec(mask_documents=True), 0, range(4))
    with pytest.raises(data.DataError, match="rows must lie in 0..3"):
        data.batch_rows(tokens, spec(), 0, [4])


# --- global arrays -------------------------------------------------------------------------------


def test_to_global_matches_process_batch():
    mesh = parallel.make_mesh(2, 4)
    tokens = np.random.default_rng(1).integers(0, 500, 3000).astype(np.uint16)
    s = spec(global_batch=4, num_seq_shards=4, mask_documents=True, reset_positions=True,
             eos_id=3)
    requested = []
    def batch_fn(step, rows):
        requested.append(list(rows))
        return data.batch_rows(tokens, s, step, rows)
    got = data.to_global(batch_fn, 5, mesh, s)
    assert requested == [[0, 1, 2, 3]]                     # one call, the rows this process holds
    want = data.process_batch(tokens, s, 5, 0, 1)
    for name in data.FIELDS:
        assert got[name].sharding.spec == P("data", "seq")
        assert got[name].dtype == want[name].dtype and got[name].shape == (4, 16)
        np.testing.assert_array_equal(np.asarray(got[name]), want[name])
        for shard in got[name].addressable_shards:        # each device holds its own block
            np.testing.assert_array_equal(np.asarray(shard.data), want[name][shard.index])
    with pytest.raises(data.DataError, match="4 devices on 'seq'"):
        data.to_global(batch_fn, 0, mesh, dataclasses.replace(s, num_seq_shards=2))


def test_prefetcher():
    mesh = parallel.make_mesh(2, 4)
    tokens = np.arange(2000)
    s = spec()
    def batch_fn(step, rows):
        if step == 4:
            raise RuntimeError("broken step 4")
        return data.batch_rows(tokens, s, step, rows)
    prefetch = data.Prefetcher(batch_fn, mesh, s, start_step=2)
    for expected_step in (2, 3):
        step, batch = prefetch.next()
        assert step == expected_step
        np.testing.assert_array_equal(np.asarray(batch["inputs"]),
                                      data.process_batch(tokens, s, step, 0, 1)["inputs"])
    with pytest.raises(RuntimeError, match="broken step 4"):
        prefetch.next()
    prefetch.close()
    assert not prefetch._thread.is_alive()
