"""The mixture-of-experts layer: a router picks top_k of num_experts gated MLPs for each token,
whose outputs are summed with the router's weights. Dropless by default.

Shapes: T tokens of one device (b x n of its [b, n, D] block), D d_model, E experts, k top_k,
F the expert's hidden width.

    logits = x Wr (+ br)               [T, E] float32
    softmax_topk (Qwen3-MoE, Mixtral,   p = softmax(logits); w, e = top_k(p, k); w /= sum(w)
      DeepSeek-V2):                     (the last only with norm_topk_prob)
    topk_softmax (GPT-OSS):             l, e = top_k(logits, k); w = softmax(l)
    sigmoid_topk (DeepSeek-V3,          p = sigmoid(logits); e = top_k(p + b, k) with b the
      GLM-4.5):                         correction bias; w = p[e] (/= sum with norm_topk_prob)
    with n_group > 1 a token chooses among the topk_group groups of E / n_group experts of
    highest score only (a group's best expert; with sigmoid_topk its best two's sum of p + b);
    w *= routed_scaling_factor
    y[t] = sum_j w[t, j] expert_{e[t, j]}(x[t])  (+ shared(x[t]), times sigmoid(x[t] Wsg)
                                                    with shared_expert_gate)

The correction bias b is not trained by the gradient: after each step an expert's bias goes
down by bias_update_speed when it got more than its even share of the pairs, up when fewer
(update_correction_bias: DeepSeek-V3's auxiliary-loss-free balancing).

The T k (token, expert) pairs are sorted by expert, so each expert's tokens are one contiguous
run, and every expert's gate, up and down matmuls are one grouped matmul over the runs
(`jax.lax.ragged_dot`, group sizes = tokens per expert): no token is dropped and no expert
computes padding. Each pair's output goes back to its token by the inverse permutation and is
summed with its weight. With a capacity factor c, an expert keeps the first C = ceil(c T k / E)
pairs of its run (in token order) and the rest get weight 0: "dropped" (the residual passes).

The expert's MLP: act(x Wg) * (x Wu) Wd as the dense MLP (silu or gelu_tanh), or with
swiglu_limit L (GPT-OSS): g = min(x Wg + bg, L), u = clip(x Wu + bu, -L, L),
(u + 1) g sigmoid(1.702 g) Wd + bd.

Per layer the layer also returns its statistics over every device's tokens (psum):
    counts [E]   pairs routed to each expert (before any capacity drop): share = counts / (T k)
    balance      E sum_e (counts_e / T) mean_t p[t, e]   (k when routing is uniform; the
                 load-balancing loss of Switch and Mixtral; p the softmax over all E logits)
    z            mean_t logsumexp(logits[t])^2         (the router z-loss)
    dropped      pairs dropped by the capacity (0 when dropless)

    Experts(cfg, mesh, rngs)(x [B, S, D]) -> (y [B, S, D], stats)
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from parallel.chunks import ALL, TOKENS
from parallel.experts import ExpertSplit, exchange, expert_split
from model.config import ModelConfig, MoEConfig
from model.layers import GatedMLP, dense

GPT_OSS_ALPHA = 1.702  # the sigmoid's slope in GPT-OSS's clamped SwiGLU
_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


class Experts(nnx.Module):
    """The router and E gated MLPs of one sparse layer. Parameters: router [D, E] (+ bias [E]),
    gate and up [E, D, F], down [E, F, D] (+ biases [E, F], [E, F], [E, D] with expert_bias),
    each sharded over the whole mesh on its second axis (FSDP, as the dense MLP's), or with
    the experts over whole mesh axes, E over those and the second axis over the rest."""

    def __init__(self, cfg: ModelConfig, mesh, rngs: nnx.Rngs):
        moe, d, f = cfg.moe, cfg.d_model, cfg.expert_mlp_dim
        e, dtype = moe.num_experts, cfg.weights_dtype
        self.mesh, self.moe, self.dtype, self.activation = mesh, moe, cfg.compute_dtype, \
            cfg.mlp_activation
        self.split = expert_split(mesh, moe.expert_devices, moe.ragged_exchange)
        # The experts' matrices: split over the expert axes when a group is those whole axes,
        # the second axis over the others (FSDP); otherwise (no expert parallelism, or groups
        # smaller than their axes) the second axis over every device, gathered whole per layer.
        axes = self.split.axes if self.split.whole else ()
        rest = tuple(a for a in ALL if a not in axes) or None
        spec = (axes, rest, None) if axes else (None, ALL, None)

        def param(shape, scale, spec):
            init = nnx.initializers.variance_scaling(scale, "fan_in", "normal", in_axis=-2,
                                                     out_axis=-1, batch_axis=(0,))
            return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=spec)

        self.router = nnx.Param(nnx.initializers.variance_scaling(1.0, "fan_in", "normal")(
            rngs.params(), (d, e), dtype), out_sharding=(ALL, None))
        self.gate = param((e, d, f), 1.0, spec)
        self.up = param((e, d, f), 1.0, spec)
        self.down = param((e, f, d), 1.0 / cfg.num_layers, spec)
        if moe.expert_bias:
            zeros = lambda *shape, spec=None: nnx.Param(  # noqa: E731
                jnp.zeros(shape, dtype), out_sharding=(spec or None,) + (None,) * (len(shape) - 1))
            self.router_bias = zeros(e)
            self.gate_bias, self.up_bias, self.down_bias = (
                zeros(e, f, spec=axes), zeros(e, f, spec=axes), zeros(e, d, spec=axes))
        if moe.correction_bias:  # float32 whatever the parameters' dtype: steps of 0.001 stay
            self.correction_bias = nnx.Param(jnp.zeros((e,), jnp.float32), out_sharding=(None,))
        if moe.num_shared_experts:
            self.shared = GatedMLP(cfg, mesh, rngs, width=moe.shared_width(cfg.mlp_dim))
            if moe.shared_expert_gate:
                self.shared_gate = dense(cfg, d, 1, rngs)

    def weights(self) -> dict:
        names = ["router", "gate", "up", "down"] + (
            ["router_bias", "gate_bias", "up_bias", "down_bias"] if self.moe.expert_bias else [])
        out = {name: getattr(self, name)[...] for name in names}
        if self.moe.correction_bias:  # moved by update_correction_bias, not by the gradient
            out["correction_bias"] = jax.lax.stop_gradient(self.correction_bias[...])
        return out

    def __call__(self, x, sharded: bool = True):
        """x [B, S, D] sharded P('data', 'seq') -> (y [B, S, D] likewise, stats: module
        docstring, over every device's tokens). sharded=False: x as it is (decoding's few
        tokens in natural order), on whatever device holds it."""
        weights, (b, n, _) = self.weights(), x.shape

        def through(weights, x, split=None):  # [b, n, D] -> ([b, n, D], this device's sums)
            y, sums = route_and_run(weights, x.reshape(-1, x.shape[-1]), self.moe, self.dtype,
                                    self.activation, split)
            return y.reshape(x.shape), sums

        if not sharded:
            y, sums = through(weights, x)
            return self._with_shared(x, y), layer_stats(sums, self.moe, b * n)

        split = self.split if self.split.size > 1 else None

        def local(weights, x):
            if split and not split.whole:  # every expert gathered: keep this device's own
                weights = split.own(weights)
            y, sums = through(weights, x, split)
            return y, jax.tree.map(lambda s: jax.lax.psum(s, ALL), sums)

        # Gathered whole, but for the experts' own axes when they hold whole groups.
        stored = jax.P(split.axes) if split and split.whole else jax.P()
        specs = {k: jax.P() if k.startswith("router") else stored for k in weights}
        y, sums = jax.shard_map(local, mesh=self.mesh, in_specs=(specs, TOKENS),
                                out_specs=(TOKENS, jax.P()))(weights, x)
        return self._with_shared(x, y), layer_stats(sums, self.moe, b * n)

    def _with_shared(self, x, y):
        """y plus the shared experts' output on x (gated by sigmoid(x Wsg) with a gate)."""
        if not self.moe.num_shared_experts:
            return y
        shared = self.shared(x)
        if self.moe.shared_expert_gate:
            shared = jax.nn.sigmoid(self.shared_gate(x).astype(jnp.float32)).astype(
                shared.dtype) * shared
        return y + shared


def route(logits, moe: MoEConfig, correction_bias=None):
    """(w [T, k] float32, experts [T, k] int32) from router logits [T, E] float32 (module
    docstring); correction_bias [E]: sigmoid_topk's b."""
    if moe.router == "topk_softmax":
        top, experts = jax.lax.top_k(logits, moe.top_k)
        return jax.nn.softmax(top, axis=-1), experts
    sigmoid = moe.router == "sigmoid_topk"
    scores = jax.nn.sigmoid(logits) if sigmoid else jax.nn.softmax(logits, axis=-1)
    choice = scores + correction_bias if correction_bias is not None else scores
    if moe.n_group > 1:
        grouped = choice.reshape(*choice.shape[:-1], moe.n_group, -1)
        best = jax.lax.top_k(grouped, min(2, grouped.shape[-1]))[0]
        group_score = jnp.sum(best, axis=-1) if sigmoid else best[..., 0]
        chosen = jax.lax.top_k(group_score, moe.topk_group)[1]  # [T, topk_group]
        keep = jnp.any(chosen[..., None] == jnp.arange(moe.n_group), axis=-2)  # [T, n_group]
        choice = jnp.where(keep[..., None], grouped, -jnp.inf).reshape(choice.shape)
    experts = jax.lax.top_k(choice, moe.top_k)[1]
    w = jnp.take_along_axis(scores, experts, axis=-1)
    if moe.norm_topk_prob:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + (1e-20 if sigmoid else 0.0))
    return w * moe.routed_scaling_factor if moe.routed_scaling_factor != 1.0 else w, experts


def update_correction_bias(params, counts, moe: MoEConfig, sparse_layers: tuple[int, ...]):
    """params with every sparse layer's correction bias moved bias_update_speed against its
    expert's load: down where it got more than the mean of the layer's counts, up where fewer.
    counts [L, E]: the pairs each sparse layer sent each expert this step (the layers' stats in
    order); params: the model's parameters, blocks unrolled (blocks[i]) or stacked (every
    block sparse, the bias [L, E])."""
    if not (moe.correction_bias and moe.bias_update_speed):
        return params
    step = moe.bias_update_speed * jnp.sign(jnp.mean(counts, axis=-1, keepdims=True) - counts)

    def move(path, leaf):
        keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
        if "correction_bias" not in keys:
            return leaf
        layer = next((k for k in keys if isinstance(k, int)), None)
        delta = step if layer is None else step[sparse_layers.index(layer)]
        return leaf + delta.astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(move, params)


def expert_mlp(weights, xs, sizes, experts, *, dtype, activation: str, limit: float):
    """The experts' gated MLPs on the pairs xs [P, D] sorted by expert (sizes [E] pairs per
    expert; experts [P] each pair's expert, for the biases) -> [P, D] in dtype."""
    w = {k: v.astype(dtype) for k, v in weights.items()}
    g = jax.lax.ragged_dot(xs, w["gate"], sizes)
    u = jax.lax.ragged_dot(xs, w["up"], sizes)
    if "gate_bias" in w:
        g, u = g + w["gate_bias"][experts], u + w["up_bias"][experts]
    if limit:
        g = jnp.minimum(g, limit)
        h = (jnp.clip(u, -limit, limit) + 1) * g * jax.nn.sigmoid(GPT_OSS_ALPHA * g)
    else:
        h = _ACTIVATIONS[activation](g) * u
    out = jax.lax.ragged_dot(h, w["down"], sizes)
    return out + w["down_bias"][experts] if "down_bias" in w else out


def route_and_run(weights, x, moe: MoEConfig, dtype, activation: str = "silu",
                  split: ExpertSplit | None = None):
    """One device's tokens x [T, D] through the layer -> (y [T, D] in dtype, this device's sums:
    counts [E], prob_sums [E], z_sum, dropped). With a split (inside a shard_map over the
    mesh), the expert weights are this device's E / X experts and the pairs travel to their
    experts' devices and back (exchange)."""
    t, e, k = x.shape[0], moe.num_experts, moe.top_k
    logits = jnp.dot(x.astype(jnp.float32), weights["router"].astype(jnp.float32))
    if "router_bias" in weights:
        logits = logits + weights["router_bias"].astype(jnp.float32)
    w, experts = route(logits, moe, weights.get("correction_bias"))

    flat = experts.reshape(-1)  # [T k]: pair j is token j // k's (j % k)-th choice
    order = jnp.argsort(flat, stable=True)  # pairs by expert, tokens in order within one
    sorted_experts = flat[order]
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    xs = x.astype(dtype)[order // k]
    run = functools.partial(expert_mlp, weights, dtype=dtype, activation=activation,
                            limit=moe.swiglu_limit)
    out = exchange(run, xs, sizes, sorted_experts, split) if split else run(xs, sizes,
                                                                            sorted_experts)

    pair_w = w.reshape(-1)[order]
    if moe.capacity_factor:
        capacity = math.ceil(moe.capacity_factor * t * k / e)
        starts = jnp.cumsum(sizes) - sizes
        kept = jnp.arange(t * k) - starts[sorted_experts] < capacity
        pair_w = jnp.where(kept, pair_w, 0.0)
        dropped = jnp.sum(~kept).astype(jnp.float32)
    else:
        dropped = jnp.sum(jnp.zeros_like(pair_w))  # 0, computed from this device's values
    weighted = out.astype(jnp.float32) * pair_w[:, None]
    back = jnp.argsort(order)  # pair j's row in the sorted order
    y = jnp.sum(weighted[back].reshape(t, k, -1), axis=1).astype(dtype)

    probs = jax.nn.softmax(logits, axis=-1)
    sums = {"counts": sizes.astype(jnp.float32), "prob_sums": jnp.sum(probs, axis=0),
            "z_sum": jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2), "dropped": dropped}
    return y, sums


def layer_stats(sums, moe: MoEConfig, tokens: int) -> dict:
    """The layer's statistics (module docstring) from the sums over all `tokens` tokens."""
    return {"counts": sums["counts"],
            "balance": moe.num_experts * jnp.sum(sums["counts"] / tokens * sums["prob_sums"]
                                                 / tokens),
            "z": sums["z_sum"] / tokens, "dropped": sums["dropped"]}


def looped_expert_mlp(weights, xs, sizes, experts, *, dtype, activation: str, limit: float):
    """expert_mlp as a loop over the experts, each a dense matmul over every pair with the
    other experts' rows masked out (what a layer without grouped matmuls computes: E times the
    matmul work). For the benchmark against expert_mlp (scripts/bench/moe.py), not for runs."""
    out = 0.0
    for e in range(sizes.shape[0]):
        one = {k: v[e:e + 1] if k in ("gate", "up", "down", "gate_bias", "up_bias", "down_bias")
               else v for k, v in weights.items()}
        mine = (experts == e)[:, None]
        rows = jnp.where(mine, xs, 0)
        y = expert_mlp(one, rows, jnp.asarray([xs.shape[0]], jnp.int32),
                       jnp.zeros_like(experts), dtype=dtype, activation=activation, limit=limit)
        out = out + jnp.where(mine, y, 0)
    return out
