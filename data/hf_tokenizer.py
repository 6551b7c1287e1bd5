"""A Hugging Face `tokenizer.json` (the `tokenizers` library) with the interface of data.Tokenizer.

    tok = load_tokenizer("/models/Llama-3.2-1B/tokenizer.json")   # data.load_tokenizer dispatches
    tok.encode("def f(x):")       # ids, with the special tokens the tokenizer adds (Llama: BOS)
    tok.eos_id                    # from the directory's config.json or tokenizer_config.json

The end-of-sequence id, which separates documents in the token stream, is the model's
`eos_token_id` (config.json; the first of a list) or the id of tokenizer_config.json's
`eos_token`. `tokenizers` encodes a batch on all cores itself, so the token cache never starts a
process pool for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import Iterable

import storage
from data.errors import DataError


class HFTokenizer:
    """A loaded tokenizer.json; build it with data.load_tokenizer."""

    process_pool = False  # the token cache's pool of encoders is for sentencepiece only

    def __init__(self, path: str, content: bytes):
        from tokenizers import Tokenizer as RustTokenizer  # only for tokenizer.json files
        self.path = path
        self.fingerprint = hashlib.sha256(content).hexdigest()[:16]
        try:
            self._tok = RustTokenizer.from_str(content.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the library's parse errors have no common type
            raise DataError(f"tokenizer {path!r} is not a valid tokenizer.json "
                            f"({str(e).splitlines()[0][:120]}): point data.tokenizer_path at "
                            f"another one") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = _eos_id(path, self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self):
        return (f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
                f"fingerprint={self.fingerprint})")


def _read_json(path: str) -> dict:
    try:
        return json.loads(storage.read_text(path))  # a local file, or a bucket's
    except (OSError, json.JSONDecodeError):
        return {}


def _eos_id(path: str, tok) -> int:
    folder = posixpath.dirname(path) if storage.is_remote(path) else os.path.dirname(path)
    eos = _read_json(storage.join(folder, "config.json")).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        token = _read_json(storage.join(folder, "tokenizer_config.json")).get("eos_token")
        if isinstance(token, dict):  # older files: {"content": "</s>", ...}
            token = token.get("content")
        eos = tok.token_to_id(token) if token else None
    if eos is None or not 0 <= int(eos) < tok.get_vocab_size(with_added_tokens=True):
        raise DataError(f"tokenizer {path!r}: no end-of-sequence token (eos_token_id in "
                        f"config.json or eos_token in tokenizer_config.json beside it), which "
                        f"separates documents: add one of them")
    return int(eos)
