"""Llama-3-8B taken from its Hugging Face checkpoint (pretrained at 8,192 tokens) to 131,072
tokens on a v5p-128 slice (64 chips): continued pretraining, 64k then 128k.

    python scripts/plan.py --config configs/tpu/llama3_8b_128k_v5p.py --compile tpu  # FITS, per chip
    WANDB_MODE=online WANDB_PROJECT=llama3-128k python scripts/launch.py tpu \\
        --name rs-l8b-128k --zone us-east5-a --accelerator-type v5p-128 --spot \\
        --config configs/tpu/llama3_8b_128k_v5p.py --workdir gs://my-bucket/runs/l8b-128k \\
        --config.init_from=hf:gs://my-bucket/models/Meta-Llama-3-8B \\
        --config.data.source='gs://my-bucket/data/long/*.txt'
    python scripts/eval_long.py --workdir gs://my-bucket/runs/l8b-128k --seq_shards 8 \\
        --lengths 8192 32768 131072 --json runs/l8b-128k_probes.json
    python scripts/hf/export.py --workdir gs://my-bucket/runs/l8b-128k --dtype bfloat16 \\
        --out /models/Llama-3-8B-128k                  # transformers loads it

The weights: init_from=hf:gs://... reads config.json, the tokenizer and the safetensors from the
bucket on every host (each host the byte ranges of the tensors its chips hold), so the 16 hosts
need no copy of the 16 GB checkpoint on their disks. The shapes come from the checkpoint (the
ones below are Llama-3-8B's, for the planner); the RoPE rule does not: both stages set it, so
the checkpoint's own rope_theta (500,000, no scaling) is replaced by Llama 3.1's rule for 128k
(llama3 scaling: factor 8 over the original 8,192 tokens, the low frequencies stretched, the
high ones kept), which Meta used to take this model to 131,072 tokens.

The schedule: about 4.2M tokens a step (64 x 65,536, then 32 x 131,072), AdamW at a peak
learning rate of 1e-5 (a continued-pretraining rate, a hundredth of a from-scratch one) after a
warm-up, cosine to a tenth; 400 steps at 64k then 600 at 128k (about 4.2B tokens), each stage
from the one before with a fresh optimizer (config.stages; a preempted stage resumes inside it).
Bring long documents: with the default corpus (the Python standard library's sources) the
packed rows are many short files, and the model learns little about long range.

Memory per chip: 19.12 GB of the v5p's 95 GB at 128k (data 4 x seq 16, 8 micro-steps; the 64k
stage holds half the tokens a chip), compiled by the TPU compiler on this file (libtpu, no TPU:
the first command above, 277 s on 2 cores; the planner's analytic figure 19.70 GB, its predicted
step 83.6 s; BENCHMARKS.md has the output).
"""

from configs import accelerator_precision, default

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)

# Llama 3.1's RoPE rule for 131,072 tokens (its config.json's rope_scaling)
ROPE_128K = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_position_embeddings=8192)


def set_llama3_8b(config):
    """The checkpoint's shapes (init_from fills them from config.json; here for the planner),
    Llama 3.1's RoPE rule for 128k, and the continued-pretraining optimizer."""
    model = config.model
    model.vocab_size = 128256  # Llama-3 tokenizer pieces = embedding rows
    model.d_model = 4096  # residual width
    model.num_layers = 32  # transformer blocks
    model.num_heads = 32  # query heads
    model.num_kv_heads = 8  # key/value heads (GQA, 4 query heads each)
    model.head_dim = 128  # per-head width
    model.mlp_dim = 14336  # SwiGLU hidden width
    model.norm_eps = 1e-5  # RMSNorm epsilon (Llama 3)
    model.rope_theta = 500_000.0  # RoPE base, kept (the rule below stretches it)
    model.rope_scaling = dict(ROPE_128K)
    accelerator_precision(model)
    config.init_from = "hf:gs://my-bucket/models/Meta-Llama-3-8B"  # replace: --config.init_from
    config.tracker = "wandb"  # wandb (offline unless WANDB_MODE=online) plus metrics.jsonl
    config.optim.learning_rate = 1e-5  # peak: continued pretraining
    config.optim.warmup_steps = 20  # linear warm-up steps (each stage)
    config.optim.min_lr_ratio = 0.1  # cosine to a tenth
    config.optim.weight_decay = 0.1  # AdamW decoupled weight decay (matrices only)
    config.eval_every_steps = 100  # evaluate every this many steps (and at each stage's end)
    config.eval_batches = 2  # batches in one evaluation
    config.log_every_steps = 10  # metrics every this many steps
    config.checkpoint_every_steps = 50  # asynchronous checkpoint (a spot slice loses at most 50)


def length_stages(micro_rows: int):
    """64k then 128k at about 4.2M tokens a step; each sets the RoPE rule (so the checkpoint's
    does not come back) and its own schedule. micro_rows: the rows one micro-step holds."""
    return (
        dict(name="64k", steps=400, seq_len=65536, global_batch_size=64,
             optim=dict(grad_accum_steps=64 // micro_rows), model=dict(rope_scaling=ROPE_128K)),
        dict(name="128k", steps=600, seq_len=131072, global_batch_size=32,
             optim=dict(grad_accum_steps=32 // micro_rows), model=dict(rope_scaling=ROPE_128K)),
    )


def get_config():
    config = default.get_config()
    set_llama3_8b(config)
    config.cpu_devices = 8  # fake devices if this ever runs on a CPU (irrelevant on a TPU)
    # The 128k stage's settings, which scripts/plan.py checks (the 64k stage needs less a chip)
    config.seq_len = 131072  # tokens per sequence
    config.global_batch_size = 32  # sequences per step: 32 x 131,072 = 4.2M tokens
    config.mesh.data = 4  # data-parallel shards
    config.mesh.seq = 16  # sequence shards: 8,192 tokens of each sequence a chip
    config.optim.grad_accum_steps = 8  # micro-steps of one row per data shard
    config.parallel.layout = "zigzag"  # balanced under the causal mask, contiguous chunks
    config.parallel.tile = 512  # attention tiles (the zigzag chunk is 4,096 tokens)
    config.stages = length_stages(micro_rows=config.mesh.data)
    return config
