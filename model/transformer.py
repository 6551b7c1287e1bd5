"""The decoder-only transformer (Llama-style): embed, N pre-norm blocks, norm, output projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from model.config import ModelConfig
from model.layers import ACTIVATIONS, FSDP, Attention, RMSNorm, SwiGLU, dense


class Block(nnx.Module):
    """x + attention(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(cfg, rngs)
        self.attention = Attention(cfg, mesh, rngs)
        self.mlp_norm = RMSNorm(cfg, rngs)
        self.mlp = SwiGLU(cfg, rngs)

    def __call__(self, x, positions, segment_ids, order):
        x = x + self.attention(self.attention_norm(x), positions, segment_ids, order)
        x = x + self.mlp(self.mlp_norm(x))
        return jax.lax.with_sharding_constraint(x, ACTIVATIONS)


def _run_block(block, x, positions, segment_ids, order):
    return block(x, positions, segment_ids, order)


_run_block_remat = nnx.remat(_run_block)


class Transformer(nnx.Module):
    """tokens [B, S] (+ RoPE positions, segment ids, order) -> logits [B, S, vocab] float32.

    All inputs are in the attention layout's order and sharded (batch over 'data', seq over
    'seq'); the model never needs to know which layout it is, except to pass `kind` along.
    Build it inside `jax.set_mesh(mesh)` so that parameters are created sharded.
    """

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs):
        self.cfg = cfg
        embed_init = nnx.with_partitioning(nnx.initializers.normal(1.0), (FSDP, None))
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                               param_dtype=cfg.weights_dtype, embedding_init=embed_init,
                               rngs=rngs)
        self.blocks = nnx.List([Block(cfg, mesh, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = dense(cfg, cfg.d_model, cfg.vocab_size, rngs)

    def __call__(self, tokens, positions, segment_ids=None, order=None):
        """order: the original index of each token as it sits ([B, S]; the batch's 'order'),
        required by the 'balanced' layout, optional for the others."""
        x = jax.lax.with_sharding_constraint(self.embed(tokens), ACTIVATIONS)
        run = _run_block_remat if self.cfg.remat else _run_block
        for block in self.blocks:
            x = run(block, x, positions, segment_ids, order)
        x = self.final_norm(x)
        if self.cfg.tie_embeddings:
            logits = self.embed.attend(x)
        else:
            logits = self.lm_head(x)
        return logits.astype(jnp.float32)


def create(cfg: ModelConfig, mesh, seed: int) -> Transformer:
    """Initialises a sharded model: parameters are created directly in their FSDP shards."""

    @nnx.jit
    def init():
        return Transformer(cfg, mesh, nnx.Rngs(seed))

    with jax.set_mesh(mesh):
        return init()


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
