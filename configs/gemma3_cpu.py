"""A Gemma-3-like model that trains on a CPU: five sliding-window layers for every global one.

    python train.py --config configs/gemma3_cpu.py --workdir runs/gemma3_cpu
    python scripts/bench/window.py --config configs/gemma3_cpu.py        # work and traffic

The default model's size (d_model 128, 4 heads, 2 KV heads of 32) with Gemma 3's block: six
layers, five of them sliding (window 128 tokens, RoPE base 10,000) and the sixth global (full
causal, RoPE base 1,000,000); RMSNorm of every query and key head; GeGLU; norms after attention
and the MLP as well as before; the embedding scaled by sqrt(d_model); the query scale of
query_pre_attn_scalar = head_dim. Sequences of 1,024 tokens over 4 fake devices (data 1 x seq
4): a device's block is 256 tokens, so a sliding layer's window is half of it and the ring and
zigzag layouts exchange halos of 128 keys instead of whole blocks (parallel/strategies/halo.py).
"""

from configs import default

LAYER_TYPES = ("sliding_attention",) * 5 + ("full_attention",)  # Gemma 3's 5 : 1


def set_gemma3_block(model, num_layers: int, window: int):
    """Gemma 3's attention and block on a config's `model` section."""
    model.num_layers = num_layers  # transformer blocks
    model.layer_types = tuple(LAYER_TYPES[i % 6] for i in range(num_layers))
    model.sliding_window = window  # keys a local layer's query sees, itself included
    model.rope_local_theta = 10_000.0  # local layers' RoPE base
    model.rope_theta = 1_000_000.0  # global layers' RoPE base
    model.qk_norm = True  # RMSNorm of each query and key head
    model.mlp_activation = "gelu_tanh"  # GeGLU
    model.sandwich_norms = True  # a norm after attention and the MLP too
    model.embed_scale = True  # embeddings times sqrt(d_model)
    model.query_scale = float(model.head_dim)  # scores scaled by query_pre_attn_scalar^-0.5
    model.tie_embeddings = True


def get_config():
    config = default.get_config()
    config.parallel.layout = "zigzag"  # contiguous chunks: halos for the local layers
    set_gemma3_block(config.model, num_layers=6, window=128)
    return config
