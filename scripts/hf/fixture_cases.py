"""The cases scripts/hf/make_fixtures.py writes to tests/fixtures/hf/: each a tiny model's
shape and options under transformers' names (its docstring says what each family case sets
apart). Data only; the writer is make_fixtures.py.
"""

import os

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "hf")
SIZES = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
             max_position_embeddings=256)
THETA, TOKENS = 10_000.0, 96  # the reference runs 96 tokens; the scaled rules' context is 64
CASES = {  # name: (rope_parameters without theta, tied, dtype, shard size, old config layout)
    "default_untied_sharded": ({"rope_type": "default"}, False, torch.float32, "60KB", False),
    "linear_tied": ({"rope_type": "linear", "factor": 4.0}, True, torch.float32, None, False),
    "llama3_untied_bf16": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                           False, torch.bfloat16, None, True),
    "yarn_tied": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                  True, torch.float32, "60KB", False),
}


# The other families, each with windows shorter than the reference's 96 tokens and the options
# that set it apart: (transformers classes, config keywords, tied, dtype).
FAMILY_CASES = {
    "mistral_window": ("MistralConfig", "MistralForCausalLM",
                       dict(sliding_window=16, rope_parameters={"rope_type": "default",
                                                                "rope_theta": THETA}),
                       False, torch.float32),
    "qwen3_window": ("Qwen3Config", "Qwen3ForCausalLM",  # layer 0 full, layer 1 sliding
                     dict(use_sliding_window=True, sliding_window=16, max_window_layers=1,
                          rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                     True, torch.float32),
    "gemma2_caps": ("Gemma2Config", "Gemma2ForCausalLM",  # sliding, full; caps that bite
                    dict(sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                         final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
                         rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                    True, torch.bfloat16),
    "gemma3_local_global": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                            dict(sliding_window=16, query_pre_attn_scalar=12,
                                 layer_types=["sliding_attention", "full_attention"],
                                 hidden_activation="gelu_pytorch_tanh",
                                 rope_parameters={
                                     "sliding_attention": {"rope_type": "default",
                                                           "rope_theta": THETA},
                                     "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 1_000_000.0}}),
                            False, torch.float32),
    # Mixtures of experts, 4 experts of width 32, 2 a token: Qwen3-MoE with a dense first layer
    # and the top-2 weights not renormalised; Mixtral (renormalised) with a window.
    "qwen3_moe_experts": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                          dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               norm_topk_prob=False, mlp_only_layers=[0],
                               rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                          False, torch.float32),
    "mixtral_experts": ("MixtralConfig", "MixtralForCausalLM",
                        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                             sliding_window=16,
                             rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                        False, torch.float32),
    # GPT-OSS: sliding and full layers, sinks, q/k/v/o and expert biases (drawn, not zero),
    # a SwiGLU limit low enough to clamp, YaRN without truncation.
    "gpt_oss_experts": ("GptOssConfig", "GptOssForCausalLM",
                        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                             sliding_window=16, swiglu_limit=1.5,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "truncate": False,
                                              "original_max_position_embeddings": 64,
                                              "rope_theta": THETA}),
                        False, torch.float32),
}


# Issue 62's families (latent attention, shared experts, sigmoid routing with a correction bias,
# group-limited routing, a dense first layer), added by --latent-only: MLA of a 16-wide latent,
# queries through a 24-wide one (DeepSeek-V3) or not (V2-Lite), heads of 8 + 4 (RoPE) for
# queries and keys and 8 for values, 8 routed experts of width 16 and one shared.
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=4,
           num_key_value_heads=4, moe_intermediate_size=16, n_shared_experts=1,
           first_k_dense_replace=1)
LATENT_CASES = {
    "deepseek_v3_mla": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                        dict(**MLA, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2,
                             n_group=2, topk_group=1, routed_scaling_factor=2.5,
                             norm_topk_prob=True, rope_interleave=True,
                             rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "mscale": 1.0, "mscale_all_dim": 1.0,
                                              "rope_theta": THETA}),
                        False, torch.float32),
    "deepseek_v2_lite_mla": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                             dict(**MLA, q_lora_rank=None, n_routed_experts=8,
                                  num_experts_per_tok=2, n_group=1, topk_group=1,
                                  topk_method="greedy", routed_scaling_factor=1.0,
                                  norm_topk_prob=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                             False, torch.float32),
    "glm4_moe_shared": ("Glm4MoeConfig", "Glm4MoeForCausalLM",  # partial rotary, q/k/v biases
                        dict(moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
                             num_experts_per_tok=2, n_group=1, topk_group=1,
                             first_k_dense_replace=1, routed_scaling_factor=2.5,
                             norm_topk_prob=True, attention_bias=True,
                             rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                              "partial_rotary_factor": 0.5}),
                        False, torch.float32),
    "qwen2_moe_shared": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",  # sigmoid-gated shared expert
                         dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=32, norm_topk_prob=False,
                              mlp_only_layers=[0],
                              rope_parameters={"rope_type": "default", "rope_theta": THETA}),
                         False, torch.float32),
}


# Issue 63's hybrids, added by --hybrid-only: Qwen3-Next (three Gated DeltaNet layers of 2 key
# heads of 8 for 4 value heads of 8, a causal convolution of 4, then a gated softmax layer with
# partial rotary (a quarter of heads of 16, as Qwen3-Next's 64 of 256); experts with a sigmoid-gated shared one) and Granite 4.0's GraniteMoeHybrid
# (Mamba2 layers of 6 heads of 16 (2 x d_model), state 16, 2 groups, chunks of 16 over the 96
# tokens, an attention layer; experts with a shared MLP; Granite's multipliers).
HYBRID_CASES = {
    "qwen3_next_hybrid": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                          dict(num_hidden_layers=4, layer_types=["linear_attention"] * 3
                               + ["full_attention"], head_dim=16, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8, linear_conv_kernel_dim=4,
                               num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=32, norm_topk_prob=True,
                               rope_parameters={"rope_type": "default", "rope_theta": THETA,
                                                "partial_rotary_factor": 0.25}),
                          False, torch.float32),
    "granite_hybrid_mamba2": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                              dict(num_hidden_layers=4, layer_types=["mamba", "mamba",
                                                                     "attention", "mamba"],
                                   mamba_n_heads=6, mamba_d_head=16, mamba_d_state=16,
                                   mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
                                   mamba_chunk_size=16, num_local_experts=4,
                                   num_experts_per_tok=2, shared_intermediate_size=32,
                                   intermediate_size=16, embedding_multiplier=2.0,
                                   logits_scaling=4.0, residual_multiplier=0.5,
                                   attention_multiplier=0.3, position_embedding_type="rope",
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": THETA}),
                              False, torch.float32),
}


# One latent-attention layer alone (transformers' DeepseekV3Attention, eager, a causal mask),
# for model/mixers/latent.py: DeepSeek-V3's shape (queries through a latent, YaRN with its softmax
# mscale, interleaved RoPE), V2-Lite's (no query latent, plain RoPE, interleaved) and one with
# the halves convention (rope_interleave=False). Positions 70..93, past YaRN's original 64.
MLA_ATTENTION = {
    "v3": dict(q_lora_rank=24, rope_interleave=True, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "rope_theta": THETA}),
    "v2_lite": dict(q_lora_rank=None, rope_interleave=True,
                    rope_parameters={"rope_type": "default", "rope_theta": THETA}),
    "halves": dict(q_lora_rank=24, rope_interleave=False,
                   rope_parameters={"rope_type": "default", "rope_theta": THETA}),
}
