"""TinyLlama-1.1B-sized model on one 8-GPU node, 128k tokens per sequence.

    python train.py --config configs/gpu/llama_1b.py --workdir runs/llama_1b
    python scripts/plan.py --config configs/gpu/llama_1b.py        # memory and speed on 8 x A100 80GB

1.10B parameters (d_model 2048, 22 layers, 32 query heads and 4 KV heads x 64, SwiGLU 5632, vocab
32000), bfloat16 compute, float32 parameters and AdamW state, every block rematerialised. Mesh
data 1 x seq 8: each GPU holds 16,384 tokens of each sequence. Tokens per step:
global_batch_size 2 x seq_len 131,072 = 262,144. Data and tokenizer as in configs/gpu/llama_7b.py.

Memory (scripts/plan.py): about 22 GB per 80 GB GPU (weights and AdamW state sharded over the
8 GPUs); about 30 GB even if XLA kept every layer's gathered weights alive. Fits.
"""

from configs import accelerator_precision, accelerator_run, default
from model import presets

DEVICE = "a100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 131072  # tokens per sequence
    config.global_batch_size = 2  # sequences per step, all devices together
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the attention ring's length (one 8-GPU node)
    config.model.update(presets.LLAMA_1B)  # model/presets.py
    accelerator_precision(config.model)
    config.parallel.tile = 2048  # attention tiles (block 16384 -> 8 tiles per side)
    config.optim.learning_rate = 4e-4  # peak learning rate (TinyLlama's)
    return config
