"""The decoder-only transformer (Llama-style): embed, N pre-norm blocks, norm, output projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from model import mixers
from model.config import BLOCK_INPUT, FULL, REMAT_POLICIES, ModelConfig
from model.embedding import sharded_lookup
from model.layers import ACTIVATIONS, FSDP, GatedMLP, RMSNorm, dense
from model.moe import Experts
from parallel import SAVED_BY_NAME
from parallel.choice import UNPLANNED, AttentionChoice


class Block(nnx.Module):
    """x + attention(norm(x)), then + mlp(norm(x)); with cfg.sandwich_norms (Gemma) each
    sub-block's output is normalised too before it is added: x + norm(attention(norm(x)))."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice,
                 sparse: bool = False,
                 kind: str = FULL):
        self.activations = jax.NamedSharding(mesh, ACTIVATIONS)
        self.attention_norm = RMSNorm(cfg, rngs)
        self.residual_multiplier = cfg.residual_multiplier
        # the layer type's token mixer (model/mixers): named attention whatever its kind, as
        # checkpoints name it
        self.attention = mixers.mixer_of(cfg, kind).build(cfg, mesh, rngs, choice)
        self.mlp_norm = RMSNorm(cfg, rngs)
        # sparse: the mixture-of-experts layer in place of the dense MLP (model/moe.py)
        self.mlp = Experts(cfg, mesh, rngs) if sparse else GatedMLP(cfg, mesh, rngs)
        if cfg.sandwich_norms:
            self.post_attention_norm = RMSNorm(cfg, rngs)
            self.post_mlp_norm = RMSNorm(cfg, rngs)

    def __call__(self, x, positions, segment_ids=None, order=None, cache=None,
                 collect: bool = False, kind: str = FULL, with_stats: bool = False):
        """Training: x -> x; with `with_stats`, (x, the expert layer's statistics or None for
        a dense block); with `collect`, (x, this layer's keys and values). Decoding (cache:
        this block's KVCache or ShardedCache): x -> (x, updated cache). kind: the layer's
        attention (cfg.layer_type)."""
        h = self.attention(self.attention_norm(x), positions, segment_ids, order, cache=cache,
                           collect=collect, kind=kind)
        if cache is not None or collect:
            h, cache = h
        sandwich = hasattr(self, "post_attention_norm")
        x = x + self._residual(self.post_attention_norm(h) if sandwich else h)
        decoding = cache is not None and not collect  # natural order, not sharded
        stats = None
        if isinstance(self.mlp, Experts):
            h, stats = self.mlp(self.mlp_norm(x), sharded=not decoding)
        else:
            h = self.mlp(self.mlp_norm(x))
        x = x + self._residual(self.post_mlp_norm(h) if sandwich else h)
        if decoding:
            return x, cache
        x = jax.lax.with_sharding_constraint(x, self.activations)
        if collect:
            return x, cache
        return (x, stats) if with_stats else x


    def _residual(self, h):
        """A sub-block's output as it is added: times Granite's residual_multiplier."""
        if self.residual_multiplier == 1.0:
            return h
        return h * jnp.asarray(self.residual_multiplier, h.dtype)


def _block(cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice, i: int) -> Block:
    """Block i as the config makes it: sparse or dense MLP, its layer type's mixer."""
    return Block(cfg, mesh, rngs, choice, sparse=cfg.moe.sparse(i), kind=cfg.layer_type(i))


def _remat_policy(name: str):
    policy = getattr(jax.checkpoint_policies, REMAT_POLICIES[name])
    if name == "offload":  # the named block input goes to host memory; nothing else is kept
        return policy(names_which_can_be_saved=[], names_which_can_be_offloaded=[BLOCK_INPUT],
                      offload_src="device", offload_dst="pinned_host")
    if name == "attention":  # the attention's output and lse, as its custom VJP names them
        return policy(*SAVED_BY_NAME)
    return policy


def _stacked_blocks(cfg: ModelConfig, mesh, rngs: nnx.Rngs, choice: AttentionChoice):
    """One Block whose parameters carry a leading [layers] axis for blocks cfg.first_stacked ..
    num_layers - 1 (unsharded: each device holds its FSDP shard of every layer); for a hybrid
    (scan_period(cfg) P > 1) a list of P such Blocks, position p holding blocks first + p,
    first + p + P, ... The blocks are drawn exactly as the unrolled model draws them and then
    stacked, so a run starts from the same weights whether or not it scans (the dense blocks
    before the stack are drawn first)."""
    layers = [_block(cfg, mesh, rngs, choice, i)
              for i in range(cfg.first_stacked, cfg.num_layers)]
    period = scan_period(cfg)
    stacks = [_stack(layers[p::period]) for p in range(period)]
    return stacks[0] if period == 1 else nnx.List(stacks)


def _stack(layers):
    graphdef, _ = nnx.split(layers[0])

    def stack(*variables):
        meta = variables[0].get_metadata()
        if meta.get("out_sharding") is not None:
            meta["out_sharding"] = (None, *meta["out_sharding"])
        return type(variables[0])(jnp.stack([v[...] for v in variables]), **meta)

    states = [nnx.state(layer) for layer in layers]
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=is_variable))


class Transformer(nnx.Module):
    """tokens [B, S] (+ RoPE positions, segment ids, order) -> logits [B, S, vocab] float32.

    All inputs are in the attention layout's order and sharded (batch over 'data', seq over
    'seq'); the model never needs to know which layout it is, except to pass `kind` along.
    Build it inside `jax.set_mesh(mesh)` so that parameters are created sharded.

    `hidden` is everything before the output projection ([B, S, d_model], what the chunked loss
    takes with `head_weight`); `layers()` yields the blocks one by one whether or not they are
    stacked (cfg.scan_layers). Given a `cache`, the same modules decode (see __call__).

    `choice` is how the run splits the sequence over the mesh (its resolved AttentionChoice:
    layout, strategy, kernel, tiles, the latent and recurrent exchanges), held apart from the
    architecture `cfg`; a model built by hand takes UNPLANNED (striped, by ring, the backend's
    kernel and tiles).
    """

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs,
                 choice: AttentionChoice = UNPLANNED):
        mixers.check(cfg)
        self.cfg, self.mesh, self.choice = cfg, mesh, choice
        # Rows of unit variance; with Gemma's embedding scale (x sqrt(d_model) on the way in)
        # of variance 1 / d_model, so that the block inputs are of unit variance and the tied
        # output logits of about 1, as Gemma draws them
        std = cfg.d_model ** -0.5 if cfg.embed_scale else 1.0
        embed_init = nnx.with_partitioning(nnx.initializers.normal(std), (FSDP, None))
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                               param_dtype=cfg.weights_dtype, embedding_init=embed_init,
                               rngs=rngs)
        if cfg.scan_layers:
            if cfg.first_stacked:  # DeepSeek's dense first blocks, one by one before the stack
                self.first_blocks = nnx.List([_block(cfg, mesh, rngs, choice, i)
                                              for i in range(cfg.first_stacked)])
            self.blocks = _stacked_blocks(cfg, mesh, rngs, choice)  # hybrids: one per position
        else:
            self.blocks = nnx.List([_block(cfg, mesh, rngs, choice, i)
                                    for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = dense(cfg, cfg.d_model, cfg.vocab_size, rngs)

    def __call__(self, tokens, positions=None, segment_ids=None, order=None, cache=None):
        """positions default to 0 .. S-1 in every row (one document per row in natural
        order, as `model(tokens)` on one device is called). order: the original index of each token as it sits ([B, S]; the batch's 'order'),
        required by the 'balanced' layout, optional for the others.

        Decoding: with cache (a list of one KVCache per layer, model/mixers/cache.py), tokens
        [B, T] in natural order at positions [B, T] attend densely to the cache and to each
        other; returns (logits, the updated cache)."""
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        if cache is not None:
            x, cache = self.decode_hidden(tokens, positions, cache)
            return self.logits(x), cache
        return self.logits(self.hidden(tokens, positions, segment_ids, order))

    def hidden(self, tokens, positions, segment_ids=None, order=None):
        """[B, S] -> the final norm's output [B, S, d_model] in the compute dtype."""
        return self.hidden_and_stats(tokens, positions, segment_ids, order)[0]

    def hidden_and_stats(self, tokens, positions, segment_ids=None, order=None):
        """hidden(), and the expert layers' statistics (model/moe.py) stacked over the sparse
        layers in order ({'counts': [L, E], 'balance': [L], 'z': [L], 'dropped': [L]}), or
        None for a dense model."""
        x = self._embed(tokens)

        def run(block, x, kind):
            # Named so that remat_policy 'offload' keeps it in host memory; else a no-op.
            return block(checkpoint_name(x, BLOCK_INPUT), positions, segment_ids, order,
                         kind=kind, with_stats=True)

        if self.cfg.remat:
            run = nnx.remat(run, policy=_remat_policy(self.cfg.remat_policy), static_argnums=2)
        if self.cfg.scan_layers:
            for i in range(self.cfg.first_stacked):  # dense: no statistics
                x, _ = run(self.first_blocks[i], x, self.cfg.layer_type(i))
            x, stats = _scan_blocks(run, self.blocks, x, self.cfg)
        else:
            per_layer = []
            for i, block in enumerate(self.blocks):
                x, layer = run(block, x, self.cfg.layer_type(i))
                per_layer.append(layer)
            found = [layer for layer in per_layer if layer is not None]
            stats = jax.tree.map(lambda *a: jnp.stack(a), *found) if found else None
        return self.final_norm(x), stats

    def prefill(self, tokens, positions, segment_ids=None, order=None):
        """hidden() that also returns every layer's keys and values (a KVCache each, [B, S, K,
        Dh] in the layout's order, sharded like the tokens): a long prompt's forward pass run
        sequence-parallel, as in training, whose cache stays where it was computed."""
        x, caches = self._embed(tokens), []
        for i, block in enumerate(self.layers()):
            x, kv = block(x, positions, segment_ids, order, collect=True,
                          kind=self.cfg.layer_type(i))
            caches.append(kv)
        return self.final_norm(x), caches

    def _embed(self, tokens):
        """The embedding of tokens in the training layout, sharded as activations, looked up
        without gathering the table (model/embedding.py). A sharding on the model's own mesh
        (not a bare spec), so that the model is also callable outside `jax.set_mesh`, as
        `hf.load(path)(tokens)` is in a notebook."""
        x = sharded_lookup(self.embed.embedding[...], tokens, self.mesh, self.cfg.compute_dtype)
        return jax.lax.with_sharding_constraint(self._scaled(x),
                                                jax.NamedSharding(self.mesh, ACTIVATIONS))

    def _embedding(self, tokens):
        """The embedding rows (the plain lookup: decoding's few tokens), scaled as _scaled."""
        return self._scaled(self.embed(tokens))

    def _scaled(self, x):
        """x times sqrt(d_model) in the compute dtype with cfg.embed_scale (Gemma), times
        cfg.embedding_multiplier (Granite)."""
        if self.cfg.embed_scale:
            x = x * jnp.asarray(self.cfg.d_model ** 0.5, x.dtype)
        if self.cfg.embedding_multiplier != 1.0:
            x = x * jnp.asarray(self.cfg.embedding_multiplier, x.dtype)
        return x

    def decode_hidden(self, tokens, positions, cache):
        """hidden() for decoding: the same blocks with their caches; returns (x, new caches)."""
        x, new_cache = self._embedding(tokens), []
        for i, (block, layer_cache) in enumerate(zip(self.layers(), cache, strict=True)):
            x, layer_cache = block(x, positions, cache=layer_cache, kind=self.cfg.layer_type(i))
            new_cache.append(layer_cache)
        return self.final_norm(x), new_cache

    def head_weight(self):
        """The output projection as a [d_model, vocab] matrix (the embedding's transpose when
        tied), divided by Granite's logits_scaling."""
        w = self.embed.embedding[...].T if self.cfg.tie_embeddings else self.lm_head.kernel[...]
        return w if self.cfg.logits_scaling == 1.0 else w / self.cfg.logits_scaling

    def logits(self, x):
        """[B, S, d_model] -> [B, S, vocab] float32 (soft-capped with cfg.final_logit_soft_cap,
        as the chunked loss caps them: model/loss.py)."""
        logits = self.embed.attend(x) if self.cfg.tie_embeddings else self.lm_head(x)
        logits = logits.astype(jnp.float32) / self.cfg.logits_scaling
        return soft_cap(logits, self.cfg.final_logit_soft_cap)

    def layers(self):
        """The blocks in order, as Block modules (slices of the stacked ones with scan_layers)."""
        if not self.cfg.scan_layers:
            yield from self.blocks
            return
        if self.cfg.first_stacked:
            yield from self.first_blocks
        period = scan_period(self.cfg)
        stacks = [nnx.split(b) for b in (self.blocks if period > 1 else [self.blocks])]
        for i in range(self.cfg.num_layers - self.cfg.first_stacked):
            graphdef, state = stacks[i % period]
            yield nnx.merge(graphdef, jax.tree.map(lambda a, j=i // period: a[j], state))


def _scan_blocks(run, blocks, x, cfg: ModelConfig):
    """(x, stats) through the stacked blocks (cfg.first_stacked on) with one lax.scan: the program
    holds one block's code whatever the depth, so compile time and program size stay flat in
    num_layers. Blocks of
    mixed attention kinds (local and global) share their parameters' shapes: each step switches
    to its layer's kind, so the program holds one block per kind."""
    if scan_period(cfg) > 1:
        return _scan_periods(run, blocks, x, cfg)
    graphdef, state = nnx.split(blocks)
    kinds = _layer_types_used(cfg)
    index = jnp.asarray([kinds.index(cfg.layer_type(i))
                         for i in range(cfg.first_stacked, cfg.num_layers)])

    def body(x, step):
        layer_state, which = step
        branches = [lambda x, st, kind=kind: run(nnx.merge(graphdef, st), x, kind)
                    for kind in kinds]
        if len(branches) == 1:
            return branches[0](x, layer_state)
        return jax.lax.switch(which, branches, x, layer_state)

    return jax.lax.scan(body, x, (state, index))  # (x, the stacked layers' stats or None)


def _scan_periods(run, stacks, x, cfg: ModelConfig):
    """A hybrid's stack: each scan step runs one period of blocks (scan_period(cfg), each
    position its own stacked Block and layer kind). The expert layers' statistics come out in
    layer order ([steps, sparse positions, ...] flattened)."""
    period, first = scan_period(cfg), cfg.first_stacked
    split = [nnx.split(stack) for stack in stacks]
    kinds = [cfg.layer_type(first + p) for p in range(period)]

    def body(x, states):
        found = []
        for (graphdef, _), state, kind in zip(split, states, kinds):
            x, stats = run(nnx.merge(graphdef, state), x, kind)
            found += [] if stats is None else [stats]
        return x, (jax.tree.map(lambda *a: jnp.stack(a), *found) if found else None)

    x, stats = jax.lax.scan(body, x, tuple(state for _, state in split))
    flat = None if stats is None else jax.tree.map(
        lambda a: a.reshape(-1, *a.shape[2:]), stats)
    return x, flat


def _layer_types_used(cfg: ModelConfig) -> tuple[str, ...]:
    """The layer types the blocks use, in model.mixers.layer_types() order."""
    used = {cfg.layer_type(i) for i in range(cfg.num_layers)}
    return tuple(t for t in mixers.layer_types() if t in used)


def hybrid(cfg: ModelConfig) -> bool:
    """Blocks of more than one kind of mixer (their parameters differ: no one stack)."""
    return len(mixers.used(cfg)) > 1


def scan_period(cfg: ModelConfig) -> int:
    """With scan_layers, the blocks one scan step runs: 1 where every stacked block has the
    same parameters; for a hybrid the shortest period of its stacked blocks' layer types
    (Qwen3-Next: 4, three Gated DeltaNet layers and a softmax one), the blocks at each
    position of it stacked apart (at worst every stacked block: one step)."""
    if not hybrid(cfg):
        return 1
    types = [cfg.layer_type(i) for i in range(cfg.first_stacked, cfg.num_layers)]
    return next(p for p in range(1, len(types) + 1) if len(types) % p == 0
                and all(t == types[i % p] for i, t in enumerate(types)))


def soft_cap(x, cap: float):
    """cap tanh(x / cap), or x when cap is 0 (Gemma 2's final logits)."""
    return x if not cap else cap * jnp.tanh(x / cap)


def create(cfg: ModelConfig, mesh, seed: int, choice: AttentionChoice = UNPLANNED) -> Transformer:
    """Initialises a sharded model: parameters are created directly in their FSDP shards."""

    @nnx.jit
    def init():
        return Transformer(cfg, mesh, nnx.Rngs(seed), choice)

    with jax.set_mesh(mesh):
        return init()


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
