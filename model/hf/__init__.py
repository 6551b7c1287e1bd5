"""Hugging Face checkpoints in and out, for the families of model/hf/families.py:

    from model import hf
    m = hf.load("/models/Llama-3.2-1B")      # a Transformer on one device
    hf.save(m, "/tmp/out")                    # a directory transformers loads

    checkpoint.py       load, save, load_params (tensor by tensor onto a mesh)
    config_json.py      read_config, config_json: config.json <-> ModelConfig fields; HFError
    families/           FAMILIES: one file a family, its config.json <-> ModelConfig and its
                        tensor names (base.py: what a family is, what they share)
    safetensors_dir.py  a directory of safetensors files read by byte ranges (MXFP4 included)
"""

from model.hf.checkpoint import load, load_params, model_config, open_weights, save
from model.hf.config_json import HFError, config_json, read_config

__all__ = ["HFError", "config_json", "load", "load_params", "model_config", "open_weights",
           "read_config", "save"]
