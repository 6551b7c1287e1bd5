"""What a ring step of latent attention moves, from the compiled train step: the bytes of every
collective-permute in the program (each once: one ring step's forward hop, one backward hop with
its gradients, the last hop home) with parallel.mla_exchange 'latent' and 'full', for DeepSeek-V2-
Lite's and DeepSeek-V3's attention shapes on a ring of 4 (fake CPU devices: one layer, block of
--block tokens, the rest of the model small), and the planner's predicted crossover (tokens per
device past which 'full' is faster) on the accelerators it knows.

    python scripts/bench/mla_exchange.py [--block 512] [--shapes v2_lite,v3]

Prints one row per shape: the bytes with each exchange, their ratio and the ideal ratio of a
token's latent + RoPE key to its expanded keys and values as the kernels tile them (K and V
both max(qk, v) wide).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import app, flags  # noqa: E402

flags.DEFINE_integer("block", 512, "tokens per device")
flags.DEFINE_string("shapes", "v2_lite,v3", "attention shapes: v2_lite, v3")
flags.DEFINE_string("devices", "h100-80gb,tpu-v5p", "planner devices for the crossover")
FLAGS = flags.FLAGS

SHAPES = {  # config.json's attention fields of the published models
    "v2_lite": dict(title="DeepSeek-V2-Lite", heads=16, q_lora_rank=0, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    "v3": dict(title="DeepSeek-V3", heads=128, q_lora_rank=1536, kv_lora_rank=512,
               qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
}
RING = 4


def config_for(shape: dict, exchange: str, block: int):
    from configs import mla_tiny
    c = mla_tiny.get_config()
    c.seq_len, c.global_batch_size, c.num_train_steps = block * RING, 1, 10
    c.mesh.data, c.mesh.seq, c.cpu_devices = 1, RING, RING
    c.parallel.layout, c.parallel.strategy, c.parallel.kernel = "ring", "ring", "xla"
    c.parallel.tile, c.parallel.mla_exchange = 128, exchange
    m = c.model
    m.num_layers, m.d_model, m.num_heads, m.mlp_dim = 1, 256, shape["heads"], 512
    m.moe.num_experts, m.moe.num_shared_experts, m.moe.first_dense_layers = 0, 0, 0
    m.moe.router, m.moe.n_group, m.moe.topk_group = "softmax_topk", 1, 1
    m.moe.routed_scaling_factor, m.moe.bias_update_speed = 1.0, 0.0
    for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim"):
        m.mla[name] = shape[name]
    m.remat, m.remat_policy, m.scan_layers, m.loss_chunk, m.mlp_chunk = (
        False, "nothing", False, 0, 0)
    return c


def permute_bytes(config) -> int:
    import jax

    import planner
    from planner.run import make_run
    from training.analysis.aot import compile_train_step
    resolved = planner.resolve_run(config, (1, RING), "cpu", jax.devices()[0].device_kind)
    assert resolved.attention.mla_exchange == config.parallel.mla_exchange
    figures, _ = compile_train_step(config, make_run(config, RING, (1, RING)), resolved)
    return figures["collective_bytes"].get("collective-permute", 0)


def main(_):
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={RING}")
    import model
    import run_config
    from planner import mla_exchange
    from planner.devices import DEVICES
    print(f"ring of {RING}, {FLAGS.block:,} tokens a device, one layer; bytes of the compiled "
          "train step's collective-permutes (each once: one ring step)")
    print(f"{'shapes':<18} {'latent bytes':>14} {'full bytes':>14} {'latent/full':>12} "
          f"{'ideal':>8}")
    for key in FLAGS.shapes.split(","):
        shape = SHAPES[key]
        got = {x: permute_bytes(run_config.build(config_for(shape, x, FLAGS.block)))
               for x in ("latent", "full")}
        width = max(shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"], shape["v_head_dim"])
        ideal = ((shape["kv_lora_rank"] + shape["qk_rope_head_dim"])
                 / (2 * shape["heads"] * width))
        print(f"{shape['title']:<18} {got['latent']:>14,} {got['full']:>14,} "
              f"{got['latent'] / got['full']:>12.4f} {ideal:>8.4f}", flush=True)
    print("\npredicted crossover (tokens per device past which 'full' is faster), ring of 8:")
    for key in FLAGS.shapes.split(","):
        cfg = model.ModelConfig.from_config(run_config.build(config_for(
            SHAPES[key], "auto", FLAGS.block)).model, switches=model.MemorySwitches())
        for name in FLAGS.devices.split(","):
            device = DEVICES[name.strip()]
            at = mla_exchange.crossover(cfg, 1, 8, device)
            print(f"  {SHAPES[key]['title']:<18} {device.title:<28} "
                  f"{'beyond 16M' if at is None else f'{at:,}'}")


if __name__ == "__main__":
    app.run(main)
