"""Token layouts: which original token index sits at each slot of each device's block.

A sequence of S tokens is split over N devices ("seq shards"), each holding a block of B = S/N.
The three layouts, S=16, N=4 (numbers are original token indices in each device's stored order):

    ring     dev0 [0 1 2 3]      dev1 [4 5 6 7]      dev2 [8 9 10 11]    dev3 [12 13 14 15]
    striped  dev0 [0 4 8 12]     dev1 [1 5 9 13]     dev2 [2 6 10 14]    dev3 [3 7 11 15]
    zigzag   dev0 [0 1 14 15]    dev1 [2 3 12 13]    dev2 [4 5 10 11]    dev3 [6 7 8 9]

In every layout the original indices increase along a block. The attention kernel relies on that:
masks and tile skipping are decided from original indices (`block_positions`), so one kernel
serves all three layouts.

`block_positions` is written once for both numpy (host permutations) and jax.numpy (inside the
kernel, where the shard index is traced), so the host and the kernel can never disagree.
"""

from __future__ import annotations

import numpy as np

KINDS = ("ring", "striped", "zigzag")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}: choose one of {', '.join(KINDS)}")


def check_divisible(kind: str, seq_len: int, num_shards: int) -> None:
    """Raises ValueError unless seq_len splits into the layout's equal chunks."""
    check_kind(kind)
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    chunks = 2 * num_shards if kind == "zigzag" else num_shards
    if seq_len % chunks:
        what = f"2 x {num_shards} seq shards" if kind == "zigzag" else f"{num_shards} seq shards"
        raise ValueError(
            f"seq_len {seq_len} is not divisible by {chunks} ({kind} needs {what}): "
            f"use a seq_len that is a multiple of {chunks}")


def block_positions(kind: str, shard, block: int, num_shards: int, xp=np):
    """Original token indices held by seq shard `shard`, in stored order.

    Args:
      kind: 'ring' | 'striped' | 'zigzag'.
      shard: the device's index along the seq axis (an int, an integer array that broadcasts
        against [block], or a traced jax scalar when xp is jax.numpy).
      block: tokens per device, B = seq_len / num_shards.
      num_shards: N, devices along the seq axis.
      xp: numpy or jax.numpy.

    Returns:
      int32 array [..., block], increasing along the last axis.

    Example (block=4, N=4, zigzag, shard 1): chunk size 2, chunks 1 and 6 -> [2 3 12 13].
    """
    i = xp.arange(block, dtype=np.int32)
    if kind == "ring":
        return shard * block + i
    if kind == "striped":
        return i * num_shards + shard
    if kind == "zigzag":
        half = block // 2
        first = shard * half + i
        second = (2 * num_shards - 1 - shard) * half + (i - half)
        return xp.where(i < half, first, second).astype(np.int32)
    check_kind(kind)


def permutation(kind: str, seq_len: int, num_shards: int) -> np.ndarray:
    """Natural order -> layout order: `x[:, perm]` is x laid out for `kind`.

    After `y = x[:, perm]`, slot j of y holds original token perm[j]; shard d of the seq axis
    (slots d*B .. d*B+B-1) holds exactly `block_positions(kind, d, B, N)`.

    Example, seq_len=8, num_shards=2:
      ring    [0 1 2 3 4 5 6 7]   striped [0 2 4 6 1 3 5 7]   zigzag [0 1 6 7 2 3 4 5]
    """
    check_divisible(kind, seq_len, num_shards)
    block = seq_len // num_shards
    shards = np.arange(num_shards, dtype=np.int32)[:, None]
    perm = block_positions(kind, shards, block, num_shards, xp=np)
    return np.ascontiguousarray(np.broadcast_to(perm, (num_shards, block)).reshape(seq_len))


def inverse_permutation(kind: str, seq_len: int, num_shards: int) -> np.ndarray:
    """Layout order -> natural order: `y[:, inv]` undoes `x[:, perm]`."""
    perm = permutation(kind, seq_len, num_shards)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(seq_len, dtype=perm.dtype)
    return inv
