"""A tiny DeepSeek-V3-shaped model that trains here on 4 fake devices, the sequence over all 4:
latent attention (a 64-wide latent and a 16-wide shared RoPE key for 4 heads of 32 + 16 query
and key, 32 value dimensions), a dense first block, then 8 routed experts a block, 2 a token,
chosen by sigmoid among the best 2 of 4 groups, beside one shared expert; balanced by DeepSeek-V3's
correction bias, no auxiliary loss.

    python train.py --config configs/mla_tiny.py --workdir runs/mla_tiny
    python train.py --config configs/mla_tiny.py --workdir /tmp/mla --config.parallel.mla_exchange=full

The devices pass each token's latent and RoPE key around the ring (parallel.mla_exchange
'latent': 80 values a token against the expanded keys' and values' 4 x 2 x 48 = 384); 'auto'
lets the planner price both. The progress line carries moe/share_max, the busiest expert's share
of the routed tokens, which the correction bias pulls towards 1 / 8.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.mesh.data = 1
    config.mesh.seq = 4  # the ring of 4 devices the latents travel
    config.parallel.mla_exchange = "latent"
    m = config.model
    m.mla.kv_lora_rank = 64  # the latent a token keeps of its keys and values
    m.mla.q_lora_rank = 96  # the queries' latent
    m.mla.qk_nope_head_dim = 32
    m.mla.qk_rope_head_dim = 16  # the RoPE key every head shares
    m.mla.v_head_dim = 32
    m.moe.num_experts = 8
    m.moe.top_k = 2
    m.moe.expert_mlp_dim = 96  # each expert a quarter of the dense MLP's 384
    m.moe.router = "sigmoid_topk"  # DeepSeek-V3's: sigmoid scores, a correction bias on the choice
    m.moe.n_group = 4  # the experts in 4 groups of 2, a token choosing among the best 2 groups
    m.moe.topk_group = 2
    m.moe.routed_scaling_factor = 2.5  # DeepSeek-V3's
    m.moe.bias_update_speed = 0.001  # the correction bias's step (DeepSeek-V3's)
    m.moe.num_shared_experts = 1  # beside the routed ones, every token's
    m.moe.first_dense_layers = 1  # block 0 keeps the dense MLP (DeepSeek's first_k_dense_replace)
    m.scan_layers = False  # a dense block beside sparse ones: not stacked
    return config
