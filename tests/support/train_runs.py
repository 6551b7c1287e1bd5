"""Running train.py as a user does, for the end-to-end tests."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.support import ROOT


# How the tests compile, in this process and in each train.py they start: LLVM's optimisation of
# the CPU code is most of a compile and buys nothing at these sizes, and XLA's older loop
# emitters compile a fusion in about half the time of its newer MLIR ones (the attention's
# forward and backward over 4 devices: 0.8 s against 1.4 s; the suite a fifth faster). Both
# change how fast the code runs, not what it computes.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


# The tests start train.py and sample.py about a hundred times, mostly on the same tiny
# configs: half of a tiny run's 11 seconds is XLA compiling programs an earlier run compiled
# already. JAX's persistent compilation cache hands them back from disk (keyed by the program,
# the flags and the devices it runs on, so a hit is the same executable and the same numbers, bit
# for bit). One folder per test worker, made fresh for each pytest run (tests/conftest.py), so
# nothing outlives the run and the two workers never write one file.
COMPILE_CACHE = "RINGSTRIPE_TEST_COMPILE_CACHE"


def clean_env(processes=1):
    """The environment of a train.py the tests start: its own device count (train.py sets it),
    compiled as this process compiles (FAST_COMPILE), wandb off, and the test run's
    compilation cache.

    A run of `processes` > 1 (launch_local, --num_processes) keeps a folder of its own: the
    cache's key names the devices a program runs on, not how many processes own them, so 2
    processes of 1 device and 1 process of 2 compile to the same key, and the executable built
    for one crashes inside XLA when the other runs it (seen: a single-process run aborted in
    its evaluation after a two-process run of the same program)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = FAST_COMPILE
    env["WANDB_MODE"] = "disabled"
    if os.environ.get(COMPILE_CACHE):
        folder = os.environ[COMPILE_CACHE]
        env["JAX_COMPILATION_CACHE_DIR"] = folder if processes == 1 else (
            f"{folder}-{processes}-processes")
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def command(workdir, *overrides, config="configs/tiny.py"):
    return [sys.executable, "train.py", "--config", config, "--workdir", str(workdir), *overrides]


def run_train(workdir, *overrides, timeout=600, config="configs/tiny.py", env=None):
    return subprocess.run(command(workdir, *overrides, config=config), cwd=ROOT,
                          env=env or clean_env(), capture_output=True, text=True, timeout=timeout)


def start_train(workdir, *overrides):
    return subprocess.Popen(command(workdir, *overrides), cwd=ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_metrics(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def losses(rows):
    """{step: train/loss} of the metric rows (events excluded)."""
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def completed_checkpoints(workdir):
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def wait_for_step(workdir, step, proc, timeout=300, since=0.0):
    """Blocks until metrics.jsonl shows `step` in a row written after `since` (a time.time()),
    or the process ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            rows = [r for r in read_metrics(workdir) if r.get("time", 0) >= since]
            if any(r.get("step", 0) >= step for r in rows):
                return
        except json.JSONDecodeError:  # a line being written
            pass
        time.sleep(0.05)


def terminate(proc, sig=signal.SIGTERM, timeout=120):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
