"""GPT-OSS-20B at its real size, 131,072 tokens per sequence on a TPU v5p-128 (64 chips): the
sequence over 16 chips, 4 sequences a step, the 32 experts over the 4 data-parallel groups'
chips (mesh.expert = mesh.data: 8 experts a chip), for the TPU compiler and the planner.

    python scripts/plan.py --config configs/tpu/gpt_oss_20b_v5p.py --compile tpu --topology v5p-128
    python train.py --config configs/tpu/gpt_oss_20b_v5p.py --workdir gs://my-bucket/gpt_oss_20b \\
        --config.init_from=hf:/models/gpt-oss-20b-bf16          # unquantised weights

GPT-OSS-20B's shapes: d_model 2880, 24 layers alternating a 128-token window and full
attention, 64 query and 8 KV heads of 64 with learned sinks and biases on q, k, v, o; every
block a mixture of 32 experts of width 2,880, 4 a token (top-k, then softmax), with biases and
the SwiGLU clamped at 7; vocab 201,088; YaRN x 32 over 4,096 pretrained tokens (its own
131,072). 20.9B parameters, 4.0B active a token. bf16 compute, float32 weights and AdamW state,
blocks rematerialised and scanned, the loss in chunks.
"""

from configs import accelerator_precision, default
from configs.tpu.qwen3_30b_a3b_v5p import set_moe_run_on_v5p_128

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = default.get_config()
    set_moe_run_on_v5p_128(config)  # 8 experts a chip
    config.parallel.tile = 512  # attention tiles (block 8,192 -> 16 per side)
    m = config.model
    m.vocab_size = 201_088  # tokenizer pieces = embedding rows
    m.d_model = 2880  # residual width
    m.num_layers = 24  # transformer blocks
    m.num_heads = 64  # query heads
    m.num_kv_heads = 8  # key/value heads
    m.head_dim = 64  # per-head width
    m.mlp_dim = 2880  # config.json's intermediate_size: each expert's width
    m.layer_types = ("sliding_attention", "full_attention") * 12  # window, full, ...
    m.sliding_window = 128  # keys a sliding layer's query sees
    m.attention_sinks = True  # a learned logit per head
    m.attention_bias = True  # biases on q, k, v, o
    m.norm_eps = 1e-5  # RMSNorm epsilon
    m.rope_theta = 150_000.0  # RoPE base
    m.rope_scaling.rope_type = "yarn"  # its own 131,072 over 4,096 pretrained tokens
    m.rope_scaling.factor = 32.0
    m.rope_scaling.original_max_position_embeddings = 4096
    m.rope_scaling.truncate = False  # GPT-OSS's YaRN ramp is not cut at whole dimensions
    m.moe.num_experts = 32  # experts per block
    m.moe.top_k = 4  # experts a token goes to
    m.moe.router = "topk_softmax"  # the 4 largest logits, then a softmax over them
    m.moe.expert_bias = True  # router and expert biases
    m.moe.swiglu_limit = 7.0  # the clamped SwiGLU
    m.moe.aux_loss_coef = 0.001  # router_aux_loss_coef
    accelerator_precision(m)
    m.scan_layers = True  # one scanned program: each step switches to its layer's kind
    m.loss_chunk = 2048  # 201k-word logits 2,048 tokens at a time
    return config
