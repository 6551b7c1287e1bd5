"""A new launcher is one file and one registry line: a toy engine, defined here as its own file
would define it (a file in launch/) and registered with one line in launch/engines.py, becomes a
subcommand of scripts/launch.py with the options every engine has, and gets the run train.py
would be started with: the config relative to the repository, the workdir, the overrides."""

import pytest

from launch.engine import Engine
from launch.engines import ENGINES
from launch.preflight import TrainRun
from scripts import launch as launcher


class Recorded(Engine):
    """Submits nothing: keeps the run and its own option, as a scheduler would be handed them."""

    name = "recorded"
    help = "keep the run (a test's engine)"
    runs: list = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--queue", default="default")

    def launch(self, args, run: TrainRun) -> None:
        self.runs.append((run, args.queue, args.skip_check))


@pytest.fixture
def registered(monkeypatch):
    engine = Recorded()
    engine.runs = []
    monkeypatch.setitem(ENGINES, engine.name, engine)  # the one registry line
    return engine


def test_it_is_a_subcommand_that_gets_the_run(registered, tmp_path):
    launcher.main(["recorded", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                   "--queue", "long", "--skip-check", "--config.seq_len=256"])
    (run, queue, skipped), = registered.runs
    assert run == TrainRun("configs/tiny.py", str(tmp_path / "w"), ("--config.seq_len=256",))
    assert run.train_args() == ["train.py", "--config=configs/tiny.py",
                                f"--workdir={tmp_path / 'w'}", "--config.seq_len=256"]
    assert (queue, skipped) == ("long", True)
    assert "recorded" in launcher.build_parser().format_help()


def test_a_workdir_is_needed_unless_the_engine_has_a_default(registered, capsys):
    with pytest.raises(SystemExit) as stop:
        launcher.main(["recorded", "--config", "configs/tiny.py"])
    assert stop.value.code == 2 and not registered.runs
    assert "--workdir is required for recorded" in capsys.readouterr().err


def test_without_the_line_it_is_no_subcommand(capsys):
    assert Recorded.name not in ENGINES
    with pytest.raises(SystemExit) as stop:
        launcher.main(["recorded", "--config", "configs/tiny.py", "--workdir", "w"])
    assert stop.value.code == 2 and "invalid choice: 'recorded'" in capsys.readouterr().err
