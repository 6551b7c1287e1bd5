"""LLaMA-7B-sized model (LLaMA 1/2 7B shapes) on one 8-GPU node, 32k tokens per sequence.

    python train.py --config configs/gpu/llama_7b.py --workdir runs/llama_7b
    python scripts/plan.py --config configs/gpu/llama_7b.py        # memory and speed on 8 x A100 80GB

6.74B parameters (d_model 4096, 32 layers, 32 heads x 128, no GQA, SwiGLU 11008, vocab 32000),
bfloat16 compute, float32 parameters and AdamW state, every block rematerialised. Mesh data 1 x
seq 8: each GPU holds 4,096 tokens of each sequence. Tokens per step: global_batch_size 8 x
seq_len 32,768 = 262,144. Bring a corpus and a 32000-piece sentencepiece model with an EOS id (e.g.
LLaMA's tokenizer.model): --config.data.source=/data/corpus --config.data.tokenizer_path=...;
without them a 32000-piece BPE is trained on the Python standard library (fine for a smoke test).

Memory (scripts/plan.py): about 46 GB per 80 GB GPU with weights and AdamW state sharded over
the 8 GPUs and gathered one layer at a time. If XLA kept every layer's gathered weights alive
(as its CPU compile does) it would need about 97 GB: check memory_analysis() on the GPU.
"""

from configs import default

DEVICE = "a100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def set_model(model):
    """LLaMA-7B shapes on accelerator precision; `model` is a config's `model` section."""
    model.vocab_size = 32000  # tokenizer pieces = embedding rows (shared with data.vocab_size)
    model.d_model = 4096  # residual width
    model.num_layers = 32  # transformer blocks
    model.num_heads = 32  # query heads
    model.num_kv_heads = 32  # key/value heads (no GQA in LLaMA-7B)
    model.head_dim = 128  # per-head width
    model.mlp_dim = 11008  # SwiGLU hidden width
    set_accelerator_precision(model)


def set_accelerator_precision(model):
    """bf16 compute, fp32 master weights, remat: the precision every real-hardware config uses."""
    model.dtype = "bfloat16"  # compute dtype: bf16 matmuls on the tensor cores / MXU
    model.param_dtype = "float32"  # parameters, gradients and AdamW state stay float32
    model.remat = True  # recompute each block in the backward pass: keep only block inputs
    # The other memory switches as these configs were measured with them (BENCHMARKS.md),
    # where a config has not set them: not yet left to the planner's 'auto' on a pod.
    for switch, value in (("remat_policy", "nothing"), ("scan_layers", False),
                          ("loss_chunk", 0), ("mlp_chunk", 0)):
        if model[switch] == "auto":
            model[switch] = value


def set_accelerator_run(config):
    """Run-level settings shared by the real-hardware configs (llama_*, paper_*)."""
    config.cpu_devices = 8  # fake devices if this ever runs on a CPU (irrelevant on GPU/TPU)
    config.tracker = "wandb"  # wandb (offline unless WANDB_MODE=online) plus metrics.jsonl
    config.num_train_steps = 1000  # optimizer steps
    config.eval_every_steps = 200  # evaluate every this many steps (and at the end)
    config.eval_batches = 2  # batches in one evaluation
    config.log_every_steps = 10  # metrics every this many steps
    config.checkpoint_every_steps = 100  # asynchronous checkpoint every this many steps
    config.optim.learning_rate = 3e-4  # peak learning rate (LLaMA-7B's)
    config.optim.warmup_steps = 100  # linear warmup steps


def get_config():
    config = default.get_config()
    set_accelerator_run(config)
    config.seq_len = 32768  # tokens per sequence
    config.global_batch_size = 8  # sequences per step, all devices together
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the attention ring's length (one 8-GPU node)
    set_model(config.model)
    config.parallel.tile = 512  # attention tiles (block 4096 -> 8 tiles per side)
    return config
