"""How each Hugging Face family names its tensors (model/hf/families.py holds the families): our
parameter's path inside a block -> the tensor's name inside model.layers.i, and `Stored` for a
tensor kept otherwise than as a plain [out, in] matrix or a vector. model/hf/checkpoint.py reads and writes
through these maps."""

from __future__ import annotations

import dataclasses

# Our parameter path (inside a block) -> the tensor's name inside model.layers.i.
LLAMA_LAYER = {("attention_norm", "scale"): "input_layernorm.weight",
               ("attention", "q", "kernel"): "self_attn.q_proj.weight",
               ("attention", "k", "kernel"): "self_attn.k_proj.weight",
               ("attention", "v", "kernel"): "self_attn.v_proj.weight",
               ("attention", "o", "kernel"): "self_attn.o_proj.weight",
               ("mlp_norm", "scale"): "post_attention_layernorm.weight",
               ("mlp", "gate", "kernel"): "mlp.gate_proj.weight",
               ("mlp", "up", "kernel"): "mlp.up_proj.weight",
               ("mlp", "down", "kernel"): "mlp.down_proj.weight"}
QK_NORMS = {("attention", "q_norm", "scale"): "self_attn.q_norm.weight",
            ("attention", "k_norm", "scale"): "self_attn.k_norm.weight"}
GEMMA_NORMS = {("mlp_norm", "scale"): "pre_feedforward_layernorm.weight",
               ("post_attention_norm", "scale"): "post_attention_layernorm.weight",
               ("post_mlp_norm", "scale"): "post_feedforward_layernorm.weight"}


# A mixture-of-experts block (model/moe.py): the router, and each expert's matrices ({e}: the
# expert's index), stored [out, in] per expert as torch's Linear keeps them.
QWEN3_MOE_LAYER = {**LLAMA_LAYER, **QK_NORMS,
                   ("mlp", "router"): "mlp.gate.weight",
                   ("mlp", "gate"): "mlp.experts.{e}.gate_proj.weight",
                   ("mlp", "up"): "mlp.experts.{e}.up_proj.weight",
                   ("mlp", "down"): "mlp.experts.{e}.down_proj.weight"}
MIXTRAL_LAYER = {**LLAMA_LAYER,
                 ("mlp", "router"): "block_sparse_moe.gate.weight",
                 ("mlp", "gate"): "block_sparse_moe.experts.{e}.w1.weight",
                 ("mlp", "up"): "block_sparse_moe.experts.{e}.w3.weight",
                 ("mlp", "down"): "block_sparse_moe.experts.{e}.w2.weight"}


@dataclasses.dataclass(frozen=True)
class Stored:
    """How a family stores one of our parameters when not as a plain [out, in] matrix or
    vector: `transposed` or not (the last two axes swapped: ours [.., in, out]), as part `part`
    of `parts` interleaved along the last axis of one tensor (GPT-OSS keeps gate and up as the
    even and odd columns of gate_up_proj) or, with `halves`, one after the other along the
    stored out axis (Granite's input_linear: gate, then up), or as torch's depthwise Conv1d
    weight."""
    name: str
    transposed: bool = False
    part: int = 0
    parts: int = 1
    depthwise: bool = False  # a depthwise conv: ours [K, C], the file's [C, 1, K] (torch's Conv1d)
    halves: bool = False  # the parts contiguous along the stored [.., out, in]'s out axis


# GPT-OSS: q, k, v, o with biases, sinks; the router [E, D] with a bias; every expert's
# matrices in one tensor a layer, [E, in, out] (not transposed), gate and up interleaved.
GPT_OSS_LAYER = {**{k: v for k, v in LLAMA_LAYER.items() if k[0] != "mlp"},
                 **{("attention", p, "bias"): f"self_attn.{p}_proj.bias" for p in "qkvo"},
                 ("attention", "sinks"): "self_attn.sinks",
                 ("mlp", "router"): "mlp.router.weight",
                 ("mlp", "router_bias"): "mlp.router.bias",
                 ("mlp", "gate"): Stored("mlp.experts.gate_up_proj", part=0, parts=2),
                 ("mlp", "up"): Stored("mlp.experts.gate_up_proj", part=1, parts=2),
                 ("mlp", "gate_bias"): Stored("mlp.experts.gate_up_proj_bias", part=0, parts=2),
                 ("mlp", "up_bias"): Stored("mlp.experts.gate_up_proj_bias", part=1, parts=2),
                 ("mlp", "down"): Stored("mlp.experts.down_proj"),
                 ("mlp", "down_bias"): "mlp.experts.down_proj_bias"}


# DeepSeek's latent attention (model/mixers/latent.py); its MoE block: the router with the correction bias
# beside the routed experts, and the shared experts as one gated MLP (GLM-4.5's too).
MLA_LAYER = {("attention_norm", "scale"): "input_layernorm.weight",
             ("attention", "q", "kernel"): "self_attn.q_proj.weight",
             ("attention", "q_a", "kernel"): "self_attn.q_a_proj.weight",
             ("attention", "q_a_norm", "scale"): "self_attn.q_a_layernorm.weight",
             ("attention", "q_b", "kernel"): "self_attn.q_b_proj.weight",
             ("attention", "kv_a", "kernel"): "self_attn.kv_a_proj_with_mqa.weight",
             ("attention", "kv_a_norm", "scale"): "self_attn.kv_a_layernorm.weight",
             ("attention", "kv_b", "kernel"): "self_attn.kv_b_proj.weight",
             ("attention", "o", "kernel"): "self_attn.o_proj.weight",
             **{k: v for k, v in LLAMA_LAYER.items() if k[0].startswith("mlp")}}
SHARED_EXPERTS = {("mlp", "shared", p, "kernel"): f"mlp.shared_experts.{p}_proj.weight"
                  for p in ("gate", "up", "down")}
DEEPSEEK_MOE = {("mlp", "router"): "mlp.gate.weight",
                ("mlp", "correction_bias"): "mlp.gate.e_score_correction_bias",
                **{("mlp", p): f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")},
                **SHARED_EXPERTS}
QKV_BIASES = {("attention", p, "bias"): f"self_attn.{p}_proj.bias" for p in "qkv"}
# Qwen2-MoE: q, k, v biases; one shared expert, gated.
QWEN2_MOE_LAYER = {**LLAMA_LAYER, **QKV_BIASES,
                   **{k: v for k, v in QWEN3_MOE_LAYER.items() if k not in LLAMA_LAYER
                      and k not in QK_NORMS},
                   **{("mlp", "shared", p, "kernel"): f"mlp.shared_expert.{p}_proj.weight"
                      for p in ("gate", "up", "down")},
                   ("mlp", "shared_gate", "kernel"): "mlp.shared_expert_gate.weight"}
GLM4_MOE_LAYER = {**LLAMA_LAYER, **QKV_BIASES, **QK_NORMS, **DEEPSEEK_MOE}

# Qwen3-Next: Qwen2-MoE's experts (a gated shared one), Qwen3's q/k norms; its Gated DeltaNet
# layers (model/mixers/gated_deltanet.py) beside the softmax ones, each block one or the other.
GATED_DELTANET = {("attention", "qkvz", "kernel"): "linear_attn.in_proj_qkvz.weight",
                  ("attention", "ba", "kernel"): "linear_attn.in_proj_ba.weight",
                  ("attention", "conv"): Stored("linear_attn.conv1d.weight", depthwise=True),
                  ("attention", "dt_bias"): "linear_attn.dt_bias",
                  ("attention", "a_log"): "linear_attn.A_log",
                  ("attention", "norm"): "linear_attn.norm.weight",
                  ("attention", "out", "kernel"): "linear_attn.out_proj.weight"}
QWEN3_NEXT_LAYER = {**{k: v for k, v in QWEN2_MOE_LAYER.items() if k not in QKV_BIASES},
                    **QK_NORMS, **GATED_DELTANET}


def stored(path: tuple, entry) -> Stored:
    """A family's entry as a Stored: a bare name is transposed when it is a kernel or an
    expert layer's matrix ([out, in], as torch's Linear keeps them)."""
    if isinstance(entry, Stored):
        return entry
    return Stored(entry, transposed=path[-1] in ("kernel", "router", "gate", "up", "down"))


# Granite 4.0's hybrids (granitemoehybrid): Llama's softmax layers, Mamba2 layers
# (model/mixers/mamba2.py), experts stacked [E, out, in] with gate and up one after the other in
# input_linear, and the shared MLP (or, without experts, the block's only MLP) likewise.
def _gate_up(name: str) -> dict:
    return {"gate": Stored(name, transposed=True, part=0, parts=2, halves=True),
            "up": Stored(name, transposed=True, part=1, parts=2, halves=True)}


MAMBA2 = {("attention", "in_proj", "kernel"): "mamba.in_proj.weight",
          ("attention", "conv"): Stored("mamba.conv1d.weight", depthwise=True),
          ("attention", "conv_bias"): "mamba.conv1d.bias",
          ("attention", "dt_bias"): "mamba.dt_bias",
          ("attention", "a_log"): "mamba.A_log",
          ("attention", "d"): "mamba.D",
          ("attention", "norm"): "mamba.norm.weight",
          ("attention", "out", "kernel"): "mamba.out_proj.weight"}
GRANITE_HYBRID_LAYER = {
    **{k: v for k, v in LLAMA_LAYER.items() if k[0] != "mlp"}, **MAMBA2,
    ("mlp", "router"): "block_sparse_moe.router.layer.weight",
    **{("mlp", p): how for p, how in _gate_up("block_sparse_moe.input_linear.weight").items()},
    ("mlp", "down"): Stored("block_sparse_moe.output_linear.weight", transposed=True),
    **{("mlp", "shared", p, "kernel"): how
       for p, how in _gate_up("shared_mlp.input_linear.weight").items()},
    ("mlp", "shared", "down", "kernel"): "shared_mlp.output_linear.weight",
    **{("mlp", p, "kernel"): how for p, how in _gate_up("shared_mlp.input_linear.weight").items()},
    ("mlp", "down", "kernel"): "shared_mlp.output_linear.weight"}
