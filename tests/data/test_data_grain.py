"""The grain loader: the same batches as the thread Prefetcher, whatever the worker count."""

import dataclasses
import functools
import multiprocessing
import os
import pickle
import threading
import time

import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import data
import parallel

STEPS = 6


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A token cache on disk (random ids, EOS = 1 now and then), opened like build_token_cache."""
    path = str(tmp_path_factory.mktemp("cache") / "tokens.npy")
    np.save(path, np.random.default_rng(0).integers(1, 9, 4000).astype(np.uint16))
    tokens = np.load(path, mmap_mode="r")
    return data.TokenCache(path=path, train=tokens[:3500], eval=tokens[3500:], eos_id=1,
                           num_tokens=4000, num_documents=0)


@pytest.fixture(scope="module")
def mesh():
    return parallel.make_mesh(2, 4)


@pytest.fixture(scope="module")
def spec():
    return data.BatchSpec(seq_len=16, global_batch=4, seed=3, layout="zigzag", num_seq_shards=4,
                          mask_documents=True, reset_positions=True, eos_id=1)


@pytest.fixture(scope="module")
def reference(cache, mesh, spec):
    """Steps 0..STEPS-1 from the thread Prefetcher, as numpy."""
    prefetch = data.Prefetcher(functools.partial(data.batch_rows, cache.train, spec), mesh, spec)
    try:
        return [as_numpy(prefetch.next()) for _ in range(STEPS)]
    finally:
        prefetch.close()


def as_numpy(step_batch):
    step, batch = step_batch
    for value in batch.values():
        assert value.sharding.spec == P("data", "seq") and value.shape == (4, 16)
    return step, {name: np.asarray(value) for name, value in batch.items()}


def assert_same(got, want):
    assert got[0] == want[0]
    for name in data.FIELDS:
        assert got[1][name].dtype == want[1][name].dtype
        assert got[1][name].tobytes() == want[1][name].tobytes(), (got[0], name)


def grain_children():
    return [p for p in multiprocessing.active_children() if p.name.startswith("grain")]


def test_reference_is_nontrivial(reference, cache, spec):
    steps = [step for step, _ in reference]
    assert steps == list(range(STEPS))
    assert not np.array_equal(reference[0][1]["inputs"], reference[1][1]["inputs"])
    assert reference[0][1]["segment_ids"].max() > 0          # documents are masked
    want = data.process_batch(cache.train, spec, 2, 0, 1)
    np.testing.assert_array_equal(reference[2][1]["targets"], want["targets"])


@pytest.mark.parametrize("workers, start", [(0, 0), (0, 4), (1, 0), (2, 3)])
def test_same_batches_as_thread_prefetcher(workers, start, cache, mesh, spec, reference):
    before = {p.pid for p in grain_children()}
    prefetch = data.GrainPrefetcher(cache, mesh, spec, start_step=start, workers=workers)
    try:
        got = [as_numpy(prefetch.next()) for _ in range(STEPS - start)]
        pids = {p.pid for p in grain_children()} - before
        assert len(pids) == workers                          # really in worker processes
    finally:
        prefetch.close()
    for g, want in zip(got, reference[start:]):
        assert_same(g, want)
    # close() joined every worker: none is left running (or as a zombie).
    assert not {p.pid for p in grain_children()} & pids
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")


def test_close_stops_threads(cache, mesh, spec):
    before = set(threading.enumerate())
    prefetch = data.GrainPrefetcher(cache, mesh, spec, workers=0, threads=2)
    prefetch.next()
    assert set(threading.enumerate()) - before               # grain's prefetch threads run
    prefetch.close()
    prefetch.close()                                         # twice is fine
    deadline = time.monotonic() + 5
    while {t for t in set(threading.enumerate()) - before if t.is_alive()}:
        assert time.monotonic() < deadline, set(threading.enumerate()) - before
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="after close"):
        prefetch.next()


def test_batch_function_errors(mesh, spec):
    tokens = np.arange(2000) % 50

    def batch_fn(step, rows, columns):
        if step == 2:
            raise ValueError("broken step 2")
        return data.batch_rows(tokens, spec, step, rows, columns)

    with data.GrainPrefetcher(batch_fn, mesh, spec, workers=0, num_steps=5) as prefetch:
        assert [prefetch.next()[0] for _ in range(2)] == [0, 1]
        for _ in range(2):                                   # raised again, not skipped
            with pytest.raises(ValueError, match="broken step 2"):
                prefetch.next()
    with data.GrainPrefetcher(functools.partial(data.batch_rows, tokens, spec), mesh, spec,
                              start_step=7, num_steps=1) as prefetch:
        assert prefetch.next()[0] == 7
        with pytest.raises(RuntimeError, match="num_steps ran out"):
            prefetch.next()


def test_cache_rows_pickle_small(cache, spec):
    rows = data.CacheRows(cache, spec)
    blob = pickle.dumps(rows)
    assert len(blob) < 2000 < cache.train.nbytes             # the path, not the tokens
    again = pickle.loads(blob)
    assert again._tokens is None
    for name, value in again(5, [1, 3]).items():
        np.testing.assert_array_equal(value, data.batch_rows(cache.train, spec, 5, [1, 3])[name])
    whole = data.batch_rows(cache.train, spec, 5, [1, 3])["targets"]
    np.testing.assert_array_equal(again(5, [1, 3], [2, 9])["targets"], whole[:, [2, 9]])
    evals = pickle.loads(pickle.dumps(data.CacheRows(cache, spec, "eval")))
    np.testing.assert_array_equal(evals(1, [0, 2])["inputs"],
                                  data.eval_rows(cache.eval, spec, 1, [0, 2])["inputs"])


def test_make_prefetcher(cache, mesh, spec, reference):
    config = ml_collections.ConfigDict({"loader": "thread", "grain_workers": 0})
    for loader, kind in (("thread", data.Prefetcher), ("grain", data.GrainPrefetcher)):
        config.loader = loader
        prefetch = data.make_prefetcher(config, cache, mesh, spec, start_step=1)
        try:
            assert isinstance(prefetch, kind)
            assert_same(as_numpy(prefetch.next()), reference[1])
        finally:
            prefetch.close()
    config.loader = "torch"
    with pytest.raises(data.DataError, match="is not a loader: use one of"):
        data.make_prefetcher(config, cache, mesh, spec)
    with pytest.raises(data.DataError, match="grain_workers: expected a whole number >= 0"):
        data.GrainPrefetcher(cache, mesh, spec, workers=-1)
    with pytest.raises(data.DataError, match="4 devices on 'seq'"):
        data.GrainPrefetcher(cache, mesh, dataclasses.replace(spec, num_seq_shards=2))


def test_local_rows(mesh, spec):
    np.testing.assert_array_equal(data.local_rows(mesh, spec), [0, 1, 2, 3])  # one process
    np.testing.assert_array_equal(data.local_columns(mesh, spec), np.arange(16))
