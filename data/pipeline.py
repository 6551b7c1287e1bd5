"""Host batches -> global jax.Arrays on the ('data', 'seq') mesh, and a prefetching thread.

    batch_fn = functools.partial(data.batch_rows, cache.train, spec)   # (step, rows) -> dict
    batch = data.to_global(batch_fn, step, mesh, spec)                 # dict of [B, S] jax.Arrays

Every field is sharded P('data', 'seq'): rows over 'data', the (already permuted) sequence over
'seq', so device (d, s) holds rows of its data shard and seq block s of the layout. Each process
builds only the rows its own devices hold, never the whole global batch.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from data.batches import FIELDS, BatchSpec
from data.errors import DataError

BatchFn = Callable[[int, np.ndarray], dict]   # (step, global rows) -> {field: [R, S] numpy}


def to_global(batch_fn: BatchFn, step: int, mesh, spec: BatchSpec) -> dict[str, jax.Array]:
    """Global arrays [global_batch, S] sharded P('data', 'seq'), built from local rows only."""
    rows = local_rows(mesh, spec)
    return assemble_global(batch_fn(step, rows), rows, mesh, spec)


def local_rows(mesh, spec: BatchSpec) -> np.ndarray:
    """The global row indices, sorted, that this process's devices hold under P('data', 'seq').

    A process may hold only its seq slice of a row, but builds the whole row: simple, and cheap on
    the host. These are the rows to pass to batch_fn(step, rows).
    """
    _check_mesh(mesh, spec)
    index_map = _sharding(mesh).addressable_devices_indices_map(_shape(spec))
    return np.unique(np.concatenate(
        [np.arange(*index[0].indices(spec.global_batch)) for index in index_map.values()]))


def assemble_global(local: dict[str, np.ndarray], rows: np.ndarray, mesh,
                    spec: BatchSpec) -> dict[str, jax.Array]:
    """Global arrays from `local`, this process's rows `rows` (from local_rows) of every field."""
    shape, sharding = _shape(spec), _sharding(mesh)

    def field_array(name: str) -> jax.Array:
        def shard(index):
            row_slice, col_slice = index
            wanted = np.arange(*row_slice.indices(shape[0]))
            return local[name][np.searchsorted(rows, wanted), col_slice]  # global row -> local
        return jax.make_array_from_callback(shape, sharding, shard)

    return {name: field_array(name) for name in FIELDS}


class Prefetcher:
    """Builds the global batches of steps start_step, start_step+1, ... on a background thread.

        prefetch = Prefetcher(batch_fn, mesh, spec, start_step=step)
        step, batch = prefetch.next()
        ...
        prefetch.close()

    At most `depth` batches wait in the queue. An exception on the thread is raised by next().
    """

    def __init__(self, batch_fn: BatchFn, mesh, spec: BatchSpec, start_step: int = 0,
                 depth: int = 2):
        self._batch_fn, self._mesh, self._spec = batch_fn, mesh, spec
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(start_step,), daemon=True,
                                        name="data-prefetch")
        self._thread.start()

    def next(self) -> tuple[int, dict[str, jax.Array]]:
        """(step, batch) for the next step, waiting for it if needed."""
        while self._error is None:
            if self._stop.is_set():
                raise RuntimeError("Prefetcher.next() after close()")
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                self._error = item          # every later next() raises it too
            else:
                return item
        raise self._error

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self, step: int) -> None:
        try:
            while not self._stop.is_set():
                self._put((step, to_global(self._batch_fn, step, self._mesh, self._spec)))
                step += 1
        except BaseException as e:  # noqa: BLE001  (handed to the consumer, raised there)
            self._put(e)

    def _put(self, item) -> None:
        # Polls, so that close() is never stuck behind a full queue.
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


def _shape(spec: BatchSpec) -> tuple[int, int]:
    return (spec.global_batch, spec.seq_len)


def _sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data", "seq"))


def _check_mesh(mesh, spec: BatchSpec) -> None:
    seq, data = mesh.shape["seq"], mesh.shape["data"]
    if seq != spec.num_seq_shards:
        raise DataError(f"the mesh has {seq} devices on 'seq' but the batch is laid out for "
                        f"num_seq_shards={spec.num_seq_shards}: build the BatchSpec from the mesh")
    if spec.global_batch % data:
        raise DataError(f"global_batch {spec.global_batch} is not divisible by the mesh's "
                        f"{data} devices on 'data': use a multiple of {data}")
