"""`zigzag`: shard d holds chunks d and 2N-1-d of 2N equal chunks (load-balanced context
parallelism). An early chunk and its mirror image pair up, so every device holds the same share
of the causal triangle, in contiguous runs of B/2 tokens.

    S=16, N=4:  dev0 [0 1 14 15]  dev1 [2 3 12 13]  dev2 [4 5 10 11]  dev3 [6 7 8 9]

Example (block 4, N=4, shard 1): chunks of 2, chunks 1 and 6 -> [2 3 12 13].
"""

from __future__ import annotations

import numpy as np

from parallel.layouts.base import Layout


class Zigzag(Layout):
    name = "zigzag"
    chunks_per_shard = 2

    def positions(self, shard, block, num_shards, xp=np):
        i = xp.arange(block, dtype=np.int32)
        half = block // 2
        first = shard * half + i
        second = (2 * num_shards - 1 - shard) * half + (i - half)
        return xp.where(i < half, first, second).astype(np.int32)


LAYOUT = Zigzag()
