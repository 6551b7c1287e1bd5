"""The launchers scripts/launch.py offers, one subcommand each, in --help's order: a new one is
one file with an Engine subclass (launch/engine.py) and one entry below."""

from __future__ import annotations

from launch import gke, slurm, tpu
from launch.engine import Engine

ENGINES: dict[str, Engine] = {m.ENGINE.name: m.ENGINE for m in (slurm, tpu, gke)}
