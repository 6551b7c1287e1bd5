"""What a recurrent strategy is: how a recurrent layer's rule (Gated DeltaNet's, Mamba2's)
crosses the 'seq' devices, the recurrent layers' counterpart of parallel/strategies/base.py.

A layer describes itself by a `Recurrence` (its convolution's channels by group, its heads, its
rule, its convolution, how the convolution's output becomes q, k, v, its two ends); the planner
describes it by a `RecurrentShape` (sizes only). A strategy takes the convolution's inputs
`mixed` [B, S, C], g, beta [B, S, H], segment ids [B, S] and the batch's order, in the layout's
order and sharded ('data', 'seq'), and returns (o [B, S, H, P] in the layout's order, the state
after each whole row [B, H, N, P]): exact, forward and backward. It prices itself for one layer
on one device (`cost`: FLOPs, bytes, collectives), which the planner turns into seconds.

The rules, the convolution and the layer's projections come in through the Recurrence: nothing
here imports the model, and the rules (model/rules/) hold no collective.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp

from parallel.mesh import DATA, SEQ

TOKENS = jax.P(DATA, SEQ)
CHANNELS = jax.P(DATA, SEQ, None)
OUT = (jax.P(DATA, SEQ, None, None), jax.P(DATA))
F32 = jnp.float32
GATED_DELTANET_UNIT = "Gated DeltaNet layers' key heads"


@dataclasses.dataclass(frozen=True)
class Recurrence:
    """What the strategies need of one recurrent layer."""

    widths: tuple[int, ...]  # a group's channels in each part of the convolution's input, in
    # order (Gated DeltaNet: q dk, k dk, v group dv; Mamba2: x heads/G P, B N, C N)
    groups: int  # what 'heads' splits over the devices (key heads; Mamba2's groups)
    heads: int  # g and beta are one per head, the heads grouped in order
    chunk: int
    rule: Callable  # (q, k, v, g, beta, chunk, initial_state, segment_ids) -> (o, state),
    # linear in (values, start state) together (state passing relies on it)
    # (the convolution's output [b, n, C] of `groups` groups, groups) -> q, k, v [b, n, H', *]
    # and what o adds besides the rule (Mamba2's D x) or None
    heads_of: Callable
    # the causal short convolution: (x [b, n, C], taps [K, C], segment ids, before=(inputs,
    # segment ids, present of the K - 1 tokens before), bias=) -> [b, n, C]
    conv: Callable
    unit: str = GATED_DELTANET_UNIT  # what `groups` counts, for errors
    # The layer's two ends (parallel/recurrent/pieces.py runs them a piece at a time):
    # project(weights, x [b, n, D]) -> (the convolution's inputs [b, n, C] float32, g, beta
    # [b, n, H] float32, what finish needs besides o: Gated DeltaNet's and Mamba2's gate z);
    # finish(weights, o [b, n, H, P], that) -> out [b, n, D]
    project: Callable | None = None
    finish: Callable | None = None

    def split(self, count: int) -> "Recurrence":
        return dataclasses.replace(self, groups=self.groups // count,
                                   heads=self.heads // count)


@dataclasses.dataclass(frozen=True)
class RecurrentShape:
    """A recurrent kind as the planner prices it: heads of a key_dim x value_dim state (Mamba2:
    N x P), its convolution, the groups the 'heads' strategy splits (key heads; Mamba2's
    groups), the chunk, and whether each chunk solves a triangular system (Gated DeltaNet)."""

    heads: int
    key_dim: int
    value_dim: int
    conv_channels: int
    conv_kernel: int
    groups: int
    chunk: int
    solves: bool
    unit: str = GATED_DELTANET_UNIT  # what `groups` counts, for errors

    def rule_flops(self, value_dim: int | None = None) -> float:
        """Forward FLOPs per token of the rule in chunks of C, its values value_dim wide
        (default: the layer's), 2 a multiply-add, per head. Gated DeltaNet: the chunk's k k^T,
        q k^T rows and its triangular inverse's row (C dk, C dk, C C), the written vectors and
        the read (C (dk + dv), C dv), the start state read twice and the state written
        (3 dk dv). Mamba2's SSD: the q k^T row and its read (C (dk + dv)), the start state
        read and the state written (2 dk dv)."""
        c, dk = self.chunk, self.key_dim
        dv = self.value_dim if value_dim is None else value_dim
        if self.solves:
            return 2 * self.heads * (c * (3 * dk + 2 * dv + c) + 3 * dk * dv)
        return 2 * self.heads * (c * (dk + dv) + 2 * dk * dv)

    def token_numbers(self) -> int:
        return token_numbers(self.conv_channels, self.heads, self.value_dim)

    def summary_numbers(self) -> int:
        return summary_numbers(self.heads, self.key_dim, self.value_dim)


def token_numbers(channels: int, heads: int, value_dim: int) -> int:
    """The numbers one token moves when it goes to another device and its output comes back:
    the convolution's inputs, g, beta, its segment id, its output."""
    return channels + 2 * heads + 1 + heads * value_dim


def summary_numbers(heads: int, key_dim: int, value_dim: int) -> int:
    """The numbers that summarise a piece of the row for the pieces after it: (T, R),
    H dk (dk + dv)."""
    return heads * key_dim * (key_dim + value_dim)


class RecurrentStrategy:
    """One way of running a recurrent layer's rule over the 'seq' devices. The registry
    (parallel/recurrent/__init__.py) holds one instance of each."""

    name: ClassVar[str] = ""

    def check(self, groups: int, num_shards: int, unit: str = GATED_DELTANET_UNIT) -> None:
        """ValueError, one line, where it cannot run this layer on num_shards devices."""

    def runs(self, shape: RecurrentShape, num_shards: int) -> bool:
        """Whether it can run a layer of this shape on num_shards 'seq' devices."""
        try:
            self.check(shape.groups, num_shards, shape.unit)
        except ValueError:
            return False
        return True

    def run(self, mixed, g, beta, seg, order, conv, bias, rec: Recurrence, layout: str, mesh):
        """(o [B, S, H, P] in the layout's order, the state after each row [B, H, N, P]):
        conv [K, C] and bias [C] (or None) the convolution's weights."""
        raise NotImplementedError

    def cost(self, x: RecurrentShape, layout: str, seq_len: int, num_shards: int,
             rows: int = 1) -> dict:
        """One layer on one device, forward and backward: {'flops', 'bytes' (sent),
        'collectives' (how many, each paying the network's latency)}."""
        raise NotImplementedError

    def in_pieces(self) -> bool:
        """Whether a training call may run the layer a piece of each device's tokens at a time
        (parallel/recurrent/pieces.py) with this strategy."""
        return True


def over_devices(local, mesh, bias, order):
    """local(mixed, g, beta, seg, conv, bias, order) on each device of the mesh."""
    return jax.shard_map(
        local, mesh=mesh, check_vma=False,
        in_specs=(CHANNELS, CHANNELS, CHANNELS, TOKENS, jax.P(),
                  None if bias is None else jax.P(), None if order is None else TOKENS),
        out_specs=OUT)


def state_widths(rec: Recurrence) -> tuple[int, int]:
    """(dk, dv) of the layer's state per head: the widths of the q and v its heads_of makes."""
    q, _, v, _ = jax.eval_shape(lambda m: rec.heads_of(m, rec.groups),
                                jax.ShapeDtypeStruct((1, 1, rec.groups * sum(rec.widths)),
                                                     jnp.float32))
    return q.shape[-1], v.shape[-1]


def numbers(rec: Recurrence) -> tuple[int, int]:
    """(a piece's summary, a token's move) in numbers, as the planner's RecurrentShape counts
    them."""
    dk, dv = state_widths(rec)
    return (summary_numbers(rec.heads, dk, dv),
            token_numbers(rec.groups * sum(rec.widths), rec.heads, dv))
