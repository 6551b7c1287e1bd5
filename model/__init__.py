"""Flax NNX decoder-only transformer with RoPE, GQA and SwiGLU; attention from parallel/.

Public API:
  ModelConfig                     hyper-parameters (from config.model)
  Transformer(cfg, mesh, rngs)    tokens, positions, segment_ids [B, S] -> logits [B, S, V]
  create(cfg, mesh, seed)         a Transformer with parameters created sharded (FSDP)
  count_params(model)
  hf.load(path) / hf.save(model, path)   Hugging Face Llama checkpoints in and out (model/hf.py)
"""

from model.config import ModelConfig
from model.transformer import Transformer, count_params, create

__all__ = ["ModelConfig", "Transformer", "count_params", "create"]
