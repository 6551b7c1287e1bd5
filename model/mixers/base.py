"""What a kind of token mixer declares: everything the rest of the code asks of a block's first
half (the decoder builds it, decoding makes its cache, the planner counts its parameters, FLOPs
and state), so that a new kind is one file and one line in model/mixers/__init__.py's MIXERS.

`m` below is a model.ModelConfig, or a run config's `model` section as the planner reads it
(its groups, `m.mla`, `m.linear_attention`, ..., may still be mappings: each kind reads its own
group through the group's `from_config`).
"""

from __future__ import annotations

from parallel.recurrent import RecurrentShape


class Mixer:
    """One kind of token mixer. Subclasses set the class attributes and override what differs;
    the registry holds one instance of each."""

    name: str = ""  # its key in MIXERS
    layer_types: tuple[str, ...] = ()  # the model.layer_types entries it can run
    module: type | None = None  # the nnx.Module: module(cfg, mesh, rngs, choice)

    def serves(self, m) -> bool:
        """Whether this kind runs its layer types in model `m` (where two kinds share a layer
        type, the first in MIXERS that serves it does: latent attention where model.mla gives a
        latent, else softmax attention)."""
        return True

    def check(self, m) -> None:
        """ValueError, one line, for a model that has layers of this kind it cannot build."""

    def build(self, cfg, mesh, rngs, choice):
        """The layer's module, its parameters created sharded over the mesh; `choice` (the run's
        parallel.AttentionChoice) says how it crosses the 'seq' devices."""
        return self.module(cfg, mesh, rngs, choice)

    def init_cache(self, cfg, batch: int, max_len: int):
        """Its decoding cache for `batch` rows of up to `max_len` tokens, zeros
        (model/mixers/cache.py's types)."""
        raise NotImplementedError(self.name)

    def matrix_params(self, m) -> int:
        """Parameters of one layer's matrices (what takes part in matmuls: sharded)."""
        raise NotImplementedError(self.name)

    def vector_params(self, m) -> int:
        """Parameters of one layer's vectors (norm scales, biases, decays, convolutions:
        replicated)."""
        return 0

    def recurrent(self, m) -> RecurrentShape | None:
        """A recurrent kind's shape (its FLOPs and state); None for a kind that attends over
        keys and values."""
        return None

    def head_widths(self, m) -> tuple[int, int]:
        """An attending kind's (query/key, value) widths of a head, for its attention FLOPs."""
        raise NotImplementedError(self.name)

    def kernel_heads(self, m) -> tuple[int, int]:
        """An attending kind's (key/value heads, head width) as the attention kernel tiles
        them."""
        raise NotImplementedError(self.name)

    def exchanged_width(self, m, mla_exchange: str) -> int:
        """Numbers a token passes between devices in place of its keys and values (latent
        attention's latent and RoPE key, under parallel.mla_exchange 'latent'); 0: its keys
        and values travel."""
        return 0

    def __repr__(self) -> str:
        return f"<mixer {self.name}>"
