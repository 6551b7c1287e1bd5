"""Bad input to parallel.attention: each a ValueError that names the problem."""

import jax
import numpy as np
import pytest

import parallel

MESH_SHAPE = (2, 4)


@pytest.fixture(scope="module")
def mesh():
    return parallel.make_mesh(*MESH_SHAPE)


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def call(mesh, q, k, v, **kw):
    kw.setdefault("layout", "striped")
    return parallel.attention(q, k, v, mesh=mesh, **kw)


GOOD_Q, GOOD_KV = (2, 64, 4, 8), (2, 64, 2, 8)


@pytest.mark.parametrize("q,k,v,match", [
    (GOOD_Q, GOOD_KV, (2, 64, 1, 8), "agree in batch, seq and heads"),
    (GOOD_Q, (2, 32, 2, 8), (2, 32, 2, 8), "agree in batch, seq and head_dim"),
    (GOOD_Q, (4, 64, 2, 8), (4, 64, 2, 8), "agree in batch, seq and head_dim"),
    (GOOD_Q, (2, 64, 2, 16), (2, 64, 2, 16), "agree in batch, seq and head_dim"),
    ((2, 64, 32), GOOD_KV, GOOD_KV, r"\[batch, seq, heads, head_dim\]"),
    ((2, 64, 4, 8), (2, 64, 3, 8), (2, 64, 3, 8), r"query heads \(4\) must be a multiple of "
                                                   r"key/value heads \(3\)"),
])
def test_mismatched_shapes(mesh, q, k, v, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(*q), zeros(*k), zeros(*v))


@pytest.mark.parametrize("layout,seq_len,match", [
    ("ring", 62, "seq_len 62 is not divisible by 4"),
    ("striped", 66, "seq_len 66 is not divisible by 4"),
    ("zigzag", 36, r"seq_len 36 is not divisible by 8 \(zigzag needs 2 x 4 seq shards\)"),
])
def test_sequence_not_divisible(mesh, layout, seq_len, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(2, seq_len, 4, 8), zeros(2, seq_len, 2, 8), zeros(2, seq_len, 2, 8),
             layout=layout)


def test_unknown_layout(mesh):
    with pytest.raises(ValueError,
                       match="unknown attention layout 'stripes'.*ring, striped, zigzag"):
        call(mesh, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV), layout="stripes")


@pytest.mark.parametrize("tiles,match", [
    ({"tile_q": 3}, "tile_q=3 does not divide the per-device block of 16 tokens"),
    ({"tile_k": 32}, "tile_k=32 does not divide the per-device block of 16 tokens"),
    ({"tile_q": 0}, "tile_q=0 does not divide"),
])
def test_tile_not_dividing_block(mesh, tiles, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV), **tiles)


def test_batch_not_divisible_by_data_shards(mesh):
    with pytest.raises(ValueError, match="batch 3 is not divisible by the 2 'data' shards"):
        call(mesh, zeros(3, 64, 4, 8), zeros(3, 64, 2, 8), zeros(3, 64, 2, 8))


@pytest.mark.parametrize("seg,match", [
    (zeros(2, 32, dtype=np.int32), r"segment_ids must be \[batch, seq\]"),
    (zeros(2, 64), "segment_ids must be integers"),
])
def test_bad_segment_ids(mesh, seg, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV), segment_ids=seg)


def test_mesh_without_seq_axis():
    other = jax.make_mesh((8,), ("x",))
    with pytest.raises(ValueError, match="parallel.make_mesh"):
        call(other, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV))


@pytest.mark.parametrize("kw,match", [
    ({"strategy": "allgatherr"}, "unknown attention strategy 'allgatherr': choose one of ring"),
    ({"kernel": "flash"},
     "unknown attention kernel 'flash': choose auto or one of xla, pallas_gpu, pallas_tpu"),
    ({"scale": 0.0}, r"scale=0.0 must be positive"),
    ({"scale": -0.5}, r"scale=-0.5 must be positive"),
])
def test_bad_strategy_kernel_or_scale(mesh, kw, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV), **kw)


@pytest.mark.parametrize("kw,match", [
    ({"strategy": "usp"}, r"strategy 'usp' needs ulysses_degree: one of \[1, 2, 4\]"),
    ({"strategy": "usp", "ulysses_degree": 3},
     r"ulysses_degree=3 does not divide the 4 'seq' shards: choose one of \[1, 2, 4\]"),
    ({"strategy": "usp", "ulysses_degree": 8}, r"ulysses_degree=8 does not divide the 4"),
    ({"strategy": "ring", "ulysses_degree": 2},
     r"ulysses_degree=2 applies to strategy 'usp' only"),
    ({"strategy": "ulysses", "ulysses_degree": 2},
     r"strategy 'ulysses' spreads heads over all 4 'seq' shards, not 2"),
])
def test_bad_ulysses_degree(mesh, kw, match):
    with pytest.raises(ValueError, match=match):
        call(mesh, zeros(*GOOD_Q), zeros(*GOOD_KV), zeros(*GOOD_KV), **kw)


@pytest.mark.parametrize("strategy,degree", [("ulysses", None), ("usp", 4)])
def test_heads_not_divisible_by_the_ulysses_degree(mesh, strategy, degree):
    """6 query heads on 4 devices: the error names the degrees that fit (KV heads need not
    divide: they are repeated)."""
    with pytest.raises(ValueError, match=r"query heads \(6\) are not divisible by the Ulysses "
                                         r"degree 4: choose strategy='usp' with ulysses_degree "
                                         r"in \[1, 2\]"):
        call(mesh, zeros(2, 64, 6, 8), zeros(2, 64, 3, 8), zeros(2, 64, 3, 8), strategy=strategy,
             ulysses_degree=degree)
