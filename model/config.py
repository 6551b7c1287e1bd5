"""The model's hyper-parameters, read from the `model` section of a run config."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from model.rope import RopeScaling
from parallel.choice import AUTO, AttentionChoice
from parallel.strategies import BASELINE


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
    """How the model trades compute for memory: the five `model.*` switches of a run config,
    each 'auto' there by default and resolved once by the planner (planner/switches.py) to the
    fastest setting it predicts to fit; a value given in the config always wins. The defaults
    here are all switches off: what a model built in code, or read only for its shapes, runs
    with."""

    remat: bool = False  # recompute each block in the backward pass
    remat_policy: str = "nothing"  # with remat, what a block keeps: REMAT_POLICIES
    scan_layers: bool = False  # the blocks stacked under one lax.scan
    loss_chunk: int = 0  # output projection + loss this many tokens per device at a time; 0 = all
    mlp_chunk: int = 0  # the MLP this many tokens per device at a time; 0 = all at once

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def record(self) -> dict:
        return dataclasses.asdict(self)

    def label(self) -> str:
        """'remat (nothing), scanned layers, loss in chunks of 4,096, MLP in chunks of 8,192';
        'no memory switches'."""
        parts = ([f"remat ({self.remat_policy})"] if self.remat else []) + (
            ["scanned layers"] if self.scan_layers else []) + (
            [f"loss in chunks of {self.loss_chunk:,}"] if self.loss_chunk else []) + (
            [f"MLP in chunks of {self.mlp_chunk:,}"] if self.mlp_chunk else [])
        return ", ".join(parts) or "no memory switches"


# What a checkpoint's weights fix, marked on the fields below (the one list of them: resume,
# init_from and the stages read weight_fields): SHAPE, the parameters' shapes or their tree (a
# checkpoint made with other values cannot be restored); FUNCTION, what the same parameters
# compute (a source's weights were trained for its values: init_from takes them with the
# weights). TRAINING: how the weights are trained, the source's unless set.
SHAPE, FUNCTION, TRAINING = "shape", "function", "training"


def _fixed(kind: str, default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata={"fixed_by_weights": kind})


def weight_fields(cls, *kinds: str) -> tuple[str, ...]:
    """The fields of dataclass `cls` (ModelConfig, MoEConfig) marked with one of `kinds`, in
    their order: weight_fields(ModelConfig, SHAPE) -> ('vocab_size', 'd_model', ...)."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.metadata.get("fixed_by_weights") in kinds)


# Qwen3-MoE, Mixtral, DeepSeek-V2; GPT-OSS; DeepSeek-V3, GLM-4.5 (model/moe.py route)
ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_topk")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts layers (`model.moe` of a run config; model/moe.py). The default, no
    experts, leaves every block's MLP dense: today's models and checkpoints unchanged."""

    num_experts: int = _fixed(SHAPE, 0)  # experts per sparse layer; 0 = no sparse layers
    top_k: int = _fixed(FUNCTION, 2)  # experts each token is sent to
    expert_mlp_dim: int = _fixed(SHAPE, 0)  # each expert's gated-MLP hidden width; 0 = mlp_dim
    # 'softmax_topk': softmax over every expert's logit, then the k largest (Qwen3-MoE,
    # Mixtral, DeepSeek-V2); 'topk_softmax': the k largest logits, then a softmax over those k
    # (GPT-OSS); 'sigmoid_topk': each expert's sigmoid, the k largest of sigmoid + a correction
    # bias chosen, weighted by their sigmoids (DeepSeek-V3, GLM-4.5).
    router: str = _fixed(FUNCTION, "softmax_topk")
    norm_topk_prob: bool = _fixed(FUNCTION, True)  # softmax/sigmoid_topk: the k weights sum to 1
    # Group-limited routing (DeepSeek): the experts in n_group groups, each token choosing among
    # the topk_group groups of highest score (a group's best expert; with sigmoid_topk its best
    # two's sum) only.
    n_group: int = _fixed(FUNCTION, 1)
    topk_group: int = _fixed(FUNCTION, 1)
    routed_scaling_factor: float = _fixed(FUNCTION, 1.0)  # the routed experts' weights times this
    # sigmoid_topk: each step, the correction bias of an expert that got more than its even
    # share of the tokens goes down by this, one that got fewer up (DeepSeek-V3's auxiliary-
    # loss-free balancing, outside the gradient; its paper's 0.001); 0 = the bias stays as it is.
    bias_update_speed: float = _fixed(TRAINING, 0.0)
    # Shared experts (DeepSeek, GLM-4.5, Qwen2-MoE): a dense gated MLP every token goes through
    # beside the routed ones, num_shared_experts x shared_expert_mlp_dim wide (0: the routed
    # experts' width); with shared_expert_gate its output is scaled by sigmoid(x w) (Qwen2-MoE).
    num_shared_experts: int = _fixed(SHAPE, 0)
    shared_expert_mlp_dim: int = _fixed(SHAPE, 0)
    shared_expert_gate: bool = _fixed(SHAPE, False)
    first_dense_layers: int = _fixed(SHAPE, 0)  # the first k blocks dense (DeepSeek's first_k_dense_replace)
    capacity_factor: float = _fixed(TRAINING, 0.0)  # 0: dropless; c: at most c T k / E tokens
    aux_loss_coef: float = _fixed(TRAINING, 0.0)  # weight of the load-balancing loss
    z_loss_coef: float = _fixed(TRAINING, 0.0)  # weight of the router z-loss
    # layer i sparse when (i + 1) % this == 0 (Qwen3-MoE's name)
    decoder_sparse_step: int = _fixed(SHAPE, 1)
    # layers kept dense whatever decoder_sparse_step says
    mlp_only_layers: tuple[int, ...] = _fixed(SHAPE, ())
    expert_bias: bool = _fixed(SHAPE, False)  # biases on the router and the experts' matmuls
    # GPT-OSS's clamped SwiGLU (its limit, 7.0); 0 = act(gate) * up
    swiglu_limit: float = _fixed(FUNCTION, 0.0)
    # How the run splits the experts, set by ModelConfig.from_config, not model.moe settings:
    # the devices they are split over (the run's mesh.expert; model/moe.py expert_split), and
    # whether the tokens travel by ragged all-to-alls (the platform has them: TPU and GPU).
    expert_devices: int = 1
    ragged_exchange: bool = False
    DERIVED = ("expert_devices", "ragged_exchange")

    @classmethod
    def from_config(cls, section) -> "MoEConfig":
        """From `model.moe` (a MoEConfig, a mapping or None; unknown fields are an error)."""
        if isinstance(section, cls):
            return section
        values = dict(section or {})
        allowed = [f.name for f in dataclasses.fields(cls) if f.name not in cls.DERIVED]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"model.moe.{unknown[0]} is not a mixture-of-experts setting: use "
                             f"{', '.join(allowed)} (experts over devices: mesh.expert)")
        if "mlp_only_layers" in values:  # a list, from JSON
            values["mlp_only_layers"] = tuple(values["mlp_only_layers"])
        return cls(**values)

    def __post_init__(self):
        if not self.num_experts:
            return
        problem = (
            f"router {self.router!r} is not one of {', '.join(ROUTERS)}"
            if self.router not in ROUTERS else
            f"top_k {self.top_k} must be 1 to num_experts ({self.num_experts})"
            if not 1 <= self.top_k <= self.num_experts else
            f"decoder_sparse_step {self.decoder_sparse_step} must be at least 1"
            if self.decoder_sparse_step < 1 else
            f"capacity_factor {self.capacity_factor} must be 0 (dropless) or positive"
            if self.capacity_factor < 0 else
            f"n_group {self.n_group} must divide num_experts ({self.num_experts})"
            if self.n_group < 1 or self.num_experts % self.n_group else
            f"topk_group {self.topk_group} must be 1 to n_group ({self.n_group})"
            if not 1 <= self.topk_group <= self.n_group else
            f"top_k {self.top_k} is more than the {self.topk_group} group(s) of "
            f"{self.num_experts // self.n_group} experts a token chooses from (topk_group)"
            if self.top_k > self.topk_group * (self.num_experts // self.n_group) else
            "bias_update_speed needs router 'sigmoid_topk' (the correction bias is its own)"
            if self.bias_update_speed and self.router != "sigmoid_topk" else
            "shared_expert_gate needs num_shared_experts"
            if self.shared_expert_gate and not self.num_shared_experts else
            f"num_experts {self.num_experts} must split evenly over mesh.expert = "
            f"{self.expert_devices} devices" if self.num_experts % self.expert_devices else None)
        if problem:
            raise ValueError(f"model.moe: {problem}")

    def mixed(self, num_layers: int) -> bool:
        """Whether some blocks are sparse and some dense."""
        return 0 < len(self.sparse_layers(num_layers)) < num_layers

    def dense_prefix(self, num_layers: int) -> int | None:
        """How many blocks lead the model dense before only sparse ones follow (DeepSeek's
        first_k_dense_replace): 0 when all blocks are alike, None when sparse and dense blocks
        interleave otherwise (then they cannot be stacked: scan_layers)."""
        sparse = self.sparse_layers(num_layers)
        if not self.mixed(num_layers):
            return 0
        return sparse[0] if sparse == tuple(range(sparse[0], num_layers)) else None

    def sparse_layers(self, num_layers: int) -> tuple[int, ...]:
        """The blocks whose MLP is the expert layer (model/moe.py), in order."""
        return tuple(i for i in range(num_layers) if self.sparse(i))

    def width(self, mlp_dim: int) -> int:
        """Each expert's hidden width: expert_mlp_dim, or the dense MLP's when 0."""
        return self.expert_mlp_dim or mlp_dim

    def sparse(self, i: int) -> bool:
        """Whether block i's MLP is the expert layer."""
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and i >= self.first_dense_layers and (i + 1) % self.decoder_sparse_step == 0)

    def shared_width(self, mlp_dim: int) -> int:
        """The shared experts' MLP width (0: none)."""
        return self.num_shared_experts * (self.shared_expert_mlp_dim or self.width(mlp_dim))

    @property
    def correction_bias(self) -> bool:
        """Whether the layer has DeepSeek-V3's per-expert bias on the choice (sigmoid_topk)."""
        return self.router == "sigmoid_topk"


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (`model.mla` of a run config; model/mla.py): DeepSeek-V2/V3,
    Kimi K2, Moonlight. kv_lora_rank 0 (the default) is ordinary attention; else every layer's
    keys and values come from a kv_lora_rank-wide latent and one RoPE key all heads share, and
    model.head_dim and num_kv_heads do not apply (each head: qk_nope + qk_rope wide keys,
    v_head_dim wide values)."""

    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # the queries' latent width; 0: queries straight from x (V2-Lite)
    qk_nope_head_dim: int = 128  # a head's key/query part without RoPE
    qk_rope_head_dim: int = 64  # the rotated part, the key's shared by every head
    v_head_dim: int = 128
    rope_interleave: bool = True  # RoPE pairs (2i, 2i+1), DeepSeek's layout (else halves)

    def __post_init__(self):
        if not self.kv_lora_rank:
            return
        problem = next((f"{name} {getattr(self, name)} must be positive" for name in (
            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            if getattr(self, name) < 1), None) or (
            f"q_lora_rank {self.q_lora_rank} must be 0 (no query latent) or positive"
            if self.q_lora_rank < 0 else
            f"qk_rope_head_dim {self.qk_rope_head_dim} must be even (RoPE rotates pairs)"
            if self.qk_rope_head_dim % 2 else None)
        if problem:
            raise ValueError(f"model.mla: {problem}")

    @property
    def enabled(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """What a token's keys and values compress to: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_config(cls, section) -> "MLAConfig":
        """From `model.mla` (an MLAConfig, a mapping or None)."""
        return section if isinstance(section, cls) else cls(**dict(section or {}))


FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)  # Hugging Face's names of a layer's attention
MLP_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = _fixed(SHAPE)
    d_model: int = _fixed(SHAPE)
    num_layers: int = _fixed(SHAPE)
    num_heads: int = _fixed(SHAPE)  # query heads
    num_kv_heads: int = _fixed(SHAPE)  # key/value heads (GQA when fewer than num_heads; 1 = MQA)
    head_dim: int = _fixed(SHAPE)
    mlp_dim: int = _fixed(SHAPE)  # gated MLP hidden width
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling = RopeScaling()  # model/rope.py: none, linear, llama3, yarn
    norm_eps: float = 1e-5
    tie_embeddings: bool = _fixed(SHAPE, False)  # output projection = embedding transposed
    remat: bool = False  # recompute each block in the backward pass (saves activations)
    remat_policy: str = "nothing"  # with remat, what a block keeps: REMAT_POLICIES
    # blocks stacked and run by one lax.scan (compile time flat in L): one tree of parameters
    scan_layers: bool = _fixed(SHAPE, False)
    loss_chunk: int = 0  # output projection + loss this many tokens per device at a time; 0 = all
    mlp_chunk: int = 0  # the MLP this many tokens per device at a time; 0 = all at once
    dtype: str = "float32"  # compute dtype (e.g. 'bfloat16'); parameters stay param_dtype
    param_dtype: str = "float32"
    # The run's resolved sequence-parallel attention (layout, strategy and its degree, kernel,
    # tiles; planner.resolve_run), held whole, as every other reader holds it. None: a model
    # built by hand, which attends striped, by ring, with the backend's kernel and tiles.
    attention: AttentionChoice | None = None
    # Attention per layer (Hugging Face's names and meanings). The defaults leave a Llama model
    # as it was: every layer full causal attention, no caps, no sinks, no norms on q and k.
    # per block, LAYER_TYPES; () = all 'full_attention'
    layer_types: tuple[str, ...] = _fixed(FUNCTION, ())
    sliding_window: int = 0  # keys a sliding layer's query sees, itself included
    rope_local_theta: float = 0.0  # RoPE base of sliding layers (no scaling); 0 = as full ones
    # RMSNorm over head_dim of each query and key head (Qwen3, Gemma 3)
    qk_norm: bool = _fixed(SHAPE, False)
    attn_logit_soft_cap: float = _fixed(FUNCTION, 0.0)  # scores c tanh(s / c) (Gemma 2); 0 = none
    # output logits c tanh(z / c) (Gemma 2); 0 = none
    final_logit_soft_cap: float = _fixed(FUNCTION, 0.0)
    # a learned logit per head in its softmax (GPT-OSS)
    attention_sinks: bool = _fixed(SHAPE, False)
    attention_bias: bool = _fixed(SHAPE, False)  # biases on the q, k, v and o projections (GPT-OSS)
    qkv_bias: bool = _fixed(SHAPE, False)  # biases on q, k and v, not o (Qwen2-MoE, GLM-4.5)
    # RoPE on the first head_dim x this of each head's dimensions only (GLM-4.5: 0.5)
    partial_rotary_factor: float = _fixed(FUNCTION, 1.0)
    # scores scaled by query_scale^-0.5 (Gemma); 0 = head_dim
    query_scale: float = _fixed(FUNCTION, 0.0)
    # Gemma's block: a GELU (tanh) gated MLP, norms after attention and the MLP as well as
    # before, the embedding multiplied by sqrt(d_model).
    mlp_activation: str = _fixed(FUNCTION, "silu")  # 'silu' (SwiGLU) | 'gelu_tanh' (GeGLU)
    sandwich_norms: bool = _fixed(SHAPE, False)
    embed_scale: bool = _fixed(FUNCTION, False)
    moe: MoEConfig = MoEConfig()  # mixture-of-experts layers (none by default)
    mla: MLAConfig = _fixed(SHAPE, MLAConfig())  # latent attention (none by default)

    @classmethod
    def from_config(cls, model_cfg, attention=None, switches=None, expert_devices: int = 1,
                    ragged_exchange: bool = False) -> "ModelConfig":
        """Builds from a run config's `model` section (a ModelConfig whose switches may be
        'auto', or a mapping: a record, config.json's fields; unknown fields are ignored), the
        run's resolved attention (a parallel.AttentionChoice: layout, strategy, kernel, tiles), its
        resolved memory switches (a MemorySwitches, which replaces the section's: they may be
        'auto' there), its mesh.expert and whether its platform has ragged all-to-alls.
        ValueError, one line, for a switch left 'auto' without them."""
        names = {f.name for f in dataclasses.fields(cls)} - {"attention"}
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
        values["moe"] = dataclasses.replace(MoEConfig.from_config(values.get("moe")),
                                            expert_devices=expert_devices,
                                            ragged_exchange=ragged_exchange)
        return cls(**values, attention=attention)

    def __post_init__(self):
        # JSON gives lists: a tuple keeps the config hashable (static in jit).
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.scan_layers is True and self.moe.dense_prefix(self.num_layers) is None:
            raise ValueError("model.scan_layers stacks identical blocks (after a dense first "
                             f"few), but model.moe makes layers {list(self.sparse_layers)} "
                             "sparse and the others dense: set model.scan_layers=False")
        rotary = self.partial_rotary_factor * self.head_dim
        if not 0 < self.partial_rotary_factor <= 1 or rotary != int(rotary) or rotary % 2:
            raise ValueError(f"model.partial_rotary_factor {self.partial_rotary_factor} must "
                             f"rotate an even number of the {self.head_dim} head dimensions")
        if self.mla.enabled and (self.attention_bias or self.qkv_bias or self.qk_norm
                                 or self.attention_sinks):
            raise ValueError("model.mla: latent attention has no biases, q/k norms or sinks: "
                             "set attention_bias, qkv_bias, qk_norm and attention_sinks False")

    @property
    def layout(self) -> str:
        """Where the tokens sit on the 'seq' devices (parallel.LAYOUTS)."""
        return self.attention.layout if self.attention else "striped"

    def attention_kwargs(self) -> dict:
        """parallel.attention's layout, strategy (its degree), kernel and tiles; a tile of 0:
        the kernel's default for each call's length (a saved run read at any length)."""
        if self.attention is None:
            return {"layout": "striped", "strategy": BASELINE, "kernel": "auto"}
        kwargs = self.attention.attention_kwargs()
        return dict(kwargs, tile_q=kwargs["tile_q"] or None, tile_k=kwargs["tile_k"] or None)

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
        """Block i's attention: 'full_attention' or 'sliding_attention'."""
        return self.layer_types[i] if self.layer_types else FULL

    @property
    def kinds(self) -> tuple[str, ...]:
        """The attention kinds the blocks use, in LAYER_TYPES order."""
        used = {self.layer_type(i) for i in range(self.num_layers)}
        return tuple(k for k in LAYER_TYPES if k in used)

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
        f"moe.{name}" for name in weight_fields(MoEConfig, SHAPE))

