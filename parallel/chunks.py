"""Per-token work done a chunk of the sequence at a time, so its memory is O(chunk), not O(S).

A token-wise function f (the gated MLP, the output projection and its loss) applied to a
[B, S, D] activation makes [B, S, F] or [B, S, V] intermediates, and autodiff keeps them for the
backward. Here each device runs f over its own tokens in chunks of `chunk`, inside
`jax.shard_map` so that nothing crosses devices inside the loop:

    x [B, S, D] sharded P('data', 'seq')  ->  local [b, n, D]  ->  [n / chunk, b, chunk, D]
    lax.map(checkpoint(f)) over the chunks ->  [b, n, D']      ->  [B, S, D'] P('data', 'seq')

The checkpoint makes the backward recompute a chunk's intermediates instead of saving them, so
one chunk's are alive at a time. Parameters enter replicated (XLA gathers the FSDP shards once,
before the loop) and their gradients are summed over devices once, after it, by shard_map's
transpose. Token order does not matter to a token-wise f, so the layout's permutation is moot.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import parallel

TOKENS = jax.P(parallel.DATA, parallel.SEQ)  # [B, S, ...] as the model holds it
ALL = (parallel.DATA, parallel.SEQ)  # every device: what a sum over all tokens reduces over


def tokens_per_device(x, mesh) -> int:
    """n: the tokens of one row each device holds of x [B, S, ...] sharded over 'seq'."""
    return x.shape[1] // mesh.shape[parallel.SEQ]


def splits(chunk: int, block: int) -> bool:
    """Whether a chunk of `chunk` tokens really cuts a device's `block` tokens into pieces
    (0, or a chunk as long as the block, means the whole block in one call)."""
    return 0 < chunk < block


def check_chunk(chunk: int, block: int, what: str = "chunk") -> None:
    """ValueError unless 0 < chunk <= block and chunk divides block."""
    if not 0 < chunk <= block or block % chunk:
        raise ValueError(f"{what} {chunk} does not divide the {block} tokens each device holds "
                         f"(seq_len / mesh.seq): choose a divisor of {block}")


def split_local(x, chunk: int):
    """[b, n, ...] -> [n / chunk, b, chunk, ...]: one device's tokens as a stack of chunks.

    Example: b = 1, n = 6, chunk = 2: tokens [t0 .. t5] -> [[t0 t1], [t2 t3], [t4 t5]].
    """
    b, n = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, n // chunk, chunk, *x.shape[2:]), 1, 0)


def join_local(x):
    """The inverse of split_local: [n / chunk, b, chunk, ...] -> [b, n, ...]."""
    count, b, chunk = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, count * chunk, *x.shape[3:])


def map_chunks(fn, params, x, *, mesh, chunk: int):
    """fn(params, x_chunk [b, chunk, D]) -> [b, chunk, D'], over every token of x [B, S, D].

    Same values as fn(params, x) on the whole array; with chunk 0 (or a chunk as long as the
    device's block) it is exactly that call, without shard_map. Memory of fn's intermediates:
    one chunk's, forward and backward.
    """
    block = tokens_per_device(x, mesh)
    if not splits(chunk, block):
        return fn(params, x)
    check_chunk(chunk, block)

    def local(params, x):
        out = jax.lax.map(lambda xc: jax.checkpoint(fn)(params, xc), split_local(x, chunk))
        return join_local(out)

    replicated = jax.tree.map(lambda _: jax.P(), params)
    return jax.shard_map(local, mesh=mesh, in_specs=(replicated, TOKENS), out_specs=TOKENS)(
        params, x)
