"""Qwen3-30B-A3B at its real size, 131,072 tokens per sequence on a TPU v5p-128 (64 chips):
the sequence over 16 chips, 4 sequences a step, the 128 experts over the 4 data-parallel
groups' chips (mesh.expert = mesh.data: 32 experts a chip), for the TPU compiler and the planner.

    python scripts/plan.py --config configs/tpu/qwen3_30b_a3b_v5p.py --compile tpu --topology v5p-128
    python train.py --config configs/tpu/qwen3_30b_a3b_v5p.py --workdir gs://my-bucket/qwen3_30b \\
        --config.init_from=hf:/models/Qwen3-30B-A3B                     # from the weights

Qwen3-30B-A3B's shapes: d_model 2048, 48 layers, 32 query and 4 KV heads of 128 with q/k norms,
every block a mixture of 128 experts of width 768, 8 a token (renormalised), vocab 151,936;
RoPE base 1,000,000 with YaRN x 4 over its 32,768 pretrained tokens (as its model card extends
it to 131,072). 30.5B parameters, 3.3B active a token. bf16 compute, float32 weights and AdamW
state, blocks rematerialised and scanned, the loss in chunks.
"""

from configs import accelerator_precision, accelerator_run, default

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)


def set_moe_run_on_v5p_128(config):
    """The run both mixture-of-experts pod configs make (this one, gpt_oss_20b_v5p.py): 4
    sequences of 131,072 tokens, each over 16 chips, the experts over the 4 groups' chips."""
    accelerator_run(config)
    config.seq_len = 131_072  # tokens per sequence
    config.global_batch_size = 4  # sequences per step: one per data-parallel group
    config.mesh.data = 4  # data-parallel groups
    config.mesh.seq = 16  # sequence shards: 8,192 tokens per chip
    config.mesh.expert = 4  # the experts over the 4 groups' chips (mesh.data)
    config.parallel.layout = "zigzag"  # contiguous chunks: balanced causal work, halos
    config.parallel.strategy = "ring"


def get_config():
    config = default.get_config()
    set_moe_run_on_v5p_128(config)  # 32 experts a chip
    config.parallel.tile = 1024  # attention tiles (block 8,192 -> 8 per side)
    m = config.model
    m.vocab_size = 151_936  # tokenizer pieces = embedding rows
    m.d_model = 2048  # residual width
    m.num_layers = 48  # transformer blocks
    m.num_heads = 32  # query heads
    m.num_kv_heads = 4  # key/value heads
    m.head_dim = 128  # per-head width
    m.mlp_dim = 6144  # a dense block's width (config.json's intermediate_size; none is dense)
    m.qk_norm = True  # RMSNorm of every query and key head
    m.norm_eps = 1e-6  # RMSNorm epsilon
    m.rope_theta = 1_000_000.0  # RoPE base
    m.rope_scaling.rope_type = "yarn"  # extended 4x over the pretrained 32,768 tokens
    m.rope_scaling.factor = 4.0
    m.rope_scaling.original_max_position_embeddings = 32_768
    m.moe.num_experts = 128  # experts per block
    m.moe.top_k = 8  # experts a token goes to
    m.moe.expert_mlp_dim = 768  # each expert's width (moe_intermediate_size)
    m.moe.norm_topk_prob = True  # the 8 weights renormalised
    m.moe.aux_loss_coef = 0.001  # router_aux_loss_coef
    accelerator_precision(m)
    m.scan_layers = True  # one scanned program for the 48 blocks
    m.loss_chunk = 2048  # 152k-word logits 2,048 tokens at a time
    return config
