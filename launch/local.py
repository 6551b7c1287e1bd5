"""N local processes of a JAX program joined by jax.distributed on 127.0.0.1: the local launcher
(scripts/launch_local.py reads its command line; scripts/bench/train.py and the tests' two-
process runs call `launch`).

Each process gets --coordinator_address=127.0.0.1:PORT --num_processes=N --process_id=I appended
to its arguments (train.py understands them), its own fake CPU devices (the program's config
decides how many), and its output prefixed with [I]. If any process fails, the others are
stopped: a JAX process whose peer died would otherwise wait, or abort, on its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(prefix: str, stream, sink) -> None:
    for line in stream:
        sink.write(f"{prefix}{line}")
        sink.flush()


def launch(program: list[str], processes: int, timeout: float | None = None,
           env: dict | None = None, pin: bool = False, sink=None) -> int:
    """Runs the processes to the end; returns the exit code (124 on timeout). pin: process i on
    core i only (mod the core count), as one device per core; sink: where their prefixed output
    goes (default stdout)."""
    port = free_port()
    sink = sys.stdout if sink is None else sink
    env = dict(os.environ if env is None else env)
    # The program sets its own device count; any other XLA flags pass through.
    kept = [f for f in env.pop("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
    if kept:
        env["XLA_FLAGS"] = " ".join(kept)
    procs, pumps = [], []
    for i in range(processes):
        args = [sys.executable, *program, f"--coordinator_address=127.0.0.1:{port}",
                f"--num_processes={processes}", f"--process_id={i}"]
        core = {i % os.cpu_count()}
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, preexec_fn=(lambda: os.sched_setaffinity(0, core)) if pin
                             else None)
        pumps.append(threading.Thread(target=_pump, args=(f"[{i}] ", p.stdout, sink),
                                      daemon=True))
        pumps[-1].start()
        procs.append(p)
    deadline = None if timeout is None else time.monotonic() + timeout
    code = 0
    # SIGTERM (a job scheduler, a killed bench) ends this process through `finally`, which stops
    # the children: they would otherwise train on, orphaned.
    previous = _exit_on_sigterm()
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or (deadline is not None and time.monotonic() > deadline):
                code = failed[0] if failed else 124
                break
            time.sleep(0.2)
        else:
            code = next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        for t in pumps:
            t.join(timeout=5)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return code


def _exit_on_sigterm():
    """Makes SIGTERM raise SystemExit (only the main thread may set handlers); returns the
    handler it replaced, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)
