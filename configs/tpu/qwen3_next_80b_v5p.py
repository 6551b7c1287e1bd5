"""Qwen3-Next-80B-A3B at its real size and native context, 262,144 tokens per sequence on a TPU
v5p-256 (128 chips): the sequence over 32 chips (8,192 tokens a chip), 4 sequences a step, the
512 experts over the 4 data-parallel groups' chips, for the TPU compiler and the planner.

    python scripts/plan.py --config configs/tpu/qwen3_next_80b_v5p.py --compile tpu --topology v5p-256
    python train.py --config configs/tpu/qwen3_next_80b_v5p.py --workdir gs://my-bucket/qwen3_next \\
        --config.init_from=hf:/models/Qwen3-Next-80B-A3B-Instruct      # from the weights

Qwen3-Next-80B-A3B's shapes (its config.json): d_model 2048, 48 layers, three Gated DeltaNet
layers to one gated softmax layer (16 key heads and 32 value heads of 128, convolution 4; the
softmax layers 16 query and 2 KV heads of 256 with q/k norms, an output gate and RoPE on a
quarter of each head, base 10,000,000), every block 512 routed experts of 512 (10 a token,
renormalised) beside one sigmoid-gated shared expert of 512, vocab 151,936. About 80B parameters,
3B active a token. The Gated DeltaNet layers pass their blocks' states over the 16 chips
(parallel.linear_strategy 'auto': 'heads' cannot split 16 key heads over 32 chips);
only the 12 softmax layers move keys and values. bf16 compute, float32 weights and AdamW state,
blocks rematerialised and scanned a period at a time (each of the period's 4 positions stacked
[12, ...]: unrolled, the TPU compiler kept every layer's gathered weights, 386 GB of
temporaries a chip), the loss in chunks.
"""

from configs import accelerator_precision, default
from configs.tpu.qwen3_30b_a3b_v5p import set_moe_run_on_v5p_128

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    set_moe_run_on_v5p_128(config)  # the experts over the 4 groups' chips
    config.seq_len = 262_144  # Qwen3-Next's native context: 8,192 tokens a chip
    config.mesh.seq = 32  # 4 x 32 chips (on 64, v5p-128, the TPU compiler: 102 GB a chip)
    config.parallel.tile = 1024  # the softmax layers' attention tiles
    m = config.model
    m.vocab_size = 151_936  # tokenizer pieces = embedding rows
    m.d_model = 2048  # residual width
    m.num_layers = 48  # blocks: 36 Gated DeltaNet, 12 softmax
    m.layer_types = ("linear_attention",) * 3 + ("full_attention",)
    m.layer_types = m.layer_types * 12  # full_attention_interval 4
    m.num_heads = 16  # the softmax layers' query heads
    m.num_kv_heads = 2  # their key/value heads
    m.head_dim = 256  # their per-head width
    m.qk_norm = True  # RMSNorm of every query and key head
    m.attention_output_gate = True  # out times sigmoid(gate), the query projection twice as wide
    m.partial_rotary_factor = 0.25  # RoPE on 64 of each head's 256 dimensions
    m.rope_theta = 10_000_000.0  # RoPE base
    m.norm_eps = 1e-6  # RMSNorm epsilon
    m.mlp_dim = 5120  # a dense block's width (config.json's intermediate_size; none is dense)
    la = m.linear_attention
    la.num_key_heads = 16  # q and k heads of the Gated DeltaNet layers
    la.num_value_heads = 32  # v heads, two a key head
    la.key_head_dim = 128
    la.value_head_dim = 128
    la.conv_kernel = 4
    la.chunk_size = 64
    m.moe.num_experts = 512  # routed experts per block
    m.moe.top_k = 10  # experts a token goes to
    m.moe.expert_mlp_dim = 512  # each expert's width (moe_intermediate_size)
    m.moe.norm_topk_prob = True  # the 10 weights renormalised
    m.moe.num_shared_experts = 1  # every token's, gated
    m.moe.shared_expert_mlp_dim = 512  # shared_expert_intermediate_size
    m.moe.shared_expert_gate = True  # the shared expert times sigmoid(x w)
    m.moe.aux_loss_coef = 0.001  # router_aux_loss_coef
    accelerator_precision(m)  # bf16 compute, float32 state, remat
    m.scan_layers = True  # 12 scan steps of one period: 3 Gated DeltaNet blocks, a softmax one
    m.loss_chunk = 2048  # 152k-word logits 2,048 tokens at a time
    return config
