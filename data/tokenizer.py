"""The tokenizer: a sentencepiece model, loaded from a file or trained once on the corpus.

    tok = get_tokenizer(config.data, cache_dir)     # trains on first use, then loads from the cache
    ids = tok.encode("def f(x):\n    return x")     # list[int]
    tok.decode(ids)                                  # the same text back, whitespace included

Trained tokenizers are made for code as well as prose: no normalization, whitespace kept as is,
digits split, a single piece for '\\n', and byte fallback so any text round-trips exactly.
EOS (id 1) separates documents in the token stream; there is no BOS and no padding piece.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Callable, Iterable, Iterator

import sentencepiece as spm

import storage
from data.errors import DataError
from data.hf_tokenizer import HFTokenizer
from data.progress import Ticker
from data.sources import describe_source, iter_documents, source_options, take_bytes

# sentencepiece reads its training text one line per sentence: documents are split into lines.
# More lines than this are thinned evenly (deterministically) so training takes seconds.
MAX_TRAINING_LINES = 1_000_000
# A fixed thread count: sentencepiece's BPE merges break ties differently with other counts, and a
# tokenizer trained twice on the same text should come out byte-identical.
_TRAIN_THREADS = 4
# get_tokenizer trains on at most this much text: 1M lines is about 40 MB of code, and the whole
# corpus need not pass through a temporary file.
TOKENIZER_TRAIN_BYTES = 100_000_000


class Tokenizer:
    """A loaded sentencepiece model. Build it with `load_tokenizer` or `train_tokenizer`."""

    process_pool = True  # the token cache may encode big corpora in a pool of processes

    def __init__(self, path: str, model_bytes: bytes):
        self.path = path
        # Identifies the exact model: caches of tokens are keyed on it.
        self.fingerprint = hashlib.sha256(model_bytes).hexdigest()[:16]
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(model_bytes)  # RuntimeError if corrupt
        self.vocab_size = self._sp.vocab_size()
        self.eos_id = self._sp.eos_id()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __repr__(self):
        return (f"Tokenizer({self.path!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
                f"fingerprint={self.fingerprint})")


def load_tokenizer(path: str) -> Tokenizer:
    """Loads a sentencepiece .model file, or a Hugging Face tokenizer.json (data/hf_tokenizer.py).
    DataError if it is missing, corrupt or has no EOS."""
    try:
        model_bytes = storage.path(path).read_bytes()  # a local file, or a bucket's (gs://)
    except OSError as e:
        raise DataError(f"data.tokenizer_path: cannot read {path!r} ({e.strerror or e}): point "
                        f"it at a sentencepiece .model or a tokenizer.json file, or leave it "
                        f"empty to train one") from e
    if path.endswith(".json"):
        return HFTokenizer(path, model_bytes)
    try:
        tok = Tokenizer(path, model_bytes)
    except RuntimeError as e:
        raise DataError(f"data.tokenizer_path: {path!r} is not a valid sentencepiece model: "
                        f"delete it to retrain, or point at another .model file") from e
    if tok.eos_id < 0:
        raise DataError(f"data.tokenizer_path: {path!r} has no EOS piece, which separates "
                        f"documents: use a model trained with eos_id set")
    return tok


def train_tokenizer(documents: Iterable[str], out_path: str, *, vocab_size: int,
                    model_type: str = "bpe", max_bytes: int) -> Tokenizer:
    """Trains a sentencepiece model on up to `max_bytes` of `documents` (0: all of them).

    Writes `out_path` (and the `.vocab` beside it) atomically: under a temporary name first, then
    renamed, so a reader never sees half a file. About 5 s for BPE 8k on the 31 MB stdlib corpus.
    """
    tmp = f".tmp-{os.getpid()}"
    text_path, vocab_path = out_path + tmp + ".txt", _vocab_path(out_path)
    try:
        _write_training_text(take_bytes(iter(documents), max_bytes), text_path)
        model_bytes = _run_trainer(text_path, vocab_size=vocab_size, model_type=model_type)
        _write_file(vocab_path + tmp, _vocab_text(model_bytes).encode("utf-8"))
        _write_file(out_path + tmp, model_bytes)
        # The .vocab first: once the .model exists under its name, both are complete.
        os.replace(vocab_path + tmp, vocab_path)
        os.replace(out_path + tmp, out_path)
    finally:
        for leftover in (text_path, vocab_path + tmp, out_path + tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
    return load_tokenizer(out_path)


def get_tokenizer(config_data, cache_dir: str, *, process_index: int = 0,
                  barrier: Callable[[], None] = lambda: None) -> Tokenizer:
    """The run's tokenizer: `config_data.tokenizer_path` if set, else one trained and cached.

    Reads config_data (a run_config.DataConfig): tokenizer_path ('': train), source,
    vocab_size, tokenizer_model_type ('bpe' or 'unigram') and max_bytes (the corpus budget,
    0 = all; training reads at most TOKENIZER_TRAIN_BYTES of it). The cached model lives at
    cache_dir/tokenizer-<hash>.model, the hash covering the source's files, vocab size, type and
    byte budget. Process 0 trains it when missing; every process waits
    at `barrier()` and then loads it, so cache_dir must be a filesystem all processes see.
    """
    if config_data.tokenizer_path:
        return load_tokenizer(config_data.tokenizer_path)
    source = _required(config_data, "source")
    vocab_size = int(_required(config_data, "vocab_size"))
    model_type = config_data.tokenizer_model_type
    max_bytes = int(config_data.max_bytes)
    options = source_options(config_data)
    key = json.dumps([describe_source(source, options), vocab_size, model_type, max_bytes])
    path = os.path.join(cache_dir, f"tokenizer-{_short_hash(key)}.model")
    if process_index == 0 and not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        print(f"data: training a {model_type} tokenizer, vocab {vocab_size}, on {source!r} "
              f"-> {path}", flush=True)
        train_bytes = min(max_bytes, TOKENIZER_TRAIN_BYTES) if max_bytes else TOKENIZER_TRAIN_BYTES
        with Ticker("data: training the tokenizer", "data: tokenizer trained"):
            train_tokenizer(iter_documents(source, options), path, vocab_size=vocab_size,
                            model_type=model_type, max_bytes=train_bytes)
    barrier()
    return load_tokenizer(path)


# ---------------------------------------------------------------------------------------------


def _write_training_text(documents: Iterator[str], text_path: str) -> None:
    """One non-empty line per sentence; thinned evenly to MAX_TRAINING_LINES."""
    num_lines = 0
    # newline="\n": a '\r' inside a line is text, not a line end.
    with open(text_path, "w", encoding="utf-8", newline="\n") as f:
        for doc in documents:
            for line in doc.split("\n"):
                if line:
                    f.write(line + "\n")
                    num_lines += 1
    if num_lines == 0:
        raise DataError("tokenizer: the corpus has no text to train on: "
                        "use a non-empty data.source or a larger data.max_bytes")
    if num_lines > MAX_TRAINING_LINES:
        _thin_lines(text_path, num_lines, MAX_TRAINING_LINES)


def _thin_lines(text_path: str, num_lines: int, keep: int) -> None:
    """Keeps lines i * num_lines // keep: spread over the whole corpus, the same every time.

    (sentencepiece's own sampling, shuffle_input_sentence, is seeded from the clock.)
    """
    thinned = text_path + ".thin"
    kept = 0
    with (open(text_path, encoding="utf-8", newline="\n") as src,
          open(thinned, "w", encoding="utf-8", newline="\n") as dst):
        for i, line in enumerate(src):
            if kept < keep and i == kept * num_lines // keep:
                dst.write(line)
                kept += 1
    os.replace(thinned, text_path)


def _run_trainer(text_path: str, *, vocab_size: int, model_type: str) -> bytes:
    """The trained model's bytes.

    The lines are fed through sentence_iterator and the model comes back through model_writer:
    with file paths, sentencepiece records them inside the model, and the same text trained to
    another path would give other bytes, so another fingerprint and a needless cache rebuild.
    """
    if model_type not in ("bpe", "unigram"):
        raise DataError(f"data.tokenizer_model_type: {model_type!r} is not supported: "
                        f"use 'bpe' (seconds) or 'unigram' (minutes)")
    model = io.BytesIO()
    try:
        with open(text_path, encoding="utf-8", newline="\n") as f:
            spm.SentencePieceTrainer.train(
                sentence_iterator=(line[:-1] for line in f),  # drop the '\n' ending each line
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                unk_id=0, eos_id=1, bos_id=-1, pad_id=-1,  # EOS joins documents; no BOS, no pad
                byte_fallback=True,                   # unseen characters become bytes, never <unk>
                normalization_rule_name="identity",   # the text as written: no NFKC
                remove_extra_whitespaces=False,       # code needs its indentation
                add_dummy_prefix=False,               # so decode(encode(s)) == s exactly
                allow_whitespace_only_pieces=True,    # runs of indentation become single pieces
                split_digits=True,
                user_defined_symbols=["\n"],          # lines are split for training; '\n' one piece
                max_sentence_length=1 << 16,          # long lines of code or prose are kept
                input_sentence_size=MAX_TRAINING_LINES,
                shuffle_input_sentence=False,         # lines are already thinned, deterministically
                num_threads=_TRAIN_THREADS,
                minloglevel=2,                        # no screens of trainer logs
            )
    except RuntimeError as e:
        detail = " ".join(str(e).split("]")[-1].split()) or str(e)  # one line, no C++ location
        raise DataError(f"tokenizer: sentencepiece could not train a vocab of {vocab_size} "
                        f"({detail}): change data.vocab_size or use a larger corpus") from e
    return model.getvalue()


def _vocab_text(model_bytes: bytes) -> str:
    """sentencepiece's .vocab format, 'piece<TAB>score' per id, for people to read."""
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    lines = []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i).replace("\n", "\\n").replace("\t", "\\t")
        lines.append(f"{piece}\t{sp.get_score(i):g}\n")
    return "".join(lines)


def _write_file(path: str, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def _vocab_path(model_path: str) -> str:
    stem = model_path[:-len(".model")] if model_path.endswith(".model") else model_path
    return stem + ".vocab"


def _required(config_data, name: str):
    value = getattr(config_data, name)
    if value is None or value == "":
        raise DataError(f"config.data.{name} is not set: set it in the config file")
    return value


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
