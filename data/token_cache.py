"""The token cache: the whole corpus tokenized once into one flat array on disk.

    cache = build_token_cache(tok, "stdlib", cache_dir, eval_fraction=0.01)
    cache.train   # uint16 memmap [num_train_tokens], read-only
    cache.eval    # uint16 memmap [num_eval_tokens], the last 1% of the stream

Documents are joined with EOS after each one:

    documents ["ab", "c"] -> tokens [a b EOS c EOS]

The array is `cache_dir/tokens-<hash>.npy` (uint16 when the vocab fits, else uint32) with a
`.json` beside it (counts, dtype, EOS id, tokenizer fingerprint, source description). The hash
covers the source's files, the tokenizer's fingerprint and the byte budget, so a cache made with
another tokenizer or from changed files is never picked up; the json is checked as well.

Process 0 writes both files under temporary names and renames them (the .json last, so its
presence means the .npy is complete); the other processes wait at `barrier()` and open them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Callable, Iterator

import numpy as np

from data.errors import DataError
from data.sources import describe_source, iter_documents, take_bytes
from data.tokenizer import Tokenizer

_DOCS_PER_CHUNK = 256       # documents sent to encode_batch at once
_PROGRESS_EVERY_S = 5.0


@dataclasses.dataclass(frozen=True)
class TokenCache:
    """The token stream, split into a train head and an eval tail (disjoint token ranges)."""
    path: str
    train: np.ndarray       # [num_tokens - num_eval] read-only memmap
    eval: np.ndarray        # [num_eval] read-only memmap, the last eval_fraction of the stream
    eos_id: int
    num_tokens: int
    num_documents: int


def build_token_cache(tokenizer: Tokenizer, source: str, cache_dir: str, *,
                      eval_fraction: float, process_index: int = 0,
                      barrier: Callable[[], None] = lambda: None,
                      max_bytes: int = 0) -> TokenCache:
    """Tokenizes `source` once (process 0) and opens the cache (every process).

    max_bytes: tokenize only the first max_bytes of text (0: all of it).
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"data.eval_fraction must be in [0, 1), got {eval_fraction}: "
                        f"use e.g. 0.01 for the last 1% of the tokens")
    description = describe_source(source)
    key = json.dumps([description, tokenizer.fingerprint, max_bytes])
    stem = os.path.join(cache_dir, f"tokens-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    npy_path, json_path = stem + ".npy", stem + ".json"
    if process_index == 0 and not (os.path.exists(json_path) and os.path.exists(npy_path)):
        os.makedirs(cache_dir, exist_ok=True)
        meta = {"source": source, "source_description": description, "max_bytes": max_bytes,
                "tokenizer_path": tokenizer.path, "tokenizer_fingerprint": tokenizer.fingerprint,
                "eos_id": tokenizer.eos_id}
        _write_cache(tokenizer, take_bytes(iter_documents(source), max_bytes),
                     npy_path, json_path, meta)
    barrier()
    return _open_cache(npy_path, json_path, tokenizer, eval_fraction)


def _token_dtype(vocab_size: int) -> np.dtype:
    # ids run 0 .. vocab_size-1; uint16 holds them up to a vocab of 65536 and halves the disk.
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _write_cache(tokenizer: Tokenizer, documents: Iterator[str], npy_path: str, json_path: str,
                 meta: dict) -> None:
    dtype = _token_dtype(tokenizer.vocab_size)
    tmp = f".tmp-{os.getpid()}"
    raw_path = npy_path + tmp + ".raw"
    try:
        # Pass 1 streams tokens to a raw file (the count is unknown until the end); pass 2 copies
        # them into an .npy of the right length. Memory stays flat whatever the corpus size.
        num_tokens, num_documents = _tokenize_to_raw(tokenizer, documents, raw_path, dtype)
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
                     dtype: np.dtype) -> tuple[int, int]:
    """Appends each document's ids and an EOS to raw_path. Returns (tokens, documents)."""
    num_tokens = num_documents = 0
    start = last_report = time.monotonic()
    with open(raw_path, "wb") as f:
        for chunk in _chunks(documents, _DOCS_PER_CHUNK):
            ids = []
            for doc_ids in tokenizer.encode_batch(chunk):
                ids += doc_ids
                ids.append(tokenizer.eos_id)
            f.write(np.asarray(ids, dtype=dtype).tobytes())
            num_tokens += len(ids)
            num_documents += len(chunk)
            if time.monotonic() - last_report > _PROGRESS_EVERY_S:
                last_report = time.monotonic()
                print(f"data: tokenized {num_documents} documents, {num_tokens} tokens "
                      f"({num_tokens / (last_report - start):.0f} tokens/s)", flush=True)
    return num_tokens, num_documents


def _raw_to_npy(raw_path: str, npy_path: str, num_tokens: int, dtype: np.dtype) -> None:
    out = np.lib.format.open_memmap(npy_path, mode="w+", dtype=dtype, shape=(num_tokens,))
    raw = np.memmap(raw_path, dtype=dtype, mode="r", shape=(num_tokens,))
    step = 1 << 26
    for i in range(0, num_tokens, step):
        out[i:i + step] = raw[i:i + step]
    out.flush()
    del out, raw


def _open_cache(npy_path: str, json_path: str, tokenizer: Tokenizer,
                eval_fraction: float) -> TokenCache:
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
    split = len(tokens) - num_eval
    return TokenCache(path=npy_path, train=tokens[:split], eval=tokens[split:],
                      eos_id=int(meta["eos_id"]), num_tokens=len(tokens),
                      num_documents=int(meta["num_documents"]))


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
