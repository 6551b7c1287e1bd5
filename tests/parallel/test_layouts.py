"""parallel.permutation / inverse_permutation / make_mesh."""

import jax
import numpy as np
import pytest

import parallel
from tests.support.attention_cases import STATIC

# parallel/README.md's worked example, S=16, N=4: original indices in stored order.
WORKED_EXAMPLE = {
    "ring": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
    "striped": [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]],
    "zigzag": [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]],
}


@pytest.mark.parametrize("layout", STATIC)
def test_worked_example(layout):
    tokens = np.arange(16)[None]  # a natural-order sequence whose values are its indices
    laid_out = tokens[:, parallel.permutation(layout, 16, 4)]
    np.testing.assert_array_equal(laid_out.reshape(4, 4), WORKED_EXAMPLE[layout])


@pytest.mark.parametrize("layout", STATIC)
@pytest.mark.parametrize("seq_len,num_shards", [(8, 1), (24, 2), (64, 4), (96, 8), (320, 16)])
def test_permutation_properties(layout, seq_len, num_shards):
    perm = parallel.permutation(layout, seq_len, num_shards)
    inv = parallel.inverse_permutation(layout, seq_len, num_shards)
    assert perm.shape == (seq_len,) and np.issubdtype(perm.dtype, np.integer)
    np.testing.assert_array_equal(np.sort(perm), np.arange(seq_len))
    x = np.random.default_rng(0).standard_normal((3, seq_len, 2))
    np.testing.assert_array_equal(x[:, perm][:, inv], x)
    blocks = perm.reshape(num_shards, -1)
    assert (np.diff(blocks, axis=1) > 0).all(), "indices must increase along every block"
    if layout == "ring":
        np.testing.assert_array_equal(perm, np.arange(seq_len))
    if layout == "striped":  # token t lives on device t mod N
        np.testing.assert_array_equal(blocks % num_shards, np.arange(num_shards)[:, None] + 0 * blocks)
    if layout == "zigzag":  # device d holds chunks d and 2N - 1 - d
        chunk = seq_len // (2 * num_shards)
        for d, row in enumerate(blocks):
            np.testing.assert_array_equal(np.unique(row // chunk), sorted({d, 2 * num_shards - 1 - d}))


@pytest.mark.parametrize("layout,seq_len,num_shards,needed", [
    ("ring", 10, 4, "4"), ("striped", 10, 4, "4"), ("zigzag", 12, 4, "8"), ("zigzag", 6, 2, "4")])
def test_permutation_rejects_indivisible_lengths(layout, seq_len, num_shards, needed):
    with pytest.raises(ValueError, match=f"not divisible by {needed}"):
        parallel.permutation(layout, seq_len, num_shards)


def test_permutation_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown attention layout 'spiral'"):
        parallel.permutation("spiral", 16, 4)
    with pytest.raises(ValueError, match="unknown attention layout"):
        parallel.inverse_permutation("Ring", 16, 4)


@pytest.mark.parametrize("data,seq,shape", [(1, 8, (1, 8)), (2, 4, (2, 4)), (-1, 2, (4, 2)),
                                             (4, -1, (4, 2)), (8, 1, (8, 1)), (-1, -1, (1, 8))])
def test_make_mesh(data, seq, shape):
    mesh = parallel.make_mesh(data, seq)
    assert mesh.axis_names == ("data", "seq")
    assert (mesh.shape["data"], mesh.shape["seq"]) == shape
    assert mesh.devices.size == jax.device_count()


@pytest.mark.parametrize("data,seq", [(3, 2), (2, 2), (-1, 3), (16, 1), (0, 8)])
def test_make_mesh_rejects_sizes_not_matching_devices(data, seq):
    with pytest.raises(ValueError, match="8 devices"):
        parallel.make_mesh(data, seq)
