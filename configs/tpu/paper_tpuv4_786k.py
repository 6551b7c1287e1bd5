"""Striped Attention paper, TPU setting: 16 TPU v4 chips (v4-32), 786,432-token sequences.

    python scripts/tpu_pod.py all --name ringstripe-v4 --zone us-central2-b \\
        --accelerator-type v4-32 --config configs/tpu/paper_tpuv4_786k.py \\
        --workdir gs://my-bucket/ringstripe/paper_tpuv4_786k
    #   add --config.parallel.layout=ring (or zigzag) for the comparison runs
    python scripts/plan.py --config configs/tpu/paper_tpuv4_786k.py   # memory and speed on 16 x v4

Brandon et al. 2023 (arXiv 2311.09431) report 1.65x end-to-end over Ring Attention here. Mesh
data 1 x seq 16: each chip holds 49,152 tokens of the sequence (striped: every 16th token).
Tiles 1024 x 1024: 48 tiles per block side (24 per zigzag chunk).

Model: the TinyLlama-1.1B shapes of configs/gpu/llama_1b.py. At 49,152 tokens per chip the float32
logits [1, 49,152, 32,000] and their gradient alone would take 12.6 GB of a v4 chip's 32 GB;
with the loss computed 2,048 tokens at a time (model.loss_chunk), the MLP 4,096 at a time
(model.mlp_chunk) and the blocks under one lax.scan (model.scan_layers), scripts/plan.py puts the
1.1B at about 11 GB per chip and the 3.4B OpenLLaMA-3B shapes at about 23 GB (they fit now;
without the chunks, 38 GB: they did not), while the 6.7B LLaMA-7B shapes, at about 34 GB, do
not while the 32 layers' block inputs kept for remat, their largest term (38%), stay in HBM:
configs/tpu/paper_tpuv4_786k_7b.py keeps them in host memory and fits (the TPU compiler: 28.2 GB
per chip; `--compile tpu` compiles this config's step for the v4-32 the same way, 14.8 GB).
The plan's model-size table prints all three; for the 3B:

    python scripts/plan.py --config configs/tpu/paper_tpuv4_786k.py --config.model.d_model=3200 \
        --config.model.num_layers=26 --config.model.num_kv_heads=32 \
        --config.model.head_dim=100 --config.model.mlp_dim=8640

Batch: one 786,432-token sequence per step, as in the paper. A v4-32 slice runs 4 processes (4
chips per host); the row is split across them: each host builds only the laid-out columns its 4
chips hold (196,608 of them; data/README.md), so the batch need not divide the processes. Tokens
per step: global_batch_size 1 x seq_len 786,432 = 786,432.
"""

from configs import accelerator_precision, accelerator_run, default
from model import presets

DEVICE = "tpu-v4"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 786432  # tokens per sequence (768k = 49,152 per chip), the paper's TPU setting
    config.global_batch_size = 1  # sequences per step: one, split over the 4 hosts' chips
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 16  # sequence shards: the attention ring over all 16 chips
    config.parallel.layout = "striped"  # layout: ring | striped | zigzag | balanced
    config.parallel.strategy = "ring"  # as measured (BENCHMARKS.md); 'auto': the planner's
    config.model.update(presets.LLAMA_1B)  # model/presets.py
    accelerator_precision(config.model)
    # Attention tiles (block 49152 -> 48 tiles per side; 1024, not 2048: 1.2 GB less scratch)
    config.parallel.tile = 1024
    config.model.loss_chunk = 2048  # output projection + loss 2,048 tokens at a time: no logits
    config.model.mlp_chunk = 4096  # SwiGLU 4,096 tokens at a time
    config.model.scan_layers = True  # 22 blocks in one lax.scan: one block's program to compile
    return config
