"""Optimizer schedule, gradient accumulation, FLOPs: checked against hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model
import parallel
import run_config
from configs import tiny
from planner import flops, resolve_run
from training import optim, step as step_lib
from tests.support.model_cases import SIZES, attention, natural_batch


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = tiny.get_config().optim
    cfg.learning_rate, cfg.warmup_steps, cfg.min_lr_ratio = 1.0, 10, 0.1
    schedule = optim.learning_rate_schedule(cfg, 110)
    assert float(schedule(0)) == 0.0 and float(schedule(5)) == pytest.approx(0.5)
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(60)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-5)  # cosine midpoint
    assert float(schedule(110)) == pytest.approx(0.1)


def test_gradient_accumulation_equals_one_big_batch():
    mesh = parallel.make_mesh(2, 2, devices=jax.devices()[:4])
    cfg = model.ModelConfig(**SIZES)
    graphdef, params = nnx.split(model.create(cfg, mesh, seed=0, choice=attention("striped")),
                                 nnx.Param)
    optim_cfg = tiny.get_config().optim
    tx, schedule = optim.make_optimizer(optim_cfg, 10)
    perm = parallel.permutation("striped", 32, 2)
    rows = {k: np.concatenate([v, v[::-1]])[:, perm] for k, v in natural_batch().items()}
    batch = {k: jax.device_put(v, jax.NamedSharding(mesh, jax.P("data", "seq")))
             for k, v in rows.items()}
    results = []
    for accum in (1, 2):
        state = {"step": jnp.zeros((), jnp.int32), "params": params,
                 "opt_state": tx.init(params)}
        fn = step_lib.make_train_step(graphdef, tx, schedule, mask_documents=True,
                                      grad_accum_steps=accum)
        with jax.set_mesh(mesh):
            results.append(jax.jit(fn)(state, batch))
    (one, m1), (two, m2) = results
    assert float(m1["train/loss"]) == pytest.approx(float(m2["train/loss"]), rel=1e-5)
    assert float(m1["learning/grad_norm"]) == pytest.approx(float(m2["learning/grad_norm"]),
                                                             rel=1e-4)
    for a, b in zip(jax.tree.leaves(one["params"]), jax.tree.leaves(two["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_flops_per_token_by_hand():
    m = model.ModelConfig(vocab_size=1000, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          head_dim=16, mlp_dim=128)
    attention_params = 64 * 16 * (4 + 2 + 2 + 4)  # q, k, v, o
    mlp_params = 3 * 64 * 128
    matmul = 2 * (attention_params + mlp_params) + 64 * 1000
    assert flops.matmul_params(m) == matmul
    causal_attention = 3 * 2 * (4 * 256 * 4 * 16) / 2  # fwd+bwd x layers x QK,PV / causal
    assert flops.flops_per_token(m, 256) == 6 * matmul + causal_attention
    assert flops.peak_flops("TPU v4") == 275e12 and flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops("anything", override_tflops=2.0) == 2e12


def test_optimizer_state_is_sharded_like_the_parameters():
    """FSDP covers AdamW's moments too: per device they are 1/devices of the full state."""
    from training.loop import create_train_state

    config = tiny.get_config()
    state, *_ = create_train_state(config, parallel.make_mesh(2, 4))
    adam = state["opt_state"][1][0]
    for moments in (adam.mu, adam.nu):
        for param, moment in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(moments)):
            assert moment.sharding.is_equivalent_to(param.sharding, moment.ndim)
            assert moment.addressable_shards[0].data.size == param.addressable_shards[0].data.size
    kernel = jax.tree.leaves(adam.mu)[1]
    assert kernel.addressable_shards[0].data.size * 8 == kernel.size


def test_wandb_groups_put_the_layouts_of_one_comparison_side_by_side():
    from training.trackers import wandb_names

    def names_of(config, mesh_shape):
        config = run_config.build(config)
        choice = resolve_run(config, mesh_shape, "cpu", "cpu").attention
        return wandb_names(config, mesh_shape, choice)

    names = {}
    for layout in ("ring", "striped", "zigzag", "balanced"):
        config = tiny.get_config()
        config.parallel.layout, config.parallel.strategy = layout, "ring"
        names[layout] = names_of(config, (1, 2))
    groups = {group for group, _, _ in names.values()}
    assert groups == {"S128-ring-xla-1x2-docs"}  # one group: the layouts side by side
    assert len({name for _, name, _ in names.values()}) == 4  # each run named by its layout
    assert all(names[layout][1].startswith(layout) and layout in names[layout][2]
               for layout in names)
    config = tiny.get_config()
    config.data.mask_documents, config.seq_len = False, 256
    config.parallel.strategy = "ring"
    assert names_of(config, (2, 2))[0] == "S256-ring-xla-2x2-nodocs"  # another comparison
    config.parallel.strategy = "auto"  # the group and tags name what 'auto' resolved to
    choice = resolve_run(config, (2, 2), "cpu", "cpu").attention
    group, _, tags = wandb_names(run_config.build(config), (2, 2), choice)
    assert "auto" not in group and f"strategy-{choice.strategy}" in tags
    assert "kernel-xla" in tags
    config.wandb_group = "my-sweep"
    assert names_of(config, (2, 2))[0] == "my-sweep"


def test_a_checkpoint_whose_parameters_have_other_shapes_is_refused_naming_the_field():
    """resume.check_compatible over model.parameter_fields (experts' fields too): equal values
    pass (a JSON list as its tuple), another value of any is refused in one line naming it,
    and a field the record lacks (saved before it existed) counts as its default."""
    from checkpoints import CheckpointError
    from training import resume
    cfg = model.ModelConfig(**SIZES, qk_norm=True, moe=model.config.MoEConfig(
        num_experts=4, decoder_sparse_step=2))
    fields = {**SIZES, "qk_norm": True, "moe": {"num_experts": 4, "decoder_sparse_step": 2}}

    def record(**changed):
        model_fields = {**fields, "moe": dict(fields["moe"])}
        for name, value in changed.items():
            section, _, field = name.rpartition("__")
            (model_fields[section] if section else model_fields)[field] = value
        return {"config": {"model": model_fields, "parallel": {"layout": "ring"}}}

    resume.check_compatible("ckpt", 7, record(), cfg)
    for name, value in (("qk_norm", False), ("d_model", 64), ("moe__num_experts", 8),
                        ("moe__mlp_only_layers", [1]), ("moe__decoder_sparse_step", 1)):
        dotted = name.replace("__", ".")
        with pytest.raises(CheckpointError, match=rf"step 7 in ckpt has model\.{dotted}="):
            resume.check_compatible("ckpt", 7, record(**{name: value}), cfg)
    older = record()
    del older["config"]["model"]["qk_norm"]
    with pytest.raises(CheckpointError, match="model.qk_norm=False but this run has "
                                              "model.qk_norm=True"):
        resume.check_compatible("ckpt", 7, older, cfg)
