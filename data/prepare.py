"""A run's data, from its config: the tokenizer and token cache (process 0 builds shared files, the
others wait and read them) and the BatchSpec its batches are cut by, laid out for the run's
resolved attention (parallel.AttentionChoice: the layout, and balanced's unit).

    prepare_data(config, workdir, num_seq_shards, choice) -> (tokenizer, cache, spec)
    sample_segment_ids(config, workdir, rows) -> int32 [rows, seq_len] of the first rows
    natural_segment_ids(cache, spec, rows)    -> the same from a prepared run
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import numpy as np
from jax.experimental import multihost_utils

import storage
from storage.run_dir import RunDir
from data.batches import BatchSpec, batch_rows
from data.errors import DataError
from data.passkey import PasskeyMix
from data.sources import source_options
from data.token_cache import build_token_cache
from data.tokenizer import get_tokenizer


def barrier(name: str):
    """Blocks until every process gets here (a no-op with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def cache_location(config, workdir: str) -> str:
    """Where the run's tokenizer and token cache live: data.cache_dir, else WORKDIR/cache (a
    local directory, or gs://...)."""
    return config.data.cache_dir or RunDir(workdir).cache


def prepare_data(config, workdir: str, num_seq_shards: int, choice):
    """(tokenizer, token cache, BatchSpec); DataError for a corpus or tokenizer that does not
    fit the config. With the cache in an object store, the files are built (or pulled) in a
    local mirror, which is what the tokenizer and the memory-mapped cache read."""
    cache_dir = cache_location(config, workdir)
    if not storage.is_remote(cache_dir):
        if jax.process_index() == 0:  # the directory every process shares
            remove_stale_temp_files(cache_dir)
        kw = dict(process_index=jax.process_index(), barrier=lambda: barrier("data"))
        return _prepare(config, cache_dir, num_seq_shards, choice, kw)
    local = storage.mirror(cache_dir)
    remove_stale_temp_files(local)  # each host its own mirror (live writers' files stay)
    alone = dict(process_index=0, barrier=lambda: None)  # the mirror is this host's own
    if jax.process_index() == 0:
        storage.pull(cache_dir, local)  # what an earlier start (on any machine) built
        prepared = _prepare(config, local, num_seq_shards, choice, alone)
        # A cache's .npy and a tokenizer's .vocab go before the file that says it is complete.
        finished = sorted((n for n in os.listdir(local) if ".tmp-" not in n),
                          key=lambda n: n.endswith((".json", ".model")))
        storage.push(local, cache_dir, finished)
    barrier("data pushed")
    if jax.process_index() != 0:
        storage.pull(cache_dir, local)
        prepared = _prepare(config, local, num_seq_shards, choice, alone)
    return prepared


def remove_stale_temp_files(cache_dir: str) -> list[str]:
    """Removes what a killed tokenization left (NAME.tmp-PID...): files of processes not running
    on this host. A cache directory may be shared by runs, so a live writer's files stay."""
    if not os.path.isdir(cache_dir):
        return []
    removed = []
    for name in os.listdir(cache_dir):
        match = re.search(r"\.tmp-(\d+)", name)
        if match and not storage.process_running(int(match.group(1))):
            os.remove(os.path.join(cache_dir, name))
            removed.append(name)
    return removed


def _prepare(config, cache_dir: str, num_seq_shards: int, choice, kw: dict):
    tokenizer = get_tokenizer(config.data, cache_dir, **kw)
    # Every id must have an embedding row. A model may have more rows than its tokenizer has
    # pieces (Hugging Face models often pad theirs); a trained tokenizer has exactly as many.
    too_many = tokenizer.vocab_size > config.model.vocab_size
    if too_many or (not tokenizer.path.endswith(".json")
                    and tokenizer.vocab_size != config.model.vocab_size):
        raise DataError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} pieces but "
            f"model.vocab_size is {config.model.vocab_size}: "
            + ("its ids would index past the embedding: use the model's own tokenizer"
               if config.init_from else
               f"set --config.model.vocab_size={tokenizer.vocab_size} or use a matching "
               f"tokenizer"))
    cache = build_token_cache(tokenizer, config.data.source, cache_dir,
                              eval_fraction=config.data.eval_fraction,
                              max_bytes=config.data.max_bytes,
                              options=source_options(config.data),
                              min_eval_tokens=config.tokens_per_step + 1,
                              **kw)
    if len(cache.train) < config.seq_len + 1:
        raise DataError(
            f"the training split has {len(cache.train):,} tokens, smaller than one sequence of "
            f"seq_len + 1 = {config.seq_len + 1}: use a larger corpus or a smaller seq_len")
    spec = BatchSpec(seq_len=config.seq_len, global_batch=config.global_batch_size,
                     seed=config.seed, layout=choice.layout, num_seq_shards=num_seq_shards,
                     mask_documents=config.data.mask_documents,
                     reset_positions=config.data.reset_positions,
                     eos_id=tokenizer.eos_id, tile=choice.balance_unit,
                     passkey=_passkey_mix(config, tokenizer))
    return tokenizer, cache, spec


def laid_out_for(spec: BatchSpec, choice) -> BatchSpec:
    """The batches of `spec` laid out for the attention `choice` (its layout; balanced's
    unit, its tiles'): what a run whose attention was resolved on the corpus's own documents
    builds."""
    return dataclasses.replace(spec, layout=choice.layout, tile=choice.balance_unit)


def _passkey_mix(config, tokenizer) -> PasskeyMix | None:
    """The training rows' passkey examples (data/passkey.py), None without them."""
    if not config.data.passkey_fraction:
        return None
    mix = PasskeyMix.build(tokenizer, config.data.passkey_fraction,
                           config.data.passkey_min_len,
                           config.data.passkey_weight,
                           config.data.passkey_repeats)
    need = max(mix.shortest + 1, config.data.passkey_min_len)
    if config.seq_len + 1 < need:
        raise DataError(f"seq_len={config.seq_len} is shorter than one passkey example "
                        f"({need} tokens with this tokenizer): raise seq_len or set "
                        f"data.passkey_fraction=0")
    return mix


def natural_segment_ids(cache, spec: BatchSpec, rows: int) -> np.ndarray:
    """Segment ids int32 [rows, seq_len] of step 0's first `rows` training rows in natural order
    (documents at EOS whatever spec.mask_documents says)."""
    spec = dataclasses.replace(spec, global_batch=rows, layout="ring", num_seq_shards=1,
                               mask_documents=True, tile=None)
    return batch_rows(cache.train, spec, 0, np.arange(rows))["segment_ids"]


def sample_segment_ids(config, workdir: str, rows: int) -> np.ndarray:
    """Segment ids int32 [rows, seq_len], natural order, of the run's first training rows (its
    tokenizer, corpus and windows): the document lengths the planner and
    scripts/bench/documents.py measure layouts on. Builds the tokenizer and token cache in
    workdir (or data.cache_dir) unless they are there already."""
    _, cache, spec = prepare_data(config, workdir, 1, _NaturalOrder())
    return natural_segment_ids(cache, spec, rows)


@dataclasses.dataclass(frozen=True)
class _NaturalOrder:
    """The rows as they come, on one shard (what sample_segment_ids reads)."""

    layout: str = "ring"
    balance_unit: int | None = None
