"""Cross-entropy of the output projection, without keeping the [B, S, V] logits for the backward.

    total = sum over tokens of weight * (logsumexp(x W) - (x W)[target])

Autodiff of the plain formula keeps the float32 logits from the forward to the backward (with a
32,000-word vocabulary and 49,152 tokens per device that is 6.3 GB) and makes their gradient
there. `nll_sum` computes the gradient where the logits are made: the loss is the last thing the
forward computes, so each device walks its tokens `chunk` at a time (all of them at once with
chunk 0) and, in the same pass (a custom VJP):

    per chunk:   logits = x_c W  [b, chunk, V] float32;  p = softmax(logits)
                 total += sum(weight (lse - logits[target]))
                 dlogits = weight (p - onehot(target))
                 dx_c = dlogits W^T,   dW += x_c^T dlogits      (float32 accumulator)
    backward:    (g dx, g dW) for the incoming scalar cotangent g

so the loss costs O(chunk x V) memory, alive only while it runs, and no recomputation: three
matmuls per chunk, as autodiff's forward + backward would. dW is summed on each device in
float32 and reduced over devices once, at the end (psum_scatter onto W's FSDP shards along
d_model). W enters in the compute dtype and its gradient leaves in it, as autodiff of the model's
own bfloat16 head would: the FSDP gather moves half the bytes, and no float32 [D, V] outlives the
loss (the llama2-7b step on a v5p-128 at 32k: 4.57 -> 4.04 GB a chip, BENCHMARKS.md). Logits and
the softmax are float32, as in the model's own head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from parallel.chunks import (ALL, TOKENS, check_chunk, join_local, split_local, splits,
                          tokens_per_device)


def nll_sum(x, w, targets, weights, *, mesh, chunk: int = 0, soft_cap: float = 0.0):
    """sum(weights * cross-entropy) of the logits x w, from x [B, S, D] (after the final norm,
    compute dtype, sharded P('data', 'seq')), the head w [D, V] and int targets, float weights
    [B, S]; differentiable in x and w. chunk: tokens of a device at a time, a divisor of the
    tokens per device (0: all of them in one piece). soft_cap c: the logits are c tanh(x w / c)
    (the model's final_logit_soft_cap)."""
    block = tokens_per_device(x, mesh)
    chunk = chunk or block
    check_chunk(chunk, block, "loss chunk")
    # Cast outside the custom VJP: W's gather and dW's way back both in the compute dtype.
    return _nll_sum(x, w.astype(x.dtype), targets, weights, mesh, chunk, float(soft_cap))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _nll_sum(x, w, targets, weights, mesh, chunk, soft_cap):
    total, _, _ = _over_chunks(x, w, targets, weights, mesh, chunk, soft_cap, with_grads=False)
    return total


def _nll_sum_fwd(x, w, targets, weights, mesh, chunk, soft_cap):
    total, dx, dw = _over_chunks(x, w, targets, weights, mesh, chunk, soft_cap, with_grads=True)
    return total, (dx, dw.astype(w.dtype))


def _capped(raw, soft_cap):
    """(logits, d logits / d raw or None): c tanh(raw / c) and its slope, or raw itself."""
    if not soft_cap:
        return raw, None
    t = jnp.tanh(raw / soft_cap)
    return soft_cap * t, 1.0 - t * t


def _nll_sum_bwd(mesh, chunk, soft_cap, residuals, g):
    dx, dw = residuals
    return (g.astype(dx.dtype) * dx, g.astype(dw.dtype) * dw, None, None)


_nll_sum.defvjp(_nll_sum_fwd, _nll_sum_bwd)


def _over_chunks(x, w, targets, weights, mesh, chunk, soft_cap, with_grads: bool):
    """(total, dx [B, S, D] or None, dW [D, V] float32 or None), one shard_map over the mesh."""
    dtype = x.dtype

    def local(x, w, targets, weights):
        def step(carry, chunk_in):
            total, dw = carry
            xc, tc, wc = chunk_in  # [b, chunk, D], [b, chunk], [b, chunk]
            logits, slope = _capped(jnp.dot(xc, w).astype(jnp.float32), soft_cap)
            lse = jax.nn.logsumexp(logits, axis=-1)
            target_logit = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
            total = total + jnp.sum((lse - target_logit) * wc)
            if not with_grads:
                return (total, dw), None
            probs = jnp.exp(logits - lse[..., None])
            dlogits = (probs - jax.nn.one_hot(tc, w.shape[1], dtype=jnp.float32)) * wc[..., None]
            if slope is not None:
                dlogits = dlogits * slope
            dlogits = dlogits.astype(dtype)
            dxc = jnp.dot(dlogits, w.T)
            dw = dw + jnp.einsum("bkd,bkv->dv", xc, dlogits, preferred_element_type=jnp.float32)
            return (total, dw), dxc

        zero = jnp.zeros((), jnp.float32)
        dw0 = jnp.zeros(w.shape if with_grads else (), jnp.float32)
        carry0 = jax.tree.map(lambda a: jax.lax.pcast(a, ALL, to="varying"), (zero, dw0))
        chunks = tuple(split_local(a, chunk) for a in (x, targets, weights))
        (total, dw), dx = jax.lax.scan(step, carry0, chunks)
        total = jax.lax.psum(total, ALL)
        if not with_grads:
            return total
        # Every device's dW covers all of W: sum them, each device keeping its rows of d_model.
        dw = jax.lax.psum_scatter(dw, ALL, scatter_dimension=0, tiled=True)
        return total, join_local(dx), dw

    if with_grads:
        out_specs = (jax.P(), TOKENS, jax.P(ALL))
    else:
        out_specs = jax.P()
    out = jax.shard_map(local, mesh=mesh, in_specs=(TOKENS, jax.P(), TOKENS, TOKENS),
                        out_specs=out_specs)(x, w, targets, weights)
    return out if with_grads else (out, None, None)


def token_nll(x, w, targets, *, mesh, chunk: int = 0, soft_cap: float = 0.0):
    """Each token's cross-entropy, [B, S] float32 (layout order, sharded like x), from x
    [B, S, D] after the final norm and the head w [D, V]: for evaluation (no gradient), each
    device's tokens `chunk` at a time (0: all at once), so the logits never exist whole.
    soft_cap as nll_sum's."""
    block = tokens_per_device(x, mesh)
    chunk = chunk if splits(chunk, block) else block
    check_chunk(chunk, block, "loss chunk")

    def local(w, x, targets):
        def one(pieces):
            xc, tc = pieces
            logits, _ = _capped(jnp.dot(xc, w, preferred_element_type=jnp.float32), soft_cap)
            picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
            return jax.nn.logsumexp(logits, axis=-1) - picked
        return join_local(jax.lax.map(one, (split_local(x, chunk), split_local(targets, chunk))))

    return jax.shard_map(local, mesh=mesh, in_specs=(jax.P(), TOKENS, TOKENS),
                         out_specs=TOKENS)(w.astype(x.dtype), x, targets)
