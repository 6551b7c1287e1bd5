"""Striped Attention paper, GPU setting: 8 x A100 80GB, one 262,144-token sequence per step.

    python train.py --config configs/gpu/paper_a100_256k.py --workdir runs/paper_a100_256k
    python train.py --config configs/gpu/paper_a100_256k.py --workdir runs/paper_a100_256k_ring \\
        --config.parallel.layout=ring          # or zigzag; same tokens, same loss curve
    python scripts/plan.py --config configs/gpu/paper_a100_256k.py   # memory and speed on 8 x A100

Brandon et al. 2023 (arXiv 2311.09431) report 1.45x end-to-end over Ring Attention here. The
LLaMA-7B shapes (configs/gpu/llama_7b.py), bfloat16 compute, float32 weights and AdamW state, remat.
Mesh data 1 x seq 8: each GPU holds 32,768 tokens of the sequence (striped: every 8th token).
Tiles 2048 x 2048: 16 tiles per block side (8 per zigzag chunk), so the causal mask's skipped
tiles are most of the saving. Tokens per step: global_batch_size 1 x seq_len 262,144 = 262,144.

Memory (scripts/plan.py, per GPU): with weights and AdamW state sharded over the 8 GPUs and
weights gathered one layer at a time, the 7B needs about 47 GB of the 80: it fits, so this config
keeps the 7B. If XLA kept every layer's gathered weights alive (as its CPU compile does) it would
need about 98 GB; check `memory_analysis()` on the GPUs, and if so fall back to the 3B shapes
(about 59 GB in that worst case) or the 1.1B shapes (about 36 GB):

    python train.py --config configs/gpu/paper_a100_256k.py --workdir runs/paper_a100_256k_3b \
        --config.model.d_model=3200 --config.model.num_layers=26 --config.model.head_dim=100 \
        --config.model.mlp_dim=8640
    #   1.1B: --config.model.d_model=2048 --config.model.num_layers=22 \
    #         --config.model.num_kv_heads=4 --config.model.head_dim=64 --config.model.mlp_dim=5632
"""

from configs import accelerator_precision, accelerator_run, default
from model import presets

DEVICE = "a100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 262144  # tokens per sequence (256k), the paper's GPU setting
    config.global_batch_size = 1  # sequences per step, all devices together (the paper's)
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the attention ring over the node's 8 GPUs
    config.parallel.layout = "striped"  # layout: ring | striped | zigzag | balanced
    config.parallel.strategy = "ring"  # as measured (BENCHMARKS.md); 'auto': the planner's
    config.model.update(presets.LLAMA_7B)  # model/presets.py
    accelerator_precision(config.model)
    config.parallel.tile = 2048  # attention tiles (block 32768 -> 16 tiles per side)
    return config
