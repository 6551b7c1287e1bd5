"""Cloud TPU queued resources: ask for a slice (spot, reserved or on demand; one slice or several),
wait for it, start the run on every worker, and watch it until it finishes.

    slice_ = QueuedSlice("rs-v5p", "us-east5-a", "v5p-64", spot=True)
    watcher = Watcher(slice_, run, Gcloud(dry_run=False))
    watcher.launch()           # create, wait ACTIVE, set up, start; then watch

The watch (one look every --poll-seconds):
- the queued resource leaves ACTIVE for SUSPENDING, SUSPENDED, PREEMPTED or FAILED: the slice
  was taken back. It is deleted and asked for again, set up, and the run started again; train.py
  resumes from the workdir's last checkpoint (a bucket: the slice's disks went with it).
- ~/train.exit on worker 0 (tpu_worker.run_script): 0, finished: the slice is deleted (unless
  --keep); 75, stopped on a notice (a maintenance event) after saving: started again on the same
  slice; anything else, a failure: started again up to --max-failures times, then the watch
  stops with one line and the slice is kept for a look.
Preemptions are counted apart from failures, with a bound of their own (--max-preemptions).
A look that fails (the network, an ssh to a VM going down) is tried again at the next one; ten
in a row stop the watch, the slice and the run left as they are.
--dry-run prints one pass of every gcloud command, as it would run, and runs nothing.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
import sys
import time

from launch.engine import Engine
from launch.preflight import (PREEMPTED_EXIT_CODE, Check, CommandFailed, LaunchError, TrainRun,
                              run_check)
from launch.run_env import forwarded, hide_secrets
from launch.tpu_inputs import check_accelerator_type, check_name, check_workdir
from launch.tpu_worker import (EXIT_FILE, REMOTE_TARBALL, bootstrap_script, local_tarball,
                               logs_script, run_script, tar_command)
from planner.topology import slice_for  # no JAX: planner/__init__ imports lazily

TAKEN_BACK = ("SUSPENDING", "SUSPENDED", "PREEMPTED", "FAILED")
LOOKS_FAILED_IN_A_ROW = 10


@dataclasses.dataclass(frozen=True)
class QueuedSlice:
    name: str  # the queued resource's id; its node (or each slice's: NAME-0, NAME-1, ...)
    zone: str
    accelerator_type: str  # v4-32, v5litepod-16, v5p-64, v6e-16, ...
    runtime_version: str = "tpu-ubuntu2204-base"
    project: str | None = None
    spot: bool = False
    reserved: bool = False
    num_slices: int = 1
    python: str = "python3.11"

    def __post_init__(self):
        check_name(self.name)
        check_accelerator_type(self.accelerator_type)
        if self.spot and self.reserved:
            raise LaunchError("--spot and --reserved exclude each other: choose one")
        if self.num_slices < 1:
            raise LaunchError(f"--num-slices={self.num_slices} must be at least 1")

    @property
    def nodes(self) -> list[str]:
        """The TPU VMs: one, or one a slice (gcloud's --node-prefix names them NAME-0, ...)."""
        if self.num_slices == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.num_slices)]

    @property
    def multi_host(self) -> bool:
        """More than one process: several slices, or a slice of more than one TPU VM, which
        train.py --distributed joins."""
        return self.num_slices > 1 or vms_of(self.accelerator_type)[0] > 1

    def where(self) -> list[str]:
        return [f"--zone={self.zone}", *([f"--project={self.project}"] if self.project else [])]

    def queued(self, verb: str, *rest: str) -> list[str]:
        return ["gcloud", "compute", "tpus", "queued-resources", verb, *rest, *self.where()]

    def tpu_vm(self, verb: str, *rest: str) -> list[str]:
        return ["gcloud", "compute", "tpus", "tpu-vm", verb, *rest, *self.where()]

    def create(self) -> list[str]:
        nodes = ([f"--node-id={self.name}"] if self.num_slices == 1 else
                 [f"--node-count={self.num_slices}", f"--node-prefix={self.name}"])
        capacity = ["--spot"] if self.spot else ["--reserved"] if self.reserved else []
        return self.queued("create", self.name, *nodes,
                           f"--accelerator-type={self.accelerator_type}",
                           f"--runtime-version={self.runtime_version}", *capacity)

    def describe(self) -> list[str]:
        return self.queued("describe", self.name, "--format=value(state.state)")

    def delete(self) -> list[str]:
        return self.queued("delete", self.name, "--force", "--quiet")

    def ssh(self, node: str, worker: str, script: str) -> list[str]:
        return self.tpu_vm("ssh", node, f"--worker={worker}",
                           f"--command={shlex.join(['bash', '-c', script])}")


def vms_of(accelerator_type: str) -> tuple[int, int]:
    """(TPU VMs, chips a VM) of one slice: 4 chips a VM, but a v5e or v6e slice of 8 chips is
    one VM of 8, and a slice of fewer chips one VM of them all."""
    chips = slice_for(accelerator_type).chips
    if accelerator_type.startswith(("v5litepod", "v6e")) and chips == 8:
        return 1, 8
    per_vm = min(4, chips)
    return chips // per_vm, per_vm


class Gcloud:
    """Runs gcloud (every command printed as `+ COMMAND`); with dry_run, prints only."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run

    def run(self, cmd: list[str], capture: bool = False) -> str:
        print(f"+ {hide_secrets(shlex.join(cmd))}", flush=True)
        if self.dry_run:
            return ""
        try:
            done = subprocess.run(cmd, capture_output=capture, text=True)
        except OSError as e:
            raise CommandFailed(f"`{cmd[0]}` could not start: {e}") from None
        if done.returncode:
            detail = (done.stderr or "").strip().splitlines()[-1:] if capture else []
            raise CommandFailed(f"`{hide_secrets(shlex.join(cmd))}` exited with code "
                                f"{done.returncode}" + (f": {detail[0]}" if detail else ""))
        return done.stdout or ""


@dataclasses.dataclass
class Watcher:
    slice_: QueuedSlice
    run: TrainRun
    gcloud: Gcloud
    max_preemptions: int = 100
    max_failures: int = 3
    poll_seconds: float = 60.0
    keep: bool = False
    preemptions: int = 0
    failures: int = 0

    def launch(self) -> None:
        """The slice asked for and the run started, then watched to its end."""
        self._bring_up()
        if self.gcloud.dry_run:
            self.gcloud.run(self.slice_.describe(), capture=True)
            self.gcloud.run(self._exit_code_command(), capture=True)
            self.gcloud.run(self.slice_.delete())
            return
        self._watch()

    def _say(self, message: str) -> None:
        print(f"launch: {message}", flush=True)

    def _bring_up(self) -> None:
        self.gcloud.run(self.slice_.create())
        self._wait_active()
        self._set_up()
        self._start()

    def _wait_active(self) -> None:
        while not self.gcloud.dry_run:
            state = self.gcloud.run(self.slice_.describe(), capture=True).strip()
            if state == "ACTIVE":
                return
            if state in ("FAILED", "SUSPENDED"):
                raise CommandFailed(f"the queued resource {self.slice_.name} is {state} before "
                                    f"it ran: see `gcloud compute tpus queued-resources describe "
                                    f"{self.slice_.name}`; delete it before asking again")
            self._say(f"{self.slice_.name} is {state or 'not listed yet'}, waiting")
            time.sleep(self.poll_seconds)

    def _set_up(self) -> None:
        tarball = local_tarball(self.slice_.name)
        self.gcloud.run(tar_command(tarball))
        for node in self.slice_.nodes:
            self.gcloud.run(self.slice_.tpu_vm("scp", tarball, f"{node}:{REMOTE_TARBALL}",
                                               "--worker=all"))
            self.gcloud.run(self.slice_.ssh(node, "all", bootstrap_script(self.slice_.python)))

    def _start(self) -> None:
        script = run_script(self.run.config, self.run.workdir, list(self.run.overrides),
                            distributed=self.slice_.multi_host, env=forwarded())
        for node in self.slice_.nodes:
            self.gcloud.run(self.slice_.ssh(node, "all", script))

    def _exit_code_command(self) -> list[str]:
        return self.slice_.ssh(self.slice_.nodes[0], "0",
                               f'cat "{EXIT_FILE}" 2>/dev/null || true')

    def _look(self, cmd: list[str]) -> str | None:
        """A poll's output; None when it failed (the network, an ssh to a VM going down),
        which the watch outlives up to LOOKS_FAILED_IN_A_ROW times in a row."""
        try:
            out = self.gcloud.run(cmd, capture=True).strip()
        except CommandFailed as e:
            self._failed_looks += 1
            if self._failed_looks >= LOOKS_FAILED_IN_A_ROW:
                raise CommandFailed(f"{e} ({self._failed_looks} looks in a row failed; the "
                                    f"slice and the run are left as they are)") from None
            self._say(f"could not look ({e}); trying again")
            return None
        self._failed_looks = 0
        return out

    def _watch(self) -> None:
        self._failed_looks = 0
        while True:
            time.sleep(self.poll_seconds)
            state = self._look(self.slice_.describe())
            if state in TAKEN_BACK:
                self._count("preemptions", f"the slice is {state}")
                self.gcloud.run(self.slice_.delete())
                self._bring_up()
                continue
            if state != "ACTIVE":
                continue
            code = self._look(self._exit_code_command())
            if not code:
                continue  # still training (or the look failed)
            if code == "0":
                self._say(f"the run finished ({self.preemptions} preemptions, "
                          f"{self.failures} failures on the way)")
                if self.keep:
                    self._say(f"kept {self.slice_.name} (--keep)")
                else:
                    self.gcloud.run(self.slice_.delete())
                return
            if code == str(PREEMPTED_EXIT_CODE):
                self._count("preemptions", "train.py stopped on a notice (exit 75)")
            else:
                self._count("failures", f"train.py failed (exit {code}; its log: "
                                        f"{shlex.join(self._log_command())})")
            self._start()

    def _count(self, kind: str, why: str) -> None:
        count = getattr(self, kind) + 1
        setattr(self, kind, count)
        bound = self.max_preemptions if kind == "preemptions" else self.max_failures
        if count > bound:
            raise CommandFailed(f"{why}; {count} {kind}, more than --max-{kind}={bound}: not "
                                f"started again (the slice {self.slice_.name} is kept: "
                                f"{shlex.join(self.slice_.delete())} deletes it)")
        self._say(f"{why}: starting the run again ({kind} {count} of at most {bound})")

    def _log_command(self) -> list[str]:
        return self.slice_.ssh(self.slice_.nodes[0], "0", logs_script())


class QueuedResources(Engine):
    name = "tpu"
    help = "a Cloud TPU queued resource, watched: re-created when preempted, the run resumed"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, help="the queued resource's and TPU's name")
        parser.add_argument("--zone", required=True)
        parser.add_argument("--project")
        parser.add_argument("--accelerator-type", default="v4-8",
                            help="v4-32, v5litepod-16, v5p-64, v6e-16, ... (default: %(default)s)")
        parser.add_argument("--runtime-version", default="tpu-ubuntu2204-base")
        capacity = parser.add_mutually_exclusive_group()
        capacity.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
        capacity.add_argument("--reserved", action="store_true",
                              help="the project's reservation")
        parser.add_argument("--num-slices", type=int, default=1,
                            help="multi-slice: slices of the type")
        parser.add_argument("--python", default="python3.11",
                            help="the workers' venv's interpreter")
        parser.add_argument("--max-preemptions", type=int, default=100,
                            help="re-creations after the slice was taken back (default: "
                                 "%(default)s)")
        parser.add_argument("--max-failures", type=int, default=3,
                            help="restarts after train.py failed by itself (default: "
                                 "%(default)s)")
        parser.add_argument("--poll-seconds", type=float, default=60.0)
        parser.add_argument("--keep", action="store_true",
                            help="keep the slice once the run finished")
        parser.add_argument("--dry-run", action="store_true",
                            help="print every gcloud command, as it would run; run nothing")

    def launch(self, args, run: TrainRun) -> None:
        slice_ = QueuedSlice(args.name, args.zone, args.accelerator_type, args.runtime_version,
                             args.project, args.spot, args.reserved, args.num_slices,
                             args.python)
        notes = []
        check_workdir(run.workdir, notes)
        for note in notes:
            print(note, file=sys.stderr)
        if not args.dry_run and shutil.which("gcloud") is None:
            raise LaunchError("gcloud is not on PATH: install the Google Cloud SDK, or use "
                              "--dry-run to print the commands")
        if not args.skip_check:
            run_check(Check(run, compile="tpu", topology=args.accelerator_type,
                            num_slices=args.num_slices),
                      f"the compile check for {args.accelerator_type}", dry_run=args.dry_run)
        watcher = Watcher(slice_, run, Gcloud(args.dry_run), args.max_preemptions,
                          args.max_failures, args.poll_seconds, args.keep)
        try:
            watcher.launch()
        except KeyboardInterrupt:
            print(f"\nstopped watching; the slice and the run go on (delete: "
                  f"{shlex.join(slice_.delete())})", file=sys.stderr)
            sys.exit(130)


ENGINE = QueuedResources()
