"""What a launcher is: an engine that takes train.py's config file, workdir and overrides (a
TrainRun) with options of its own, checks the run on this machine (launch/preflight.py) and
hands it to a scheduler. scripts/launch.py makes one subcommand of each registered engine
(launch/engines.py: ENGINES); a new one is one file with an Engine subclass and one entry there
(tests/launch/test_engines.py adds one).
"""

from __future__ import annotations

import argparse

from launch.preflight import LaunchError, TrainRun


class Engine:
    name: str = ""
    help: str = ""  # the subcommand's line in scripts/launch.py --help

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The engine's own options (the run's --config, --workdir, --skip-check and --device
        are every engine's: train_options)."""

    def launch(self, args: argparse.Namespace, run: TrainRun) -> None:
        """Checks the run (unless args.skip_check) and submits, prints or starts it; LaunchError
        (exit 2) for a mistake, CommandFailed (exit 1) for a command that failed, one line."""
        raise NotImplementedError

    def default_workdir(self, args: argparse.Namespace) -> str:
        """The workdir where --workdir is not given; by default, there is none: every host of
        a cloud engine reads and writes the run in a bucket it names."""
        raise LaunchError(f"--workdir is required for {self.name}: give gs://BUCKET/PATH, "
                          f"where every host of the slice reads and writes the run")


def train_options(parser: argparse.ArgumentParser) -> None:
    """The options every engine takes: the run train.py is started with, and its check."""
    parser.add_argument("--config", required=True, help="config file, e.g. configs/tiny.py")
    parser.add_argument("--workdir", help="train.py's --workdir (slurm's default: runs/CONFIG "
                                          "in this repository, which the nodes share)")
    parser.add_argument("--skip-check", action="store_true",
                        help="launch without the check of the run (scripts/plan.py --check)")
    parser.add_argument("--device", help="the planner's device for the check (planner.DEVICES; "
                                         "default: the config's DEVICE)")
