"""data/: step-indexed batches in layout order (with each row's `order`), and global arrays."""

import dataclasses

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import data
import parallel
from data import batches as batches_module


def spec(**overrides):
    fields = dict(seq_len=16, global_batch=4, seed=0, layout="striped", num_seq_shards=4,
                  mask_documents=False, reset_positions=False, eos_id=None)
    fields.update(overrides)
    return data.BatchSpec(**fields)


def natural(batch, s):
    """Un-permutes every field of a batch back to natural order, by the batch's own 'order'
    (then 'order' itself reads 0 .. S-1)."""
    inv = np.argsort(batch["order"], axis=1)
    return {name: np.take_along_axis(value, inv, axis=1) for name, value in batch.items()}


# --- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("shards", [1, 2, 4])
def test_fields_round_trip_the_permutation(layout, shards):
    tokens = np.arange(1000, dtype=np.uint16)             # each token is its own index
    s = spec(layout=layout, num_seq_shards=shards, mask_documents=True, reset_positions=True,
             eos_id=7)
    batch = data.process_batch(tokens, s, step=3, process_index=0, process_count=1)
    assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
        "inputs": (np.int32, (4, 16)), "targets": (np.int32, (4, 16)),
        "weights": (np.float32, (4, 16)), "positions": (np.int32, (4, 16)),
        "segment_ids": (np.int32, (4, 16)), "order": (np.int32, (4, 16))}
    nat = natural(batch, s)
    np.testing.assert_array_equal(nat["order"], np.broadcast_to(np.arange(16), (4, 16)))
    if not parallel.get_layout(layout).data_dependent:  # the layout's permutation in every row
        perm = parallel.permutation(layout, 16, shards)
        np.testing.assert_array_equal(batch["order"], np.broadcast_to(perm, (4, 16)))
    for row in batch["order"]:  # every shard's original indices increase
        assert (np.diff(row.reshape(shards, -1), axis=1) > 0).all()
    starts = nat["inputs"][:, 0]
    assert np.all(starts % 16 == 0)
    np.testing.assert_array_equal(nat["inputs"], starts[:, None] + np.arange(16))
    np.testing.assert_array_equal(nat["targets"], starts[:, None] + np.arange(1, 17))
    np.testing.assert_array_equal(nat["targets"][:, :-1], nat["inputs"][:, 1:])
    # Token 7 is the only EOS below 16: row starting at 0 has segments 0 to slot 7, then 1.
    for segments, positions, start in zip(nat["segment_ids"], nat["positions"], starts):
        after_eos = (start == 0) * (np.arange(16) > 7)
        np.testing.assert_array_equal(segments, after_eos)
        np.testing.assert_array_equal(positions, np.arange(16) - 8 * after_eos)


def test_segments_and_positions_worked_example():
    # EOS = 1. One window of S+1 = 9 tokens: documents [5 6 EOS] [7 8 9 EOS] [3 4 ...
    tokens = np.array([5, 6, 1, 7, 8, 9, 1, 3, 4])
    s = spec(seq_len=8, global_batch=1, layout="ring", num_seq_shards=1, mask_documents=True,
             reset_positions=True, eos_id=1)
    batch = data.batch_rows(tokens, s, 0, [0])
    np.testing.assert_array_equal(batch["inputs"], [[5, 6, 1, 7, 8, 9, 1, 3]])
    np.testing.assert_array_equal(batch["targets"], [[6, 1, 7, 8, 9, 1, 3, 4]])
    np.testing.assert_array_equal(batch["segment_ids"], [[0, 0, 0, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(batch["positions"], [[0, 1, 2, 0, 1, 2, 3, 0]])
    # Striped over 2 shards, perm [0 2 4 6 1 3 5 7]: the same values, in layout order.
    striped = data.batch_rows(tokens, dataclasses.replace(s, layout="striped", num_seq_shards=2),
                              0, [0])
    np.testing.assert_array_equal(striped["inputs"], [[5, 1, 8, 1, 6, 7, 9, 3]])
    np.testing.assert_array_equal(striped["positions"], [[0, 2, 1, 3, 1, 0, 2, 0]])
    np.testing.assert_array_equal(striped["segment_ids"], [[0, 0, 1, 1, 0, 1, 1, 2]])
    # Consecutive EOS tokens: each ends a (possibly empty) document of its own.
    s2 = dataclasses.replace(s, seq_len=6)
    batch = data.batch_rows(np.array([5, 1, 7, 1, 1, 3, 9]), s2, 0, [0])
    np.testing.assert_array_equal(batch["segment_ids"], [[0, 0, 1, 1, 2, 3]])
    np.testing.assert_array_equal(batch["positions"], [[0, 1, 0, 1, 0, 0]])
    # Each switch on its own.
    only_seg = data.batch_rows(tokens, dataclasses.replace(s, reset_positions=False), 0, [0])
    np.testing.assert_array_equal(only_seg["segment_ids"], [[0, 0, 0, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(only_seg["positions"], [np.arange(8)])
    only_pos = data.batch_rows(tokens, dataclasses.replace(s, mask_documents=False), 0, [0])
    np.testing.assert_array_equal(only_pos["segment_ids"], np.zeros((1, 8)))
    np.testing.assert_array_equal(only_pos["positions"], [[0, 1, 2, 0, 1, 2, 3, 0]])
    plain = data.batch_rows(tokens, dataclasses.replace(s, mask_documents=False,
                                                      reset_positions=False, eos_id=None), 0, [0])
    np.testing.assert_array_equal(plain["segment_ids"], np.zeros((1, 8)))
    np.testing.assert_array_equal(plain["positions"], [np.arange(8)])
    np.testing.assert_array_equal(plain["weights"], np.ones((1, 8)))


def test_batches_are_a_function_of_the_step():
    tokens = np.random.default_rng(0).integers(0, 500, 5000).astype(np.uint16)
    s = spec(global_batch=8)
    in_order = [data.process_batch(tokens, s, t, 0, 1) for t in range(8)]
    for t in (5, 2):                                       # out of order, fresh epoch cache
        batches_module._epoch_order.cache_clear()
        for name, value in data.process_batch(tokens, s, t, 0, 1).items():
            np.testing.assert_array_equal(value, in_order[t][name])
    assert not np.array_equal(in_order[0]["inputs"], in_order[1]["inputs"])
    for processes in (2, 4):
        parts = [data.process_batch(tokens, s, 6, p, processes) for p in range(processes)]
        for name in data.FIELDS:
            np.testing.assert_array_equal(np.concatenate([x[name] for x in parts]),
                                          in_order[6][name])
    # Seed changes the order.
    other = data.process_batch(tokens, dataclasses.replace(s, seed=1), 0, 0, 1)
    assert not np.array_equal(other["inputs"], in_order[0]["inputs"])


def test_every_window_once_per_epoch():
    tokens = np.arange(16 * 12 + 1)                        # W = 12 windows
    s = spec(global_batch=4)
    def starts(step):
        return natural(data.batch_rows(tokens, s, step, range(4)), s)["inputs"][:, 0]
    epoch0 = np.concatenate([starts(t) for t in range(3)])
    epoch1 = np.concatenate([starts(t) for t in range(3, 6)])
    np.testing.assert_array_equal(np.sort(epoch0), np.arange(12) * 16)
    np.testing.assert_array_equal(np.sort(epoch1), np.arange(12) * 16)
    assert not np.array_equal(epoch0, epoch1)
    # global_batch not dividing W: a batch straddles two epochs.
    s5 = spec(global_batch=5)
    rows = natural(data.batch_rows(tokens, s5, 2, range(5)), s5)["inputs"][:, 0]
    order0 = np.random.default_rng([0, 0]).permutation(12)
    order1 = np.random.default_rng([0, 1]).permutation(12)
    np.testing.assert_array_equal(rows, 16 * np.array([*order0[10:], *order1[:3]]))


def test_eval_batches_in_order():
    tokens = np.arange(16 * 10 + 1)                        # 10 windows: 2 full batches of 4
    s = spec()
    got = data.eval_batches(tokens, s, num_batches=5)
    assert len(got) == 2
    for b, batch in enumerate(got):
        starts = natural(batch, s)["inputs"][:, 0]
        np.testing.assert_array_equal(starts, (b * 4 + np.arange(4)) * 16)
    assert len(data.eval_batches(tokens, s, num_batches=1)) == 1
    with pytest.raises(data.DataError, match="fewer than one batch"):
        data.eval_batches(tokens[:16 * 3 + 1], s, num_batches=1)


def test_bad_batch_inputs():
    tokens = np.arange(100)
    with pytest.raises(data.DataError, match="corpus of 16 tokens is smaller than one sequence "
                                             "of 17: use a larger corpus or a smaller seq_len"):
        data.batch_rows(tokens[:16], spec(), 0, range(4))
    with pytest.raises(data.DataError, match="global_batch 4 is not divisible by the 3 processes"):
        data.process_batch(tokens, spec(), 0, 0, 3)
    with pytest.raises(data.DataError, match="seq_len 12 is not divisible by 8"):
        data.batch_rows(tokens, spec(seq_len=12, layout="zigzag"), 0, range(4))
    with pytest.raises(data.DataError, match="unknown attention layout"):
        data.batch_rows(tokens, spec(layout="spiral"), 0, range(4))
    with pytest.raises(data.DataError, match="eos_id"):
        data.batch_rows(tokens, spec(mask_documents=True), 0, range(4))
    with pytest.raises(data.DataError, match="rows must lie in 0..3"):
        data.batch_rows(tokens, spec(), 0, [4])


# --- global arrays -------------------------------------------------------------------------------


def test_to_global_matches_process_batch():
    mesh = parallel.make_mesh(2, 4)
    tokens = np.random.default_rng(1).integers(0, 500, 3000).astype(np.uint16)
    s = spec(global_batch=4, num_seq_shards=4, mask_documents=True, reset_positions=True,
             eos_id=3)
    requested = []
    def batch_fn(step, rows, columns):
        requested.append((list(rows), list(columns)))
        return data.batch_rows(tokens, s, step, rows, columns)
    got = data.to_global(batch_fn, 5, mesh, s)
    assert requested == [([0, 1, 2, 3], list(range(16)))]  # one call, the block this process holds
    want = data.process_batch(tokens, s, 5, 0, 1)
    for name in data.FIELDS:
        assert got[name].sharding.spec == P("data", "seq")
        assert got[name].dtype == want[name].dtype and got[name].shape == (4, 16)
        np.testing.assert_array_equal(np.asarray(got[name]), want[name])
        for shard in got[name].addressable_shards:        # each device holds its own block
            np.testing.assert_array_equal(np.asarray(shard.data), want[name][shard.index])
    with pytest.raises(data.DataError, match="4 devices on 'seq'"):
        data.to_global(batch_fn, 0, mesh, dataclasses.replace(s, num_seq_shards=2))


def test_prefetcher():
    mesh = parallel.make_mesh(2, 4)
    tokens = np.arange(2000)
    s = spec()
    def batch_fn(step, rows, columns):
        if step == 4:
            raise RuntimeError("broken step 4")
        return data.batch_rows(tokens, s, step, rows, columns)
    prefetch = data.Prefetcher(batch_fn, mesh, s, start_step=2)
    for expected_step in (2, 3):
        step, batch = prefetch.next()
        assert step == expected_step
        np.testing.assert_array_equal(np.asarray(batch["inputs"]),
                                      data.process_batch(tokens, s, step, 0, 1)["inputs"])
    with pytest.raises(RuntimeError, match="broken step 4"):
        prefetch.next()
    prefetch.close()
    assert not prefetch._thread.is_alive()
