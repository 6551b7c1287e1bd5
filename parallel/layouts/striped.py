"""`striped`: shard d holds tokens d, d+N, d+2N, ... (Striped Attention, Brandon et al., 2023).

Every block pair is then an almost-even slice of the causal triangle: with tile skipping each
device does about half a block pair of work on every ring step, whatever the step.

    S=16, N=4:  dev0 [0 4 8 12]  dev1 [1 5 9 13]  dev2 [2 6 10 14]  dev3 [3 7 11 15]
"""

from __future__ import annotations

import numpy as np

from parallel.layouts.base import Layout


class Striped(Layout):
    name = "striped"

    def positions(self, shard, block, num_shards, xp=np):
        return (xp.arange(block, dtype=np.int32) * num_shards + shard).astype(np.int32)


LAYOUT = Striped()
