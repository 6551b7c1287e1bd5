"""Flax NNX decoder-only transformer with RoPE, GQA and a gated MLP (SwiGLU, or Gemma's GeGLU),
full or sliding-window attention per layer; attention from parallel/.

Public API:
  ModelConfig                     hyper-parameters (from config.model)
  MemorySwitches                  remat, scanned layers, loss and MLP chunks (the planner's)
  Transformer(cfg, mesh, rngs, choice)
                                  tokens, positions, segment_ids [B, S] -> logits [B, S, V],
                                  attending as the run's parallel.AttentionChoice says
  create(cfg, mesh, seed, choice) a Transformer with parameters created sharded (FSDP)
  count_params(model)
  hf.load(path) / hf.save(model, path)   Hugging Face checkpoints in and out (model/hf/checkpoint.py; the
                                         families: model/hf/families/)
"""

from model.config import MemorySwitches, ModelConfig
from model.transformer import Transformer, count_params, create

__all__ = ["MemorySwitches", "ModelConfig", "Transformer", "count_params", "create"]
