"""What each install brings: `pip install -e .` (and `make train`) what a run needs and no more,
no test tools and no TPU runtime (libtpu is 684 MB and Linux x86-64 only); the extras tpu, cuda
and test the rest, `make test` the test extra."""

import os
import subprocess
import sys

import pytest

from tests.support.train_runs import FAST_COMPILE, ROOT, losses, read_metrics


def make_dry_run(target):
    """The commands `make TARGET` runs from scratch (-B: as on a fresh clone), none run."""
    done = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [ln for ln in done.stdout.splitlines() if " -m pip install " in ln]


def test_make_train_installs_the_runtime_and_make_test_the_test_extra():
    (train,) = make_dry_run("train")
    assert train.split("constraints.txt ")[1].startswith("-e . ") and "[" not in train
    test = make_dry_run("test")
    assert test[0] == train and "-e '.[test]'" in test[1]


@pytest.mark.programs
def test_a_fresh_environment_with_pip_install_e_trains_without_libtpu(tmp_path):
    """A new virtual environment, `pip install -e .` as the README says (the versions of
    constraints.txt), then configs/tiny.py trained with it: what a user without the test extra
    has. (Needs the package registry, as make test's own install does.)"""
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "-c", "constraints.txt", "-e", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    absent = subprocess.run(
        [python, "-c", "import importlib.util as u; print([m for m in ('libtpu', 'pytest', "
                       "'matplotlib', 'gcp_storage_emulator') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True)
    assert absent.stdout.strip() == "[]"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env.update(XLA_FLAGS=FAST_COMPILE, WANDB_MODE="disabled")
    workdir = tmp_path / "run"
    train = subprocess.run([python, "train.py", "--config", "configs/tiny.py", "--workdir",
                            str(workdir), "--config.num_train_steps=4",
                            "--config.eval_every_steps=4", "--config.checkpoint_every_steps=4"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert train.returncode == 0, train.stderr[-3000:]
    assert max(losses(read_metrics(workdir)), default=0) == 4
