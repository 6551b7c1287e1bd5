"""`ring`: contiguous blocks, as in Ring Attention (Liu et al., 2023).

Shard d holds tokens dB ... dB+B-1. Simple, but under the causal mask shard d only has work
against the d+1 blocks at or before it, so on most ring steps some devices idle while others
compute a full block pair.

    S=16, N=4:  dev0 [0 1 2 3]  dev1 [4 5 6 7]  dev2 [8 9 10 11]  dev3 [12 13 14 15]
"""

from __future__ import annotations

import numpy as np

from parallel.layouts.base import Layout


class Ring(Layout):
    name = "ring"

    def positions(self, shard, block, num_shards, xp=np):
        return (shard * block + xp.arange(block, dtype=np.int32)).astype(np.int32)


LAYOUT = Ring()
