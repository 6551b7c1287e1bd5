"""Model shapes that run configs and the planner's size table share: Llama-style models of 1B,
3B and 7B parameters, as `model.*` fields, and the precision every real-hardware run trains
in. A config file takes one with `config.model.update(presets.LLAMA_7B)`.

    presets.SIZES["llama_7b"]   # {'vocab_size': 32000, 'd_model': 4096, ...}
"""

# TinyLlama-1.1B: 1.10B parameters, GQA (8 query heads share each key/value head)
LLAMA_1B = dict(vocab_size=32000, d_model=2048, num_layers=22, num_heads=32, num_kv_heads=4,
                head_dim=64, mlp_dim=5632)
# OpenLLaMA-3B: 3.43B parameters, no GQA
LLAMA_3B = dict(vocab_size=32000, d_model=3200, num_layers=26, num_heads=32, num_kv_heads=32,
                head_dim=100, mlp_dim=8640)
# LLaMA-7B (LLaMA 1/2 7B): 6.74B parameters, no GQA
LLAMA_7B = dict(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                head_dim=128, mlp_dim=11008)
# The sizes the planner's model-size table prices a run's memory options on (planner/reports/
# sizes.py), and the configs/gpu/ file that trains each.
SIZES = {"llama_1b": LLAMA_1B, "llama_3b": LLAMA_3B, "llama_7b": LLAMA_7B}

# bf16 matmuls on the tensor cores / MXU; parameters, gradients and AdamW state stay float32
ACCELERATOR_PRECISION = dict(dtype="bfloat16", param_dtype="float32")
