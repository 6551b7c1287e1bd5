"""Llama-3 8B shapes on 64 TPU v5p chips (v5p-128 slice: 64 chips), the sequence over all 64.

    python scripts/plan.py --config configs/tpu/llama3_8b_v5p.py                        # 64k
    python scripts/calibrate.py --config llama3_8b_v5p   # the fit, and every point predicted
    python scripts/plan.py --config configs/tpu/llama3_8b_v5p.py --config.seq_len=131072
    python scripts/plan.py --config configs/tpu/llama3_8b_v5p.py --config.seq_len=262144
    python scripts/tpu_pod.py all --name ringstripe-v5p --zone us-east5-a \\
        --accelerator-type v5p-128 --config configs/tpu/llama3_8b_v5p.py \\
        --workdir gs://my-bucket/ringstripe/llama3_8b_v5p -- --config.parallel.strategy=auto

The setting in which MaxText measured its context-parallel strategies (llama3-8b, context
parallelism 64 on 64 v5p chips; the median step times are in
planner/calibration/step_times/llama3_8b_v5p.toml, which the planner prints beside its strategy
table and the TPU v5p calibration is fitted to).

8.0B parameters: d_model 4096, 32 layers, 32 query heads and 8 KV heads x 128, SwiGLU 14336,
vocab 128256, RoPE base 500000; bfloat16 compute, float32 parameters and AdamW state, every
block rematerialised. Mesh data 1 x seq 64: 1,024 tokens per chip at 64k.

Batch: one sequence a step over the 64 chips (16 hosts of 4), as MaxText measured: each host
builds only its columns of the row (data/README.md).
"""

from configs import accelerator_precision, accelerator_run, default

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)



def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 65536  # tokens per sequence (1,024 per chip)
    config.global_batch_size = 1  # sequences per step: one, over all 64 chips
    config.optim.grad_accum_steps = 1  # micro-batches per step
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 64  # sequence shards over all 64 chips
    config.parallel.layout = "zigzag"  # layout: ring | striped | zigzag | balanced
    config.parallel.strategy = "ring"  # as measured (BENCHMARKS.md); 'auto': the planner's
    config.model.vocab_size = 128256  # Llama-3 tokenizer pieces = embedding rows
    config.model.d_model = 4096  # residual width
    config.model.num_layers = 32  # transformer blocks
    config.model.num_heads = 32  # query heads
    config.model.num_kv_heads = 8  # key/value heads (GQA, 4 query heads each)
    config.model.head_dim = 128  # per-head width
    config.model.mlp_dim = 14336  # SwiGLU hidden width
    config.model.rope_theta = 500_000.0  # RoPE base (Llama 3)
    config.parallel.tile = 512  # attention tiles: the zigzag chunk of 512 tokens at 64k
    accelerator_precision(config.model)
    return config
