"""Published step times beside the planner's predictions, and the fit of a device's calibration
(planner/devices.py: `Calibration`) to them.

A config file that carries measurements (configs/llama3_8b_v5p.py) holds, at module level:

    DEVICE = "tpu-v5p"                         the device they were measured on
    MEASURED = {layout: {seq_len: {label: seconds}}}
                                               labels as the strategy table prints them:
                                               'ring', 'allgather', 'usp 4x16' (u Ulysses x
                                               N / u ring), 'ulysses 64'
    MEASURED_SETUP = {"field": value}          config overrides that match the measured runs
    MEASURED_SOURCE = "..."                    where the figures come from
    MEASURED_FIT = {layout: [seq_len, ...]}    the points the calibration is fitted to; every
                                               other point is held out, predicted, not fitted

`compare` predicts every point with a calibration; `fit` finds the calibration (the matmul and
attention shares of peak, a ring step's fixed cost, the exposed share of a hop's transfer) that
minimises the squared log error over the fitted points. scripts/calibrate.py prints both.
"""

from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np

from parallel.strategies import parse_label
from planner import recommend, time
from planner.attention import choice_from_config
from planner.devices import DEVICES, Calibration, Device
from planner.flops import flops_per_token
from planner.run import make_run
from planner.switches import all_given, resolve_switches

# What the fit may choose: (lower, upper) for each Calibration field it fits.
BOUNDS = {"matmul_efficiency": (0.05, 1.0), "attention_efficiency": (0.05, 1.0),
          "ring_step_s": (0.0, 500e-6), "hop_exposed": (0.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One published step time and the setup it was measured in."""

    config: str  # configs.<module>
    device: str  # a key of planner.DEVICES
    layout: str
    seq_len: int
    label: str  # 'ring', 'allgather', 'usp 4x16', 'ulysses 64'
    seconds: float
    fitted: bool  # in the fit, or held out
    source: str

    @property
    def strategy(self) -> tuple[str, int]:
        """(strategy, Ulysses degree) from the label (each strategy reads its own)."""
        return parse_label(self.label)


def measurements(module: str) -> list[Measurement]:
    """Every point of configs.<module>'s MEASURED; ValueError, one line, if there are none."""
    try:
        mod = importlib.import_module(f"configs.{module}")
    except ModuleNotFoundError:
        raise ValueError(f"no config configs/{module}.py: name a file under configs/ without "
                         f"'.py', e.g. llama3_8b_v5p") from None
    if not getattr(mod, "MEASURED", None):
        raise ValueError(f"configs/{module}.py has no MEASURED step times: choose a config "
                         f"that carries them (llama3_8b_v5p, llama2_7b_v5p)")
    fit_at = getattr(mod, "MEASURED_FIT", {})
    return [Measurement(module, mod.DEVICE, layout, seq_len, label, seconds,
                        seq_len in fit_at.get(layout, ()), mod.MEASURED_SOURCE)
            for layout, by_length in mod.MEASURED.items()
            for seq_len, by_label in by_length.items()
            for label, seconds in by_label.items()]


def point_config(point: Measurement):
    """The run config of one measured point: the file's config, its MEASURED_SETUP, the point's
    layout and length."""
    mod = importlib.import_module(f"configs.{point.config}")
    config = mod.get_config()
    for key, value in getattr(mod, "MEASURED_SETUP", {}).items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    config.parallel.layout, config.seq_len = point.layout, point.seq_len
    return config


def predict(point: Measurement, device: Device) -> float:
    """The planner's step time for the measured run, in seconds."""
    config = point_config(point)
    run = make_run(config, config.mesh.data * config.mesh.seq)
    strategy, degree = point.strategy
    choice = choice_from_config(config, run.seq, device.platform, strategy, degree)
    # The measured setups give every switch; a search would price the step twice per call of
    # the fit, which calls this thousands of times.
    switches = all_given(config.model) or resolve_switches(config, run, choice, device)[0]
    m = recommend.run_model(config, choice, switches)
    model_flops = flops_per_token(m, run.seq_len) * run.tokens_per_step
    return time.step_time(m, run, choice.tiles, point.layout, device, 1.0,
                          bool(config.data.mask_documents), model_flops, None,
                          choice.strategy, choice.ulysses_degree)["step_s"]


def compare(points: list[Measurement], device: Device | None = None) -> list[dict]:
    """Each point with its prediction on `device` (default: the point's, as calibrated)."""
    return [dict(dataclasses.asdict(p), predicted=(s := predict(p, device or DEVICES[p.device])),
                 ratio=s / p.seconds) for p in points]


def fit(points: list[Measurement], device: Device) -> Calibration:
    """The calibration of `device` that best predicts the fitted points (least squares of
    log(predicted / measured), bounded by BOUNDS; Powell's method from the nominal model)."""
    from scipy import optimize
    chosen = [p for p in points if p.fitted]
    names = list(BOUNDS)

    def calibrated(x) -> Device:
        values = {n: float(np.clip(v, *BOUNDS[n])) for n, v in zip(names, x)}
        return dataclasses.replace(device, calibration=Calibration(**values))

    def loss(x):
        dev = calibrated(x)
        return sum(math.log(predict(p, dev) / p.seconds) ** 2 for p in chosen)

    start = [0.5, 0.5, 20e-6, 0.5]
    scale = np.array([1.0, 1.0, 1e-4, 1.0])  # Powell steps in units of similar size
    result = optimize.minimize(lambda z: loss(z * scale), np.array(start) / scale,
                               method="Powell", bounds=[(lo / s, hi / s) for (lo, hi), s in
                                                         zip(BOUNDS.values(), scale)],
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
