"""The mixture-of-experts layer against a dense float64 formula written here (every token through
each of its top-k experts, weighted: no sorting, no grouped matmuls), and the model with expert
layers on several meshes against the same model on one device."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
import parallel
import run_config
from model import moe as moe_lib
from model.config import MLAConfig, MoEConfig
from planner import memory
from tests.support.model_cases import SIZES, assert_as_one_device, loss_and_grads

T, D, E, F = 24, 8, 4, 6


def reference(weights, x, moe: MoEConfig):
    """(y [T, D], counts [E], balance, z, dropped) in float64, token by token."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    x = np.asarray(x, np.float64)
    logits = x @ w["router"] + w.get("router_bias", 0.0)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    y, counts, dropped = np.zeros_like(x), np.zeros(E), 0
    capacity = np.ceil(moe.capacity_factor * len(x) * moe.top_k / E) if moe.capacity_factor \
        else np.inf
    for t in range(len(x)):
        if moe.router == "topk_softmax":
            chosen = np.argsort(-logits[t], kind="stable")[:moe.top_k]
            gates = np.exp(logits[t, chosen] - logits[t, chosen].max())
            gates /= gates.sum()
        else:
            chosen = np.argsort(-probs[t], kind="stable")[:moe.top_k]
            gates = probs[t, chosen]
            if moe.norm_topk_prob:
                gates = gates / gates.sum()
        for e, gate in zip(chosen, gates):
            counts[e] += 1
            if counts[e] > capacity:  # tokens earlier in the order keep their place
                dropped += 1
                continue
            g = x[t] @ w["gate"][e] + (w["gate_bias"][e] if "gate_bias" in w else 0)
            u = x[t] @ w["up"][e] + (w["up_bias"][e] if "up_bias" in w else 0)
            if moe.swiglu_limit:
                g = np.minimum(g, moe.swiglu_limit)
                u = np.clip(u, -moe.swiglu_limit, moe.swiglu_limit)
                h = (u + 1) * g / (1 + np.exp(-1.702 * g))
            else:
                h = g / (1 + np.exp(-g)) * u
            out = h @ w["down"][e] + (w["down_bias"][e] if "down_bias" in w else 0)
            y[t] += gate * out
    lse = logits.max(-1) + np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
    balance = E * np.sum(counts / len(x) * probs.mean(0))
    return y, counts, balance, np.mean(lse ** 2), dropped


def layer_weights(moe: MoEConfig, seed=0):
    rng = np.random.default_rng(seed)
    w = {"router": rng.normal(size=(D, E)), "gate": rng.normal(size=(E, D, F)) / 3,
         "up": rng.normal(size=(E, D, F)) / 3, "down": rng.normal(size=(E, F, D)) / 3}
    if moe.expert_bias:
        w |= {"router_bias": rng.normal(size=E), "gate_bias": rng.normal(size=(E, F)),
              "up_bias": rng.normal(size=(E, F)), "down_bias": rng.normal(size=(E, D))}
    return {k: v.astype(np.float32) for k, v in w.items()}


@pytest.mark.parametrize("moe", [
    MoEConfig(num_experts=E, top_k=2),  # Qwen3-MoE, Mixtral
    MoEConfig(num_experts=E, top_k=2, norm_topk_prob=False),  # Qwen3-MoE's flag off
    MoEConfig(num_experts=E, top_k=2, router="topk_softmax", expert_bias=True,
              swiglu_limit=1.5),  # GPT-OSS (a limit low enough to clamp here)
    MoEConfig(num_experts=E, top_k=3, capacity_factor=0.5),  # a capacity that drops
], ids=["softmax_topk", "no_renorm", "gpt_oss", "capacity"])
def test_layer_against_a_dense_float64_formula(moe):
    weights = layer_weights(moe)
    x = np.random.default_rng(1).normal(size=(T, D)).astype(np.float32)
    y, sums = moe_lib.route_and_run(weights, x, moe, np.float32)
    stats = moe_lib.layer_stats(sums, moe, T)
    want_y, counts, balance, z, dropped = reference(weights, x, moe)
    assert np.abs(np.asarray(y) - want_y).max() < 1e-5 * np.abs(want_y).max()
    np.testing.assert_array_equal(np.asarray(stats["counts"]), counts)
    assert abs(float(stats["balance"]) - balance) < 1e-5 * balance
    assert abs(float(stats["z"]) - z) < 1e-5 * z
    assert float(stats["dropped"]) == dropped
    assert (dropped > 0) == bool(moe.capacity_factor)  # the capacity case does drop


def test_balance_loss_with_equal_router_logits():
    moe = MoEConfig(num_experts=E, top_k=2)
    weights = dict(layer_weights(moe), router=np.zeros((D, E), np.float32))
    x = np.random.default_rng(2).normal(size=(E, D)).astype(np.float32)
    # equal logits: every probability 1 / E, and top_k keeps the lowest indices on a tie
    _, sums = moe_lib.route_and_run(weights, x, moe, np.float32)
    stats = moe_lib.layer_stats(sums, moe, E)
    # every token sends its pairs to experts 0 and 1: counts [E, E, 0, 0] / T, mean p = 1 / E
    np.testing.assert_array_equal(np.asarray(stats["counts"]), [E, E, 0, 0])
    assert abs(float(stats["balance"]) - 2.0) < 1e-6  # E * (1 + 1 + 0 + 0) / E = 2


def test_interleaved_sparse_and_dense_layers_cannot_be_stacked():
    """A dense first few then sparse blocks stack (the first run alone: DeepSeek's
    first_k_dense_replace); dense blocks between sparse ones do not."""
    moe = MoEConfig(num_experts=4, mlp_only_layers=(1,))  # sparse 0 and 2, dense 1
    with pytest.raises(ValueError, match="scan_layers=False"):
        model.ModelConfig(**{**SIZES, "num_layers": 3}, moe=moe, scan_layers=True)
    assert dataclasses.replace(moe, mlp_only_layers=()).mixed(2) is False
    first = model.ModelConfig(**{**SIZES, "num_layers": 3}, scan_layers=True,
                              moe=MoEConfig(num_experts=4, first_dense_layers=2))
    assert first.first_stacked == 2 and first.sparse_layers == (2,)


@pytest.mark.parametrize("moe,options", [
    (MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, mlp_only_layers=(0,)), {}),
    (MoEConfig(num_experts=4, top_k=1, router="topk_softmax", expert_bias=True),
     dict(attention_bias=True, attention_sinks=True)),  # GPT-OSS's attention too
    (MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, router="sigmoid_topk",  # DeepSeek-V3
               num_shared_experts=2, first_dense_layers=1),
     dict(mla=MLAConfig(kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                        v_head_dim=6))),
    (MoEConfig(num_experts=4, top_k=2, expert_mlp_dim=16, num_shared_experts=1,  # Qwen2-MoE
               shared_expert_mlp_dim=24, shared_expert_gate=True),
     dict(qkv_bias=True, partial_rotary_factor=0.5))])
def test_planner_counts_the_experts_parameters(moe, options):
    cfg = model.ModelConfig(**SIZES, moe=moe, **options)
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    counts = memory.param_counts(cfg)
    assert counts["total"] == model.count_params(model.create(cfg, mesh, seed=0))
    # active: each sparse layer's experts other than top_k's are not used by a token (the
    # biases, replicated vectors, are counted in both)
    idle = (moe.num_experts - moe.top_k) * 3 * SIZES["d_model"] * cfg.expert_mlp_dim
    assert counts["total"] - counts["active"] == len(cfg.sparse_layers) * idle


EP = dict(moe=MoEConfig(num_experts=8, top_k=2, aux_loss_coef=0.01, z_loss_coef=0.001,
                        expert_bias=True))


@pytest.fixture(scope="module")
def single_device_ep():
    return loss_and_grads("ring", 1, 1, **EP)


@pytest.mark.sweeps
@pytest.mark.parametrize("layout,data,seq,experts,strategy", [
    # every layout on each mesh; experts in groups of 2 within the 4 or 8 sequence devices,
    # over the 2 data devices, and over whole axes (4, 8)
    ("ring", 1, 4, 2, "ring"), ("striped", 1, 4, 4, "ring"), ("zigzag", 1, 4, 2, "ring"),
    ("balanced", 1, 4, 4, "allgather"), ("ring", 2, 4, 8, "ring"),
    ("striped", 2, 4, 2, "ring"), ("zigzag", 2, 4, 4, "allgather"),
    ("balanced", 2, 4, 8, "ring"), ("ring", 1, 8, 8, "ring"), ("striped", 1, 8, 2, "ring"),
    ("zigzag", 1, 8, 4, "ring"), ("balanced", 1, 8, 8, "ring")])
def test_experts_over_devices_as_one_device(single_device_ep, layout, data, seq, experts,
                                            strategy, monkeypatch):
    """Expert parallelism folded into the data x seq devices: the same loss and gradients,
    dropless, with expert biases and both router losses, under the ring and all-gather
    strategies (one case with stacked layers; two with the ragged all-to-alls of TPU and GPU,
    as jax documents them)."""
    ragged = (layout, data, seq, experts) in (("striped", 1, 8, 2), ("ring", 2, 4, 8))
    if ragged:  # XLA:CPU has no ragged all-to-all
        monkeypatch.setattr(jax.lax, "ragged_all_to_all", ragged_all_to_all_as_documented)
    moe = dataclasses.replace(EP["moe"], expert_devices=experts, ragged_exchange=ragged)
    scan = (layout, seq, experts) == ("zigzag", 8, 4)
    loss, grads, params = loss_and_grads(layout, data, seq, strategy, moe=moe,
                                         scan_layers=scan)
    gate = params["blocks"]["mlp"]["gate"] if scan else params["blocks"][0]["mlp"]["gate"]
    whole = experts in (data, seq, data * seq)  # groups smaller than an axis gather them
    assert gate[...].addressable_shards[0].data.shape[-3] == (8 // experts if whole else 8)
    assert_as_one_device(loss, grads, single_device_ep, scan)


def ragged_all_to_all_as_documented(operand, output, input_offsets, send_sizes, output_offsets,
                                    recv_sizes, *, axis_name, axis_index_groups=None):
    """jax.lax.ragged_all_to_all as its docstring describes it, from padded all-to-alls: the
    slice input_offsets[j]:+send_sizes[j] goes to device j, written there at output_offsets[j];
    recv_sizes[j] rows arrive from device j."""
    a2a = functools.partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=0,
                            concat_axis=0, tiled=True, axis_index_groups=axis_index_groups)
    rows = jnp.arange(operand.shape[0])
    slabs = jax.vmap(lambda start, size: jnp.where(
        (rows < size)[:, None], operand[jnp.minimum(start + rows, operand.shape[0] - 1)], 0))(
        input_offsets, send_sizes)  # [X, N, D]: device j's slice first in slab j
    got, where = a2a(slabs), a2a(output_offsets)
    result = output
    for j in range(input_offsets.shape[0]):
        at = jnp.where(rows < recv_sizes[j], where[j] + rows, output.shape[0])  # past: dropped
        result = result.at[at].set(got[j], mode="drop")
    return result


def test_expert_groups_must_fit_the_mesh():
    assert moe_lib.expert_split({"data": 2, "seq": 4}, 2).axes == ("data",)
    assert moe_lib.expert_split({"data": 4, "seq": 2}, 2).axes == ("seq",)  # one mesh row
    split = moe_lib.expert_split({"data": 8, "seq": 2}, 4)  # two rows of the mesh a group
    assert (split.axes, split.groups) == (
        ("data", "seq"), ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)))
    assert moe_lib.expert_split({"data": 1, "seq": 8}, 2).groups == ((0, 1), (2, 3), (4, 5),
                                                                      (6, 7))
    with pytest.raises(ValueError, match="mesh.expert=3 must be 1, mesh.data"):
        moe_lib.expert_split({"data": 2, "seq": 4}, 3)


def test_planner_prices_the_all_to_alls_the_compiler_emits():
    """The planner's bytes of the expert exchange (planner/step_time.py) against the all-to-alls in
    the compiled train step (configs/tiny.py with 4 experts over its 4 devices): the pair
    slots' all-to-alls, forward and backward, of every sparse layer."""
    import re

    from configs import tiny
    from planner import step_time as planner_time
    from planner.resolve import resolve_run
    from planner.run import make_run
    from training.analysis import aot

    config = tiny.get_config()
    for name, value in model.MemorySwitches().record().items():
        config.model[name] = value
    config.model.moe.num_experts, config.mesh.expert = 4, 4
    config = run_config.build(config)
    resolved = resolve_run(config, (config.mesh.data, config.mesh.seq), "cpu", "cpu")
    run = make_run(config, 4)
    _, compiled = aot.compile_train_step(config, run, resolved)
    m, slot = resolved.model, run.rows * run.block * 2  # a device's T tokens x top_k 2
    sent = 0
    for line in compiled.as_text().splitlines():
        if " all-to-all(" not in line:
            continue
        shapes = re.findall(r"f32\[([\d,]+)\]", line.split(" all-to-all(")[0])
        dims = [tuple(map(int, s.split(","))) for s in shapes]
        if dims and dims[0][-2:] == (slot, m.d_model):  # the pairs, not the embedding's
            sent += sum(np.prod(d) * 4 for d in dims) * 3 / 4  # 3 of the 4 slots leave
    assert sent == planner_time.expert_exchange_bytes(m, run) > 0


@pytest.mark.sweeps
def test_the_correction_bias_moves_the_busiest_expert_down_with_no_auxiliary_loss():
    """DeepSeek-V3's balancing outside the gradient: a model whose expert 0 is favoured (its
    correction bias +0.5, as a checkpoint may carry it), trained 12 steps by AdamW with the
    auxiliary loss off. With bias_update_speed 0.02 the busiest expert's share falls towards
    1 / 4 and the bias of expert 0 goes down; with 0 (the gradient alone: the bias has none)
    the bias stays where it was and the share stays high."""
    from configs import tiny
    from flax import nnx

    from training import optim
    from training import step as step_lib
    from tests.support.model_cases import attention, natural_batch

    mesh = parallel.make_mesh(1, 2, devices=jax.devices()[:2])
    shares, biases = {}, {}
    for speed in (0.0, 0.02):
        moe = MoEConfig(num_experts=4, top_k=1, expert_mlp_dim=16, router="sigmoid_topk",
                        bias_update_speed=speed, num_shared_experts=1)
        cfg = model.ModelConfig(moe=moe, **SIZES)
        graphdef, params = nnx.split(model.create(cfg, mesh, seed=0, choice=attention("striped")),
                                     nnx.Param)
        params = jax.tree_util.tree_map_with_path(
            lambda path, x: x.at[..., 0].add(0.5) if "correction_bias" in str(path) else x,
            params)
        tx, schedule = optim.make_optimizer(tiny.get_config().optim, 12)
        fn = jax.jit(step_lib.make_train_step(graphdef, tx, schedule, mask_documents=True,
                                              model_cfg=cfg))
        perm = parallel.permutation("striped", 32, 2)
        batch = {k: jax.device_put(v[:, perm], jax.NamedSharding(mesh, jax.P("data", "seq")))
                 for k, v in natural_batch().items()}
        state = {"step": jnp.zeros((), jnp.int32), "params": params,
                 "opt_state": tx.init(params)}
        trace = []
        with jax.set_mesh(mesh):
            for _ in range(12):
                state, metrics = fn(state, batch)
                trace.append(float(metrics["moe/share_max"]))
        shares[speed] = trace
        biases[speed] = [np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(
            state["params"]) if "correction_bias" in str(p)]
    assert shares[0.0][0] == shares[0.02][0] > 0.5  # the same first step: expert 0 favoured
    assert shares[0.02][-1] < shares[0.02][0] - 0.15 and shares[0.02][-1] < shares[0.0][-1]
    assert all(np.allclose(b[..., 0], 0.5) for b in biases[0.0])
    assert all((b[..., 0] < 0.5).all() for b in biases[0.02])
