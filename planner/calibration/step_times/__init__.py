"""Published step times, one TOML file a measured setting: planner/calibration/step_times/
NAME.toml, NAME the config file's (configs/tpu/llama3_8b_v5p.py: llama3_8b_v5p.toml). Data, not
code: the planner prints them beside its strategy table (scripts/plan.py) and fits the device
calibrations to them (scripts/calibrate.py). A file holds

    config = "configs/tpu/llama3_8b_v5p.py"    the run config of the measured setting
    device = "tpu-v5p"                         the device they were measured on (planner.DEVICES)
    source = "..."                             where the figures come from
    setup = { "field" = value }                config overrides that match the measured runs
    fit = { layout = [seq_len, ...] }          the points the calibration is fitted to; every
                                               other point is held out, predicted, not fitted
    tiles = { label = tile }                   a strategy measured with its own attention tile
                                               (the config's parallel.tile otherwise)
    [measured.LAYOUT]
    SEQ_LEN = { label = seconds, ... }         labels as the strategy table prints them:
                                               'ring', 'allgather', 'usp 4x16', 'ulysses 64'
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tomllib

import configs

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("config", "device", "source", "setup", "fit", "tiles", "measured")


@dataclasses.dataclass(frozen=True)
class Table:
    name: str  # the file's name without '.toml'
    config: str  # the config file's path under the configs package ('configs/tpu/...')
    device: str
    source: str
    setup: dict  # dotted field -> value
    fit: dict  # layout -> the lengths fitted
    tiles: dict  # label -> tile
    measured: dict  # layout -> seq_len (int) -> label -> seconds

    @property
    def config_file(self) -> str:
        """The config file, wherever this is run from."""
        return os.path.join(os.path.dirname(configs.__file__), self.config.removeprefix("configs/"))

    @property
    def path(self) -> str:
        return f"planner/calibration/step_times/{self.name}.toml"

    @property
    def labels(self) -> set[str]:
        return {label for by_length in self.measured.values() for by_label in by_length.values()
                for label in by_label}


def names() -> tuple[str, ...]:
    """The tables there are, by name."""
    return tuple(sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".toml")))


@functools.cache
def table(name: str) -> Table:
    """The table NAME.toml; ValueError, one line, for none or one that does not read."""
    path = os.path.join(HERE, f"{name}.toml")
    if not name.isidentifier() or not os.path.isfile(path):
        raise ValueError(f"no measured step times for {name}: tables there are for "
                         f"{', '.join(names())} (planner/calibration/step_times/)")
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"planner/calibration/step_times/{name}.toml does not read: "
                         f"{e}") from None
    if stray := sorted(set(values) - set(KEYS)):
        raise ValueError(f"planner/calibration/step_times/{name}.toml: {stray[0]} is not a "
                         f"table key: use {', '.join(KEYS)}")
    measured = {layout: {int(n): dict(by_label) for n, by_label in by_length.items()}
                for layout, by_length in values.get("measured", {}).items()}
    return Table(name, values["config"], values["device"], values["source"],
                 values.get("setup", {}), values.get("fit", {}), values.get("tiles", {}),
                 measured)


def for_config(config_file: str) -> Table | None:
    """The table measured in the setting of config file `config_file` (any path to it), else
    None."""
    name = os.path.splitext(os.path.basename(config_file))[0]
    if name not in names():
        return None
    found = table(name)
    same = os.path.samefile(config_file, found.config_file)
    return found if same else None
