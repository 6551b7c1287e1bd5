"""A real one-node SLURM cluster for the tests: Debian's munged, slurmctld and slurmd, started in
the foreground by the test (no systemd) and stopped by their process ids.

Everything lives under one directory: the munge key and socket, slurm.conf, the controller's
state, the daemons' logs. Client commands (sbatch, squeue, scancel, scontrol) find the cluster
through SLURM_CONF in `cluster.env`, which the tests pass to scripts/launch.py and to them.

Where the packages are missing they are installed (as root, with apt-get); where that or a
daemon's start fails, `start` raises with the reason and the daemon's log, so the tests that
need the cluster fail rather than skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
DAEMONS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
           "sbatch": "slurm-client"}


class ClusterError(RuntimeError):
    pass


def install_missing() -> None:
    """apt-get installs the SLURM and munge packages this machine lacks (root only)."""
    missing = sorted({package for program, package in DAEMONS.items()
                      if shutil.which(program) is None
                      and not os.path.exists(f"/usr/sbin/{program}")})
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(f"the SLURM tests need {', '.join(missing)}: install them "
                           f"(apt-get install {' '.join(PACKAGES)}) or run the tests as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise ClusterError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """One node (this machine, named as `hostname -s` says), one partition `debug`, `cpus`
    CPUs a node (more than the machine has is allowed: the tasks share its cores)."""

    def __init__(self, root: str, cpus: int = 4, cred_expire: int = 5):
        self.root = os.path.abspath(root)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus
        self.cred_expire = cred_expire
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def path(self, *parts) -> str:
        return os.path.join(self.root, *parts)

    def _write_config(self) -> None:
        for folder in ("munge", "state", "spool", "log"):
            os.makedirs(self.path(folder), exist_ok=True)
        os.chmod(self.path("munge"), 0o700)
        key = self.path("munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        socket_path = self.path("munge", "munge.socket")
        lines = {
            "ClusterName": "ringstripe",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmUser": "root", "SlurmdUser": "root",
            "SlurmctldPort": _free_port(), "SlurmdPort": _free_port(),
            "AuthType": "auth/munge", "CredType": "cred/munge",
            # a requeued job waits for the credential of its last start to expire
            "AuthInfo": f"socket={socket_path},cred_expire={self.cred_expire}",
            "StateSaveLocation": self.path("state"), "SlurmdSpoolDir": self.path("spool"),
            "SlurmctldPidFile": self.path("slurmctld.pid"),
            "SlurmdPidFile": self.path("slurmd.pid"),
            "SlurmctldLogFile": self.path("log", "slurmctld.log"),
            "SlurmdLogFile": self.path("log", "slurmd.log"),
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobRequeue": 1, "ReturnToService": 2, "MpiDefault": "none",
            "SchedulerType": "sched/backfill", "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU", "SlurmdParameters": "config_overrides",
            "KillWait": 30, "MinJobAge": 600, "InactiveLimit": 0,
            "JobCompType": "jobcomp/none", "AccountingStorageType": "accounting_storage/none",
            "SchedulerParameters": "sched_interval=2",
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN\n"
                 f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE "
                 f"State=UP\n")
        with open(self.conf, "w") as f:
            f.write(text)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.path("log", f"{name}.out"), "w")
        self.procs[name] = subprocess.Popen([_program(name), *args], stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def _log(self, name: str) -> str:
        text = ""
        for file in (f"{name}.out", f"{name}.log"):
            try:
                with open(self.path("log", file)) as f:
                    text += f.read()[-1500:]
            except OSError:
                pass
        return text

    def start(self, timeout: float = 60) -> "SlurmCluster":
        install_missing()
        self._write_config()
        munge = self.path("munge")
        self._spawn("munged", ["--foreground", "--force",
                               f"--socket={munge}/munge.socket",
                               f"--key-file={munge}/munge.key",
                               f"--pid-file={munge}/munged.pid",
                               f"--seed-file={munge}/munged.seed",
                               f"--log-file={self.path('log', 'munged.log')}"])
        self._wait(lambda: os.path.exists(f"{munge}/munge.socket"), "munged", timeout)
        self._spawn("slurmctld", ["-D", "-i", "-f", self.conf])
        self._wait(lambda: self._run(["scontrol", "ping"]).stdout.count("UP") >= 1,
                   "slurmctld", timeout)
        self._spawn("slurmd", ["-D", "-f", self.conf])
        self._wait(self._node_ready, "slurmd", timeout)
        return self

    def _run(self, command, **kwargs):
        return subprocess.run(command, env=self.env, capture_output=True, text=True, **kwargs)

    def _node_ready(self) -> bool:
        state = self._run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.strip()
        return state in ("idle", "mixed", "allocated")

    def _wait(self, ready, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                break
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.2)
        self.stop()
        raise ClusterError(f"{name} did not start (exit {self.procs[name].poll()}): "
                           f"{self._log(name)}")

    def job(self, job_id: str) -> dict:
        """scontrol show job's fields of `job_id` (JobState, RestartCnt, ExitCode, ...)."""
        out = self._run(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(part.split("=", 1) for part in out.split() if "=" in part)

    def stop(self) -> None:
        """SIGTERM to each daemon, the last started first, SIGKILL after 10 s; jobs' processes
        left behind (their sessions) are killed with them."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


if __name__ == "__main__":  # make test-cluster's first step: the packages, where missing
    install_missing()
