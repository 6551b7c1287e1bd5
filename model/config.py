"""The model's hyper-parameters, read from the `model` section of a run config."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from model.rope import RopeScaling
from model.sections import (FUNCTION, ROUTERS, SHAPE, TRAINING, LinearAttentionConfig, MambaConfig,  # noqa: F401
                            MLAConfig, MoEConfig, fixed, weight_fields)
from parallel.choice import AUTO


# What a rematerialised block saves for its backward (jax.checkpoint policies): 'nothing' (all of
# it is recomputed: least memory) or 'dots' (the outputs of its projections and MLP matmuls are
# kept, so the backward recomputes only the cheap elementwise work and the attention kernel), or
# 'attention' (the attention's output and softmax statistics are kept, b n (H d + 4 H) bytes a
# layer: the backward reruns the block's matmuls but not the attention forward, its tiles and
# its K/V transfers, which at long context are most of a block's forward), or 'offload': as
# 'nothing', but each block's input is kept in host memory (memory kind 'pinned_host') instead
# of HBM and copied back for the block's backward (TPU, GPU).
REMAT_POLICIES = {"nothing": "nothing_saveable",  # name -> jax.checkpoint_policies.<attribute>
                  "dots": "dots_with_no_batch_dims_saveable",
                  "attention": "save_only_these_names",
                  "offload": "save_and_offload_only_these_names"}
BLOCK_INPUT = "block_input"  # the checkpoint name of a block's input (what 'offload' moves)


# AUTO ('auto'): a switch's value that leaves it to the planner (planner/switches.py), as for
# the attention's layout, strategy and tile (planner/recommend.py).


@dataclasses.dataclass(frozen=True)
class MemorySwitches:
    """How the model trades compute for memory: the six `model.*` switches of a run config
    (ModelConfig holds them: it is a MemorySwitches with an architecture on top). A run config
    leaves each 'auto' (run_config.schema.RUN_MODEL) and the planner resolves it once
    (planner/switches.py) to the fastest setting it predicts to fit; a value given in the config
    always wins. The defaults here, every switch off, are what a model built in code, or read
    only for its shapes, runs with."""

    remat: bool = False  # recompute each block in the backward pass (True | False)
    # With remat, what a block keeps: 'nothing' | 'attention' (its attention's output: the
    # backward does not rerun the attention forward) | 'dots' (matmuls) | 'offload' (its input,
    # in host memory): REMAT_POLICIES
    remat_policy: str = "nothing"
    # The blocks stacked under one lax.scan: compile time flat in depth, one tree of parameters
    scan_layers: bool = fixed(SHAPE, False)
    # Per-token work a chunk of each device's tokens at a time (0 = all at once; a divisor of
    # seq_len / mesh.seq): the output projection + loss never makes [B, S, vocab] logits, the
    # MLP never [B, S, mlp_dim]
    loss_chunk: int = 0
    mlp_chunk: int = 0
    # Gated DeltaNet and Mamba2 layers a piece of each device's tokens at a time, the state
    # carried between pieces (parallel/recurrent/pieces.py); 0 = the whole block at once
    linear_chunk: int = 0

    def __post_init__(self):
        """Each switch is 'auto' (a run config's, for the planner) or a value of its kind."""
        for name in ("remat", "scan_layers"):
            value = getattr(self, name)
            if value != AUTO and not isinstance(value, bool):
                raise ValueError(f"model.{name}={value!r}: use True, False or 'auto'")
        if self.remat_policy != AUTO and self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"model.remat_policy={self.remat_policy!r}: choose one of "
                             f"{', '.join(REMAT_POLICIES)}, or 'auto'")
        for name in ("loss_chunk", "mlp_chunk", "linear_chunk"):
            value = getattr(self, name)
            # (a negative size, or one that does not divide the block: training/validate.py)
            if value != AUTO and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"model.{name}={value!r}: use a number of tokens per device "
                                 f"(0: all at once) or 'auto'")

    @staticmethod
    def fields() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(MemorySwitches))

    def record(self) -> dict:
        """The switches alone (of a MemorySwitches or a ModelConfig), by name."""
        return {name: getattr(self, name) for name in MemorySwitches.fields()}

    def label(self) -> str:
        """'remat (nothing), scanned layers, loss in chunks of 4,096, MLP in chunks of 8,192';
        'no memory switches'."""
        parts = ([f"remat ({self.remat_policy})"] if self.remat else []) + (
            ["scanned layers"] if self.scan_layers else []) + (
            [f"loss in chunks of {self.loss_chunk:,}"] if self.loss_chunk else []) + (
            [f"MLP in chunks of {self.mlp_chunk:,}"] if self.mlp_chunk else []) + (
            [f"recurrent layers in pieces of {self.linear_chunk:,}"] if self.linear_chunk else [])
        return ", ".join(parts) or "no memory switches"


# Softmax attention's layer types (Hugging Face's names), the ones this config reads: a sliding
# layer's window and RoPE. Which kind runs each layer type, and the others: model/mixers/.
FULL, SLIDING = "full_attention", "sliding_attention"
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
DTYPES = ("float32", "bfloat16", "float16")  # compute dtypes


@dataclasses.dataclass(frozen=True)
class ModelConfig(MemorySwitches):
    """The model's hyper-parameters (a run config's `model` section), each declared here once
    with its default: the embedded default's small Llama-style model. The architecture, on top
    of the memory switches (MemorySwitches); how a run splits it over devices is not here but in
    its plan (planner.ResolvedRun: the AttentionChoice the model is built with, model.create)."""

    vocab_size: int = fixed(SHAPE, 2048)  # tokenizer pieces = embedding rows
    d_model: int = fixed(SHAPE, 128)  # residual width
    num_layers: int = fixed(SHAPE, 4)  # transformer blocks
    num_heads: int = fixed(SHAPE, 4)  # query heads
    num_kv_heads: int = fixed(SHAPE, 2)  # key/value heads (GQA when fewer than num_heads; 1 = MQA)
    head_dim: int = fixed(SHAPE, 32)  # per-head width
    mlp_dim: int = fixed(SHAPE, 384)  # gated MLP (SwiGLU) hidden width
    rope_theta: float = 10_000.0  # RoPE base
    # RoPE scaling, to extend a (pretrained) model's context: Hugging Face's rope_type and its
    # parameters (model/rope.py): none, linear, llama3, yarn
    rope_scaling: RopeScaling = RopeScaling()
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = fixed(SHAPE, False)  # output projection = embedding transposed
    dtype: str = "float32"  # compute dtype ('bfloat16' on accelerators); parameters: param_dtype
    param_dtype: str = "float32"  # parameter and optimizer-state dtype
    # Attention per layer, as Hugging Face names it (Mistral, Qwen3, Gemma 2/3, GPT-OSS): per
    # block a layer type of model/mixers ('full_attention' | 'sliding_attention' |
    # 'linear_attention' (model.linear_attention) | 'mamba' (model.mamba)); () = all full, a
    # Llama model: no caps, no sinks, no norms on q and k.
    layer_types: tuple[str, ...] = fixed(FUNCTION, ())
    sliding_window: int = 0  # keys a sliding layer's query sees, itself included
    rope_local_theta: float = 0.0  # RoPE base of sliding layers (unscaled); 0 = rope_theta
    # RMSNorm over head_dim of each query and key head (Qwen3, Gemma 3)
    qk_norm: bool = fixed(SHAPE, False)
    attn_logit_soft_cap: float = fixed(FUNCTION, 0.0)  # scores c tanh(s / c) (Gemma 2); 0 = none
    # output logits c tanh(z / c) (Gemma 2); 0 = none
    final_logit_soft_cap: float = fixed(FUNCTION, 0.0)
    # a learned logit per head in its softmax (GPT-OSS)
    attention_sinks: bool = fixed(SHAPE, False)
    attention_bias: bool = fixed(SHAPE, False)  # biases on the q, k, v and o projections (GPT-OSS)
    qkv_bias: bool = fixed(SHAPE, False)  # biases on q, k and v, not o (Qwen2-MoE, GLM-4.5)
    # RoPE on the first head_dim x this of each head's dimensions only (GLM-4.5: 0.5)
    partial_rotary_factor: float = fixed(FUNCTION, 1.0)
    # scores scaled by query_scale^-0.5 (Gemma); 0 = head_dim
    query_scale: float = fixed(FUNCTION, 0.0)
    # Gemma's block: a GELU (tanh) gated MLP, norms after attention and the MLP as well as
    # before, the embedding multiplied by sqrt(d_model).
    mlp_activation: str = fixed(FUNCTION, "silu")  # 'silu' (SwiGLU) | 'gelu_tanh' (GeGLU)
    sandwich_norms: bool = fixed(SHAPE, False)  # a norm after attention and the MLP as well
    embed_scale: bool = fixed(FUNCTION, False)  # the embeddings times sqrt(d_model)
    moe: MoEConfig = MoEConfig()  # mixture-of-experts layers (model/moe.py; none by default)
    # multi-head latent attention (model/mixers/latent.py; none by default)
    mla: MLAConfig = fixed(SHAPE, MLAConfig())
    # Qwen3-Next's softmax layers: the query projection twice as wide, each head's second half
    # a gate, the attention's output times sigmoid(gate) before the output projection
    attention_output_gate: bool = fixed(SHAPE, False)
    # Gated DeltaNet layers (layer_types 'linear_attention'; none by default); its own fields
    # say which fix the weights (parameter_fields), the whole group comes with a source's weights
    linear_attention: LinearAttentionConfig = fixed(FUNCTION, LinearAttentionConfig())
    mamba: MambaConfig = fixed(FUNCTION, MambaConfig())  # Mamba2 layers (layer_types 'mamba')
    # Granite's multipliers: the embedding's output times embedding_multiplier, each block's
    # attention and MLP outputs times residual_multiplier before they are added, the logits
    # divided by logits_scaling
    embedding_multiplier: float = fixed(FUNCTION, 1.0)
    residual_multiplier: float = fixed(FUNCTION, 1.0)
    logits_scaling: float = fixed(FUNCTION, 1.0)

    @classmethod
    def from_config(cls, model_cfg, switches=None, expert_devices: int = 1,
                    ragged_exchange: bool = False) -> "ModelConfig":
        """Builds from a run config's `model` section (a ModelConfig whose switches may be
        'auto', or a mapping: a record, config.json's fields; unknown fields are ignored), the
        run's resolved memory switches (a MemorySwitches, which replaces the section's: they may be
        'auto' there), its mesh.expert and whether its platform has ragged all-to-alls.
        ValueError, one line, for a switch left 'auto' without them."""
        names = {f.name for f in dataclasses.fields(cls)}
        if isinstance(model_cfg, ModelConfig):
            model_cfg = {name: getattr(model_cfg, name) for name in names}
        values = {k: v for k, v in dict(model_cfg).items() if k in names}
        if switches is not None:
            values.update(switches.record())
        unresolved = [k for k in MemorySwitches.fields() if values.get(k) == AUTO]
        if unresolved:
            raise ValueError(f"model.{unresolved[0]} is 'auto': resolve the run first "
                             f"(planner.resolve_run), or give it a value")
        values["rope_scaling"] = RopeScaling.from_config(values.get("rope_scaling"))
        values["mla"] = MLAConfig.from_config(values.get("mla"))
        values["linear_attention"] = LinearAttentionConfig.from_config(
            values.get("linear_attention"))
        values["mamba"] = MambaConfig.from_config(values.get("mamba"))
        values["moe"] = dataclasses.replace(MoEConfig.from_config(values.get("moe")),
                                            expert_devices=expert_devices,
                                            ragged_exchange=ragged_exchange)
        return cls(**values)

    def __post_init__(self):
        """Its own fields, one line for the first problem (what needs the devices or the layer
        kinds' registry is training/validate.py's)."""
        super().__post_init__()
        # JSON gives lists: a tuple keeps the config hashable (static in jit).
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.num_heads={self.num_heads} is not a multiple of "
                             f"model.num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_scaling.problem():
            raise ValueError(f"model.rope_scaling: {self.rope_scaling.problem()}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r}: choose {', '.join(DTYPES[:-1])} or "
                             f"{DTYPES[-1]}")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(f"model.mlp_activation={self.mlp_activation!r}: choose one of "
                             f"{', '.join(MLP_ACTIVATIONS)}")
        for field in ("attn_logit_soft_cap", "final_logit_soft_cap", "query_scale",
                      "rope_local_theta"):
            if getattr(self, field) < 0:
                raise ValueError(f"model.{field}={getattr(self, field)} must be positive, or 0 "
                                 f"for none")
        if self.scan_layers is True and self.moe.dense_prefix(self.num_layers) is None:
            raise ValueError("model.scan_layers stacks identical blocks (after a dense first "
                             f"few), but model.moe makes layers {list(self.sparse_layers)} "
                             "sparse and the others dense: set model.scan_layers=False")
        rotary = self.partial_rotary_factor * self.head_dim
        if not 0 <= self.partial_rotary_factor <= 1 or rotary != int(rotary) or rotary % 2:
            raise ValueError(f"model.partial_rotary_factor {self.partial_rotary_factor} must "
                             f"rotate an even number of the {self.head_dim} head dimensions "
                             f"(0: no RoPE)")
        if self.mla.enabled and (self.attention_bias or self.qkv_bias or self.qk_norm
                                 or self.attention_sinks or self.attention_output_gate):
            raise ValueError("model.mla: latent attention has no biases, q/k norms, sinks or "
                             "output gate: set attention_bias, qkv_bias, qk_norm, "
                             "attention_sinks and attention_output_gate False")

    @property
    def first_stacked(self) -> int:
        """With scan_layers, the first block of the stack: the dense blocks before it run one
        by one (DeepSeek's first_k_dense_replace); 0 when every block is alike."""
        return self.moe.dense_prefix(self.num_layers) or 0

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        """The blocks whose MLP is the expert layer (model/moe.py), in order."""
        return self.moe.sparse_layers(self.num_layers)

    @property
    def expert_mlp_dim(self) -> int:
        return self.moe.width(self.mlp_dim)

    @property
    def reruns_attention(self) -> bool:
        """The backward runs each block's attention forward again (remat keeps no output of
        it): its tiles and K/V transfers are paid twice."""
        return self.remat and self.remat_policy != "attention"

    @property
    def reruns_matmuls(self) -> bool:
        """The backward recomputes each block's projections and MLP (remat keeps no matmul
        output: every policy but 'dots')."""
        return self.remat and self.remat_policy != "dots"

    def layer_type(self, i: int) -> str:
        """Block i's layer type ('full_attention', 'sliding_attention', 'linear_attention',
        'mamba': which kind mixes its tokens is model.mixers.mixer_at's to say)."""
        return self.layer_types[i] if self.layer_types else FULL

    def window(self, kind: str) -> int | None:
        """The window of a layer of this kind (parallel.attention's `window`)."""
        return self.sliding_window if kind == SLIDING and self.sliding_window else None

    def rope_for(self, kind: str) -> tuple[float, RopeScaling]:
        """(RoPE base, scaling) of a layer of this kind: sliding layers take rope_local_theta
        and no scaling when it is set (Gemma 3), else the full layers' (Mistral, Qwen3)."""
        if kind == SLIDING and self.rope_local_theta:
            return self.rope_local_theta, RopeScaling()
        return self.rope_theta, self.rope_scaling

    @property
    def score_scale(self) -> float | None:
        """The attention score scale (None: parallel.attention's 1 / sqrt(head_dim))."""
        return self.query_scale ** -0.5 if self.query_scale else None

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weights_dtype(self):
        return jnp.dtype(self.param_dtype)


def parameter_fields() -> tuple[str, ...]:
    """Every `model.*` field that fixes the parameters' shapes or tree, dotted as a config
    names it ('qk_norm', 'moe.num_experts'): a checkpoint made with other values of any of them
    cannot be restored (training/resume.py refuses it in one line)."""
    return weight_fields(ModelConfig, SHAPE) + tuple(
        f"moe.{name}" for name in weight_fields(MoEConfig, SHAPE)) + tuple(
        f"linear_attention.{name}" for name in weight_fields(LinearAttentionConfig, SHAPE)) + tuple(
        f"mamba.{name}" for name in weight_fields(MambaConfig, SHAPE))

