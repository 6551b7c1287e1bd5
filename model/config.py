"""The model's hyper-parameters, read from the `model` section of a run config."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from model.rope import RopeScaling


# What a rematerialised block saves for its backward (jax.checkpoint policies): 'nothing' (all of
# it is recomputed: least memory) or 'dots' (the outputs of its projections and MLP matmuls are
# kept, so the backward recomputes only the cheap elementwise work and the attention kernel), or
# 'offload': as 'nothing', but each block's input is kept in host memory (memory kind
# 'pinned_host') instead of HBM and copied back for the block's backward (TPU, GPU).
REMAT_POLICIES = {"nothing": "nothing_saveable",  # name -> jax.checkpoint_policies.<attribute>
                  "dots": "dots_with_no_batch_dims_saveable",
                  "offload": "save_and_offload_only_these_names"}
BLOCK_INPUT = "block_input"  # the checkpoint name of a block's input (what 'offload' moves)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA when fewer than num_heads; 1 = MQA)
    head_dim: int
    mlp_dim: int  # SwiGLU hidden width
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling = RopeScaling()  # model/rope.py: none, linear, llama3, yarn
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # output projection = embedding matrix transposed
    remat: bool = False  # recompute each block in the backward pass (saves activations)
    remat_policy: str = "nothing"  # with remat, what a block keeps: REMAT_POLICIES
    scan_layers: bool = False  # blocks stacked and run by one lax.scan (compile time flat in L)
    loss_chunk: int = 0  # output projection + loss this many tokens per device at a time; 0 = all
    mlp_chunk: int = 0  # SwiGLU this many tokens per device at a time; 0 = all at once
    dtype: str = "float32"  # compute dtype (e.g. 'bfloat16'); parameters stay param_dtype
    param_dtype: str = "float32"
    attention_layout: str = "striped"  # where tokens sit on the seq shards: parallel.LAYOUTS
    attention_strategy: str = "ring"  # how K/V meet the queries: parallel.STRATEGIES
    attention_kernel: str = "auto"  # the block-pair kernel: 'auto' or parallel.KERNELS
    ulysses_degree: int = 0  # strategy 'usp': devices per all-to-all group; 0 = not set
    tile_q: int = 0  # attention tile sizes; 0 = parallel.attention's default
    tile_k: int = 0

    @classmethod
    def from_config(cls, model_cfg, attention=None) -> "ModelConfig":
        """Builds from a run config's `model` section (unknown fields are ignored) and the run's
        resolved attention (a parallel.AttentionChoice: layout, strategy, kernel, tiles)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in dict(model_cfg).items() if k in names}
        values["rope_scaling"] = RopeScaling.from_config(values.get("rope_scaling"))
        if attention is not None:
            values.update(attention_layout=attention.layout,
                          attention_strategy=attention.strategy,
                          attention_kernel=attention.kernel, tile_q=attention.tile_q,
                          tile_k=attention.tile_k,
                          ulysses_degree=(attention.ulysses_degree
                                          if attention.strategy == "usp" else 0))
        return cls(**values)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weights_dtype(self):
        return jnp.dtype(self.param_dtype)
