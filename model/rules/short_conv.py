"""The short causal convolution before a recurrent layer's rule (Gated DeltaNet's over q, k, v;
Mamba2's over x, B, C): depthwise, conv_kernel taps, each token reading only its own document's
earlier tokens; over the 'seq' devices the first taps of a piece read the last inputs of the
piece before it (`before`: parallel/recurrent/state.piece_halos).

    causal_conv(x [B, S, C], w [K, C], segment_ids, before) -> act(conv) [B, S, C] float32
    last_inputs(...)      a prefill's last K - 1 inputs per row: a decoding cache's
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


def causal_conv(x, w, segment_ids=None, before=None, activation=jax.nn.silu, bias=None):
    """A depthwise causal convolution over the sequence: x [B, S, C], w [K, C] ->
    act(sum_j w[j] x[t - K + 1 + j]) [B, S, C] float32, a tap reading only tokens of t's own
    document (segment_ids [B, S]). before: (x, segment ids, present) of the K - 1 tokens
    before the first (the previous device's, a decoding cache's); default: none. bias [C]:
    added before the activation (Mamba2's)."""
    b, s, c = x.shape
    kernel = w.shape[0]
    seg = jnp.zeros((b, s), jnp.int32) if segment_ids is None else segment_ids
    if before is None:
        before = (jnp.zeros((b, kernel - 1, c), x.dtype), jnp.zeros((b, kernel - 1), seg.dtype),
                  jnp.zeros((b, kernel - 1), bool))
    prev_x, prev_seg, present = before
    xs = jnp.concatenate([prev_x.astype(F32), x.astype(F32)], axis=1)
    segs = jnp.concatenate([prev_seg.astype(seg.dtype), seg], axis=1)
    live = jnp.concatenate([present, jnp.ones((b, s), bool)], axis=1)
    out = 0.0
    for j in range(kernel):  # tap j reads token t - (K - 1) + j
        same = (segs[:, j:j + s] == seg) & live[:, j:j + s]
        out = out + w[j].astype(F32) * jnp.where(same[..., None], xs[:, j:j + s], 0.0)
    return activation(out if bias is None else out + bias.astype(F32))


def last_inputs(mixed, prompt, order, width: int):
    """The convolution's inputs of each row's last `width` prompt tokens [B, width, C] (zeros
    before the first), found by their original indices (order; None: natural order)."""
    b, s, _ = mixed.shape
    lengths = jnp.sum(prompt, axis=1)  # [B]
    order = jnp.broadcast_to(jnp.arange(s), (b, s)) if order is None else order
    wanted = lengths[:, None] - width + jnp.arange(width)  # [B, width] original indices
    slot = jnp.argmax(order[:, None, :] == wanted[:, :, None], axis=-1)  # [B, width]
    taken = jnp.take_along_axis(mixed, slot[..., None], axis=1)
    return jnp.where((wanted >= 0)[..., None], taken, 0.0)
