"""Time, traffic and memory of one attention layer on one device, the terms every strategy prices
itself with: a strategy's file carries its own `cost` (and the degrees it runs with), written
with the helpers here; `estimate` and `options` ask the registry, so a new strategy adds no name
here. The planner (planner/) turns these into step times, and `parallel.strategy='auto'` picks
from them.

Notation: b rows per device, S tokens, N 'seq' devices, n = S / N, H query heads, h KV heads,
d head_dim, p bytes per element, u the Ulysses degree (1 for ring and allgather, N for ulysses),
r = N / u ring steps, h' = lcm(h, u) KV heads after ulysses repeats them (h when u = 1).

Compute. A tile is tq x tk (query, key) pairs; F = 4 b tq tk d H FLOPs for a forward tile over all
H heads (QK^T and PV), 2F backward; a forward tile takes t = t0 + F / rate (t0: its fixed cost).
How often t0 is paid is the kernel's (`TileGrid`, declared by each kernel): once a live tile
(xla: a loop step over every row and head), once a live tile per row and head (Pallas GPU: a
program per row, head and query tile), or once per row and head for every tile of a visited
block pair, masked ones too (Pallas TPU: its grid walks the whole rectangle; a masked step moves
no data but still costs its step). `step_seconds` applies it.
Tile counts come from parallel.cost, the rule the kernels run, so skipping (causal, documents)
and imbalance are counted, not assumed:
  ring       c_s = max over devices of tiles on step s, x t: devices wait at every hop
  allgather  w = max over devices of all its tiles x t: nothing to wait for once gathered
  ulysses,   c'_s from the sorted groups (cost.group_tile_counts), x (t0 + F / (u rate)): a
  usp        tile spans H / u heads

Network: a collective in which each device sends B bytes costs a + B / coll (all-gather,
reduce-scatter, all-to-all: `coll` is what a device drives into them, more than one link on a
torus). A ring step that computes for c seconds while B bytes travel B / link seconds costs

    step(c, B) = a + max(c, (1 - e) B / link) + e B / link

a: the step's fixed cost (synchronisation, the loop, launching the transfer), e: the share of
the transfer that does not hide behind the compute (0: perfect overlap). Both are fitted per
device kind to published step times (planner/devices.py). KV = 2 b n h d p + 8 b n with segment
ids (their int32 ids and int32 original positions travel with the block), dKV = 8 b n h d
(float32), Q = b n H d p.

  strategy   forward                                       backward
  ring       sum_{s<N-1} step(c_s, KV) + c_{N-1}            sum_{s<N-1} step(2 c_s, KV + dKV) +
                                                           step(2 c_{N-1}, KV) + dKV / link
  allgather  AG + w, AG: (N-1) KV                          AG + 2 w + RS, RS: (N-1) dKV
  usp        A2A_in + the ring's forward over r groups     A2A_in' + the ring's backward + A2A_out'
             (blocks u n tokens x h'/u heads) + A2A_out

  A2A_in = (u-1)/u (Q + KV h'/h), A2A_out = (u-1)/u Q; backward in: + dO and float32 lse, D;
  out: dQ, dK, dV. No all-to-all overlaps compute (each feeds or drains the whole attention).

Memory: the strategy's own buffers per device, beyond what every strategy keeps:
  ring 2 KV + 2 dKV (held and arriving); allgather N KV + N dKV (the gathered sequence and every
  block's float32 dK/dV: O(S)); usp the head-sharded copies of q, dO, out (3 Q + float32 lse, D)
  and the ring's buffers of the groups' blocks (2 KV h'/h + 2 dKV h'/h).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from parallel import cost
from parallel.mask import Mask


@dataclasses.dataclass(frozen=True)
class TileGrid:
    """How a kernel's grid pays a tile's fixed cost t0 (see the module docstring)."""

    per_head: bool = False  # once per batch row and query head (a grid step each), not once
    every_tile: bool = False  # on every tile of a block pair it visits, the masked ones too


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One attention layer on one device."""

    rows: int  # b
    seq_len: int  # S
    num_shards: int  # N
    q_heads: int
    kv_heads: int
    head_dim: int
    itemsize: int  # p: bytes per element of q, k, v
    layout: str
    tiles: tuple[int, int]
    with_segments: bool = False
    window: int | None = None  # a sliding layer's window (causal)
    # latent attention passing latents (parallel/latent.py): what travels of a token, its
    # latent and RoPE key (kv_lora_rank + qk_rope_head_dim values), in place of K and V
    latent_width: int = 0

    @property
    def block(self) -> int:
        return self.seq_len // self.num_shards

    @property
    def pair_tiles(self) -> int:
        """Tiles in one block pair's rectangle (query block x key block)."""
        return pair_tiles(self.block, self.tiles)

    @property
    def mask(self) -> Mask:
        return Mask(causal=True, window=self.window)


@dataclasses.dataclass(frozen=True)
class Network:
    """The rates the formulas divide by, and how well a ring step overlaps its transfer."""

    flops_per_s: float  # what the attention kernel reaches on a tile
    link_bytes_per_s: float  # one ring hop, one direction
    collective_bytes_per_s: float  # a device's share of an all-gather / all-to-all
    latency_s: float  # a: fixed cost of each ring step or collective
    hop_exposed: float = 0.0  # e: share of a hop's transfer that compute does not hide
    tile_overhead_s: float = 0.0  # t0: fixed cost of each forward tile (its loop step, slices)
    grid: TileGrid = TileGrid()  # how the kernel pays t0

    def hop(self, compute_s: float, nbytes: float) -> float:
        """One ring step: `compute_s` of work while `nbytes` travel to the next device."""
        transfer = nbytes / self.link_bytes_per_s
        return (self.latency_s + max(compute_s, (1 - self.hop_exposed) * transfer)
                + self.hop_exposed * transfer)

    def collective(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.collective_bytes_per_s


def block_bytes(x: LayerShape, heads_kv: int):
    """(Q, KV, dKV) bytes of one device's block with `heads_kv` KV heads; KV includes the int32
    segment ids and int32 original positions that travel with it when documents are masked."""
    tokens = x.rows * x.block
    ids = 8 * tokens if x.with_segments else 0
    q = tokens * x.q_heads * x.head_dim * x.itemsize
    if x.latent_width:  # a latent block and its float32 gradient
        return q, tokens * x.latent_width * x.itemsize + ids, 4 * tokens * x.latent_width
    kv = 2 * tokens * heads_kv * x.head_dim * x.itemsize + ids
    return q, kv, 8 * tokens * heads_kv * x.head_dim


def tile_seconds(x: LayerShape, net: Network, head_share: float = 1.0) -> float:
    """A forward tile over all H heads (x `head_share` of them: ulysses' H / u): its fixed cost
    t0 and 4 b tq tk d H FLOPs at the kernel's rate. t0 is what makes small tiles slow and
    large ones imbalanced: the tile 'auto' picks weighs the two (planner/recommend.py)."""
    return net.tile_overhead_s + tile_flops(x, head_share) / net.flops_per_s


def tile_flops(x: LayerShape, head_share: float = 1.0) -> float:
    """F = 4 b tq tk d H: a forward tile's FLOPs over `head_share` of the H query heads."""
    return 4 * x.rows * x.tiles[0] * x.tiles[1] * x.head_dim * x.q_heads * head_share


def pair_tiles(side: int, tiles: tuple[int, int]) -> int:
    """Tiles in the rectangle of a block pair of `side` tokens each way."""
    return (side // tiles[0]) * (side // tiles[1])


def step_seconds(x: LayerShape, net: Network, counts, pair_tiles: int,
                 head_share: float = 1.0) -> np.ndarray:
    """Forward seconds of each entry of a tile count array (tiles[r, d, s]: the live tiles of
    the block pair a device computes on a step, from parallel.cost; `pair_tiles` tiles in that
    pair's whole rectangle): the live tiles' FLOPs at the kernel's rate, and t0 as the kernel's
    grid pays it (a pair with no live tile is skipped whole: parallel.strategies.base).

    >>> x = LayerShape(1, 4096, 2, 1, 1, 8, 2, "zigzag", (512, 512), False)
    >>> net = Network(1e9, 1e9, 1e9, 0.0, tile_overhead_s=1e-3, grid=TileGrid(every_tile=True))
    >>> step_seconds(x, net, np.array([3, 0]), pair_tiles=16).round(4).tolist()
    [0.0412, 0.0]
    """
    counts = np.asarray(counts, np.float64)
    grid_steps = np.where(counts > 0, pair_tiles, 0) if net.grid.every_tile else counts
    per_step = x.rows * x.q_heads * head_share if net.grid.per_head else 1
    return (counts * (tile_flops(x, head_share) / net.flops_per_s)
            + grid_steps * per_step * net.tile_overhead_s)


def ring_seconds(steps, kv: float, dkv: float, net: Network):
    """Forward and backward of a ring whose step computes take `steps` seconds each, K/V blocks
    of `kv` bytes travelling (and `dkv` bytes of float32 gradients with them backward)."""
    if len(steps) == 1:
        return steps[0], 2 * steps[0]
    forward = sum(net.hop(c, kv) for c in steps[:-1]) + steps[-1]
    backward = (sum(net.hop(2 * c, kv + dkv) for c in steps[:-1]) + net.hop(2 * steps[-1], kv)
                + dkv / net.link_bytes_per_s)
    return forward, backward


def step_counts(x: LayerShape, documents=None, given=None):
    """tiles[r, d, s] of the layout's ring (parallel.cost, the rule the kernels run); `given`,
    when the caller counted them already."""
    if given is not None:
        return given
    return cost.step_tile_counts(x.layout, x.num_shards, x.block, x.tiles, documents, x.mask)
