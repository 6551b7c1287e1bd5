"""One run's attention, resolved: layout, strategy (with its Ulysses degree), kernel and tiles,
with no 'auto' and no default left to apply. Everything that needs to know how a run attends
reads one `AttentionChoice`: the config checks, the batch builder (balanced's unit), the model,
the trackers, the checkpoint record, sample.py and the planner.

    choose(layout='balanced', strategy='ring', kernel='auto', tile_q=0, tile_k=0,
           seq_len=4096, num_shards=4, platform='cpu', q_heads=4)
    -> AttentionChoice(layout='balanced', strategy='ring', ulysses_degree=1, kernel='xla',
                       tile_q=512, tile_k=512)

The tile rule (a tile of 0 takes the default for the layout and kernel) and the check that the
tiles divide the block live here and nowhere else; `parallel.attention` applies the same rule.
A strategy of 'auto' is not resolved here: that needs the planner's cost model
(`planner.resolve_attention`), which then calls `choose` with the strategy it picked.
"""

from __future__ import annotations

import dataclasses
import math

from parallel.kernels import resolve_kernel
from parallel.layouts import get_layout, permutation
from parallel.layouts.base import largest_divisor
from parallel.strategies import BASELINE, configured, get_strategy
from parallel.recurrent import BASELINE as RECURRENT_BASELINE, get_recurrent_strategy


# What latent attention passes where nothing chose otherwise: the expanded keys and values.
MLA_BASELINE = "full"


def op_tile(tile: int) -> int | None:
    """A run's tile as `parallel.attention` takes it. In a run (parallel.tile, its `tiles`, an
    AttentionChoice) "no tile given" is 0; the op spells it None (its default for each call's
    length) and refuses 0. The one place the first becomes the second."""
    return tile or None


@dataclasses.dataclass(frozen=True)
class AttentionChoice:
    layout: str  # parallel.LAYOUTS
    strategy: str  # parallel.STRATEGIES (never 'auto')
    ulysses_degree: int  # devices per head all-to-all group: 1, N (ulysses) or u (usp)
    kernel: str  # parallel.KERNELS (never 'auto')
    tile_q: int
    tile_k: int
    why: str = dataclasses.field(default="configured", compare=False)  # how the strategy was picked
    # latent attention: what the devices pass, 'latent' (parallel.latent_attention) or 'full'
    # (the expanded keys and values: parallel.attention); 'full' for any other model
    mla_exchange: str = MLA_BASELINE
    # recurrent layers over the 'seq' devices: parallel.recurrent.RECURRENT_STRATEGIES ('state':
    # passed states, or 'heads': all-to-alls to whole rows of a few groups)
    linear_strategy: str = RECURRENT_BASELINE

    @property
    def balance_unit(self) -> int:
        """The tokens 'balanced' places together: a multiple of both tiles, so that every tile the
        kernel runs is one run of consecutive tokens (see parallel/layouts/balanced.py)."""
        return math.lcm(self.tile_q, self.tile_k)

    @property
    def tiles(self) -> tuple[int, int]:
        return self.tile_q, self.tile_k

    def attention_kwargs(self) -> dict:
        """The keyword arguments of `parallel.attention` that this choice fixes; a tile of 0 (no
        tile given: a saved run read at any length, a model built by hand) is the op's own
        default for each call's length (None there)."""
        return dict(layout=self.layout, strategy=self.strategy, kernel=self.kernel,
                    tile_q=op_tile(self.tile_q), tile_k=op_tile(self.tile_k),
                    **get_strategy(self.strategy).option_values(self.ulysses_degree))

    def exchanges(self) -> dict:
        """What its latent and recurrent layers pass between the devices, as the planner's
        pricing takes it (planner/step_time.py, planner/memory.py)."""
        return {"mla_exchange": self.mla_exchange, "linear_strategy": self.linear_strategy}

    def permutation(self, seq_len: int, num_shards: int, segment_ids=None):
        """The layout's permutation; for 'balanced', placed on this choice's unit."""
        return permutation(self.layout, seq_len, num_shards, segment_ids=segment_ids,
                           tile=self.balance_unit)

    def label(self) -> str:
        """'striped attention (ring strategy, xla kernel, tiles 32x32)'; usp shows its degree."""
        strategy = get_strategy(self.strategy).label(self.ulysses_degree)
        latent = ", latent exchange" if self.mla_exchange == "latent" else ""
        linear = ("" if self.linear_strategy == RECURRENT_BASELINE
                  else f", linear layers by {self.linear_strategy}")
        return (f"{self.layout} attention ({strategy} strategy, {self.kernel} kernel, tiles "
                f"{self.tile_q}x{self.tile_k}{latent}{linear})")

    def record(self) -> dict:
        """What the metrics, wandb and the checkpoint record carry."""
        return {"layout": self.layout, "strategy": self.strategy,
                "ulysses_degree": self.ulysses_degree, "kernel": self.kernel,
                "tile_q": self.tile_q, "tile_k": self.tile_k, "mla_exchange": self.mla_exchange,
                "linear_strategy": self.linear_strategy}


# What a model built without a run's plan attends with (in code, decoding, a checkpoint's
# conversion): striped, by the baseline strategy, with the backend's kernel ('auto') and its
# default tiles for each call (0), passing expanded keys and recurrent states. The one choice
# whose kernel is 'auto': nothing resolved it.
UNPLANNED = AttentionChoice(layout="striped", strategy=BASELINE, ulysses_degree=1,
                            kernel="auto", tile_q=0, tile_k=0, why="no run's plan")

MLA_EXCHANGES = ("latent", "full")  # parallel.mla_exchange, resolved
AUTO = "auto"  # a setting left to the planner: parallel.layout/strategy/tile, memory switches


def parse_tile(value) -> tuple[int, int] | None:
    """config.parallel.tile as (tile_q, tile_k), or None for 'auto' (the planner picks). 512 or
    '512': square tiles; (128, 256), [128, 256] or '128x256': query x key; 0: the kernel's
    default (the largest divisor of the block up to its max_tiles). ValueError, one line,
    for anything else.

    Example: parse_tile('256x128') -> (256, 128); parse_tile('auto') -> None."""
    if value == AUTO or value is None:
        return None
    sizes = value
    if isinstance(value, str):
        sizes = value.lower().replace(" ", "").split("x")
    elif not isinstance(value, (list, tuple)):
        sizes = (value, value)
    try:
        if isinstance(value, bool) or len(sizes) not in (1, 2):
            raise ValueError
        pair = tuple(int(s) for s in sizes) * (3 - len(sizes))
        if min(pair) < 0 or any(isinstance(s, float) and s != int(s) for s in sizes):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"parallel.tile={value!r} is not a tile: give 'auto', a size (512), "
                         f"query x key ('256x128' or (256, 128)) or 0 (the kernel's "
                         f"default)") from None
    return pair[0], pair[1]


def tile_options(layout, kernel, block: int, platform: str, smallest: int = 16,
                 most_per_side: int = 128) -> list[tuple[int, int]]:
    """The square tiles parallel.tile='auto' weighs: powers of two from `smallest` up to the
    kernel's largest default tile, each dividing the layout's contiguous run (a tile never
    straddles zigzag's halves) and compiling on `platform`, with at most `most_per_side` tiles
    a side of the block (past that, balance no longer pays for the tiles' fixed costs, and the
    tile counts the planner makes grow as their square); the kernel's default tile when no
    power of two qualifies (a block of 96 tokens: 96).

    Example: tile_options(striped, xla, 8192, 'cpu') -> [(64, 64), (128, 128), ..., (512, 512)]."""
    run, largest = get_layout(layout).contiguous_run(block), min(kernel.max_tiles)
    options, tile = [], max(smallest, block // most_per_side)
    while tile <= min(run, largest):
        try:
            if run % tile == 0:
                kernel.check_tiles(tile, tile, kernel.interpreted_on(platform))
                options.append((tile, tile))
        except ValueError:
            pass
        tile *= 2
    return options or [(default_tile(layout, block, largest),) * 2]


def default_tile(layout, block: int, largest: int) -> int:
    """Largest divisor of the layout's contiguous run (the block, half of it for zigzag,
    balanced's default unit) that is at most `largest` (a kernel's `max_tiles`), so tiles never
    straddle the jump between two chunks."""
    return largest_divisor(get_layout(layout).contiguous_run(block), largest)


def resolve_tiles(layout, kernel, block: int, tile_q, tile_k) -> tuple[int, int]:
    """(tile_q, tile_k): each as given, or (None) the default for the layout and kernel;
    ValueError, one line, for a tile that does not divide the block."""
    tiles = []
    for name, tile, largest in zip(("tile_q", "tile_k"), (tile_q, tile_k), kernel.max_tiles):
        tile = default_tile(layout, block, largest) if tile is None else int(tile)
        if tile < 1 or block % tile:
            raise ValueError(f"{name}={tile} does not divide the per-device block of {block} "
                             f"tokens: choose a divisor of {block}")
        tiles.append(tile)
    return tiles[0], tiles[1]


def choose(*, layout: str, strategy: str, kernel: str, tile_q: int, tile_k: int, seq_len: int,
           num_shards: int, platform: str, q_heads: int, ulysses_degree: int | None = None,
           why: str = "configured", mla_exchange: str = MLA_BASELINE,
           linear_strategy: str = RECURRENT_BASELINE) -> AttentionChoice:
    """The resolved attention of a run on `num_shards` 'seq' devices of `platform` (a tile of 0
    or None: the default); ValueError, one line, for any choice that cannot run (unknown names,
    tiles, the Ulysses degree, an mla_exchange other than 'latent' or 'full', a
    linear_strategy not in parallel.recurrent's registry)."""
    if mla_exchange not in MLA_EXCHANGES:
        raise ValueError(f"parallel.mla_exchange={mla_exchange!r}: choose 'latent', 'full' or "
                         f"'auto'")
    get_recurrent_strategy(linear_strategy)
    lay, strat = get_layout(layout), get_strategy(strategy)
    kern = resolve_kernel(kernel, platform)
    lay.check_divisible(seq_len, num_shards)
    degree = configured(strat, num_shards, q_heads, ulysses_degree=ulysses_degree or None).degree
    tq, tk = resolve_tiles(lay, kern, seq_len // num_shards, op_tile(tile_q), op_tile(tile_k))
    kern.check_tiles(tq, tk, kern.interpreted_on(platform))
    return AttentionChoice(layout=lay.name, strategy=strat.name, ulysses_degree=degree,
                           kernel=kern.name, tile_q=tq, tile_k=tk, why=why,
                           mla_exchange=mla_exchange, linear_strategy=linear_strategy)
