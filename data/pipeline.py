"""Host batches -> global jax.Arrays on the ('data', 'seq') mesh, and a prefetching thread.

    batch_fn = functools.partial(data.batch_rows, cache.train, spec)   # (step, rows, columns)
    batch = data.to_global(batch_fn, step, mesh, spec)                 # dict of [B, S] jax.Arrays

Every field is sharded P('data', 'seq'): rows over 'data', the (already permuted) sequence over
'seq', so device (d, s) holds rows of its data shard and seq block s of the layout. Each process
builds only the block its own devices hold, never the whole global batch: the rows of its data
shards and, of those rows, the laid-out columns of its seq shards. With one row over 2 hosts
(data 1 x seq 2, one device each, S=8): process 0 builds row 0, columns [0 1 2 3], process 1
row 0, columns [4 5 6 7]; each reads the row's whole window (its documents and balanced's order
need it), but makes the fields only for its own columns.
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

# (step, global rows, laid-out columns) -> {field: [R, C] numpy}, C = len(columns)
BatchFn = Callable[[int, np.ndarray, np.ndarray], dict]


def to_global(batch_fn: BatchFn, step: int, mesh, spec: BatchSpec) -> dict[str, jax.Array]:
    """Global arrays [global_batch, S] sharded P('data', 'seq'), built from this process's block
    only: one call batch_fn(step, rows, columns) with (rows, columns) = local_block(mesh, spec)."""
    rows, columns = local_block(mesh, spec)
    return assemble_global(batch_fn(step, rows, columns), rows, mesh, spec, columns)


def local_block(mesh, spec: BatchSpec) -> tuple[np.ndarray, np.ndarray]:
    """(rows, columns): the global row indices and the laid-out column indices, each sorted,
    that this process's devices hold under P('data', 'seq'). Pass them to batch_fn.

    Example, mesh data 2 x seq 2, B=4, S=8: a process whose devices are (data 1, seq 0) and
    (data 1, seq 1) gets rows [2 3], columns [0 .. 7]. Were its devices ever not one block of the
    mesh, it would build the block that covers them (more than it needs, never less).
    """
    _check_mesh(mesh, spec)
    shape = _shape(spec)
    index_map = _sharding(mesh).addressable_devices_indices_map(shape)

    def held(axis: int) -> np.ndarray:
        return np.unique(np.concatenate(
            [np.arange(*index[axis].indices(shape[axis])) for index in index_map.values()]))

    return held(0), held(1)


def local_rows(mesh, spec: BatchSpec) -> np.ndarray:
    """The global row indices, sorted, that this process's devices hold: local_block(...)[0]."""
    return local_block(mesh, spec)[0]


def local_columns(mesh, spec: BatchSpec) -> np.ndarray:
    """The laid-out columns, sorted, that this process's devices hold: local_block(...)[1]; all
    of 0 .. S-1 unless the mesh's 'seq' axis spans processes."""
    return local_block(mesh, spec)[1]


def assemble_global(local: dict[str, np.ndarray], rows: np.ndarray, mesh, spec: BatchSpec,
                    columns=None) -> dict[str, jax.Array]:
    """Global arrays from `local`: every field [len(rows), len(columns)], this process's `rows`
    and laid-out `columns` (from local_block; None = all S columns)."""
    shape, sharding = _shape(spec), _sharding(mesh)
    rows = np.asarray(rows)
    columns = np.arange(shape[1]) if columns is None else np.asarray(columns)
    for name in FIELDS:
        if local[name].shape != (len(rows), len(columns)):
            raise DataError(f"batch_fn gave {name} of shape {local[name].shape} for "
                            f"{len(rows)} rows x {len(columns)} columns: it must return "
                            f"[len(rows), len(columns)]")

    def field_array(name: str) -> jax.Array:
        def shard(index):  # a device's global block -> the same block of `local`
            return local[name][_where(rows, index[0], shape[0], "row"),
                               _where(columns, index[1], shape[1], "column")]
        return jax.make_array_from_callback(shape, sharding, shard)

    return {name: field_array(name) for name in FIELDS}


def _where(held: np.ndarray, part: slice, size: int, what: str) -> slice:
    """Where the global indices of `part` (a slice of 0 .. size-1) lie in `held` (sorted): a
    slice, as they are consecutive there too. Example: held [4 5 6 7], part 6:8 -> 2:4."""
    wanted = np.arange(*part.indices(size))
    start = int(np.searchsorted(held, wanted[0])) if wanted.size else 0
    if not np.array_equal(held[start:start + wanted.size], wanted):
        raise DataError(f"a device of this process holds {what}s {wanted[0]}..{wanted[-1]} but "
                        f"the local batch was built without some of them: build it for the "
                        f"rows and columns of local_block(mesh, spec)")
    return slice(start, start + wanted.size)


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
