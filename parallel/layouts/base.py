"""What a layout is: the original token index at every slot of every seq shard.

A sequence of S tokens is split over N seq shards, each holding a block of B = S / N tokens. A
layout says which original tokens a shard holds, in the order it stores them. Every layout keeps
those indices increasing along a block: the kernels decide masks and skip tiles from original
indices alone, and "increasing" is what makes the visible key tiles of a query tile a prefix.

`positions` is written once for numpy (host permutations) and jax.numpy (inside the kernel, where
the shard index is traced), so the host and the devices can never disagree.
"""

from __future__ import annotations

import numpy as np

# Default tiles are the largest divisors of a layout's contiguous run up to this: large enough
# for efficient matmuls, small enough to skip masked work (a kernel may ask for smaller ones).
MAX_DEFAULT_TILE = 512


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of n that is at most `at_most`: largest_divisor(96, 64) -> 48."""
    return max(t for t in range(1, min(n, at_most) + 1) if n % t == 0)


class Layout:
    """One way of placing tokens on the seq shards. Subclasses set `name`, `chunks_per_shard`
    and `positions`; instances are stateless singletons, registered in `parallel.layouts`."""

    name: str = ""
    chunks_per_shard: int = 1  # equal contiguous chunks a shard holds (zigzag: 2)
    # True when where a token sits depends on the data (its documents): the permutation is then
    # per row, made on the host, and attention needs it as `order`.
    data_dependent: bool = False

    def positions(self, shard, block: int, num_shards: int, xp=np):
        """Original token indices held by seq shard `shard`, in stored order: int32 [..., block].

        `shard` is an int, an integer array that broadcasts against [block], or a traced jax
        scalar when xp is jax.numpy.
        """
        raise NotImplementedError

    def one_document_order(self, seq_len: int, num_shards: int, unit: int) -> np.ndarray:
        """int32 [S]: where a row of one causal document sits (the cost model's default row;
        a data-dependent layout places it on units of `unit` tokens)."""
        return self.permutation(seq_len, num_shards)

    def contiguous_run(self, block: int) -> int:
        """Length of the runs a block is made of; default tiles divide it, so that a tile never
        straddles the jump between two chunks (zigzag's halves)."""
        return block // self.chunks_per_shard

    def check_divisible(self, seq_len: int, num_shards: int) -> None:
        """ValueError unless seq_len splits into this layout's equal chunks."""
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        chunks = self.chunks_per_shard * num_shards
        if seq_len % chunks:
            what = (f"{self.chunks_per_shard} x {num_shards} seq shards"
                    if self.chunks_per_shard > 1 else f"{num_shards} seq shards")
            raise ValueError(
                f"seq_len {seq_len} is not divisible by {chunks} ({self.name} needs {what}): "
                f"use a seq_len that is a multiple of {chunks}")

    def permutation(self, seq_len: int, num_shards: int) -> np.ndarray:
        """Natural order -> layout order: int32 [seq_len]; `x[:, perm]` is x laid out."""
        self.check_divisible(seq_len, num_shards)
        block = seq_len // num_shards
        shards = np.arange(num_shards, dtype=np.int32)[:, None]
        perm = self.positions(shards, block, num_shards, xp=np)
        return np.ascontiguousarray(np.broadcast_to(perm, (num_shards, block)).reshape(seq_len))

    def __repr__(self) -> str:
        return f"Layout({self.name!r})"
