"""Token mixers: the first half of every block, one kind per file, registered here.

A block's layer type (model.layer_types, Hugging Face's names) says which kind mixes its tokens:
the first kind of MIXERS that has the type among its `layer_types` and `serves` the model. Each
kind declares (model/mixers/base.py) how it is built, its decoding cache, its parameters, FLOPs
and state for the planner, and what it checks of a config; nothing outside this folder asks
which kind a layer is. A new kind is one file and one line below (tests/model/test_mixers.py adds one).

    softmax         'full_attention', 'sliding_attention'     model/mixers/attention.py
    latent          the same, where model.mla gives a latent   model/mixers/latent.py
    gated_deltanet  'linear_attention'                         model/mixers/gated_deltanet.py
    mamba2          'mamba'                                    model/mixers/mamba2.py
"""

from __future__ import annotations

from model.config import FULL
from model.mixers.attention import SOFTMAX
from model.mixers.base import Mixer
from parallel.recurrent import RecurrentShape
from model.mixers.gated_deltanet import GATED_DELTANET
from model.mixers.latent import LATENT
from model.mixers.mamba2 import MAMBA2

# In the order a layer type's kinds are tried (latent attention before softmax attention).
MIXERS: dict[str, Mixer] = {kind.name: kind for kind in (LATENT, SOFTMAX, GATED_DELTANET, MAMBA2)}


def layer_types() -> tuple[str, ...]:
    """Every layer type some kind runs, in MIXERS' order."""
    return tuple(dict.fromkeys(t for kind in MIXERS.values() for t in kind.layer_types))


def layer_type(m, i: int) -> str:
    """Block i's layer type ('full_attention' where model.layer_types gives none)."""
    types = m.layer_types
    return types[i] if types and i < len(types) else FULL


def mixer_of(m, layer_type: str) -> Mixer:
    """The kind that runs layers of this type in model `m`. ValueError, one line, for a type no
    kind runs."""
    for kind in MIXERS.values():
        if layer_type in kind.layer_types and kind.serves(m):
            return kind
    raise ValueError(f"model.layer_types: {layer_type!r} is not a layer type: use "
                     f"{' or '.join(repr(t) for t in layer_types())}")


def mixer_at(m, i: int) -> Mixer:
    """Block i's kind."""
    return mixer_of(m, layer_type(m, i))


def used(m) -> dict[Mixer, int]:
    """{kind: how many blocks it mixes}, in MIXERS' order."""
    counts = {}
    for i in range(m.num_layers):
        kind = mixer_at(m, i)
        counts[kind] = counts.get(kind, 0) + 1
    return {kind: counts[kind] for kind in MIXERS.values() if kind in counts}


def recurrent(m) -> list[tuple[int, RecurrentShape]]:
    """(layers, shape) of each recurrent kind the model has."""
    return [(n, kind.recurrent(m)) for kind, n in used(m).items() if kind.recurrent(m)]


def recurrent_layers(m) -> int:
    """How many blocks keep a state instead of keys and values."""
    return sum(n for n, _ in recurrent(m))


def check(m) -> None:
    """Each kind the model uses checks the config it is built from (ValueError, one line)."""
    for kind in used(m):
        kind.check(m)


def init_cache(cfg, batch: int, max_len: int) -> list:
    """Every layer's decoding cache, zeros: keys and values in the compute dtype for an
    attending layer (a latent attention layer's expanded ones), a recurrent layer's state and
    convolution inputs."""
    return [mixer_at(cfg, i).init_cache(cfg, batch, max_len) for i in range(cfg.num_layers)]


__all__ = ["MIXERS", "Mixer", "check", "init_cache", "layer_type", "layer_types",
           "mixer_at", "mixer_of", "recurrent", "recurrent_layers", "used"]
