"""Running scripts/tpu_pod.py as a user runs it, for tests/launch/test_tpu_pod.py and
tests/launch/test_tpu_pod_worker.py: no gcloud and no network (the PATH holds only TOOLS), the commands
from --dry-run, and the scripts it would send to the workers run here with bash."""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from tests.support import ROOT

REPO = Path(ROOT)
SCRIPT = REPO / "scripts" / "tpu_pod.py"
POD = ["--name", "rs-v4", "--zone", "us-central2-b"]
TRAIN = ["--config", "configs/tiny.py", "--workdir", "gs://my-bucket/runs/tiny"]
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]


# Tools the launcher and the scripts it prints need, and no gcloud: a test can never reach a
# real gcloud (one may be installed here), even by a mistake in the test.
TOOLS = ("bash", "tar", "gzip", "ps", "grep", "cat", "sha256sum", "cut", "mkdir", "cp", "mv",
         "rm", "sleep", "seq", "tail", "hostname", "printf", "echo", "nohup")
_TOOLS_DIR = None


def tools_path() -> str:
    """A directory of symlinks to TOOLS, made once per process: the PATH every run gets."""
    global _TOOLS_DIR
    if _TOOLS_DIR is None:
        tools = Path(tempfile.mkdtemp(prefix="tpu-pod-tools-"))
        for tool in TOOLS:
            found = shutil.which(tool)
            if found:
                (tools / tool).symlink_to(found)
        _TOOLS_DIR = str(tools)
    return _TOOLS_DIR


def launcher(*args, env=None, timeout=60):
    """Runs scripts/tpu_pod.py from the repository root, by default with no gcloud on PATH."""
    env = {**os.environ, "PATH": tools_path()} if env is None else env
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def dry_run(command, *args, env=None, compile_check=False):
    """The commands `COMMAND --dry-run ARGS` prints, as argv lists (checks the `+ ` one per line
    format). --dry-run goes first: after `--` it would be an override for train.py. The compile
    check that run and all print first is checked there and left out unless compile_check."""
    result = launcher(command, "--dry-run", *args, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), result.stdout
    commands = [shlex.split(line[2:]) for line in lines]
    checks = [i for i, c in enumerate(commands) if verb(c) == "compile-check"]
    assert checks == ([0] if command in ("run", "all") and "--skip-compile-check" not in args
                      else []), commands
    return commands if compile_check else [c for c in commands if verb(c) != "compile-check"]


def with_tmpdir(tmp_path):
    """The environment for a launcher that builds its tarball under tmp_path."""
    return {**os.environ, "PATH": tools_path(), "TMPDIR": str(tmp_path)}


def verb(cmd):
    """create/scp/ssh/delete for a gcloud tpu-vm command, compile-check for scripts/plan.py
    --compile=tpu, else the program name."""
    if len(cmd) > 1 and cmd[1].endswith("scripts/plan.py"):
        return "compile-check"
    return cmd[4] if cmd[:4] == GCLOUD_TPU else cmd[0]


def remote_script(cmd):
    """The bash script an ssh command runs on the workers (--command='bash -c SCRIPT')."""
    value = next(a for a in cmd if a.startswith("--command="))[len("--command="):]
    bash, flag, script = shlex.split(value)
    assert (bash, flag) == ("bash", "-c")
    return script


def one_line_error(result, *words):
    assert result.returncode != 0
    assert result.stdout == ""  # nothing was printed as run, nothing ran
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def write_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path

