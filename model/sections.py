"""The sections of `model` in a run config that are groups of their own (model.moe, model.mla,
model.linear_attention, model.mamba), and how a field says what a checkpoint's weights fix. ModelConfig
(model/config.py) holds one of each; model/config.py re-exports them."""

from __future__ import annotations

import dataclasses

# What a checkpoint's weights fix, marked on the fields below (the one list of them: resume,
# init_from and the stages read weight_fields): SHAPE, the parameters' shapes or their tree (a
# checkpoint made with other values cannot be restored); FUNCTION, what the same parameters
# compute (a source's weights were trained for its values: init_from takes them with the
# weights). TRAINING: how the weights are trained, the source's unless set.
SHAPE, FUNCTION, TRAINING = "shape", "function", "training"


def fixed(kind: str, default=dataclasses.MISSING):
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

    num_experts: int = fixed(SHAPE, 0)  # experts per sparse layer; 0 = no sparse layers
    top_k: int = fixed(FUNCTION, 2)  # experts each token is sent to
    expert_mlp_dim: int = fixed(SHAPE, 0)  # each expert's gated-MLP hidden width; 0 = mlp_dim
    # 'softmax_topk': softmax over every expert's logit, then the k largest (Qwen3-MoE,
    # Mixtral, DeepSeek-V2); 'topk_softmax': the k largest logits, then a softmax over those k
    # (GPT-OSS); 'sigmoid_topk': each expert's sigmoid, the k largest of sigmoid + a correction
    # bias chosen, weighted by their sigmoids (DeepSeek-V3, GLM-4.5).
    router: str = fixed(FUNCTION, "softmax_topk")
    norm_topk_prob: bool = fixed(FUNCTION, True)  # softmax/sigmoid_topk: the k weights sum to 1
    # Group-limited routing (DeepSeek): the experts in n_group groups, each token choosing among
    # the topk_group groups of highest score (a group's best expert; with sigmoid_topk its best
    # two's sum) only.
    n_group: int = fixed(FUNCTION, 1)
    topk_group: int = fixed(FUNCTION, 1)
    routed_scaling_factor: float = fixed(FUNCTION, 1.0)  # the routed experts' weights times this
    # sigmoid_topk: each step, the correction bias of an expert that got more than its even
    # share of the tokens goes down by this, one that got fewer up (DeepSeek-V3's auxiliary-
    # loss-free balancing, outside the gradient; its paper's 0.001); 0 = the bias stays as it is.
    bias_update_speed: float = fixed(TRAINING, 0.0)
    # Shared experts (DeepSeek, GLM-4.5, Qwen2-MoE): a dense gated MLP every token goes through
    # beside the routed ones, num_shared_experts x shared_expert_mlp_dim wide (0: the routed
    # experts' width); with shared_expert_gate its output is scaled by sigmoid(x w) (Qwen2-MoE).
    num_shared_experts: int = fixed(SHAPE, 0)
    shared_expert_mlp_dim: int = fixed(SHAPE, 0)
    shared_expert_gate: bool = fixed(SHAPE, False)
    first_dense_layers: int = fixed(SHAPE, 0)  # the first k blocks dense (DeepSeek's first_k_dense_replace)
    capacity_factor: float = fixed(TRAINING, 0.0)  # 0: dropless; c: at most c T k / E tokens
    aux_loss_coef: float = fixed(TRAINING, 0.0)  # weight of the load-balancing loss
    z_loss_coef: float = fixed(TRAINING, 0.0)  # weight of the router z-loss
    # layer i sparse when (i + 1) % this == 0 (Qwen3-MoE's name)
    decoder_sparse_step: int = fixed(SHAPE, 1)
    # layers kept dense whatever decoder_sparse_step says
    mlp_only_layers: tuple[int, ...] = fixed(SHAPE, ())
    expert_bias: bool = fixed(SHAPE, False)  # biases on the router and the experts' matmuls
    # GPT-OSS's clamped SwiGLU (its limit, 7.0); 0 = act(gate) * up
    swiglu_limit: float = fixed(FUNCTION, 0.0)
    # How the run splits the experts, set by ModelConfig.from_config, not model.moe settings:
    # the devices they are split over (the run's mesh.expert; parallel/experts.py expert_split), and
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
    """Multi-head latent attention (`model.mla` of a run config; model/mixers/latent.py): DeepSeek-V2/V3,
    Kimi K2, Moonlight. kv_lora_rank 0 (the default) is ordinary attention; else every layer's
    keys and values come from a kv_lora_rank-wide latent and one RoPE key all heads share, and
    model.head_dim and num_kv_heads do not apply (each head: qk_nope + qk_rope wide keys,
    v_head_dim wide values)."""

    kv_lora_rank: int = 0  # the latent's width (DeepSeek-V3: 512); 0 = ordinary attention
    q_lora_rank: int = 0  # the queries' latent (DeepSeek-V3: 1536); 0: straight from x (V2-Lite)
    qk_nope_head_dim: int = 128  # a head's key/query part without RoPE
    qk_rope_head_dim: int = 64  # the rotated part, the key's shared by every head
    v_head_dim: int = 128  # a head's value width
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


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet layers (`model.linear_attention`; model/mixers/gated_deltanet.py): the blocks
    whose model.layer_types entry is 'linear_attention' (Qwen3-Next: three of every four) mix
    tokens by the gated delta rule instead of softmax attention, a state of key_head_dim x
    value_head_dim numbers per value head whatever the length. num_key_heads 0 (the default):
    no such layers. Each key head (its q and k) serves num_value_heads / num_key_heads value
    heads."""

    num_key_heads: int = fixed(SHAPE, 0)  # heads of q and k (Qwen3-Next-80B: 16); 0 = no layers
    # heads of v, a multiple of num_key_heads (Qwen3-Next-80B: 32)
    num_value_heads: int = fixed(SHAPE, 0)
    key_head_dim: int = fixed(SHAPE, 128)  # a key head's (and its query's) width: the state's rows
    value_head_dim: int = fixed(SHAPE, 128)  # a value head's width: the state's columns
    conv_kernel: int = fixed(SHAPE, 4)  # the causal depthwise convolution's width, in tokens
    # tokens the rule takes at once (a triangular solve each): numerics only, any value resumes
    chunk_size: int = 64

    def __post_init__(self):
        if not self.num_key_heads:
            return
        problem = next((f"{name} {getattr(self, name)} must be positive" for name in (
            "num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel",
            "chunk_size") if getattr(self, name) < 1), None) or (
            f"num_value_heads {self.num_value_heads} must be a multiple of num_key_heads "
            f"{self.num_key_heads} (each key head serves a group of value heads)"
            if self.num_value_heads % self.num_key_heads else None)
        if problem:
            raise ValueError(f"model.linear_attention: {problem}")

    @property
    def enabled(self) -> bool:
        return self.num_key_heads > 0

    @property
    def conv_channels(self) -> int:
        """What the convolution runs over: every key head's q and k, every value head's v."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim

    @property
    def state_numbers(self) -> int:
        """A layer's recurrent state per sequence: key_head_dim x value_head_dim per value
        head."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim

    @classmethod
    def from_config(cls, section) -> "LinearAttentionConfig":
        """From `model.linear_attention` (a LinearAttentionConfig, a mapping or None)."""
        return section if isinstance(section, cls) else cls(**dict(section or {}))


@dataclasses.dataclass(frozen=True)
class MambaConfig:
    """Mamba2 layers (`model.mamba`; model/mixers/mamba2.py): the blocks whose model.layer_types entry is
    'mamba' (Granite 4.0's hybrids: most of their layers) mix tokens by Mamba2's SSD rule, a
    state of state_size x head_dim numbers per head whatever the length. num_heads 0 (the
    default): no such layers. The heads share their B and C projections in num_groups groups."""

    num_heads: int = fixed(SHAPE, 0)  # 0 = no such layers (Granite-4.0-H-Small: 128)
    head_dim: int = fixed(SHAPE, 64)  # P: each head's width (the layer is num_heads P wide)
    state_size: int = fixed(SHAPE, 128)  # N
    num_groups: int = fixed(SHAPE, 1)  # groups of heads sharing B and C
    conv_kernel: int = fixed(SHAPE, 4)  # the causal depthwise convolution's width, in tokens
    conv_bias: bool = fixed(SHAPE, True)  # a bias on that convolution
    # tokens the rule takes at once: numerics only, any value resumes
    chunk_size: int = 64

    def __post_init__(self):
        if not self.num_heads:
            return
        problem = next((f"{name} {getattr(self, name)} must be positive" for name in (
            "num_heads", "head_dim", "state_size", "num_groups", "conv_kernel", "chunk_size")
            if getattr(self, name) < 1), None) or (
            f"num_heads {self.num_heads} must be a multiple of num_groups {self.num_groups}"
            if self.num_heads % self.num_groups else None)
        if problem:
            raise ValueError(f"model.mamba: {problem}")

    @property
    def enabled(self) -> bool:
        return self.num_heads > 0

    @property
    def inner(self) -> int:
        """The layer's width: its x, its gate z and its output before out_proj."""
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """What the convolution runs over: x, then every group's B, then every group's C."""
        return self.inner + 2 * self.num_groups * self.state_size

    @property
    def state_numbers(self) -> int:
        """A layer's recurrent state per sequence: state_size x head_dim per head."""
        return self.num_heads * self.state_size * self.head_dim

    @classmethod
    def from_config(cls, section) -> "MambaConfig":
        """From `model.mamba` (a MambaConfig, a mapping or None)."""
        return section if isinstance(section, cls) else cls(**dict(section or {}))
