"""Memory: at a fixed block size seq/N, the gradient's temporary memory per device does not grow
with the ring size N. A ring loop differentiated by autodiff keeps every KV block that passed by
and grows linearly; the control below shows this measurement sees that growth."""

import jax
import jax.numpy as jnp
from jax import lax
import pytest

import parallel
from tests.support.attention_cases import STATIC

BLOCK, HEADS, DIM = 128, 2, 32


def temp_bytes(loss, mesh, seq_len):
    x = jax.ShapeDtypeStruct((1, seq_len, HEADS, DIM), jnp.float32,
                             sharding=jax.NamedSharding(mesh, jax.P("data", "seq")))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def autodiff_ring_attention(q, k, v, mesh):
    """Bidirectional ring attention differentiated through its loop (the design to avoid)."""
    n = mesh.shape["seq"]

    def local(q, k, v):
        def step(carry, _):
            k, v, o, m, l = carry
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[..., None])
            alpha = jnp.exp(m - m_new)
            o = o * jnp.moveaxis(alpha, 2, 1)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
            k, v = (lax.ppermute(x, "seq", [(i, (i + 1) % n) for i in range(n)]) for x in (k, v))
            return (k, v, o, m_new, alpha * l + p.sum(-1)), None

        stats = jnp.full((q.shape[0], q.shape[2], q.shape[1]), -jnp.inf)
        stats = lax.pcast(stats, ("data", "seq"), to="varying")
        init = (k, v, jnp.zeros_like(q), stats, jnp.zeros_like(stats))
        (_, _, o, m, l), _ = lax.scan(step, init, length=n)
        return o / jnp.moveaxis(l, 2, 1)[..., None]

    spec = jax.P("data", "seq")
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)(q, k, v)


def measure(attention_fn):
    sizes = {}
    for n in (2, 4, 8):
        mesh = parallel.make_mesh(1, n, devices=jax.devices()[:n])
        loss = lambda q, k, v: jnp.sum(attention_fn(q, k, v, mesh) ** 2)
        sizes[n] = temp_bytes(loss, mesh, n * BLOCK)
    return sizes


@pytest.mark.parametrize("layout", STATIC)  # balanced runs the same strategy and kernels
def test_gradient_memory_is_flat_in_ring_size(layout):
    sizes = measure(lambda q, k, v, mesh: parallel.attention(q, k, v, mesh=mesh, layout=layout))
    assert sizes[8] <= sizes[2] * 1.05 + 4096, sizes


def test_control_autodiffed_ring_grows():
    sizes = measure(autodiff_ring_attention)
    block_bytes = BLOCK * HEADS * DIM * 4
    # Each extra ring step keeps at least one more K and V block for the backward pass.
    assert sizes[8] - sizes[2] >= 6 * 2 * block_bytes, sizes
