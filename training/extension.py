"""Ways to extend a trained context, each as the RoPE fields of the extended model: the methods
scripts/bench/extension.py trains and compares from one short checkpoint.

    rope("yarn", theta=10_000.0, head_dim=32, trained=512, factor=32.0)
    # -> {'rope_theta': 10000.0, 'rope_scaling': {'rope_type': 'yarn', 'factor': 32.0,
    #     'original_max_position_embeddings': 512}}

- zero-shot: no change and no extension training: the short checkpoint read at every length.
- theta: a larger base, theta * factor^(d / (d - 2)) (the "NTK-aware" rule: the slowest pair
  turns over factor x the trained length as far as it turned over the trained length, the
  fastest pairs barely change).
- linear: position interpolation, every frequency divided by factor.
- yarn: YaRN, only the pairs that turned less than once over the trained length interpolated,
  a ramp between, the attention logits sharpened by 0.1 ln(factor) + 1.
- llama3: Llama 3.1's rule, the same idea with wavelength limits and a smooth blend.

`factor` is how many times the trained length the extended model should reach; the rules are
model/rope.py's, under Hugging Face's names, so an extended model exports as it trained.

Past its longest trained length any of them can also be read with dynamic scaling
(`stretched`): for a prompt of n > trained tokens the RoPE is stretched once more by
n / trained, so that the prompt's farthest distances turn no farther than training's did (the
YaRN paper's "dynamic scaling"; for plain RoPE, the NTK-aware base for that ratio). It costs no
training and changes nothing at or below the trained length.

    stretched({"rope_theta": 1e4, "head_dim": 32,
               "rope_scaling": {"rope_type": "yarn", "factor": 64.0}}, trained=8192, length=16384)
    # -> {'rope_scaling': {'factor': 128.0}}
"""

from __future__ import annotations

METHODS = ("zero-shot", "theta", "linear", "yarn", "llama3")


def rope(method: str, *, theta: float, head_dim: int, trained: int, factor: float) -> dict:
    """The model's RoPE fields (rope_theta, rope_scaling) for `method`."""
    plain = {"rope_type": "default"}
    if method == "zero-shot":
        return {"rope_theta": theta, "rope_scaling": plain}
    if method == "theta":
        return {"rope_theta": theta * factor ** (head_dim / (head_dim - 2)),
                "rope_scaling": plain}
    if method == "linear":
        return {"rope_theta": theta, "rope_scaling": {"rope_type": "linear", "factor": factor}}
    if method in ("yarn", "llama3"):
        return {"rope_theta": theta,
                "rope_scaling": {"rope_type": method, "factor": factor,
                                 "original_max_position_embeddings": trained}}
    raise ValueError(f"extension method {method!r}: choose one of {', '.join(METHODS)}")


def stretched(model, *, trained: int, length: int) -> dict:
    """Overrides of config.model's RoPE fields that read `length` tokens with dynamic scaling
    (`model`: a run config's model section, its rope_theta, head_dim and rope_scaling, a
    model.rope.RopeScaling); {} when length <= trained. A scaled
    RoPE (linear, yarn, llama3) gets its factor times length / trained (YaRN's attention factor,
    when derived, follows it); plain RoPE its base raised as `theta` does for that ratio."""
    ratio = length / trained
    if ratio <= 1:
        return {}
    scaling = model.rope_scaling
    if scaling.rope_type == "default":
        d = model.head_dim
        return {"rope_theta": model.rope_theta * ratio ** (d / (d - 2))}
    return {"rope_scaling": {"factor": scaling.factor * ratio}}
