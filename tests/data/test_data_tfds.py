"""TFDS sources: a dataset prepared as array_record in a temp dir, no TensorFlow, no network."""

import glob
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

import data
from data import token_cache
from tests.support import ROOT

NAME = "ringstripe_local_text"
VOCAB = 400


class RingstripeLocalText(tfds.core.GeneratorBasedBuilder):
    """One example per text file of the manual dir: 'text' (the contents), 'title' (the name).

    Files named test_* go to the 'test' split, the rest to 'train', each in sorted order;
    `bad.bin` (not utf-8) goes to the 'odd' split.
    """

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Text files in the manual dir."

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                                 "title": tfds.features.Text()}),
            disable_shuffling=True)  # records in the order generated (else ordered by key hash)

    def _split_generators(self, dl_manager):
        paths = sorted(glob.glob(os.path.join(dl_manager.manual_dir, "*")))
        return {
            "train": self._generate_examples(
                [p for p in paths if not os.path.basename(p).startswith("test_")
                 and not p.endswith(".bin")]),
            "test": self._generate_examples(
                [p for p in paths if os.path.basename(p).startswith("test_")]),
            "odd": self._generate_examples([p for p in paths if p.endswith(".bin")]),
        }

    def _generate_examples(self, paths):
        for path in paths:
            with open(path, "rb") as f:
                yield os.path.basename(path), {"text": f.read(), "title": os.path.basename(path)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text files for the 'train' split (in their own folder, to read as a plain files source)
    and a manual dir holding those plus the 'test' and 'odd' splits' files."""
    train = tmp_path_factory.mktemp("train_files")
    for path in sorted(glob.glob(os.path.join(ROOT, "parallel", "*.py"))):
        shutil.copy(path, train / os.path.basename(path))
    (train / "notes.txt").write_text(
        "The quick brown fox jumps over the lazy dog.\n\n    Indented 12345.\n" * 20)
    (train / "unicode.md").write_text("# Überschrift\n\nnaïve café, 漢字, emoji 🙂.\n" * 10)
    manual = tmp_path_factory.mktemp("manual")
    for path in train.iterdir():
        shutil.copy(path, manual / path.name)
    (manual / "test_one.txt").write_text("held out one\n")
    (manual / "test_two.txt").write_text("held out two\n")
    (manual / "bad.bin").write_bytes(b"caf\xe9 \xff")
    return str(train), str(manual)


@pytest.fixture(scope="module")
def data_dir(corpus, tmp_path_factory):
    _, manual = corpus
    root = str(tmp_path_factory.mktemp("tfds"))
    builder = RingstripeLocalText(data_dir=root, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual))
    return root


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    train, _ = corpus
    out = tmp_path_factory.mktemp("tok") / "tok.model"
    return data.train_tokenizer(data.iter_documents(train), str(out), vocab_size=VOCAB,
                                max_bytes=0)


def options(data_dir, field="text"):
    return data.SourceOptions(tfds_data_dir=data_dir, tfds_text_field=field)


def test_parse_tfds_source():
    parse = data.parse_tfds_source
    assert parse("tfds:pg19") == data.TfdsSource("pg19", None, None, "train")
    assert parse("tfds:pg19:test") == data.TfdsSource("pg19", None, None, "test")
    assert parse("tfds:pg19:0.1.1") == data.TfdsSource("pg19", None, "0.1.1", "train")
    got = parse("tfds:wiki40b/en:1.3.0:validation")
    assert got == data.TfdsSource("wiki40b", "en", "1.3.0", "validation")
    assert got.tfds_name == "wiki40b/en:1.3.0"
    assert parse("tfds:wmt14_translate/de-en:train[:10%]").split == "train[:10%]"
    for bad in ("tfds:", "tfds:pg 19", "tfds:pg19::train", "tfds:pg19/:train", "tfds:/en",
                "tfds:pg19:test extra"):
        with pytest.raises(data.DataError, match=r"expected 'tfds:NAME\[/CONFIG\]\[:VERSION\]"):
            parse(bad)


def test_documents_in_order(corpus, data_dir):
    train, _ = corpus
    files = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(train, "*")))]
    assert len(files) >= 4
    opts = options(data_dir)
    got = list(data.iter_documents(f"tfds:{NAME}:train", opts))
    assert got == files == list(data.iter_documents(train))
    assert list(data.iter_documents(f"tfds:{NAME}", opts)) == files          # split: 'train'
    assert list(data.iter_documents(f"tfds:{NAME}:1.0.0:train", opts)) == files
    assert list(data.iter_documents(f"tfds:{NAME}:train[1:3]", opts)) == files[1:3]
    assert list(data.iter_documents(f"tfds:{NAME}:test", opts)) == ["held out one\n",
                                                                     "held out two\n"]
    titles = list(data.iter_documents(f"tfds:{NAME}:test", options(data_dir, "title")))
    assert titles == ["test_one.txt", "test_two.txt"]
    # Bytes that are not utf-8 are decoded with replacement characters, not dropped.
    assert list(data.iter_documents(f"tfds:{NAME}:odd", opts)) == ["caf\ufffd \ufffd"]


def test_describe_tfds_source(data_dir):
    opts = options(data_dir)
    description = data.describe_source(f"tfds:{NAME}:train", opts)
    for part in (f"name={NAME}", "version=1.0.0", "split=train", "examples=", "text_field=text",
                 f"data_dir={os.path.join(data_dir, NAME, '1.0.0')}"):
        assert part in description
    train_files = len(list(data.iter_documents(f"tfds:{NAME}:train", opts)))
    assert f"examples={train_files} " in description
    assert data.describe_source(f"tfds:{NAME}", opts) == description
    assert "examples=2 " in data.describe_source(f"tfds:{NAME}:test", opts)
    assert data.describe_source(f"tfds:{NAME}:train", options(data_dir, "title")) != description


def test_token_cache_same_from_tfds_and_files(tokenizer, corpus, data_dir, tmp_path,
                                              monkeypatch):
    train, _ = corpus
    from_files = data.build_token_cache(tokenizer, train, str(tmp_path), eval_fraction=0.1,
                                        workers=0)
    # Two tokenizing processes and chunks of 2 documents: chunks are tokenized out of order on
    # two processes but written in order, so the tokens are the same.
    monkeypatch.setattr(token_cache, "_DOCS_PER_CHUNK", 2)
    from_tfds = data.build_token_cache(tokenizer, f"tfds:{NAME}:train", str(tmp_path),
                                       eval_fraction=0.1, options=options(data_dir), workers=2)
    assert from_tfds.path != from_files.path                 # keyed on the source's description
    np.testing.assert_array_equal(from_tfds.train, from_files.train)
    np.testing.assert_array_equal(from_tfds.eval, from_files.eval)
    assert from_tfds.num_documents == from_files.num_documents
    assert from_tfds.num_tokens == from_files.num_tokens > 1000
    meta = json.load(open(from_tfds.path[:-len(".npy")] + ".json"))
    assert meta["source_description"].startswith(f"tfds:name={NAME} ")
    assert meta["tokenizer_fingerprint"] == tokenizer.fingerprint
    # The same batches reach the model.
    spec = data.BatchSpec(seq_len=32, global_batch=4, seed=0, layout="striped", num_seq_shards=2,
                          mask_documents=True, reset_positions=True, eos_id=tokenizer.eos_id)
    for step in (0, 7):
        a = data.batch_rows(from_tfds.train, spec, step, range(4))
        b = data.batch_rows(from_files.train, spec, step, range(4))
        for name in data.FIELDS:
            np.testing.assert_array_equal(a[name], b[name])
    # Another text field is another source: a new cache, not the old one.
    titles = data.build_token_cache(tokenizer, f"tfds:{NAME}:train", str(tmp_path),
                                    eval_fraction=0.1, options=options(data_dir, "title"))
    assert titles.path != from_tfds.path and titles.num_tokens < from_tfds.num_tokens


def test_mock_data(tokenizer, tmp_path):
    # mock_data replaces the readers: no prepared files anywhere, random text in every example.
    for source in (f"tfds:{NAME}:train", "tfds:lm1b:train"):
        with tfds.testing.mock_data(num_examples=7):
            docs = list(data.iter_documents(source))
            assert len(docs) == 7 and all(isinstance(d, str) for d in docs)
            assert "examples=7 " in data.describe_source(source)
            cache = data.build_token_cache(tokenizer, source, str(tmp_path), eval_fraction=0.0)
        assert cache.num_documents == 7
        expected = [t for d in docs for t in tokenizer.encode(d) + [tokenizer.eos_id]]
        np.testing.assert_array_equal(cache.train, expected)


def test_bad_tfds_sources(data_dir, tmp_path):
    opts = options(data_dir)
    cases = [
        ("tfds:no_such_dataset_xyz:train", opts, "no TFDS dataset 'no_such_dataset_xyz'"),
        (f"tfds:{NAME}:validation", opts, r"Unknown split 'validation'.*check the split"),
        (f"tfds:{NAME}:2.0.0:train", opts, f"no TFDS dataset '{NAME}:2.0.0'"),
        (f"tfds:{NAME}:train", options(data_dir, "body"),
         r"has no field 'body' \(its fields: \['text', 'title'\]\): set data.tfds_text_field"),
        (f"tfds:{NAME}:train", options(str(tmp_path)), "is not prepared under .*tfds build"),
        ("tfds:", opts, "is not a TFDS source"),
    ]
    for source, opts_, words in cases:
        with pytest.raises(data.DataError, match=words):
            data.iter_documents(source, opts_)             # fails at the call, not at next()
        with pytest.raises(data.DataError, match=words):
            data.describe_source(source, opts_)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="TensorFlow is installed: tfrecord datasets are readable")
def test_tfrecord_needs_tensorflow(data_dir, tmp_path):
    # The same dataset, recorded as tfrecord: tfds.data_source cannot read it and tfds.load
    # needs TensorFlow, which is not installed.
    shutil.copytree(os.path.join(data_dir, NAME), tmp_path / NAME)
    info_path = tmp_path / NAME / "1.0.0" / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info_path.write_text(json.dumps(info))
    with pytest.raises(data.DataError, match=r"stored as tfrecord.*pip install tensorflow-cpu.*"
                                             r"file_format='array_record'"):
        data.iter_documents(f"tfds:{NAME}:train", options(str(tmp_path)))


def test_token_cache_switches_to_a_pool(tokenizer, corpus, tmp_path, monkeypatch, capsys):
    # workers=None: this process first, then a pool once enough text has passed (here after
    # the first chunk of 2 documents); progress lines on the way. The tokens do not change.
    train, _ = corpus
    alone = data.build_token_cache(tokenizer, train, str(tmp_path / "a"), eval_fraction=0.0,
                                   workers=0)
    monkeypatch.setattr(token_cache, "_DOCS_PER_CHUNK", 2)
    monkeypatch.setattr(token_cache, "_POOL_AFTER_BYTES", 1)
    monkeypatch.setattr(token_cache, "_auto_workers", lambda: 2)
    monkeypatch.setattr(token_cache, "_PROGRESS_EVERY_S", 0.0)
    capsys.readouterr()
    switched = data.build_token_cache(tokenizer, train, str(tmp_path / "b"), eval_fraction=0.0)
    out = capsys.readouterr().out
    assert "data: tokenizing in 2 processes" in out
    assert out.count("data: tokenized ") >= 3 and "tokens in" in out and "(done)" in out
    np.testing.assert_array_equal(switched.train, alone.train)
    assert switched.num_documents == alone.num_documents
