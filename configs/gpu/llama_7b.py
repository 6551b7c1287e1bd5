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

from configs import accelerator_precision, accelerator_run, default
from model import presets

DEVICE = "a100-80gb"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 32768  # tokens per sequence
    config.global_batch_size = 8  # sequences per step, all devices together
    config.mesh.data = 1  # data-parallel shards
    config.mesh.seq = 8  # sequence shards: the attention ring's length (one 8-GPU node)
    config.model.update(presets.LLAMA_7B)  # model/presets.py
    accelerator_precision(config.model)
    config.parallel.tile = 512  # attention tiles (block 4096 -> 8 tiles per side)
    return config
