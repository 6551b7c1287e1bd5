"""Striped Attention paper, TPU setting: 16 TPU v4 chips (v4-32), 786,432-token sequences.

    python scripts/tpu_pod.py all --name ringstripe-v4 --zone us-central2-b --bucket BUCKET \\
        --accelerator-type v4-32 --config configs/paper_tpuv4_786k.py \\
        --workdir gs://BUCKET/ringstripe/paper_tpuv4_786k
    #   add --config.parallel.attention=ring (or zigzag) for the comparison runs
    python scripts/plan.py --config configs/paper_tpuv4_786k.py   # memory and speed on 16 x v4

Brandon et al. 2023 (arXiv 2311.09431) report 1.65x end-to-end over Ring Attention here. Mesh
data 1 x seq 16: each chip holds 49,152 tokens of the sequence (striped: every 16th token).
Tiles 1024 x 1024: 48 tiles per block side (24 per zigzag chunk).

Model: at 49,152 tokens per chip the LLaMA-7B shapes need about 57 GB per chip as designed
(scripts/plan.py; the float32 logits and their gradient alone take 12.6 GB) and the OpenLLaMA-3B
shapes about 43 GB, more than a v4 chip's 32 GB, so this uses the TinyLlama-1.1B shapes of
configs/llama_1b.py: about 27 GB, which fits (about 35 GB if XLA kept every layer's gathered
weights alive: check memory_analysis() on the TPU).

Batch: a v4-32 slice runs 4 processes (4 chips per host), and training/validate.py wants the
global batch divisible by the process count, so the step takes 4 sequences as 4 accumulated
micro-batches of 1: each micro-step is the paper's one sequence over 16 chips, memory as for
batch 1 plus a gradient accumulator. Tokens per step: global_batch_size 4 x seq_len 786,432 =
3,145,728 (786,432 per micro-step).
"""

from configs import default, llama_1b, llama_7b

DEVICE = "tpu-v4"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    llama_7b.set_accelerator_run(config)
    config.seq_len = 786432  # tokens per sequence (768k = 49,152 per chip), the paper's TPU setting
    config.global_batch_size = 4  # sequences per step: one per process (4 hosts), see above
    config.optim.grad_accum_steps = 4  # micro-batches per step: one sequence each, as in the paper
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 16  # sequence shards: the attention ring over all 16 chips
    config.parallel.attention = "striped"  # layout: ring | striped | zigzag | balanced
    llama_1b.set_model(config.model)
    config.model.tile_q = 1024  # attention query tile (block 49152 -> 48 tiles per side)
    config.model.tile_k = 1024  # attention key tile (1024, not 2048: 1.2 GB less tile scratch)
    return config
