"""RoPE's frequencies, plain or scaled to extend a pretrained model's context.

    inv_freq, attention_factor = frequencies(head_dim=128, theta=500_000.0,
                                             scaling=RopeScaling("llama3", factor=8.0,
                                                                 original_max_position_embeddings=8192))

The rotation of pair i at position p is p * inv_freq[i]; a scaling rule changes inv_freq (and,
for YaRN, multiplies cos and sin by attention_factor, which scales every attention logit by its
square). Positions stay the ORIGINAL ones, so each layout permutes tokens and positions together
and stays exact. The rules and their parameters are Hugging Face's `rope_type`s:

- 'default': inv_freq[i] = theta^(-2i/Dh).
- 'linear' (position interpolation): every frequency divided by `factor`.
- 'llama3' (Llama 3.1): wavelengths longer than original_max_position_embeddings /
  low_freq_factor are divided by `factor`, shorter than original / high_freq_factor kept, and
  those between blended smoothly.
- 'yarn': frequencies blended between interpolated (/ factor) and kept along a ramp over the
  dimensions whose number of rotations over original_max_position_embeddings lies between
  beta_slow and beta_fast; attention_factor = 0.1 ln(factor) + 1 unless given (or derived from
  mscale / mscale_all_dim).

Computed once per shape in float64 and handed to the model as float32 constants.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """config.model.rope_scaling; fields a rule does not read are ignored by it."""

    rope_type: str = "default"  # 'default' (none) | 'linear' | 'llama3' | 'yarn'
    factor: float = 1.0  # linear, llama3, yarn: how many times longer the context becomes
    original_max_position_embeddings: int = 0  # llama3, yarn: the pretrained context length
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn: rotations above which a dimension is kept
    beta_slow: float = 1.0  # yarn: rotations below which a dimension is interpolated
    attention_factor: float = 0.0  # yarn: cos/sin multiplier; 0 = derived from factor
    mscale: float = 0.0  # yarn (DeepSeek style): with mscale_all_dim, the derived factor's ratio
    mscale_all_dim: float = 0.0  # yarn (DeepSeek style): the other side of that ratio
    truncate: bool = True  # yarn: round the ramp's ends to whole dimensions

    @classmethod
    def from_config(cls, section) -> "RopeScaling":
        """From a config's model.rope_scaling (a RopeScaling, a mapping; None or absent: no
        scaling)."""
        if isinstance(section, cls):
            return section
        if not section:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(section).items() if k in names})

    def parameters(self) -> dict:
        """The fields its rule reads, under Hugging Face's names (config.json's
        `rope_parameters`, without rope_theta). Optional ones appear only when set."""
        keys = {"default": (), "linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                           "original_max_position_embeddings"),
                "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                         "truncate")}[self.rope_type]
        out = {"rope_type": self.rope_type, **{k: getattr(self, k) for k in keys}}
        if self.rope_type == "yarn":
            out.update({k: getattr(self, k) for k in ("attention_factor", "mscale",
                                                      "mscale_all_dim") if getattr(self, k)})
        return out

    def problem(self) -> str | None:
        """What makes these parameters unusable, for a one-line error; None if they are fine."""
        if self.rope_type not in ROPE_TYPES:
            return f"rope_type={self.rope_type!r}: choose one of {', '.join(ROPE_TYPES)}"
        if self.rope_type == "default":
            return None
        if self.factor < 1.0:
            return f"factor={self.factor} must be at least 1 (the context grows by it)"
        if self.rope_type in ("llama3", "yarn") and self.original_max_position_embeddings < 1:
            return (f"rope_type={self.rope_type!r} needs original_max_position_embeddings, the "
                    f"pretrained context length (e.g. 8192 for Llama 3)")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            return (f"high_freq_factor={self.high_freq_factor} must exceed "
                    f"low_freq_factor={self.low_freq_factor}")
        if self.rope_type == "yarn" and self.beta_fast <= self.beta_slow:
            return f"beta_fast={self.beta_fast} must exceed beta_slow={self.beta_slow}"
        return None


@functools.lru_cache(maxsize=64)
def frequencies(head_dim: int, theta: float,
                scaling: RopeScaling = RopeScaling()) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [head_dim / 2], attention_factor) for one head size, base and rule."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rule = scaling.rope_type
    factor = 1.0
    if rule == "linear":
        inv_freq = inv_freq / scaling.factor
    elif rule == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    elif rule == "yarn":
        inv_freq, factor = _yarn(inv_freq, head_dim, theta, scaling)
    elif rule != "default":
        raise ValueError(RopeScaling.problem(scaling))
    return inv_freq.astype(np.float32), float(factor)


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    original = s.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_limit, short_limit = original / s.low_freq_factor, original / s.high_freq_factor
    scaled = np.where(wavelength > long_limit, inv_freq / s.factor, inv_freq)
    # Between the two limits: a blend whose weight grows with the rotations over the original
    # context, from all-interpolated at the long limit to all-kept at the short one.
    weight = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - weight) * scaled / s.factor + weight * scaled
    between = (wavelength >= short_limit) & (wavelength <= long_limit)
    return np.where(between, blended, scaled)


def _yarn(inv_freq: np.ndarray, head_dim: int, theta: float, s: RopeScaling):
    def dimension(rotations):  # the dimension that turns `rotations` times over the context
        return (head_dim * math.log(s.original_max_position_embeddings
                                    / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dimension(s.beta_fast), dimension(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of one step
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    kept = 1.0 - ramp  # 1: the dimension keeps its frequency (extrapolates), 0: interpolated
    inv_freq = (inv_freq / s.factor) * (1.0 - kept) + inv_freq * kept
    factor = s.attention_factor
    if not factor:
        factor = (_mscale(s.factor, s.mscale) / _mscale(s.factor, s.mscale_all_dim)
                  if s.mscale and s.mscale_all_dim else _mscale(s.factor))
    return inv_freq, factor


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
