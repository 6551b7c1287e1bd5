"""The same step-indexed batches as `Prefetcher`, built by grain in threads or worker processes.

    prefetch = GrainPrefetcher(cache, mesh, spec, start_step=step, workers=2)
    step, batch = prefetch.next()          # batch: global [B, S] jax.Arrays, P('data', 'seq')
    ...
    prefetch.close()                       # stops the threads and worker processes

The pipeline, for this process's rows R and laid-out columns C = local_block(mesh, spec):

    grain.MapDataset.range(start_step, start_step + num_steps)     element i = step start_step + i
      .map(step -> (step, batch_fn(step, R, C)))                    numpy, random access
      .to_iter_dataset(ReadOptions(num_threads, prefetch_buffer_size=depth))
      .mp_prefetch(MultiprocessingOptions(num_workers=workers))    only when workers > 0

and `next()` turns each host batch into global jax.Arrays on the calling thread. Element i is a
pure function of its step, and with N workers grain gives worker w the elements w, w+N, ... and
reads them back round-robin, so the batches are byte-identical whatever the worker count, equal
to `Prefetcher`'s, and the same for step k whether a run starts at 0 or resumes at k.

Worker processes are spawned, so the batch function is pickled: a `TokenCache` (or `CacheRows`)
pickles as its file path and reopens the memmap in the worker; a `functools.partial` over
`cache.train` would copy the whole token array into every worker.

`make_prefetcher(config.data, cache, mesh, spec, start_step)` picks the loader from the config:
data.loader = 'thread' (Prefetcher, the default) or 'grain' (GrainPrefetcher with
data.grain_workers processes; 0 = grain threads in this process).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from absl import flags

from data.batches import BatchSpec, batch_rows, eval_rows
from data.errors import DataError
from data.pipeline import BatchFn, Prefetcher, assemble_global, local_block
from data.token_cache import TokenCache

LOADERS = ("thread", "grain")
_ENDLESS = 1 << 40          # steps in an open-ended run: more than any run takes


def make_prefetcher(config_data, cache: TokenCache, mesh, spec: BatchSpec, start_step: int = 0):
    """The training batches of steps start_step, start_step+1, ... with the configured loader.

    Reads config_data.loader ('thread' | 'grain') and config_data.grain_workers (a
    run_config.DataConfig's). Both loaders give the same batches; either has next() and close().
    """
    loader, workers = config_data.loader, config_data.grain_workers
    if loader == "thread":
        return Prefetcher(functools.partial(batch_rows, cache.train, spec), mesh, spec,
                          start_step=start_step)
    if loader == "grain":
        return GrainPrefetcher(cache, mesh, spec, start_step=start_step, workers=workers)
    raise DataError(f"data.loader: {loader!r} is not a loader: use one of {LOADERS}")


class CacheRows:
    """batch_fn(step, rows, columns) over one split of a token cache, cheap to pickle.

    split 'train': `batch_rows` (shuffled windows, by step); 'eval': `eval_rows` (in order, by
    batch index). Pickles as (path, token range, spec); a worker reopens the .npy as a memmap.
    """

    def __init__(self, cache: TokenCache, spec: BatchSpec, split: str = "train"):
        if split not in ("train", "eval"):
            raise DataError(f"CacheRows: split {split!r} is not 'train' or 'eval'")
        self.path, self.spec, self.split = cache.path, spec, split
        self.num_tokens = cache.num_tokens
        self.start = 0 if split == "train" else len(cache.train)
        self.stop = len(cache.train) if split == "train" else cache.num_tokens
        self._tokens = cache.train if split == "train" else cache.eval

    def __call__(self, step: int, rows, columns=None) -> dict[str, np.ndarray]:
        rows_fn = batch_rows if self.split == "train" else eval_rows
        return rows_fn(self.tokens, self.spec, step, rows, columns)

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            tokens = np.load(self.path, mmap_mode="r")
            if len(tokens) != self.num_tokens:
                raise DataError(f"token cache {self.path!r} changed since it was opened: "
                                f"the run's cache files must stay as they are while it runs")
            self._tokens = tokens[self.start:self.stop]
        return self._tokens

    def __getstate__(self):
        return dict(self.__dict__, _tokens=None)


class _HostBatch:
    """step -> (step, this process's block of that step): the map grain runs (picklable)."""

    def __init__(self, batch_fn: BatchFn, rows: np.ndarray, columns: np.ndarray):
        self.batch_fn, self.rows, self.columns = batch_fn, rows, columns

    def __call__(self, step) -> tuple[int, dict[str, np.ndarray]]:
        step = int(step)
        return step, self.batch_fn(step, self.rows, self.columns)


class GrainPrefetcher:
    """`Prefetcher`'s interface on a grain pipeline: next() -> (step, global batch), close().

    batch_fn: (step, rows, columns) -> {field: [R, C] numpy}, picklable when workers > 0; or a
        TokenCache, whose train split is read through CacheRows.
    workers: 0 = build batches on `threads` grain threads in this process; N = in N spawned
        worker processes (each with one thread).
    depth: batches buffered ahead, per worker process (or in this process when workers = 0).
    num_steps: how many steps the iterator covers (None: open-ended).
    An exception building a batch is raised by next(), and by every next() after it.
    """

    def __init__(self, batch_fn: BatchFn | TokenCache, mesh, spec: BatchSpec, start_step: int = 0,
                 workers: int = 0, depth: int = 2, threads: int = 2,
                 num_steps: int | None = None):
        import grain  # here: the thread loader and everything else in data/ run without it
        if isinstance(batch_fn, TokenCache):
            batch_fn = CacheRows(batch_fn, spec)
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise DataError(f"data.grain_workers: expected a whole number >= 0, got {workers!r}: "
                            f"0 builds batches on threads, N in N worker processes")
        if depth < 1 or threads < 1:
            raise DataError(f"GrainPrefetcher: depth {depth} and threads {threads} must be >= 1")
        self._mesh, self._spec = mesh, spec
        self._rows, self._columns = local_block(mesh, spec)
        self._next_step = start_step
        self._error: BaseException | None = None
        self._closed = False
        count = _ENDLESS if num_steps is None else num_steps
        dataset = grain.MapDataset.range(start_step, start_step + count).map(
            _HostBatch(batch_fn, self._rows, self._columns))
        read = grain.ReadOptions(num_threads=threads if workers == 0 else 1,
                                 prefetch_buffer_size=depth)
        iter_dataset = dataset.to_iter_dataset(read)
        if workers > 0:
            _ensure_absl_flags_parsed()
            iter_dataset = iter_dataset.mp_prefetch(grain.MultiprocessingOptions(
                num_workers=workers, per_worker_buffer_size=depth))
        self._iterator = iter(iter_dataset)

    def next(self) -> tuple[int, dict[str, jax.Array]]:
        """(step, batch) for the next step, waiting for it if needed."""
        if self._closed:
            raise RuntimeError("GrainPrefetcher.next() after close()")
        if self._error is not None:
            raise self._error
        try:
            step, local = next(self._iterator)
        except StopIteration:
            self._error = RuntimeError(f"GrainPrefetcher: no batches after step "
                                       f"{self._next_step - 1}: num_steps ran out")
            raise self._error from None
        except BaseException as e:  # noqa: BLE001  (kept: every later next() raises it too)
            self._error = e
            raise
        if step != self._next_step:   # cannot happen with grain's ordered iteration
            raise RuntimeError(f"GrainPrefetcher: got step {step}, expected {self._next_step}")
        self._next_step += 1
        return step, assemble_global(local, self._rows, self._mesh, self._spec, self._columns)

    def close(self) -> None:
        """Stops the threads and joins the worker processes. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
        self._iterator = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _ensure_absl_flags_parsed() -> None:
    """grain's worker processes read absl flags; a program that never parsed them (no app.run,
    e.g. pytest or a notebook) would fail with UnparsedFlagAccessError. Keeps the defaults."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
