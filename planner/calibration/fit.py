"""Published step times beside the planner's predictions, and the fit of a device's calibration
(planner/devices.py: `Calibration`) to them.

The step times are data: one table a measured setting, planner/calibration/step_times/NAME.toml
(its run config, device, source, the config overrides that match the measured runs, the points
fitted and any strategy's own tile: planner/calibration/step_times/__init__.py).

`compare` predicts every point with a calibration; `fit` finds the calibration (the matmul and
attention shares of peak, a ring step's fixed cost, the exposed share of a hop's transfer, an
attention tile's fixed cost) that minimises the squared log error over the fitted points.
scripts/calibrate.py prints both.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np

import run_config
from configs import load_file
from parallel.strategies import parse_label
from planner import recommend, step_time
from planner.attention import choice_from_config
from planner.calibration import step_times
from planner.devices import DEVICES, Calibration, Device
from planner.flops import flops_per_token
from planner.run import make_run
from planner.switches import all_given, resolve_switches

# What the fit may choose: (lower, upper) for each Calibration field it fits, and the unit its
# search steps in (fields of similar scale for Powell's method).
BOUNDS = {"matmul_efficiency": (0.05, 1.0), "attention_efficiency": (0.05, 1.0),
          "ring_step_s": (0.0, 500e-6), "hop_exposed": (0.0, 1.0),
          "tile_overhead_s": (0.0, 5e-6)}
SCALE = {"ring_step_s": 1e-4, "tile_overhead_s": 1e-6}
START = {"matmul_efficiency": 0.5, "attention_efficiency": 0.5, "ring_step_s": 20e-6,
         "hop_exposed": 0.5, "tile_overhead_s": 0.3e-6}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One published step time and the setup it was measured in."""

    config: str  # the config file's path
    device: str  # a key of planner.DEVICES
    layout: str
    seq_len: int
    label: str  # 'ring', 'allgather', 'usp 4x16', 'ulysses 64'
    seconds: float
    fitted: bool  # in the fit, or held out
    source: str
    tile: object = None  # parallel.tile of the run (None: the config's)
    setup: tuple = ()  # (field, value) pairs of the measured run beside its config's

    @property
    def strategy(self) -> tuple[str, int]:
        """(strategy, Ulysses degree) from the label (each strategy reads its own)."""
        return parse_label(self.label)


def measurements(name: str) -> list[Measurement]:
    """Every point of table `name` (planner/calibration/step_times/NAME.toml); ValueError, one
    line, for no table or one whose tiles name a label it does not measure."""
    table = step_times.table(name)
    if stray := sorted(set(table.tiles) - table.labels):
        raise ValueError(f"{table.path}: tiles names {', '.join(stray)}, which measured does "
                         f"not measure: use its labels ({', '.join(sorted(table.labels))})")
    return [Measurement(table.config_file, table.device, layout, seq_len, label, seconds,
                        seq_len in table.fit.get(layout, ()), table.source,
                        tile=table.tiles.get(label), setup=tuple(table.setup.items()))
            for layout, by_length in table.measured.items()
            for seq_len, by_label in by_length.items()
            for label, seconds in by_label.items()]


def bench_measurements(path: str) -> list[Measurement]:
    """The steps scripts/bench/train.py measured on this machine (its --json): one point per
    kind with documents unmasked (one document a row: the planner's rows are the measured
    ones), its median seconds per step, on the 'cpu' device; every other one (in the file's
    order) fitted, the rest held out. ValueError, one line, for a file that is not one."""
    try:
        with open(path) as f:
            bench = json.load(f)
        args, results = bench["args"], bench["results"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path} is not scripts/bench/train.py's --json ({e}): run "
                         f"python scripts/bench/train.py --json {path}") from None
    points = []
    for i, r in enumerate(r for r in results if not r["masked"]):
        setup = (("global_batch_size", args["batch"]), ("cpu_devices", 1), ("mesh.data", 1),
                 ("mesh.seq", args["processes"]), ("data.mask_documents", False))
        tokens = args["batch"] * r["seq_len"]
        layout, label, tile = r["layout"], r["strategy"], r.get("tile")
        if r.get("ran"):  # what the run resolved its 'auto' to: "zigzag usp 2x2 256x256"
            layout, *label, tile = r["ran"].split()
            label = " ".join(label) or r["strategy"]  # older files: "zigzag 256x256"
        points.append(Measurement(args["config"], "cpu", layout, r["seq_len"], label,
                                  tokens / r["median_tokens_per_sec"], i % 2 == 0,
                                  f"scripts/bench/train.py --json {path}", tile=tile,
                                  setup=setup))
    return points


def point_config(point: Measurement) -> run_config.RunConfig:
    """The run config of one measured point: its config file's (configs.ConfigError for one
    that does not load), the point's setup, layout, length and tile."""
    config = load_file(point.config)
    updates = {**dict(point.setup), "parallel.layout": point.layout,
               "seq_len": point.seq_len}
    if point.tile is not None:
        updates["parallel.tile"] = point.tile
    return run_config.replace(run_config.build(config), updates)


def predict(point: Measurement, device: Device) -> float:
    """The planner's step time for the measured run, in seconds."""
    config = point_config(point)
    run = make_run(config, config.mesh.data * config.mesh.seq)
    strategy, degree = point.strategy
    choice = choice_from_config(config, run.seq, device.platform, strategy, degree)
    switches = _switches(point, config, run, choice)
    m = recommend.run_model(config, switches)
    model_flops = flops_per_token(m, run.seq_len) * run.tokens_per_step
    return step_time.step_time(m, run, choice.tiles, point.layout, device, 1.0,
                          bool(config.data.mask_documents), model_flops, None,
                          choice.strategy, choice.ulysses_degree,
                          **choice.exchanges())["step_s"]


@functools.lru_cache(maxsize=None)
def _resolved_switches(point: Measurement, choice):
    config = point_config(point)
    run = make_run(config, config.mesh.data * config.mesh.seq)
    return resolve_switches(config, run, choice, DEVICES[point.device])[0]


def _switches(point, config, run, choice):
    """The measured run's memory switches: as its setup gives them, or (auto) as the run
    resolved them, once per point: the fit prices every point thousands of times."""
    return all_given(config.model) or _resolved_switches(point, choice)


def compare(points: list[Measurement], device: Device | None = None) -> list[dict]:
    """Each point with its prediction on `device` (default: the point's, as calibrated)."""
    return [dict(dataclasses.asdict(p), predicted=(s := predict(p, device or DEVICES[p.device])),
                 ratio=s / p.seconds) for p in points]


def fit(points: list[Measurement], device: Device,
        names: tuple[str, ...] = tuple(BOUNDS)) -> Calibration:
    """The calibration of `device` that best predicts the fitted points (least squares of
    log(predicted / measured), bounded by BOUNDS; Powell's method from START): the fields
    `names`, the others kept as the device has them."""
    from scipy import optimize  # only the fit (scripts/calibrate.py) needs it
    chosen = [p for p in points if p.fitted]
    names = list(names)

    def calibrated(x) -> Device:
        values = {n: float(np.clip(v, *BOUNDS[n])) for n, v in zip(names, x)}
        return dataclasses.replace(device, calibration=dataclasses.replace(
            device.calibration, **values))

    def loss(x):
        dev = calibrated(x)
        return sum(math.log(predict(p, dev) / p.seconds) ** 2 for p in chosen)

    scale = np.array([SCALE.get(n, 1.0) for n in names])
    start = np.array([START[n] for n in names])
    result = optimize.minimize(lambda z: loss(z * scale), start / scale,
                               method="Powell", bounds=[(BOUNDS[n][0] / s, BOUNDS[n][1] / s)
                                                        for n, s in zip(names, scale)],
                               options={"xtol": 1e-4, "ftol": 1e-6, "maxfev": 4000})
    return calibrated(result.x * scale).calibration


def fastest(rows: list[dict], key: str, by_strategy: bool = False) -> dict:
    """For each (layout, seq_len): the labels with the smallest `key` ('seconds' or
    'predicted') among the strategies measured there (more than one on a tie); by_strategy:
    their strategies ('usp', not 'usp 4x16')."""
    best: dict[tuple[str, int], tuple[float, set]] = {}
    for r in rows:
        where, name = (r["layout"], r["seq_len"]), r["label"]
        name = name.split()[0] if by_strategy else name
        if where not in best or r[key] < best[where][0]:
            best[where] = (r[key], {name})
        elif r[key] == best[where][0]:
            best[where][1].add(name)
    return {where: names for where, (_, names) in best.items()}
