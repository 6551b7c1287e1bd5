"""Gemma 3 4B at its real size (text), 32k tokens per sequence over 8 TPU v5p chips (v5p-16):
its 5 : 1 local and global layers sequence-parallel, for the TPU compiler and the planner.

    python scripts/plan.py --config configs/tpu/gemma3_4b_v5p.py --compile tpu   # XLA:TPU's bytes
    python scripts/bench/window.py --config configs/tpu/gemma3_4b_v5p.py         # work and traffic
    python train.py --config configs/tpu/gemma3_4b_v5p.py --workdir gs://my-bucket/gemma3_4b \
        --config.init_from=hf:/models/gemma-3-4b-pt                         # from the weights

Gemma 3 4B's shapes (d_model 2560, 34 layers, 8 query and 4 KV heads of 256, GeGLU 10240,
vocab 262,208; local window 1,024, RoPE 10,000 local and 1,000,000 global with linear scaling
x 8). Mesh data 1 x seq 8: 4,096 tokens per chip, so a local layer's window is a quarter of a
chip's block: with the ring or zigzag layout it receives a halo of about 1,024 keys, not seven
blocks. bf16 compute, float32 weights and AdamW state, blocks rematerialised and scanned (both
kinds in one scan: each step switches to its layer's kind).
"""

from configs import accelerator_precision, accelerator_run, default
from configs.gemma3_cpu import set_gemma3_block

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 32768  # tokens per sequence
    config.global_batch_size = 1  # sequences per step, all devices together
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: 4,096 tokens per chip
    config.parallel.layout = "zigzag"  # contiguous chunks: halos for the local layers
    config.parallel.strategy = "ring"  # as measured (BENCHMARKS.md); 'auto': the planner's
    m = config.model
    m.vocab_size = 262_208  # tokenizer pieces = embedding rows
    m.d_model = 2560  # residual width
    m.num_heads = 8  # query heads
    m.num_kv_heads = 4  # key/value heads
    m.head_dim = 256  # per-head width
    m.mlp_dim = 10_240  # GeGLU hidden width
    m.norm_eps = 1e-6  # RMSNorm epsilon
    set_gemma3_block(m, num_layers=34, window=1024)
    m.rope_scaling.rope_type = "linear"  # global layers' RoPE, as the 4B checkpoint has it
    m.rope_scaling.factor = 8.0
    accelerator_precision(m)
    m.scan_layers = True  # one scanned program for both kinds of layer
    m.loss_chunk = 1024  # 262k-word logits a chunk of 1,024 tokens at a time
    m.mlp_chunk = 2048  # GeGLU 2,048 tokens at a time
    config.parallel.tile = 512  # attention tiles (block 4,096 -> 8 per side; 4 per zigzag chunk)
    return config
