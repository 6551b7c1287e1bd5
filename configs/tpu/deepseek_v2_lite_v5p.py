"""DeepSeek-V2-Lite at its real size, 131,072 tokens per sequence on a TPU v5p-128 (64 chips):
the sequence over 16 chips that pass each token's latent (576 values) around the ring instead of
its 16 heads' keys and values, 4 sequences a step, the 64 experts over the 4 data-parallel
groups' chips (16 a chip), for the TPU compiler and the planner.

    python scripts/plan.py --config configs/tpu/deepseek_v2_lite_v5p.py --compile tpu --topology v5p-128
    python train.py --config configs/tpu/deepseek_v2_lite_v5p.py --workdir gs://my-bucket/dsv2_lite \\
        --config.init_from=hf:/models/DeepSeek-V2-Lite                  # from the weights

DeepSeek-V2-Lite's shapes (its config.json): d_model 2048, 27 layers, 16 heads of latent
attention (kv_lora_rank 512, no query latent, qk 128 + 64, v 128), the first block a dense MLP
of 10,944, the other 26 blocks 64 routed experts of 1,408 (6 a token, softmax, not
renormalised) beside 2 shared ones, vocab 102,400; YaRN x 40 over its 4,096 pretrained tokens
with DeepSeek's mscale 0.707. 15.7B parameters, 2.7B active a token. bf16 compute, float32
weights and AdamW state, blocks rematerialised, the dense first block on its own and the 26
sparse ones in one lax.scan (unrolled, the TPU compiler kept every layer's gathered weights:
94.2 GB a chip, against 14.9 scanned; BENCHMARKS.md), the loss in chunks.
"""

from configs import accelerator_precision, default
from configs.tpu.qwen3_30b_a3b_v5p import set_moe_run_on_v5p_128

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    set_moe_run_on_v5p_128(config)  # 4 x 16 chips, the experts over the 4 groups' chips
    config.parallel.tile = 1024  # attention tiles (block 8,192 -> 8 per side)
    config.parallel.mla_exchange = "latent"  # the ring passes latents (scripts/plan.py --explain)
    m = config.model
    m.vocab_size = 102_400  # tokenizer pieces = embedding rows
    m.d_model = 2048  # residual width
    m.num_layers = 27  # transformer blocks
    m.num_heads = 16  # query heads
    m.num_kv_heads = 16  # (latent attention: every head its own keys from the latent)
    m.head_dim = 64  # (latent attention: the widths below apply)
    m.mlp_dim = 10_944  # the dense first block's width
    m.norm_eps = 1e-6  # RMSNorm epsilon
    m.rope_theta = 10_000.0  # RoPE base
    m.rope_scaling.rope_type = "yarn"  # extended 40x over the pretrained 4,096 tokens
    m.rope_scaling.factor = 40.0
    m.rope_scaling.original_max_position_embeddings = 4096
    m.rope_scaling.mscale = 0.707
    m.rope_scaling.mscale_all_dim = 0.707
    m.mla.kv_lora_rank = 512  # the latent a token keeps of its keys and values
    m.mla.q_lora_rank = 0  # queries straight from x
    m.mla.qk_nope_head_dim = 128
    m.mla.qk_rope_head_dim = 64  # the RoPE key the 16 heads share
    m.mla.v_head_dim = 128
    m.moe.num_experts = 64  # routed experts per sparse block
    m.moe.top_k = 6  # experts a token goes to
    m.moe.expert_mlp_dim = 1408  # each expert's width (moe_intermediate_size)
    m.moe.norm_topk_prob = False  # DeepSeek-V2's weights are the softmax's, not renormalised
    m.moe.num_shared_experts = 2  # every token's, beside the routed 6
    m.moe.first_dense_layers = 1  # first_k_dense_replace
    m.moe.aux_loss_coef = 0.001  # aux_loss_alpha
    accelerator_precision(m)
    m.scan_layers = True  # block 0 (dense) alone, then one scanned program for the 26 sparse
    m.remat = True  # every block recomputed in the backward
    m.remat_policy = "nothing"
    m.loss_chunk = 2048  # 102k-word logits 2,048 tokens at a time
    return config
