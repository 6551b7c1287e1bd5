"""Attention of a model with local (sliding-window) and global layers, per layout and strategy:
the tiles on the critical path and the key/value tokens each device receives, per layer kind
and for the model's mix, beside full causal attention, and the planner's choice
(scripts/bench/window.py prints it).

    rows = kind_table(config, device)      # one row per (layout, strategy, degree)
    best = recommended(rows)               # the fastest step the planner predicts

Tiles come from the rule the kernels run (parallel.cost: tiles outside a window are skipped
like those past the causal edge); tokens received from each strategy's own count (the ring's
halo exchange under a window: parallel/strategies/halo.py); step times from planner/step_time.py,
which prices every layer by its kind.
"""

from __future__ import annotations

import parallel
import run_config
from parallel import cost, strategies, strategy_cost
from parallel.mask import Mask
from parallel.strategies import BASELINE
from planner import recommend
from planner.flops import layer_windows
from planner.resolve import resolve_run
from planner.run import make_run


def kind_table(config, device, devices: int) -> list[dict]:
    """Per (layout, strategy, degree): critical-path tiles and K/V tokens received per device
    per layer, for each kind of layer, the model's mean per layer and a full-causal model's,
    and the planner's step time."""
    rows = []
    windows = layer_windows(config.model)
    for layout in parallel.LAYOUTS:
        config = run_config.replace(config, {"parallel.layout": layout})
        run = make_run(config, devices)
        # the tiles 'auto' would take with this layout
        ring = run_config.replace(config, {"parallel.strategy": BASELINE})
        resolved = resolve_run(ring, (run.data, run.seq), device.platform, "", device=device)
        choice, switches = resolved.attention, resolved.switches
        table = recommend.strategy_table(config, run, choice, device, switches=switches)
        for priced in table["rows"]:
            kinds = {w: _layer(config, run, choice.tiles, layout, priced, w) for w in windows}
            full = _layer(config, run, choice.tiles, layout, priced, None)
            total = sum(windows.values())
            rows.append({
                "layout": layout, "strategy": priced["strategy"], "degree": priced["degree"],
                "seq": run.seq, "tiles": list(choice.tiles),
                "kinds": {("global" if w is None else f"local (window {w})"): k
                          for w, k in kinds.items()},
                "model": {key: sum(windows[w] * kinds[w][key] for w in windows) / total
                          for key in ("critical_path_tiles", "kv_tokens")},
                "full_causal": full, "step_s": priced["step_s"],
                "tokens_per_s": priced["tokens_per_s"]})
    return rows


def _layer(config, run, tiles, layout, priced, window) -> dict:
    """One layer of this kind: tiles on the critical path (the strategy's own compute term, in
    tiles of every head) and the most K/V tokens a device receives."""
    m = config.model
    shape = strategy_cost.LayerShape(
        rows=1, seq_len=run.seq_len, num_shards=run.seq, q_heads=m.num_heads,
        kv_heads=m.num_kv_heads, head_dim=m.head_dim, itemsize=2, layout=layout,
        tiles=tuple(tiles), window=window)
    unit = strategy_cost.Network(flops_per_s=1.0, link_bytes_per_s=1.0,
                                 collective_bytes_per_s=1.0, latency_s=0.0)
    est = strategies.estimate(shape, unit, priced["strategy"], priced["degree"])
    strategy = strategies.configured(priced["strategy"], run.seq, m.num_heads,
                                     ulysses_degree=priced["degree"])
    received = strategy.kv_tokens_received(parallel.get_layout(layout), run.seq, run.block,
                                           Mask(True, window), tiles[1], m.num_kv_heads)
    return {"critical_path_tiles": est["compute_s"] / strategy_cost.tile_seconds(shape, unit),
            "ideal_tiles": cost.ideal_tiles(run.seq_len, run.seq, *tiles,
                                            Mask(True, window)),
            "kv_tokens": float(received.max())}


def recommended(rows: list[dict]) -> dict:
    """The row with the fastest predicted step."""
    return min(rows, key=lambda r: r["step_s"])
