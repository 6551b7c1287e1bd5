"""What the sequence devices of a latent attention model pass (parallel.mla_exchange): each token's
latent and RoPE key, expanded by every device that receives it ('latent', parallel/latent.py), or
its expanded keys and values ('full', parallel.attention). The planner prices both for one
layer on one device and 'auto' takes the cheaper:

    transfer   the tokens a device receives (the strategy's own count, as for any attention)
               times a token's bytes: latent (R + r) in the compute dtype forward, again with
               its float32 gradient backward; full 2 H w (K and V, w = max(qk, v): the kernels
               tile one width) likewise
    expansion  latent only: 2 R H (nope + v) FLOPs a received token forward, three times that
               backward (the block expanded again, dc and d kv_b)
    seconds    max(transfer, the attention's own tiles) + expansion: a ring hides its hops
               behind the tiles, the expansion adds to them

Short blocks (few tokens a device) are bound by the transfer, where the latent's 71x fewer
bytes (DeepSeek-V3) win; long blocks hide any transfer behind their tiles (they grow as n^2),
where the expansion is pure cost. `crossover` is the block length where the two meet.

    price(cfg, degree, seq_len, num_shards, device) -> {'latent': s, 'full': s, ...}
    resolve(config, attention, cfg, num_shards, device) -> 'latent' | 'full'
"""

from __future__ import annotations

import numpy as np

from planner.flops import peak_flops

BACKWARD = 3.0  # the backward's share of the expansion and the tiles, against the forward's


def _widths(cfg):
    mla = cfg.mla
    return (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim,
            max(mla.qk_head_dim, mla.v_head_dim))


def price(cfg, degree: int, seq_len: int, num_shards: int, device, batch_rows: int = 1) -> dict:
    """Seconds of one layer's exchange on one device, forward and backward, for 'latent' and
    'full' (module docstring), with the terms: {'latent', 'full', 'latent_bytes', 'full_bytes',
    'expand_flops', 'tiles_s'}. cfg: a ModelConfig with model.mla; degree: the strategy's
    Ulysses degree (a device expands H / degree heads of every block); device:
    planner/devices.py's."""
    r_latent, rope, nope, v, width = _widths(cfg)
    heads, block = cfg.num_heads, seq_len // num_shards
    size = np.dtype(cfg.dtype).itemsize
    received = float((num_shards - 1) * block * batch_rows)  # the other devices' blocks
    latent_bytes = received * (r_latent + rope) * (2 * size + 4)
    full_bytes = received * 2 * heads * width * (2 * size + 4)
    # every block a device meets, its own too, expanded for its heads
    expand_flops = (num_shards * block * batch_rows * 2.0 * r_latent * heads / degree
                    * (nope + v) * (1 + BACKWARD))
    flops = peak_flops(device.flops_key) * device.calibration.matmul_efficiency
    # the attention's own tiles: causal, about half of each (query, key) pair, every head
    tiles = (2.0 * block * seq_len * heads * (nope + rope + v) / 2 * batch_rows
             * (1 + BACKWARD) / flops)
    link = device.link_bytes_per_s
    return {"latent": max(latent_bytes / link, tiles) + expand_flops / flops,
            "full": max(full_bytes / link, tiles), "latent_bytes": latent_bytes,
            "full_bytes": full_bytes, "expand_flops": expand_flops, "tiles_s": tiles}


def crossover(cfg, degree: int, num_shards: int, device) -> int | None:
    """The tokens per device past which 'full' is predicted faster than 'latent' (None: latent
    stays faster up to 2^24 tokens a device)."""
    for exponent in range(7, 25):
        block = 2 ** exponent
        p = price(cfg, degree, block * num_shards, num_shards, device)
        if p["full"] < p["latent"]:
            return block
    return None


def resolve(config, attention, cfg, num_shards: int, device) -> str:
    """parallel.mla_exchange for the run: the config's, or for 'auto' the cheaper by `price`;
    'full' for a model without latent attention. ValueError, one line, for 'latent' where the
    attention cannot pass latents (sliding layers: their halo moves expanded keys)."""
    wanted = config.parallel.mla_exchange
    if wanted not in ("latent", "full", "auto"):
        raise ValueError(f"parallel.mla_exchange={wanted!r}: choose 'latent', 'full' or 'auto'")
    if not cfg.mla.enabled:
        return "full"
    windowed = any(cfg.window(cfg.layer_type(i)) for i in range(cfg.num_layers))
    if wanted == "latent" and windowed:
        raise ValueError("parallel.mla_exchange='latent' with sliding-window layers: a window's "
                         "halo moves the expanded keys; set parallel.mla_exchange='full'")
    if wanted != "auto":
        return wanted
    if windowed:
        return "full"
    p = price(cfg, attention.ulysses_degree, config.seq_len, num_shards, device)
    return "latent" if p["latent"] <= p["full"] else "full"
