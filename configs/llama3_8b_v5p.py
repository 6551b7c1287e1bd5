"""Llama-3 8B shapes on 64 TPU v5p chips (v5p-128 slice: 64 chips), the sequence over all 64.

    python scripts/plan.py --config configs/llama3_8b_v5p.py                        # 64k
    python scripts/plan.py --config configs/llama3_8b_v5p.py --config.seq_len=131072
    python scripts/plan.py --config configs/llama3_8b_v5p.py --config.seq_len=262144
    python scripts/tpu_pod.py all --name ringstripe-v5p --zone ZONE --bucket BUCKET \\
        --accelerator-type v5p-128 --config configs/llama3_8b_v5p.py \\
        --workdir gs://BUCKET/ringstripe/llama3_8b_v5p --config.parallel.strategy=auto

The setting in which MaxText measured its context-parallel strategies (llama3-8b, context
parallelism 64 on v5p-64, median step times below: MEASURED, which the planner prints beside its
strategy table). 8.0B parameters: d_model 4096, 32 layers, 32 query heads and 8 KV heads x 128,
SwiGLU 14336, vocab 128256, RoPE base 500000; bfloat16 compute, float32 parameters and AdamW
state, every block rematerialised. Mesh data 1 x seq 64: 1,024 tokens per chip at 64k.

Batch: a step is 16 sequences as 16 accumulated micro-batches of 1; each micro-step is one
sequence over the 64 chips (16 hosts of 4), the unit the strategy table compares (we do not know
MaxText's batch: compare the ratios between strategies). The 16 is no longer forced by the host
count: each host builds only its columns of a row (data/README.md), so
--config.global_batch_size=1 --config.optim.grad_accum_steps=1 also runs, one sequence a step.
"""

from configs import default, llama_7b

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)

# MaxText's median step times (s) for llama3-8b with context parallelism 64 on TPU v5p-64, by
# sequence length; read by scripts/plan.py (not a config field). "usp 16x4": 16 x 4 devices as
# Ulysses x ring (which factor is which is not stated: the table shows both).
MEASURED = {
    65536: {"ring": 1.42, "allgather": 1.09, "usp 16x4": 1.04},
    131072: {"ring": 3.71, "allgather": 2.98, "usp 16x4": 2.88},
    262144: {"ring": 10.78, "allgather": 9.71, "usp 16x4": 9.50},
}


def get_config():
    config = default.get_config()
    llama_7b.set_accelerator_run(config)
    config.seq_len = 65536  # tokens per sequence (1,024 per chip)
    config.global_batch_size = 16  # sequences per step, as 16 micro-batches of 1 (see above)
    config.optim.grad_accum_steps = 16  # micro-batches per step: one sequence each
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 64  # sequence shards over all 64 chips
    config.parallel.layout = "zigzag"  # layout: ring | striped | zigzag | balanced
    config.model.vocab_size = 128256  # Llama-3 tokenizer pieces = embedding rows
    config.model.d_model = 4096  # residual width
    config.model.num_layers = 32  # transformer blocks
    config.model.num_heads = 32  # query heads
    config.model.num_kv_heads = 8  # key/value heads (GQA, 4 query heads each)
    config.model.head_dim = 128  # per-head width
    config.model.mlp_dim = 14336  # SwiGLU hidden width
    config.model.rope_theta = 500_000.0  # RoPE base (Llama 3)
    config.model.tile_q = 512  # attention tiles: the zigzag chunk of 512 tokens at 64k
    config.model.tile_k = 512
    llama_7b.set_accelerator_precision(config.model)
    return config
