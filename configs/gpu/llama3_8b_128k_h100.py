"""Llama-3-8B from its Hugging Face checkpoint to 131,072 tokens on one node of 8 x H100 80 GB,
by SLURM: the job of configs/tpu/llama3_8b_128k_v5p.py (its weights, RoPE rule, 64k then 128k,
about 4.2M tokens a step, the same optimizer) on 8 GPUs instead of 64 TPU chips.

    python scripts/plan.py --config configs/gpu/llama3_8b_128k_h100.py        # memory and speed
    python scripts/launch.py slurm --config configs/gpu/llama3_8b_128k_h100.py \\
        --nodes 1 --tasks-per-node 8 --gpus-per-task 1 --print            # the check, the script
    WANDB_MODE=online WANDB_PROJECT=llama3-128k python scripts/launch.py slurm \\
        --config configs/gpu/llama3_8b_128k_h100.py --workdir /shared/runs/l8b-128k \\
        --nodes 1 --tasks-per-node 8 --gpus-per-task 1 --partition gpu --time 2-00:00:00 \\
        --config.init_from=hf:/shared/models/Meta-Llama-3-8B \\
        --config.data.source='/shared/data/long/*.txt'
    python scripts/eval_long.py --workdir /shared/runs/l8b-128k --seq_shards 8 \\
        --lengths 8192 32768 131072 --json runs/l8b-128k_probes.json
    python scripts/hf/export.py --workdir /shared/runs/l8b-128k --dtype bfloat16 \\
        --out /shared/models/Llama-3-8B-128k

Mesh data 1 x seq 8: each GPU holds 16,384 tokens of each 128k sequence, one sequence a
micro-step (32 micro-steps a step; 64 at 64k). The launcher's check plans the job's 8 GPUs
against this mesh before anything is submitted (a job of other GPUs is refused in one line).

Memory per GPU: 48.04 GB of 80 (the planner's estimate, scripts/plan.py --check as launch.py
slurm runs it; predicted 106 s a step, uncalibrated for H100; not compiled for a GPU here:
check memory_analysis() on the node).
"""

from configs import default
from configs.tpu.llama3_8b_128k_v5p import length_stages, set_llama3_8b

DEVICE = "h100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    set_llama3_8b(config)
    config.init_from = "hf:/shared/models/Meta-Llama-3-8B"  # replace: --config.init_from
    config.cpu_devices = 8  # fake devices if this ever runs on a CPU (irrelevant on GPUs)
    # The 128k stage's settings, which scripts/plan.py checks (the 64k stage needs less a GPU)
    config.seq_len = 131072  # tokens per sequence
    config.global_batch_size = 32  # sequences per step: 32 x 131,072 = 4.2M tokens
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the node's 8 GPUs
    config.optim.grad_accum_steps = 32  # micro-steps of one row
    config.parallel.layout = "zigzag"  # balanced under the causal mask, contiguous chunks
    config.parallel.tile = 512  # attention tiles (the zigzag chunk is 8,192 tokens)
    config.stages = length_stages(micro_rows=1)
    return config
