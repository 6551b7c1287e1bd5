"""Data for ringstripe: corpus -> tokenizer -> token cache -> step-indexed, layout-ordered batches.

Public API (see data/README.md):
  iter_documents(source, options), describe_source(source, options),    sources.py
  SourceOptions, source_options(config.data), parse_tfds_source
  Tokenizer, load_tokenizer, train_tokenizer, get_tokenizer             tokenizer.py
  TokenCache, build_token_cache                                         token_cache.py
  BatchSpec, num_windows, batch_rows, process_batch,                    batches.py
  eval_rows, eval_batches
  to_global, local_block (local_rows, local_columns), assemble_global,  pipeline.py
  Prefetcher
  GrainPrefetcher, CacheRows, make_prefetcher                           grain_loader.py
  prepare_data, cache_location, sample_segment_ids, natural_segment_ids  prepare.py
  DataError                                                             every user error
"""

from data.batches import (FIELDS, BatchSpec, batch_rows, eval_batches, eval_rows,
                          num_eval_batches, num_windows, process_batch)
from data.errors import DataError
from data.grain_loader import LOADERS, CacheRows, GrainPrefetcher, make_prefetcher
from data.pipeline import (Prefetcher, assemble_global, local_block, local_columns, local_rows,
                           to_global)
from data.prepare import (cache_location, laid_out_for, natural_segment_ids, prepare_data,
                          sample_segment_ids)
from data.sources import (SOURCE_KINDS, SourceOptions, TfdsSource, describe_source,
                          iter_documents, parse_tfds_source, source_options)
from data.token_cache import TokenCache, build_token_cache
from data.tokenizer import Tokenizer, get_tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "FIELDS", "LOADERS", "SOURCE_KINDS", "BatchSpec", "CacheRows", "DataError", "GrainPrefetcher",
    "Prefetcher", "SourceOptions", "TfdsSource", "TokenCache", "Tokenizer", "assemble_global",
    "batch_rows", "build_token_cache", "cache_location", "describe_source", "eval_batches", "eval_rows",
    "get_tokenizer", "iter_documents", "laid_out_for", "load_tokenizer", "local_block", "local_columns",
    "local_rows", "make_prefetcher", "natural_segment_ids", "num_eval_batches", "num_windows",
    "parse_tfds_source", "prepare_data", "process_batch", "sample_segment_ids", "source_options",
    "to_global", "train_tokenizer",
]
