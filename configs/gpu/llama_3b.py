"""OpenLLaMA-3B-sized model on one 8-GPU node, 64k tokens per sequence.

    python train.py --config configs/gpu/llama_3b.py --workdir runs/llama_3b
    python scripts/plan.py --config configs/gpu/llama_3b.py        # memory and speed on 8 x A100 80GB

3.43B parameters (d_model 3200, 26 layers, 32 heads x 100, no GQA, SwiGLU 8640, vocab 32000),
bfloat16 compute, float32 parameters and AdamW state, every block rematerialised. Mesh data 1 x
seq 8: each GPU holds 8,192 tokens of each sequence. Tokens per step: global_batch_size 4 x
seq_len 65,536 = 262,144. Data and tokenizer as in configs/gpu/llama_7b.py.

Memory (scripts/plan.py): about 34 GB per 80 GB GPU (weights and AdamW state sharded over the
8 GPUs); about 59 GB even if XLA kept every layer's gathered weights alive. Fits.
"""

from configs import accelerator_precision, accelerator_run, default
from model import presets

DEVICE = "a100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 65536  # tokens per sequence
    config.global_batch_size = 4  # sequences per step, all devices together
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the attention ring's length (one 8-GPU node)
    config.model.update(presets.LLAMA_3B)  # model/presets.py
    accelerator_precision(config.model)
    config.parallel.tile = 1024  # attention tiles (block 8192 -> 8 tiles per side)
    return config
