"""Expert parallelism: how the tokens of a mixture-of-experts layer (model/moe.py) reach the
devices that hold their experts, and come back. The experts are split over groups of devices
folded into the data x seq mesh (mesh.expert: 1, mesh.seq, mesh.data, all of them, or groups of
neighbours); each group's devices hold num_experts / size experts in order. One all-to-all sends
every device the (token, expert) pairs of its experts, a second returns their outputs: the
whole slots, padded, or where the compiler has them (RAGGED_PLATFORMS) ragged all-to-alls that
send only the pairs.

    split = expert_split(mesh, devices, ragged)      # ExpertSplit: axes, size, groups
    exchange(run, xs, sizes, experts, split)         # run(pairs) on the experts' devices
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from parallel.chunks import ALL
from parallel.mesh import DATA, SEQ

# Backends whose compilers have ragged all-to-alls (XLA:CPU does not: it sends padded slots).
RAGGED_PLATFORMS = ("tpu", "gpu")


@dataclasses.dataclass(frozen=True)
class ExpertSplit:
    """The experts over groups of `size` devices of the mesh `axes`, each device of a group
    holding num_experts / size of them in order; `groups` lists the groups by their devices'
    index over `axes` (jax.lax.all_to_all's axis_index_groups) where a group is a part of the
    axes, None where it is all of them (whole: the stored weights are split the same way);
    `ragged`: the tokens travel by ragged all-to-alls (exchange)."""
    axes: tuple[str, ...] = ()
    size: int = 1
    groups: tuple[tuple[int, ...], ...] | None = None
    ragged: bool = False

    @property
    def whole(self) -> bool:
        return self.groups is None

    def all_to_all(self, x):
        """x [X * n, ...] -> [X * n, ...]: block j to the group's device j, block j received
        from device j (inside a shard_map over the mesh)."""
        return jax.lax.all_to_all(x, self.axes, 0, 0, tiled=True,
                                  axis_index_groups=self.groups)

    def position(self):
        """This device's place in its group (inside a shard_map over the mesh)."""
        return jax.lax.axis_index(self.axes) % self.size  # groups are neighbours

    def own(self, weights: dict) -> dict:
        """Every expert's weights (inside a shard_map over the mesh) -> this device's."""
        position = self.position()
        mine = lambda w: jax.lax.dynamic_slice_in_dim(  # noqa: E731
            w, position * (w.shape[0] // self.size), w.shape[0] // self.size)
        return {k: v if k.startswith("router") else mine(v) for k, v in weights.items()}


def expert_split(mesh, devices: int, ragged: bool = False) -> ExpertSplit:
    """How `devices` devices split the experts, folded into the devices that split the batch
    and the sequence elsewhere: none for 1; whole mesh axes when `devices` is mesh.seq (the
    attention's ring devices hold the experts too), mesh.data, or every device; groups of
    neighbouring devices when it divides mesh.seq, or is a multiple of mesh.seq dividing every
    device (rows of the mesh). ValueError (one line) for any other count."""
    shape = getattr(mesh, "shape", mesh)  # a Mesh, or its {axis: size}
    data, seq = shape[DATA], shape[SEQ]
    if devices == 1:
        return ExpertSplit()
    for axes, size in (((SEQ,), seq), ((DATA,), data), (ALL, data * seq)):
        if devices == size:
            return ExpertSplit(axes, size, ragged=ragged)
    for axes, size in (((SEQ,), seq), (ALL, data * seq)):
        if size % devices == 0 and (axes == (SEQ,) or devices % seq == 0):
            return ExpertSplit(axes, devices, tuple(
                tuple(range(g, g + devices)) for g in range(0, size, devices)), ragged)
    raise ValueError(f"mesh.expert={devices} must be 1, mesh.data ({data}), a divisor of "
                     f"mesh.seq ({seq}), or a multiple of mesh.seq dividing all {data * seq} "
                     "devices: the experts are split over groups of neighbouring devices")


def exchange(run, xs, sizes, experts, split: ExpertSplit):
    """Expert parallelism: run(pairs, group sizes, experts) on the devices that hold the pairs'
    experts, and the outputs back in the pairs' order.

    xs [P, D] (P = T k) sorted by expert, sizes [E], experts [P]. The X devices of a group hold
    E / X experts each, in order. Each receiver has a [P, D] slot for each sender of its group,
    [X, P, D] in all (an expert device may get all P pairs: dropless, whatever the routing).
    One all-to-all sends each device its pairs: the whole slots, padded, or with `ragged`
    (a ragged all-to-all) only the pairs. The receiver sorts the rows it got by its own expert
    (then by sender), runs them, unsorts, and a second all-to-all returns them likewise.
    """
    p, d = xs.shape
    num_experts = sizes.shape[0]
    x_devices, local = split.size, num_experts // split.size
    all_to_all = split.all_to_all

    def ragged(rows, starts, sizes_out, sizes_in):
        # rows[starts[j]:][:sizes_out[j]] into device j's slot for this device; sizes_in[j]
        # rows come from device j into its slot here
        here = jnp.full_like(starts, split.position() * p)
        return ragged_send(rows, starts, sizes_out, here, sizes_in, split, x_devices * p)

    # Sender: each pair's slot [destination, rank among the pairs sent there].
    dest = experts // local
    sent = jnp.sum(sizes.reshape(x_devices, local), axis=1)
    slot = dest * p + jnp.arange(p) - (jnp.cumsum(sent) - sent)[dest]
    # counts[j, l]: pairs from sender j for this device's expert l.
    counts = all_to_all(sizes.reshape(x_devices, local))
    received = jnp.sum(counts, axis=1)  # [X] pairs from each sender
    if split.ragged:
        got = ragged(xs, jnp.cumsum(sent) - sent, sent, received)
    else:
        got = all_to_all(jnp.zeros((x_devices * p, d), xs.dtype).at[slot].set(xs).reshape(
            x_devices, p, d))
    # Receiver: row (j, q) is sender j's q-th pair here; its expert l and its place in the
    # order by (l, j), the unused rows of each slot after all the used ones.
    q = jnp.arange(p)
    ends = jnp.cumsum(counts, axis=1)  # [X, local]
    expert = jax.vmap(lambda e: jnp.searchsorted(e, q, side="right"))(ends)  # [X, P]
    used = q[None, :] < ends[:, -1:]
    expert = jnp.minimum(expert, local - 1)
    before_expert = jnp.cumsum(jnp.sum(counts, axis=0)) - jnp.sum(counts, axis=0)  # [local]
    before_sender = jnp.cumsum(counts, axis=0) - counts  # [X, local]
    rank = q[None, :] - (ends - counts)[jnp.arange(x_devices)[:, None], expert]
    place = before_expert[expert] + before_sender[jnp.arange(x_devices)[:, None], expert] + rank
    spare = jnp.cumsum(~used).reshape(x_devices, p) - 1 + jnp.sum(counts)
    place = jnp.where(used, place, spare).reshape(-1)
    rows = jnp.zeros_like(got.reshape(-1, d)).at[place].set(got.reshape(-1, d))
    out = run(rows, jnp.sum(counts, axis=0), jnp.zeros_like(place).at[place].set(
        expert.reshape(-1)))[place]  # back in slots
    if split.ragged:
        back = ragged(out, jnp.arange(x_devices, dtype=sent.dtype) * p, received, sent)
    else:
        back = all_to_all(out.reshape(x_devices, p, -1))
    return back.reshape(x_devices * p, -1)[slot]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def ragged_send(rows, starts, sizes_out, offsets, sizes_in, split: ExpertSplit, length: int):
    """jax.lax.ragged_all_to_all of rows [N, D] into zeros [length, D] over the split's groups:
    rows[starts[j]:][:sizes_out[j]] to device j of the group, written there from
    offsets[j]; sizes_in[j] rows arrive from device j. Its gradient is the reverse send (jax's
    own transpose ignores axis_index_groups)."""
    out = jnp.zeros_like(rows, shape=(length, rows.shape[-1]))  # varying, as rows
    return jax.lax.ragged_all_to_all(rows, out, starts, sizes_out, offsets, sizes_in,
                                     axis_name=split.axes, axis_index_groups=split.groups)


def _ragged_send_forward(rows, starts, sizes_out, offsets, sizes_in, split, length):
    y = ragged_send(rows, starts, sizes_out, offsets, sizes_in, split, length)
    return y, (starts, sizes_out, offsets, sizes_in, rows.shape[0])


def _ragged_send_backward(split, length, residuals, dy):
    starts, sizes_out, offsets, sizes_in, n = residuals
    # Device j wrote its rows here from its offsets[me] and read them from its starts[me].
    drows = ragged_send(dy, split.all_to_all(offsets), sizes_in, split.all_to_all(starts),
                        sizes_out, split, n)
    return drows, None, None, None, None


ragged_send.defvjp(_ragged_send_forward, _ragged_send_backward)
