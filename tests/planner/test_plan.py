"""The planner (planner/, printed by scripts/plan.py): analytic memory and time figures against
hand counts, JAX and the kernel.

The hand-computed numbers use configs/tiny.py's model: vocab V 512, d 64, L 2 layers, H 4 query
and K 2 KV heads of Dh 16, mlp F 128; on a data 2 x seq 2 mesh (D = 4) with batch 4 x 128 tokens,
so b = 2 rows and n = 64 tokens per device: b n = 128.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import model
import parallel
import run_config


from configs import tiny
from configs.gpu import paper_a100_256k
from parallel import strategy_cost
from planner import DEVICES, memory, resolve_run, step_time
from planner.reports import plan
from planner.run import Run, make_run, process_block
from training.analysis import aot
from tests.support import ROOT


def tiny_model(**overrides):
    """configs/tiny.py with `overrides`; its memory switches off unless given (the by-hand
    figures below count them so)."""
    config = tiny.get_config()
    for name, value in {**model.MemorySwitches().record(), **overrides}.items():
        config.model[name] = value
    config = run_config.build(config)
    return config, tiny_resolved(config).model


def tiny_resolved(config):
    return resolve_run(config, (config.mesh.data, config.mesh.seq), "cpu", "cpu")


def tiny_run(config) -> Run:
    return make_run(config, 4)


def test_parameter_counts_by_hand():
    _, m = tiny_model()
    counts = memory.param_counts(m)
    # per layer: q, o 64x64 each; k, v 64x32 each; gate, up 64x128, down 128x64
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert layer == counts["layer"] == 36_864
    assert counts["matmul"] == 2 * layer + 64 * 512 == 106_496  # + output head
    assert counts["vectors"] == 5 * 64  # 2 RMSNorms per layer + the final one
    assert counts["total"] == 106_496 + 512 * 64 + 320 == 139_584  # + embedding


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_equals_the_real_model(tie):
    config, m = tiny_model(tie_embeddings=tie)
    mesh = parallel.make_mesh(2, 2, devices=jax.devices()[:4])
    assert memory.param_counts(m)["total"] == model.count_params(model.create(m, mesh, 0))


def test_state_memory_by_hand():
    config, m = tiny_model()
    s = memory.state_memory(m, tiny_run(config))
    params = (139_264 / 4 + 320) * 4  # matrices / D devices, norm scales replicated, float32
    assert s["parameters"] == params == 140_544
    assert s["optimizer_state"] == 2 * params  # AdamW mu and nu
    assert s["gradients"] == params
    assert s["fsdp_gather"] == 2 * 36_864 * 4  # one layer's weights + gradient (> V d = 32,768)
    config = run_config.replace(config, {"optim.grad_accum_steps": 2})
    assert memory.state_memory(m, tiny_run(config))["gradients"] == 2 * params


def test_activation_terms_by_hand():
    config, m = tiny_model(dtype="bfloat16", remat=True)  # c = 2 bytes
    acts = memory.activation_memory(m, tiny_run(config), (32, 32))
    bn = 128
    assert acts == {
        "block_inputs": 2 * bn * 64 * 2,  # L x b n d c
        "norms": bn * 2 * (2 * 2 * 64 + 4),  # one layer's 2 norms: bf16 in and out, fp32 1/rms
        "swiglu": bn * 6 * 2 * 128,  # one layer: 6 [b, n, F] bf16
        "experts": 0,  # no expert layers
        "expert_exchange": 0,
        "attention_residuals": bn * (2 * 16 * (2 * 4 + 2 * 2)  # q, out (H); k, v (K); bf16
                                     + 4 * 4 + 8 * 16),  # fp32 lse; RoPE sin, cos for q and k
        "attention_outputs": 0,  # remat_policy 'nothing'
        "dot_outputs": 0,
        "kv_ring_buffers": bn * (4 * 2 * 2 * 16 + 16 * 2 * 16 + 8),  # K,V bf16, dK,dV fp32; x2
        "kernel_accumulators": bn * 4 * (4 * 16 + 4),  # fp32 dQ [b,n,H,Dh] and D [b,H,n]
        "recurrent_layers": 0,  # no Gated DeltaNet or Mamba2 layers
        "tile_scratch": 3 * 4 * 2 * 4 * 32 * 32,  # 3 fp32 [b, H, tq, tk]
        "final_norm": bn * (2 * 64 + 4),  # bf16 input, fp32 1/rms (the loss keeps no output)
        "embedding_ids": 4 * bn * 4,  # int32 ids of the 4 devices' tokens, on each
        # loss_chunk 0: all n tokens at once: bf16 dx, fp32 dW [d, V], fp32 + bf16 [b, n, V]
        "logits": bn * 2 * 64 + 4 * 64 * 512 + bn * 512 * (4 + 2),
    }
    no_remat = memory.activation_memory(dataclasses.replace(m, remat=False), tiny_run(config),
                                      (32, 32))
    assert no_remat["block_inputs"] == 0 and no_remat["swiglu"] == 2 * acts["swiglu"]


def traced_loss(config):
    """(loss(params, batch), params, batch, mesh): the summed token loss of the config's model,
    its parameters and a batch abstract on the config's mesh of fake devices (to trace)."""
    from training import step as step_lib
    run = tiny_run(config)
    mesh = parallel.make_mesh(run.data, run.seq, devices=jax.devices()[:4])
    state, program = aot.abstract_train_state(config, mesh, tiny_resolved(config))
    loss = lambda params, batch: step_lib.token_loss_sums(program.graphdef, params, batch,
                                                          True)[0]
    return loss, state["params"], aot.abstract_batch(config, mesh), mesh


@pytest.mark.parametrize("remat,chunks,policy", [(False, 0, "nothing"), (True, 0, "nothing"),
                                                 (False, 32, "nothing"), (True, 64, "nothing"),
                                                 (True, 32, "dots"), (True, 0, "attention")])
def test_saved_activations_match_jax_saved_residuals(remat, chunks, policy):
    """What JAX's autodiff saves for the backward = the analytic saved terms (within 1%)."""
    from jax._src.ad_checkpoint import saved_residuals

    config, m = tiny_model(dtype="bfloat16", remat=remat, loss_chunk=chunks, mlp_chunk=chunks,
                           remat_policy=policy)
    run = tiny_run(config)
    loss, params, batch, mesh = traced_loss(config)
    with jax.set_mesh(mesh):
        residuals = saved_residuals(loss, params, batch)
    # Activations only (weights are 2-D), less the attention output's reshape (same buffer).
    acts = [a for a, src in residuals if a.ndim >= 3
            and not ("reshape" in src and "Attention" in src and a.ndim == 3)]
    jax_bytes = sum(np.prod(a.shape) * a.dtype.itemsize for a in acts) / run.devices
    assert jax_bytes == pytest.approx(memory.saved_activation_bytes(m, run, (32, 32)), rel=0.01)


def test_remat_policy_attention_keeps_the_backward_from_rerunning_the_attention_forward():
    """The time model's rule (ModelConfig.reruns_attention): the gradient's program runs the
    attention's shard_mapped forward once a layer with remat_policy 'attention', as without
    remat, and once more a layer with 'nothing'."""
    def attention_passes(**switches):
        config, m = tiny_model(**switches)
        loss, params, batch, mesh = traced_loss(config)
        with jax.set_mesh(mesh):
            jaxpr = jax.make_jaxpr(jax.grad(loss))(params, batch)
        return shard_maps(jaxpr.jaxpr), m

    def shard_maps(jaxpr):  # each use of a shared sub-program counted (printing shows it once)
        found = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "shard_map":
                found += 1
                continue
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    sub = getattr(sub, "jaxpr", sub)
                    found += shard_maps(sub) if hasattr(sub, "eqns") else 0
        return found

    plain, m = attention_passes()
    kept, m_kept = attention_passes(remat=True, remat_policy="attention")
    rerun, m_rerun = attention_passes(remat=True, remat_policy="nothing")
    assert kept == plain and rerun == plain + m.num_layers
    assert not m_kept.reruns_attention and m_rerun.reruns_attention and m_kept.reruns_matmuls


# Critical path, N = 4 shards, T = 4 tiles per side (hand counts: T(T+1)/2 = 10, T^2 = 16).
CRITICAL_PATHS = {"ring": [10, 16, 16, 16], "striped": [10, 10, 10, 10], "zigzag": [10, 8, 8, 8]}


@pytest.mark.parametrize("layout", sorted(CRITICAL_PATHS))
def test_critical_path_matches_the_kernels_tile_counts(layout):
    n, t, tile = 4, 4, 4
    steps = step_time.ring_step_tiles(layout, n, t * tile, (tile, tile))
    assert steps == CRITICAL_PATHS[layout]
    assert sum(steps) == {"ring": 58, "striped": 40, "zigzag": 34}[layout]
    mesh = parallel.make_mesh(1, n, devices=jax.devices()[:n])
    x = np.zeros((1, n * t * tile, 1, 8), np.float32)
    _, tiles, _ = parallel.attention_with_stats(x, x, x, mesh=mesh, layout=layout, tile_q=tile,
                                             tile_k=tile)
    slowest_per_step = np.asarray(tiles).max(axis=0)  # tiles[device, ring step]
    assert slowest_per_step.tolist() == CRITICAL_PATHS[layout]


def test_ring_steps_overlap_transfer_with_compute():
    """1 s per tile; K/V 2 s (fast link) or 32 s (slow link) per hop, dK/dV twice that."""
    m = model.ModelConfig(vocab_size=8, d_model=4, num_layers=1, num_heads=1, num_kv_heads=1,
                          head_dim=2, mlp_dim=4, dtype="bfloat16")
    run = Run(devices=4, data=1, seq=4, seq_len=16, global_batch=1, accum=1, layout="striped")
    tile_flops = 4 * 1 * 1 * 1 * 2 * 1  # 4 b tq tk Dh H
    kv_bytes = 2 * 4 * 1 * 2 * 2  # K and V: [b=1, n=4, K=1, Dh=2] bf16

    def seconds(link_seconds_per_kv):
        link = kv_bytes / link_seconds_per_kv
        net = strategy_cost.Network(flops_per_s=tile_flops, link_bytes_per_s=link,
                                    collective_bytes_per_s=link, latency_s=0.0)
        return step_time.attention_layer_seconds(m, run, "striped", (1, 1), net,
                                            with_segments=False)

    fast = seconds(2.0)  # compute-bound: 10 tiles = 10 s forward, 20 s backward per step
    assert fast["forward_s"] == 3 * 10 + 10
    assert fast["backward_s"] == 3 * 20 + 20 + 4  # + the last hop bringing dK, dV home
    slow = seconds(32.0)  # link-bound: 32 s per K/V hop, 64 s per dK/dV
    assert slow["forward_s"] == 3 * 32 + 10
    assert slow["backward_s"] == 3 * (32 + 64) + 32 + 64  # the last K/V hop outlasts its compute
    assert slow["comm_bound_forward_steps"] == 3


def test_verdicts_for_the_paper_settings():
    config = run_config.build(paper_a100_256k.get_config())
    run = make_run(config, 8)
    resolve = lambda device: resolve_run(config, (run.data, run.seq), device.platform, "",
                                         device=device)
    a100 = plan.analytic_plan(config, DEVICES["a100-80gb"], run, resolve(DEVICES["a100-80gb"]))
    assert a100["fit"]["verdict"] == "fits"  # 7B at 256k on 8 x 80 GB, as designed
    t = {layout: a100["time"][layout]["step_s"] for layout in parallel.LAYOUTS}
    assert t["zigzag"] < t["striped"] < t["ring"] / 1.3
    v4 = plan.analytic_plan(config, DEVICES["tpu-v4"], run, resolve(DEVICES["tpu-v4"]))
    assert v4["fit"]["verdict"] == "does not fit"  # the same per-chip load on 32 GB
    assert v4["fit"]["headroom_bytes"] < 0


def million_token_run(memory_gb: float, **given):
    """configs/default.py at 1,048,576 tokens on 8 fake CPU devices of `memory_gb` each, the
    memory switches in `given` set, the rest 'auto'."""
    import dataclasses
    from configs import default
    config = default.get_config()
    config.seq_len, config.global_batch_size, config.mesh.seq = 1 << 20, 1, 8
    for name, value in given.items():
        config.model[name] = value
    config = run_config.build(config)
    device = dataclasses.replace(DEVICES["cpu"], memory_bytes=memory_gb * 1e9)
    return resolve_run(config, (1, 8), "cpu", "", device=device)


def test_auto_memory_switches_turn_on_what_fits_and_no_more():
    """The fastest candidate whose analytic total is at most 75% of the device (the rule of
    planner/switches.py), checked against every candidate it weighed; a given value wins."""
    tight = million_token_run(3.2)  # 24 GiB shared by 8 fake devices, as on this machine
    assert tight.switches == model.MemorySwitches(remat=True, remat_policy="attention",
                                                  scan_layers=True, loss_chunk=4096,
                                                  mlp_chunk=8192)
    assert tight.bytes_per_device <= 0.75 * 3.2e9
    fitting = [r for r in tight.candidates if r["total_bytes"] <= 0.75 * 3.2e9]
    assert all(r["fits"] == (r in fitting) for r in tight.candidates)
    assert tight.step_s == min(r["step_s"] for r in fitting)
    assert tight.model.scan_layers and tight.model.loss_chunk == 4096
    assert all(r["switches"].scan_layers for r in tight.candidates if r["switches"].remat)
    roomy = million_token_run(64.0)  # everything fits: nothing to pay for
    assert roomy.switches == model.MemorySwitches()
    given = million_token_run(3.2, remat=False, loss_chunk=2048)
    assert not given.switches.remat and given.switches.loss_chunk == 2048
    assert given.auto_switches == ("remat_policy", "scan_layers", "mlp_chunk")
    # A resume keeps what its checkpoint ran with, for the switches left 'auto' only.
    kept = given.keeping({"scan_layers": not given.switches.scan_layers, "remat": True})
    assert kept.model.scan_layers != given.switches.scan_layers and not kept.model.remat


@pytest.mark.parametrize("field,value,message", [
    ("remat", "yes", "model.remat='yes': use True, False or 'auto'"),
    ("remat_policy", "all", "model.remat_policy='all': choose one of nothing, dots, attention, "
                            "offload, or 'auto'"),
    ("mlp_chunk", "half", "model.mlp_chunk='half': use a number of tokens per device (0: all at "
                         "once) or 'auto'")])
def test_a_memory_switch_of_the_wrong_kind_is_one_line(field, value, message):
    from training.validate import ConfigError, validate_config
    config = tiny.get_config()
    config.model[field] = value
    with pytest.raises(ConfigError) as e:
        validate_config(config, 4, 1)
    assert str(e.value) == message


def run_plan(*args, tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plan.py"), *args,
                           "--json", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.programs
def test_compiled_memory_of_tiny_is_close_to_the_analytic_total(tmp_path):
    """Found: analytic / compiled = 0.69 (XLA:CPU keeps more alive than the model counts)."""
    stdout, result = run_plan("--config", "configs/tiny.py", "--compile", "yes", "--device",
                              "cpu", tmp_path=tmp_path)
    compiled = result["compiled"]
    assert compiled["temp"] > 0 and compiled["argument"] > 0
    ratio = result["fit"]["total_bytes"] / compiled["total"]
    assert 0.25 <= ratio <= 4.0, ratio
    assert set(result["time"]) == set(parallel.LAYOUTS)
    assert result["params"]["total"] == 139_584
    assert "Compiled train step" in stdout and "analytic (design) / compiled" in stdout


@pytest.mark.programs
def test_plan_compiles_and_reports_what_auto_resolved_to(tmp_path):
    """The defaults (layout, strategy and tile 'auto') are resolved as a run resolves them,
    before the compile, and the plan says to what."""
    stdout, result = run_plan("--config", "configs/default.py", "--compile", "yes",
                              "--config.parallel.strategy=auto", "--explain", tmp_path=tmp_path)
    resolved = result["attention"]
    assert resolved["strategy"] in parallel.STRATEGIES and resolved["kernel"] == "xla"
    assert result["strategies"]["choice"]["strategy"] == resolved["strategy"]
    assert result["compiled"]["total"] > 0
    assert f"({resolved['strategy']} strategy, xla kernel" in stdout
    assert (f"auto layout and strategy and tile -> {resolved['layout']} attention "
            f"({resolved['strategy']}" in stdout
            and f"tiles {resolved['tile_q']}x{resolved['tile_k']}): predicted" in stdout)
    # the JSON's "resolved": what the run would use, every 'auto' filled
    assert result["resolved"]["strategy"] == resolved["strategy"]
    assert result["resolved"]["switches"]["scan_layers"] is False
    assert len(result["resolved"]["candidates"]) >= 2
    ranked = stdout[stdout.index("Memory switches weighed"):].splitlines()[2:]
    assert len(ranked) == len(result["resolved"]["candidates"])
    assert ranked[0].split()[-1] == "switches" and " yes " in ranked[0]  # 'no memory switches'


def test_state_as_built_is_what_create_train_state_makes():
    """The planner's 'as the code runs today' figures are measured from the real shardings."""
    from training.loop import create_train_state

    config, _ = tiny_model()
    run = tiny_run(config)
    state, *_ = create_train_state(config, aot.run_mesh(run))
    built = aot.state_as_built(config, run, tiny_resolved(config))
    assert built["parameters"] == aot.bytes_per_device(state["params"])
    assert built["optimizer_state"] == aot.bytes_per_device(state["opt_state"])
    assert built["parameters"] == pytest.approx(memory.state_memory(
        tiny_resolved(config).model, run)["parameters"])


@pytest.mark.programs
def test_large_config_skips_the_compile(tmp_path):
    stdout, result = run_plan("--config", "configs/gpu/paper_a100_256k.py", tmp_path=tmp_path)
    assert "skipped (too large to compile on this host" in stdout
    assert result["device"] == "a100-80gb" and result["run"]["devices"] == 8
    assert result["fit"]["verdict"] == "fits" and "FITS" in stdout
    notes = stdout[stdout.index("Notes:"):].splitlines()
    assert notes[1].startswith("  1. XLA:CPU's compile")  # numbered from 1, whichever apply
    added = result["as_built"]["optimizer_state"] - result["state_bytes"]["optimizer_state"]
    today = result["today"]["optimizer_as_built"]
    assert today["total_bytes"] == pytest.approx(result["fit"]["total_bytes"] + added)


def test_a_host_builds_its_columns_of_a_row_or_whole_rows():
    """16 chips, 4 per host: a ring of 16 splits the row four ways; a ring of 2 leaves each host
    two data shards' rows, whole (data/pipeline.local_block builds the same)."""
    def run(data, seq, batch):
        return Run(devices=16, data=data, seq=seq, seq_len=786432, global_batch=batch,
                        accum=1, layout="striped")
    assert process_block(run(1, 16, 1), 4) == (1, 196608)
    assert process_block(run(8, 2, 16), 4) == (4, 786432)
