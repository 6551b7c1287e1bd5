"""data/: sources, tokenizer and token cache (batches and global arrays: test_data_batches.py)."""

import glob
import itertools
import json
import os
import shutil

import numpy as np
import pytest

import data
import run_config
from tests.support import ROOT


VOCAB = 400


def spec(**overrides):
    """A BatchSpec of 16-token rows, striped over 4 'seq' shards, with these fields changed."""
    fields = dict(seq_len=16, global_batch=4, seed=0, layout="striped", num_seq_shards=4,
                  mask_documents=False, reset_positions=False, eos_id=None)
    fields.update(overrides)
    return data.BatchSpec(**fields)


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
    config = run_config.build({"data": {"source": corpus, "vocab_size": VOCAB,
                                        "tokenizer_path": "", "tokenizer_model_type": "bpe",
                                        "max_bytes": 0}}).data
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
    config = run_config.replace(config, {"tokenizer_path": tokenizer.path})
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


def test_eval_split_holds_at_least_one_eval_batch(tokenizer, corpus, tmp_path):
    """A long window with the default small fraction: the eval split grows to one batch (the
    fraction's split stands where it is larger); a corpus too small for a batch of each is one
    DataError."""
    small = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.005)
    n = small.num_tokens
    need = n // 10
    grown = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.005,
                                   min_eval_tokens=need)
    assert len(small.eval) == int(n * 0.005) < need == len(grown.eval)
    assert len(grown.train) + len(grown.eval) == n
    big = data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.25,
                                 min_eval_tokens=need)
    assert len(big.eval) == int(n * 0.25)
    with pytest.raises(data.DataError, match="bring a larger corpus"):
        data.build_token_cache(tokenizer, corpus, str(tmp_path), eval_fraction=0.005,
                               min_eval_tokens=n // 2 + 1)


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


def test_a_step_without_a_count_of_its_own_prints_lines_while_it_runs():
    """Tokenizer training (sentencepiece says nothing until it returns): in a log, a line every
    every_s seconds while it runs and one with the time taken; the ticking stops with it."""
    import io
    import time

    from data.progress import Ticker
    out = io.StringIO()
    with Ticker("data: training the tokenizer", "data: tokenizer trained", every_s=0.05,
                stream=out):
        time.sleep(0.4)
    time.sleep(0.2)
    *ticks, last = out.getvalue().splitlines()
    assert len(ticks) >= 3 and last == "data: tokenizer trained in 0 s"
    assert all(t.startswith("data: training the tokenizer, ") and t.endswith(" s so far")
               for t in ticks)
