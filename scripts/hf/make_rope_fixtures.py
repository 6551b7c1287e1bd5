"""Writes tests/fixtures/hf_rope.npz: Hugging Face's RoPE, the reference tests/model/test_rope.py checks
model/rope.py and model.layers.rope against (make test reads the file; it needs no PyTorch).

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers numpy
    /tmp/ref/bin/python scripts/hf/make_rope_fixtures.py        # then commit the .npz

Written with torch 2.14.1 and transformers 5.24.0. For each case (a rope_type and its
parameters, as a Llama config.json's rope_parameters hold them): the inverse frequencies and
attention factor of transformers' LlamaRotaryEmbedding, and the queries it rotates (with
apply_rotary_pos_emb) from fixed random ones at positions far past the original context.
"""

import json
import os

import numpy as np
import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

HEAD_DIM, THETA = 64, 10_000.0
CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn_tuned": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 512,
                   "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707,
                   "mscale_all_dim": 1.0},
}
POSITIONS = np.array([[0, 1, 17, 255, 256, 1000, 4095, 20000]])


def main() -> None:
    out, rng = {}, np.random.default_rng(0)
    q = rng.standard_normal((1, 2, POSITIONS.shape[1], HEAD_DIM)).astype(np.float32)  # B H S D
    out["q"], out["positions"] = q, POSITIONS
    for name, params in CASES.items():
        original = params.get("original_max_position_embeddings")
        config = LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=HEAD_DIM,
                             max_position_embeddings=(int(original * params["factor"])
                                                      if original else 32768),
                             rope_parameters={**params, "rope_theta": THETA})
        embedding = LlamaRotaryEmbedding(config)  # its inv_freq and attention_scaling
        out[f"{name}/inv_freq"] = embedding.inv_freq.numpy().astype(np.float64)
        out[f"{name}/attention_factor"] = np.float64(embedding.attention_scaling)
        x = torch.from_numpy(q)
        cos, sin = embedding(x, torch.from_numpy(POSITIONS))
        rotated, _ = apply_rotary_pos_emb(x, x, cos, sin)
        out[f"{name}/rotated"] = rotated.numpy()
        out[f"{name}/params"] = np.array(json.dumps(params))
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "hf_rope.npz")
    np.savez(path, **out)
    print(f"wrote {os.path.normpath(path)}: {len(CASES)} cases, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
