"""The embedding lookup of a training step without the whole table on any device.

The table [V, D] is stored in FSDP shards of rows (V / n rows a device over the n devices of
('data', 'seq')). Looked up the plain way, XLA gathers all of it onto every device, and the
backward builds a table-sized gradient on every device before reducing it: two [V, D] buffers
per device (for a 32,000 x 4,096 table in bfloat16, 500 MiB), however few tokens a device holds.

`sharded_lookup` moves the table's shards the other way round instead, so that each device
holds every row but only D / n of its columns, and looks up every token of the step in its
columns:

    table  [V / n, D]  --all-to-all-->  [V, D / n]               (V D / n per device)
    tokens [b, s]      --all-gather-->  [n, b, s]                 (every device's token ids)
    rows   = table[ids] [n, b, s, D / n]  --all-to-all-->  [b, s, D]  (this device's tokens)

The backward is the same three steps transposed (autodiff): the gradient of each device's
columns is a [V, D / n] scatter-add, sent back to its row shards by one all-to-all. Per device,
nothing holds more than V D / n of the table, and what moves is V D / n table bytes and one
activation's worth of rows, against V D for the gather and again for the reduce-scatter.

    sharded_lookup(table, tokens, mesh, dtype) -> [B, S, D] in dtype, sharded P('data', 'seq')

Where V or D does not split over the devices, or there is only one, the plain lookup runs. The
backward keeps the gathered ids, 4 bytes for every token of the step on every device
(planner/memory.py counts them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import parallel
from parallel.chunks import ALL


def splits(table_shape, devices: int) -> bool:
    """Whether the table's rows and columns both divide over the devices (more than one)."""
    vocab, width = table_shape
    return devices > 1 and vocab % devices == 0 and width % devices == 0


def sharded_lookup(table, tokens, mesh, dtype):
    """table [V, D] (any dtype, its rows sharded over ('data', 'seq')), tokens [B, S] int
    (sharded P('data', 'seq')) -> table[tokens].astype(dtype), [B, S, D], sharded like tokens,
    by the three collectives of the module docstring.

    >>> x = sharded_lookup(model.embed.embedding[...], tokens, mesh, jnp.bfloat16)
    """
    if not splits(table.shape, mesh.shape[parallel.DATA] * mesh.shape[parallel.SEQ]):
        return jnp.take(table, tokens, axis=0).astype(dtype)

    def local(rows, ids):
        # Cast first: the shards travel in the compute dtype, and so does their gradient.
        columns = jax.lax.all_to_all(rows.astype(dtype), ALL, split_axis=1, concat_axis=0,
                                     tiled=True)  # [V, D / n]
        every = jax.lax.all_gather(ids, ALL, axis=0, tiled=False)  # [n, b, s]
        found = jnp.take(columns, every, axis=0)  # [n, b, s, D / n]
        mine = jax.lax.all_to_all(found, ALL, split_axis=0, concat_axis=3, tiled=True)
        return mine[0]  # [b, s, D]

    return jax.shard_map(local, mesh=mesh, in_specs=(jax.P(ALL, None), jax.P(*ALL)),
                         out_specs=jax.P(*ALL))(table, tokens)
