"""Time, traffic and memory of each strategy for one attention layer on one device: the planner's
strategy table (scripts/plan.py) and `parallel.strategy='auto'` both come from here.

Notation: b rows per device, S tokens, N 'seq' devices, n = S / N, H query heads, h KV heads,
d head_dim, p bytes per element, u the Ulysses degree (1 for ring and allgather, N for ulysses),
r = N / u ring steps, h' = lcm(h, u) KV heads after ulysses repeats them (h when u = 1).

Compute. A tile is tq x tk (query, key) pairs; F = 4 b tq tk d H FLOPs for a forward tile over all
H heads (QK^T and PV), 2F backward. Tile counts come from parallel.cost, the rule the kernels
run, so skipping (causal, documents) and imbalance are counted, not assumed:
  ring       c_s = max over devices of tiles on step s, x F / rate: devices wait at every hop
  allgather  w = max over devices of all its tiles x F / rate: nothing to wait for once gathered;
             c_0 = its own block's share
  ulysses,   c'_s from the sorted groups (cost.group_tile_counts), x F / (u rate): a tile spans
  usp        H / u heads

Network (alpha-beta): a ring hop of B bytes costs a + B / link; a collective in which each
device sends B bytes costs a + B / coll (all-gather, reduce-scatter, all-to-all: `coll` is what a
device drives into them, more than one link on a torus). KV = 2 b n h d p (+ 8 b n with segment
ids), dKV = 8 b n h d (float32), Q = b n H d p.

  strategy   forward                                       backward
  ring       sum_{s<N-1} max(c_s, hop(KV)) + c_{N-1}        sum_{s<N-1} max(2 c_s, hop(KV) +
                                                           hop(dKV)) + max(2 c_{N-1}, hop(KV))
                                                           + hop(dKV)
  allgather  max(c_0, AG) + w - c_0,                       AG + 2 w + RS, RS: (N-1) dKV
             AG: (N-1) KV
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
import math

from parallel import cost


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

    @property
    def block(self) -> int:
        return self.seq_len // self.num_shards


@dataclasses.dataclass(frozen=True)
class Network:
    """The rates the formulas divide by."""

    flops_per_s: float
    link_bytes_per_s: float  # one ring hop, one direction
    collective_bytes_per_s: float  # a device's share of an all-gather / all-to-all
    latency_s: float  # a: fixed cost of each hop or collective


def options(num_shards: int, q_heads: int) -> list[tuple[str, int]]:
    """(strategy, Ulysses degree) pairs that run on this mesh and head count."""
    found = [("ring", 1), ("allgather", 1)]
    found += [("usp", u) for u in range(2, num_shards) if num_shards % u == 0
              and q_heads % u == 0]
    if num_shards > 1 and q_heads % num_shards == 0:
        found.append(("ulysses", num_shards))
    return found


def _bytes(x: LayerShape, heads_kv: int):
    """(Q, KV, dKV) bytes of one device's block with `heads_kv` KV heads."""
    tokens = x.rows * x.block
    kv = 2 * tokens * heads_kv * x.head_dim * x.itemsize + (8 * tokens if x.with_segments else 0)
    return tokens * x.q_heads * x.head_dim * x.itemsize, kv, 8 * tokens * heads_kv * x.head_dim


def _ring_seconds(steps, hop_kv, hop_dkv):
    """Forward and backward of a ring whose step computes take `steps` seconds each."""
    if len(steps) == 1:
        return steps[0], 2 * steps[0]
    forward = sum(max(c, hop_kv) for c in steps[:-1]) + steps[-1]
    backward = (sum(max(2 * c, hop_kv + hop_dkv) for c in steps[:-1])
                + max(2 * steps[-1], hop_kv) + hop_dkv)
    return forward, backward


def estimate(x: LayerShape, net: Network, strategy: str, degree: int = 1,
             documents=None, step_counts=None) -> dict:
    """Seconds (forward, backward), bytes sent and buffer bytes of `strategy` for one layer;
    documents: segment ids [R, S] of sample rows (None: one causal document per row);
    step_counts: cost.step_tile_counts of these, when the caller has them already."""
    tile_s = 4 * x.rows * x.tiles[0] * x.tiles[1] * x.head_dim * x.q_heads / net.flops_per_s
    hop = lambda b: net.latency_s + b / net.link_bytes_per_s
    coll = lambda b: net.latency_s + b / net.collective_bytes_per_s
    n_shards = x.num_shards
    if strategy in ("ring", "allgather"):
        q, kv, dkv = _bytes(x, x.kv_heads)
        counts = (cost.step_tile_counts(x.layout, n_shards, x.block, x.tiles, documents)
                  if step_counts is None else step_counts)
        if strategy == "ring":
            steps = (counts.max(axis=1).mean(axis=0) * tile_s).tolist()
            forward, backward = _ring_seconds(steps, hop(kv), hop(dkv))
            sent, memory, path = (n_shards - 1) * kv + n_shards * (kv + dkv), 2 * (kv + dkv), steps
        else:
            work = counts.sum(axis=2).max(axis=1).mean() * tile_s
            own = counts[:, :, 0].max(axis=1).mean() * tile_s
            gather, scatter = coll((n_shards - 1) * kv), coll((n_shards - 1) * dkv)
            forward = max(own, gather) + work - own
            backward = gather + 2 * work + scatter
            sent, memory = (n_shards - 1) * (2 * kv + dkv), n_shards * (kv + dkv)
            path = [work]
    else:
        kv_heads = math.lcm(x.kv_heads, degree)
        q, kv, dkv = _bytes(x, kv_heads)
        share = (degree - 1) / degree
        counts = cost.group_tile_counts(x.layout, n_shards, degree, x.block, x.tiles, documents)
        steps = (counts.max(axis=1).mean(axis=0) * tile_s / degree).tolist()
        forward, backward = _ring_seconds(steps, hop(kv), hop(dkv))
        rows_f32 = 8 * x.rows * x.block * x.q_heads  # lse and D
        a2a = [share * (q + kv), share * q, share * (2 * q + kv + rows_f32), share * (q + kv)]
        forward += coll(a2a[0]) + coll(a2a[1])
        backward += coll(a2a[2]) + coll(a2a[3])
        rounds = n_shards // degree
        sent = sum(a2a) + (rounds - 1) * kv + rounds * (kv + dkv) * (rounds > 1)
        memory, path = 3 * q + rows_f32 + 2 * (kv + dkv), steps
    return {"strategy": strategy, "degree": degree, "forward_s": forward,
            "backward_s": backward, "bytes_sent": sent, "buffer_bytes": memory,
            "compute_s": sum(path)}


def strategy_table(x: LayerShape, net: Network, documents=None) -> list[dict]:
    """`estimate` for every option of this mesh and head count."""
    return [estimate(x, net, s, u, documents) for s, u in options(x.num_shards, x.q_heads)]


def layer_seconds(row: dict, remat: bool) -> float:
    """One layer's attention in a training step: the forward again under remat."""
    return row["forward_s"] * (2 if remat else 1) + row["backward_s"]


def recommend(table: list[dict], remat: bool, memory_left: float | None = None) -> dict:
    """The fastest row whose buffers fit in `memory_left` bytes (None: no limit; if none fits,
    the one with the smallest buffers)."""
    fits = [r for r in table if memory_left is None or r["buffer_bytes"] <= memory_left]
    if not fits:
        return min(table, key=lambda r: r["buffer_bytes"])
    return min(fits, key=lambda r: (layer_seconds(r, remat), r["buffer_bytes"]))

