"""Granite 4.0's hybrids (`granitemoehybrid`): Mamba2 layers (model/mixers/mamba2.py) and a few
softmax layers (RoPE or none); Granite's multipliers (embedding, attention, residual, logits);
experts stacked [E, out, in] with gate and up one after the other in input_linear, beside a
shared MLP (or, without experts, the block's only MLP) stored likewise. A config.json option
the model here does not compute is a one-line FamilyError.
"""

from __future__ import annotations

import math

from model.config import FULL, MambaConfig, MoEConfig
from model.hf.families import llama
from model.hf.families.base import Family, FamilyError, Stored, refuse
from model.mixers.gated_deltanet import LINEAR
from model.mixers.mamba2 import MAMBA


def _gate_up(name: str) -> dict:
    """Gate and up stored one after the other along one tensor's out axis."""
    return {"gate": Stored(name, transposed=True, part=0, parts=2, halves=True),
            "up": Stored(name, transposed=True, part=1, parts=2, halves=True)}


MAMBA2_TENSORS = {("attention", "in_proj", "kernel"): "mamba.in_proj.weight",
                  ("attention", "conv"): Stored("mamba.conv1d.weight", depthwise=True),
                  ("attention", "conv_bias"): "mamba.conv1d.bias",
                  ("attention", "dt_bias"): "mamba.dt_bias",
                  ("attention", "a_log"): "mamba.A_log",
                  ("attention", "d"): "mamba.D",
                  ("attention", "norm"): "mamba.norm.weight",
                  ("attention", "out", "kernel"): "mamba.out_proj.weight"}


LAYER = {
    **{k: v for k, v in llama.LAYER.items() if k[0] != "mlp"}, **MAMBA2_TENSORS,
    ("mlp", "router"): "block_sparse_moe.router.layer.weight",
    **{("mlp", p): how for p, how in _gate_up("block_sparse_moe.input_linear.weight").items()},
    ("mlp", "down"): Stored("block_sparse_moe.output_linear.weight", transposed=True),
    **{("mlp", "shared", p, "kernel"): how
       for p, how in _gate_up("shared_mlp.input_linear.weight").items()},
    ("mlp", "shared", "down", "kernel"): "shared_mlp.output_linear.weight",
    **{("mlp", p, "kernel"): how for p, how in _gate_up("shared_mlp.input_linear.weight").items()},
    ("mlp", "down", "kernel"): "shared_mlp.output_linear.weight"}


def read(c: dict) -> dict:
    refuse(c, [("hidden_act", ["silu"]), ("attention_bias", [False]),
               ("mamba_proj_bias", [False]), ("position_embedding_type", ["rope", "nope", None])])
    low, high = (list(c.get("time_step_limit") or (0.0, math.inf)) + [math.inf])[:2]
    if low != 0.0 or not (high == math.inf or isinstance(high, dict) or high is None):
        raise FamilyError(f"time_step_limit={c['time_step_limit']!r} is not supported (this "
                          f"model leaves dt unclamped: (0.0, inf))")
    kinds = {"mamba": MAMBA, LINEAR: MAMBA, "attention": FULL, FULL: FULL}
    named = c.get("layer_types") or c.get("layers_block_type") or ["mamba"] * c[
        "num_hidden_layers"]
    unknown = sorted(set(named) - set(kinds))
    if unknown:
        raise FamilyError(f"layer_types {unknown[0]!r} is not a Granite hybrid layer (this model "
                          f"has 'mamba' / 'linear_attention' and 'attention' / 'full_attention')")
    mamba = MambaConfig(num_heads=c["mamba_n_heads"], head_dim=c["mamba_d_head"],
                        state_size=c["mamba_d_state"], num_groups=c["mamba_n_groups"],
                        conv_kernel=c["mamba_d_conv"], conv_bias=bool(c["mamba_conv_bias"]))
    if "hidden_size" in c and mamba.inner != int(c.get("mamba_expand", 2) * c["hidden_size"]):
        raise FamilyError(f"mamba_n_heads x mamba_d_head = {mamba.inner} is not mamba_expand x "
                          f"hidden_size (the layer's width)")
    shared = c["shared_intermediate_size"]
    experts = int(c.get("num_local_experts") or 0)
    moe = MoEConfig(num_experts=experts, top_k=c["num_experts_per_tok"],
                    expert_mlp_dim=c["intermediate_size"], norm_topk_prob=True,
                    aux_loss_coef=float(c.get("router_aux_loss_coef") or 0.0),
                    num_shared_experts=1, shared_expert_mlp_dim=shared) if experts else MoEConfig()
    rope = c.get("position_embedding_type") == "rope"
    return dict(layer_types=tuple(kinds[t] for t in named), mamba=mamba, moe=moe,
                partial_rotary_factor=1.0 if rope else 0.0,
                query_scale=1.0 / float(c["attention_multiplier"]) ** 2,
                embedding_multiplier=float(c["embedding_multiplier"]),
                residual_multiplier=float(c["residual_multiplier"]),
                logits_scaling=float(c["logits_scaling"]),
                **({} if experts else {"mlp_dim": shared}))


def write(cfg) -> dict:
    mc, moe = cfg.mamba, cfg.moe
    if not mc.enabled or cfg.qk_norm or cfg.qkv_bias or cfg.attention_bias or cfg.sliding_window \
            or cfg.mla.enabled or cfg.attention_output_gate or cfg.partial_rotary_factor not in (
                0.0, 1.0) or cfg.linear_attention.enabled:
        raise FamilyError("Granite hybrid: Mamba2 and plain softmax layers (RoPE or none)")
    if moe.num_experts and (moe.router != "softmax_topk" or not moe.norm_topk_prob
                            or moe.num_shared_experts != 1 or moe.shared_expert_gate
                            or moe.mlp_only_layers or moe.decoder_sparse_step != 1
                            or moe.first_dense_layers):
        raise FamilyError("Granite's experts: every block sparse, softmax top-k renormalised, "
                          "one ungated shared MLP")
    # the published checkpoints' names, the only ones transformers 4 takes (5 reads them as its
    # linear_attention and full_attention)
    types = {MAMBA: "mamba", FULL: "attention"}
    return {"hidden_act": "silu", "attention_bias": False, "mamba_proj_bias": False,
            "layer_types": [types[cfg.layer_type(i)] for i in range(cfg.num_layers)],
            "mamba_n_heads": mc.num_heads, "mamba_d_head": mc.head_dim,
            "mamba_d_state": mc.state_size, "mamba_n_groups": mc.num_groups,
            "mamba_d_conv": mc.conv_kernel, "mamba_conv_bias": mc.conv_bias,
            "mamba_expand": _whole(mc.inner / cfg.d_model), "mamba_chunk_size": mc.chunk_size,
            "num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k or 2,
            "intermediate_size": cfg.expert_mlp_dim if moe.num_experts else cfg.mlp_dim,
            "shared_intermediate_size": (moe.shared_width(cfg.mlp_dim) if moe.num_experts
                                         else cfg.mlp_dim),
            "router_aux_loss_coef": moe.aux_loss_coef,
            "position_embedding_type": "rope" if cfg.partial_rotary_factor else "nope",
            "attention_multiplier": round((cfg.query_scale or cfg.head_dim) ** -0.5, 12),
            "embedding_multiplier": cfg.embedding_multiplier,
            "residual_multiplier": cfg.residual_multiplier,
            "logits_scaling": cfg.logits_scaling}


def _whole(x: float):
    return int(x) if x == int(x) else x


FAMILY = Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", read, write, LAYER,
                models="Granite 4.0 hybrid",
                attention="Mamba2, a few softmax layers (RoPE or none)",
                block="Granite's multipliers; experts beside a shared MLP")
