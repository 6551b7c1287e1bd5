"""A tiny Qwen3-Next-shaped hybrid that trains here on 4 fake devices, the sequence over all 4:
three Gated DeltaNet layers to one softmax layer (the softmax layer with Qwen3-Next's output gate,
q/k norms and RoPE on a quarter of each head), 8 routed experts a block, 2 a token, beside a
sigmoid-gated shared expert.

    python train.py --config configs/hybrid_tiny.py --workdir runs/hybrid_tiny
    python train.py --config configs/hybrid_tiny.py --workdir /tmp/h --config.parallel.layout=zigzag

Each Gated DeltaNet layer keeps a state of 32 x 32 numbers per value head (4 heads) whatever the
length: its devices pass their blocks' states, not keys and values (model/mixers/gated_deltanet.py);
a layout other than 'ring' reaches contiguous blocks by all-to-alls around those layers.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.mesh.data = 1
    config.mesh.seq = 4
    m = config.model
    m.layer_types = ("linear_attention",) * 3 + ("full_attention",)  # Qwen3-Next's 3 : 1
    la = m.linear_attention
    la.num_key_heads = 2  # q and k heads, each serving 2 of the value heads
    la.num_value_heads = 4
    la.key_head_dim = 32
    la.value_head_dim = 32
    la.conv_kernel = 4
    la.chunk_size = 64
    m.attention_output_gate = True  # the softmax layer's output times sigmoid(gate)
    m.qk_norm = True
    m.partial_rotary_factor = 0.25  # RoPE on 8 of each head's 32 dimensions
    m.moe.num_experts = 8
    m.moe.top_k = 2
    m.moe.expert_mlp_dim = 96
    m.moe.num_shared_experts = 1
    m.moe.shared_expert_mlp_dim = 192
    m.moe.shared_expert_gate = True  # Qwen3-Next's: the shared expert times sigmoid(x w)
    m.moe.aux_loss_coef = 0.001
    m.scan_layers = False  # Gated DeltaNet and softmax blocks differ: not stacked
    return config
