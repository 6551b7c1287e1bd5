"""data/: a process's block of a batch (rows and laid-out columns) equals the whole rows sliced,
in one process and split over two."""

import subprocess
import sys

import numpy as np
import pytest

import data
import parallel
from tests.support.train_runs import ROOT, clean_env, losses, read_metrics

S = 64
EOS = 3


def spec(layout, shards, **overrides):
    # tile 4: balanced then places 16 units per row, so its order differs from row to row.
    fields = dict(seq_len=S, global_batch=4, seed=2, layout=layout, num_seq_shards=shards,
                  mask_documents=True, reset_positions=True, eos_id=EOS, tile=4)
    return data.BatchSpec(**{**fields, **overrides})


def tokens():
    """Ids 0..19, so about one token in 20 is an EOS: rows of 64 hold several documents."""
    return np.random.default_rng(5).integers(0, 20, 40 * S).astype(np.uint16)


def subsets(shards):
    """Column subsets a process might hold: one seq block, the first and last block, an
    arbitrary sorted subset, none, and all (None)."""
    block = S // shards
    arbitrary = np.sort(np.random.default_rng(shards).choice(S, 11, replace=False))
    return {"one block": np.arange(block, 2 * block),
            "first and last": np.r_[0:block, S - block:S],
            "arbitrary": arbitrary, "none": np.array([], np.int64), "all": None}


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
@pytest.mark.parametrize("shards", [2, 4])
def test_columns_are_the_whole_rows_sliced(layout, shards):
    toks, s = tokens(), spec(layout, shards)
    for step, rows in ((0, [0, 1, 2, 3]), (7, [1, 3])):
        whole = data.batch_rows(toks, s, step, rows)
        assert whole["segment_ids"].max() > 0              # documents exist in these rows
        if layout == "balanced":                           # a placement per row, not one
            assert len({tuple(r) for r in whole["order"]}) > 1
        evals = data.eval_rows(toks, s, step, rows)
        for what, columns in subsets(shards).items():
            want = slice(None) if columns is None else columns
            got = data.batch_rows(toks, s, step, rows, columns)
            got_eval = data.eval_rows(toks, s, step, rows, columns)
            for name in data.FIELDS:
                for part, full in ((got, whole), (got_eval, evals)):
                    assert part[name].dtype == full[name].dtype, (what, name)
                    np.testing.assert_array_equal(part[name], full[name][:, want],
                                                  err_msg=f"{what}: {name}")


def test_columns_worked_example():
    # The module docstring's striped example: seq shard 1 holds original positions [1 3 5 7].
    s = data.BatchSpec(seq_len=8, global_batch=1, seed=0, layout="striped", num_seq_shards=2,
                       mask_documents=True, reset_positions=True, eos_id=1)
    half = data.batch_rows(np.array([5, 6, 1, 7, 8, 9, 1, 3, 4]), s, 0, [0], [4, 5, 6, 7])
    np.testing.assert_array_equal(half["order"], [[1, 3, 5, 7]])
    np.testing.assert_array_equal(half["inputs"], [[6, 7, 9, 3]])
    np.testing.assert_array_equal(half["targets"], [[1, 8, 1, 4]])
    np.testing.assert_array_equal(half["segment_ids"], [[0, 1, 1, 2]])
    np.testing.assert_array_equal(half["positions"], [[1, 0, 2, 0]])


def test_bad_columns():
    s = spec("ring", 2)
    with pytest.raises(data.DataError, match="columns must lie in 0..63"):
        data.batch_rows(tokens(), s, 0, [0], [3, 64])
    with pytest.raises(data.DataError, match="columns must lie in 0..63"):
        data.eval_rows(tokens(), s, 0, [0], [-1])


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_to_global_is_the_whole_batch(layout):
    mesh = parallel.make_mesh(2, 4)
    toks, s = tokens(), spec(layout, 4)
    rows, columns = data.local_block(mesh, s)                # one process: everything
    np.testing.assert_array_equal(rows, np.arange(4))
    np.testing.assert_array_equal(columns, np.arange(S))
    got = data.to_global(lambda step, r, c: data.batch_rows(toks, s, step, r, c), 3, mesh, s)
    want = data.batch_rows(toks, s, 3, np.arange(4))
    for name in data.FIELDS:
        np.testing.assert_array_equal(np.asarray(got[name]), want[name])
        for shard in got[name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want[name][shard.index])


def test_assemble_global_checks_the_local_block():
    mesh = parallel.make_mesh(1, 8)
    toks, s = tokens(), spec("zigzag", 8, global_batch=1)
    half = np.arange(S // 2)                                 # seq blocks 0..3 of 8
    local = data.batch_rows(toks, s, 0, [0], half)
    with pytest.raises(data.DataError, match="holds columns (32|40|48|56)\\.\\.[0-9]+ but the "
                                             "local batch was built without some of them"):
        data.assemble_global(local, np.array([0]), mesh, s, half)
    with pytest.raises(data.DataError, match=r"must return \[len\(rows\), len\(columns\)\]"):
        data.assemble_global(local, np.array([0]), mesh, s)  # None: all 64 columns


# --- split over two processes ----------------------------------------------------------------


def test_two_processes_build_their_halves_of_one_row():
    """tests/support/two_process_data.py in 2 processes x 2 devices, mesh data 1 x seq 4: each process
    builds columns of one row, and the global arrays equal the whole row (see that file)."""
    cmd = [sys.executable, "scripts/launch_local.py", "--processes", "2", "--timeout", "200",
           "--", "tests/support/two_process_data.py"]
    result = subprocess.run(cmd, cwd=ROOT, env=clean_env(processes=2), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    for p in (0, 1):
        assert f"[{p}] ok: 32 of 64 columns" in result.stdout, result.stdout[-3000:]


@pytest.mark.programs
def test_one_row_over_two_processes_trains_as_in_one(tmp_path):
    """tiny.py, one row per step, mesh data 1 x seq 2: 2 processes of 1 device each (the row
    split between them) log the losses of 1 process with 2 devices."""
    flags = ["--config.global_batch_size=1", "--config.mesh.data=1", "--config.mesh.seq=2",
             "--config.num_train_steps=5", "--config.log_every_steps=1",
             "--config.eval_every_steps=5", "--config.eval_batches=1",
             "--config.checkpoint_every_steps=100",
             f"--config.data.cache_dir={tmp_path / 'cache'}"]
    runs = {}
    for processes, devices in ((1, 2), (2, 1)):
        workdir = tmp_path / f"p{processes}"
        program = ["train.py", "--config", "configs/tiny.py", "--workdir", str(workdir),
                   f"--config.cpu_devices={devices}", *flags]
        if processes > 1:
            program = ["scripts/launch_local.py", "--processes", "2", "--timeout", "300", "--",
                       *program]
        result = subprocess.run([sys.executable, *program], cwd=ROOT, env=clean_env(processes),
                                capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        runs[processes] = read_metrics(workdir)
    one, two = losses(runs[1]), losses(runs[2])
    assert sorted(one) == sorted(two) == [1, 2, 3, 4, 5]
    print("losses, 1 process:", [one[s] for s in sorted(one)])
    print("losses, 2 processes:", [two[s] for s in sorted(two)])
    np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(one)],
                               rtol=1e-5)
    evals = [[r["eval/loss"] for r in runs[p] if "eval/loss" in r] for p in (1, 2)]
    print("eval loss, 1 process:", evals[0], "2 processes:", evals[1])
    np.testing.assert_allclose(evals[1], evals[0], rtol=1e-5)
    assert len(evals[0]) == 1

