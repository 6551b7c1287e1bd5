"""Data for ringstripe: corpus -> tokenizer -> token cache -> step-indexed, layout-ordered batches.

Public API (see data/README.md):
  iter_documents(source), describe_source(source)            sources.py
  Tokenizer, load_tokenizer, train_tokenizer, get_tokenizer   tokenizer.py
  TokenCache, build_token_cache                               token_cache.py
  BatchSpec, num_windows, batch_rows, process_batch,          batches.py
  eval_rows, eval_batches
  to_global, Prefetcher                                       pipeline.py
  DataError                                                   every user error
"""

from data.batches import (FIELDS, BatchSpec, batch_rows, eval_batches, eval_rows,
                          num_eval_batches, num_windows, process_batch)
from data.errors import DataError
from data.pipeline import Prefetcher, to_global
from data.sources import SOURCE_KINDS, describe_source, iter_documents
from data.token_cache import TokenCache, build_token_cache
from data.tokenizer import Tokenizer, get_tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "FIELDS", "SOURCE_KINDS", "BatchSpec", "DataError", "Prefetcher", "TokenCache", "Tokenizer",
    "batch_rows", "build_token_cache", "describe_source", "eval_batches", "eval_rows",
    "get_tokenizer", "iter_documents", "load_tokenizer", "num_eval_batches", "num_windows",
    "process_batch", "to_global", "train_tokenizer",
]
