"""AdamW with linear warmup and cosine decay, global-norm gradient clipping."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(optim_cfg, num_train_steps: int):
    """0 -> learning_rate over warmup_steps, then cosine down to learning_rate * min_lr_ratio."""
    warmup = min(optim_cfg.warmup_steps, max(num_train_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=optim_cfg.learning_rate, warmup_steps=warmup,
        decay_steps=max(num_train_steps, warmup + 1),
        end_value=optim_cfg.learning_rate * optim_cfg.min_lr_ratio)


def make_optimizer(optim_cfg, num_train_steps: int):
    """Returns (optax transformation, schedule). Weight decay applies to matrices only."""
    schedule = learning_rate_schedule(optim_cfg, num_train_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(optim_cfg.grad_clip),
        optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                    weight_decay=optim_cfg.weight_decay, mask=_matrices),
    )
    return tx, schedule


_NOT_DECAYED = ("scale", "correction_bias", "a_log", "dt_bias", "norm", "d", "conv_bias")


def _matrices(params):
    """True for the parameters weight decay applies to: every matrix (kernels, the embedding,
    the Gated DeltaNet's convolution), not the RMSNorm scales, nor the experts' correction bias
    (no gradient moves it), nor a Gated DeltaNet's decay rates and time-step bias (a_log,
    dt_bias: decay would pull every head towards one time scale) and its gated norm's scale
    (norm), nor Mamba2's skip weights and convolution bias (d, conv_bias). By name, not by rank: with model.scan_layers the scales of the stacked blocks are
    [num_layers, d_model], two-dimensional but still scales."""
    def is_matrix(path, _):
        return not any(getattr(key, "key", getattr(key, "name", None)) in _NOT_DECAYED
                       for key in path)
    return jax.tree_util.tree_map_with_path(is_matrix, params)


def optimizer_shardings(tx, params, mesh):
    """Shardings for tx.init(params): every parameter-shaped leaf (AdamW's mu, nu) takes its
    parameter's sharding (FSDP); scalars such as the step count are replicated. Left to jit, the
    moments would come out replicated: the whole optimizer state on every device."""
    replicated = jax.NamedSharding(mesh, jax.P())
    return optax.tree_map_params(
        tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params),
        jax.tree.map(lambda p: p.sharding, params),
        transform_non_params=lambda _: replicated)
