"""The token cache: the whole corpus tokenized once into one flat array on disk.

    cache = build_token_cache(tok, "stdlib", cache_dir, eval_fraction=0.01)
    cache.train   # uint16 memmap [num_train_tokens], read-only
    cache.eval    # uint16 memmap [num_eval_tokens], the last 1% of the stream

Documents are joined with EOS after each one:

    documents ["ab", "c"] -> tokens [a b EOS c EOS]

The array is `cache_dir/tokens-<hash>.npy` (uint16 when the vocab fits, else uint32) with a
`.json` beside it (counts, dtype, EOS id, tokenizer fingerprint, source description). The hash
covers the source's description (files; or a TFDS split's name, version, example count, text
field and data_dir), the tokenizer's fingerprint and the byte budget, so a cache made with
another tokenizer or from changed files is never picked up; the json is checked as well.

The source is read once, on a thread ahead of tokenization, in chunks that sentencepiece encodes
on every core; big corpora on big machines go through a process pool (chunks written in order,
so the tokens never depend on it). A progress line appears every few seconds.

Process 0 writes both files under temporary names and renames them (the .json last, so its
presence means the .npy is complete); the other processes wait at `barrier()` and open them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import queue
import sys
import threading
import time
from typing import Callable, Iterator

import numpy as np
import sentencepiece as spm

from data.errors import DataError
from data.sources import SourceOptions, describe_source, iter_documents, take_bytes
from data.tokenizer import Tokenizer

_DOCS_PER_CHUNK = 1024      # documents sent to encode_batch at once ...
_BYTES_PER_CHUNK = 4 << 20  # ... or about this much text, whichever comes first
_POOL_AFTER_BYTES = 64 << 20  # auto workers: a process pool once this much text has passed
_MAX_WORKERS = 16
_PROGRESS_EVERY_S = 5.0


@dataclasses.dataclass(frozen=True)
class TokenCache:
    """The token stream, split into a train head and an eval tail (disjoint token ranges)."""
    path: str
    train: np.ndarray       # [num_tokens - num_eval] read-only memmap
    eval: np.ndarray        # [num_eval] read-only memmap: the last eval_fraction of the stream,
                            # or min_eval_tokens if that is more
    eos_id: int
    num_tokens: int
    num_documents: int


def build_token_cache(tokenizer: Tokenizer, source: str, cache_dir: str, *,
                      eval_fraction: float, process_index: int = 0,
                      barrier: Callable[[], None] = lambda: None,
                      max_bytes: int = 0, options: SourceOptions | None = None,
                      workers: int | None = None, min_eval_tokens: int = 0) -> TokenCache:
    """Tokenizes `source` once (process 0) and opens the cache (every process).

    min_eval_tokens: the eval split holds at least this many tokens (one eval batch of a run:
        global_batch x seq_len + 1), taken from the end of the stream when eval_fraction gives
        fewer, so that a long-sequence config works with the default fraction; DataError if
        the training split would then not hold as many.
    max_bytes: tokenize only the first max_bytes of text (0: all of it).
    options: what TFDS sources read besides the string, `data.source_options(config.data)`.
    workers: tokenizing processes; 0 = this process only (sentencepiece still uses every core);
        None = a pool of up to 16 once a corpus passes 64 MB, on machines with 4+ cores.
        The tokens are the same whatever the count.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"data.eval_fraction must be in [0, 1), got {eval_fraction}: "
                        f"use e.g. 0.01 for the last 1% of the tokens")
    description = describe_source(source, options)
    key = json.dumps([description, tokenizer.fingerprint, max_bytes])
    stem = os.path.join(cache_dir, f"tokens-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    npy_path, json_path = stem + ".npy", stem + ".json"
    if process_index == 0 and not (os.path.exists(json_path) and os.path.exists(npy_path)):
        os.makedirs(cache_dir, exist_ok=True)
        meta = {"source": source, "source_description": description, "max_bytes": max_bytes,
                "tokenizer_path": tokenizer.path, "tokenizer_fingerprint": tokenizer.fingerprint,
                "eos_id": tokenizer.eos_id}
        _write_cache(tokenizer, take_bytes(iter_documents(source, options), max_bytes),
                     npy_path, json_path, meta, workers)
    barrier()
    return _open_cache(npy_path, json_path, tokenizer, eval_fraction, min_eval_tokens)


def _token_dtype(vocab_size: int) -> np.dtype:
    # ids run 0 .. vocab_size-1; uint16 holds them up to a vocab of 65536 and halves the disk.
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _write_cache(tokenizer: Tokenizer, documents: Iterator[str], npy_path: str, json_path: str,
                 meta: dict, workers: int | None = None) -> None:
    dtype = _token_dtype(tokenizer.vocab_size)
    tmp = f".tmp-{os.getpid()}"
    raw_path = npy_path + tmp + ".raw"
    try:
        # Pass 1 streams tokens to a raw file (the count is unknown until the end); pass 2 copies
        # them into an .npy of the right length. Memory stays flat whatever the corpus size.
        num_tokens, num_documents = _tokenize_to_raw(tokenizer, documents, raw_path, dtype,
                                                     workers)
        _raw_to_npy(raw_path, npy_path + tmp, num_tokens, dtype)
        os.replace(npy_path + tmp, npy_path)
        meta = dict(meta, num_tokens=num_tokens, num_documents=num_documents, dtype=dtype.name)
        with open(json_path + tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(json_path + tmp, json_path)  # last: the cache is complete from here on
    finally:
        for leftover in (raw_path, npy_path + tmp, json_path + tmp):
            if os.path.exists(leftover):
                os.remove(leftover)


def _tokenize_to_raw(tokenizer: Tokenizer, documents: Iterator[str], raw_path: str,
                     dtype: np.dtype, workers: int | None = None) -> tuple[int, int]:
    """Appends each document's ids and an EOS to raw_path, in order. Returns (tokens, documents).

    Reading runs on a thread of its own, ahead of tokenization (sentencepiece encodes a chunk on
    all cores, without the GIL). With `workers` processes (None: auto, for corpora past
    _POOL_AFTER_BYTES on machines with 4+ cores) chunks are tokenized in a process pool instead;
    the output is the same token stream whatever the worker count, chunks are written in order.
    """
    progress = _Progress()
    with open(raw_path, "wb") as f:
        for ids, docs, nbytes in _encoded_chunks(tokenizer, documents, dtype, workers):
            f.write(ids.tobytes())
            progress.add(docs, nbytes, len(ids))
    progress.done()
    return progress.tokens, progress.documents


def _auto_workers() -> int:
    cores = os.cpu_count() or 1
    return 0 if cores < 4 else min(cores, _MAX_WORKERS)


def _encoded_chunks(tokenizer: Tokenizer, documents: Iterator[str], dtype: np.dtype,
                    workers: int | None) -> Iterator[tuple[np.ndarray, int, int]]:
    """(ids with an EOS after each document, documents, utf-8 bytes) per chunk, in order."""
    pool_after = _POOL_AFTER_BYTES if workers is None else 0
    workers = _auto_workers() if workers is None else workers
    if not tokenizer.process_pool:  # it encodes a batch on every core by itself
        workers = 0
    with _ReadAhead(_text_chunks(documents)) as chunks:
        seen = 0
        if workers < 2 or pool_after > 0:   # small corpora never pay for starting a pool
            for chunk, nbytes in chunks:
                ids = _encode_chunk(tokenizer.encode_batch, tokenizer.eos_id, chunk, dtype)
                yield ids, len(chunk), nbytes
                seen += nbytes
                if workers >= 2 and seen >= pool_after:
                    break
            else:
                return
        print(f"data: tokenizing in {workers} processes", flush=True)
        context = multiprocessing.get_context("spawn")   # never fork a process running JAX
        with concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context, initializer=_init_worker,
                initargs=(_model_bytes(tokenizer), dtype.str)) as pool:
            pending: collections.deque = collections.deque()
            for chunk, nbytes in chunks:
                pending.append((pool.submit(_encode_in_worker, chunk), len(chunk), nbytes))
                if len(pending) >= 2 * workers:       # bounded: memory stays flat
                    future, docs, size = pending.popleft()
                    yield future.result(), docs, size
            while pending:
                future, docs, size = pending.popleft()
                yield future.result(), docs, size


def _encode_chunk(encode_batch: Callable[[list[str]], list[list[int]]], eos_id: int,
                  chunk: list[str], dtype: np.dtype) -> np.ndarray:
    """The chunk's ids with an EOS after each document, as one flat array."""
    eos = (eos_id,)
    return np.fromiter(
        itertools.chain.from_iterable(itertools.chain(ids, eos) for ids in encode_batch(chunk)),
        dtype=dtype)


_worker = None   # (sentencepiece processor, eos id, dtype) in a pool process


def _init_worker(model: bytes, dtype: str) -> None:
    global _worker
    # One thread per process: the pool is the parallelism.
    sp = spm.SentencePieceProcessor(model_proto=model, num_threads=1)
    _worker = (sp, sp.eos_id(), np.dtype(dtype))


def _encode_in_worker(chunk: list[str]) -> np.ndarray:
    sp, eos_id, dtype = _worker
    return _encode_chunk(lambda texts: sp.encode(texts, out_type=int), eos_id, chunk, dtype)


def _model_bytes(tokenizer: Tokenizer) -> bytes:
    with open(tokenizer.path, "rb") as f:
        model = f.read()
    if hashlib.sha256(model).hexdigest()[:16] != tokenizer.fingerprint:
        raise DataError(f"tokenizer file {tokenizer.path!r} changed after it was loaded: "
                        f"load it again")
    return model


def _text_chunks(documents: Iterator[str]) -> Iterator[tuple[list[str], int]]:
    """Lists of up to _DOCS_PER_CHUNK documents or about _BYTES_PER_CHUNK bytes, with their size."""
    chunk, nbytes = [], 0
    for doc in documents:
        chunk.append(doc)
        nbytes += len(doc.encode("utf-8"))
        if len(chunk) == _DOCS_PER_CHUNK or nbytes >= _BYTES_PER_CHUNK:
            yield chunk, nbytes
            chunk, nbytes = [], 0
    if chunk:
        yield chunk, nbytes


class _ReadAhead:
    """Iterates `items` on a thread, up to `depth` ahead; an exception there is raised here."""

    _END = object()

    def __init__(self, items: Iterator, depth: int = 4):
        self._items = items
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="data-read-ahead")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as e:  # noqa: BLE001  (raised on the consuming thread)
            self._put(e)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


class _Progress:
    """A line every _PROGRESS_EVERY_S seconds (redrawn in place on a terminal), and a summary."""

    def __init__(self):
        self.tokens = self.documents = self.bytes = 0
        self._start = self._last = time.monotonic()
        self._tty = sys.stdout.isatty()

    def add(self, documents: int, nbytes: int, tokens: int) -> None:
        self.documents += documents
        self.bytes += nbytes
        self.tokens += tokens
        if time.monotonic() - self._last >= _PROGRESS_EVERY_S:
            self._last = time.monotonic()
            print(self._line(), end="\r" if self._tty else "\n", flush=True)

    def done(self) -> None:
        if self._last != self._start or self._tty:
            print(self._line() + " (done)", flush=True)

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        return (f"data: tokenized {self.documents:,} documents, {self.bytes / 1e6:,.1f} MB, "
                f"{self.tokens:,} tokens in {elapsed:.0f} s "
                f"({self.tokens / elapsed / 1e6:.2f} M tokens/s)")


def _raw_to_npy(raw_path: str, npy_path: str, num_tokens: int, dtype: np.dtype) -> None:
    out = np.lib.format.open_memmap(npy_path, mode="w+", dtype=dtype, shape=(num_tokens,))
    raw = np.memmap(raw_path, dtype=dtype, mode="r", shape=(num_tokens,))
    step = 1 << 26
    for i in range(0, num_tokens, step):
        out[i:i + step] = raw[i:i + step]
    out.flush()
    del out, raw


def _open_cache(npy_path: str, json_path: str, tokenizer: Tokenizer,
                eval_fraction: float, min_eval_tokens: int = 0) -> TokenCache:
    try:
        with open(json_path) as f:
            meta = json.load(f)
        tokens = np.load(npy_path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"token cache {npy_path!r} is missing or unreadable ({e}): the cache "
                        f"directory must be one every process sees; delete the file to rebuild"
                        ) from e
    if meta.get("tokenizer_fingerprint") != tokenizer.fingerprint:
        raise DataError(f"token cache {npy_path!r} was built with tokenizer "
                        f"{meta.get('tokenizer_fingerprint')}, not {tokenizer.fingerprint}: "
                        f"delete it to rebuild")
    if tokens.shape != (meta["num_tokens"],) or tokens.dtype.name != meta["dtype"]:
        raise DataError(f"token cache {npy_path!r} does not match its .json: "
                        f"delete both to rebuild")
    num_eval = int(len(tokens) * eval_fraction)
    if eval_fraction > 0 and num_eval < min_eval_tokens:
        if 2 * min_eval_tokens > len(tokens):
            raise DataError(f"the corpus has {len(tokens):,} tokens: one eval batch and one "
                            f"training batch need {min_eval_tokens:,} each: bring a larger "
                            f"corpus (data.source) or lower seq_len or global_batch_size")
        num_eval = min_eval_tokens
    split = len(tokens) - num_eval
    return TokenCache(path=npy_path, train=tokens[:split], eval=tokens[split:],
                      eos_id=int(meta["eos_id"]), num_tokens=len(tokens),
                      num_documents=int(meta["num_documents"]))
