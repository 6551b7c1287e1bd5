"""scripts/tpu_pod.py, run as a user runs it. No gcloud and no network: the commands come from
--dry-run, and the scripts it would send to the workers are run here with bash in a temporary
HOME, with stub interpreters that record what they are asked to do."""

import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "tpu_pod.py"
POD = ["--name", "rs-v4", "--zone", "us-central2-b"]
TRAIN = ["--config", "configs/tiny.py", "--workdir", "gs://my-bucket/runs/tiny"]
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]


# Tools the launcher and the scripts it prints need, and no gcloud: a test can never reach a
# real gcloud (one may be installed here), even by a mistake in the test.
TOOLS = ("bash", "tar", "gzip", "ps", "grep", "cat", "sha256sum", "cut", "mkdir", "cp", "mv",
         "rm", "sleep", "seq", "tail", "hostname", "printf", "echo", "nohup", "id")
SAFE_PATH = None


@pytest.fixture(autouse=True, scope="session")
def safe_path(tmp_path_factory):
    global SAFE_PATH
    tools = tmp_path_factory.mktemp("tools")
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    SAFE_PATH = str(tools)
    return SAFE_PATH


def launcher(*args, env=None, timeout=60):
    """Runs scripts/tpu_pod.py from the repository root, by default with no gcloud on PATH."""
    env = {**os.environ, "PATH": SAFE_PATH} if env is None else env
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def dry_run(command, *args, env=None):
    """The commands `COMMAND --dry-run ARGS` prints, as argv lists (checks the `+ ` one per line
    format). --dry-run goes first: after `--` it would be an override for train.py."""
    result = launcher(command, "--dry-run", *args, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), result.stdout
    return [shlex.split(line[2:]) for line in lines]


def with_tmpdir(tmp_path):
    """The environment for a launcher that builds its tarball under tmp_path."""
    return {**os.environ, "PATH": SAFE_PATH, "TMPDIR": str(tmp_path)}


def verb(cmd):
    """create/scp/ssh/delete for a gcloud tpu-vm command, else the program name."""
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


# --- create, delete, all ----------------------------------------------------------------------

def test_create_names_type_zone_and_version():
    (cmd,) = dry_run("create", *POD)
    assert cmd[:6] == [*GCLOUD_TPU, "create", "rs-v4"]
    assert "--accelerator-type=v4-32" in cmd
    assert "--zone=us-central2-b" in cmd
    assert "--version=tpu-ubuntu2204-base" in cmd
    assert not any(a.startswith("--project") or a in ("--spot", "--preemptible") for a in cmd)


def test_create_options():
    (cmd,) = dry_run("create", *POD, "--accelerator-type", "v5litepod-16", "--spot",
                     "--project", "my-proj", "--version", "v2-alpha-tpuv5-lite")
    assert {"--accelerator-type=v5litepod-16", "--spot", "--project=my-proj",
            "--version=v2-alpha-tpuv5-lite"} <= set(cmd)
    both = launcher("create", *POD, "--spot", "--preemptible", "--dry-run")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_all_runs_every_step_in_order_and_ends_with_delete():
    commands = dry_run("all", *POD, *TRAIN, "--", "--config.num_train_steps=100")
    assert [verb(c) for c in commands] == ["create", "tar", "scp", "ssh", "ssh", "ssh", "delete"]
    assert commands[-1] == [*GCLOUD_TPU, "delete", "rs-v4", "--quiet", "--zone=us-central2-b"]
    assert "--worker=0" in commands[5] and "tail" in remote_script(commands[5])
    assert "--distributed" in remote_script(commands[4])
    # Every gcloud command carries the zone, and the project when one is given.
    with_project = dry_run("all", *POD, *TRAIN, "--project", "p1")
    assert all("--zone=us-central2-b" in c and "--project=p1" in c
               for c in with_project if c[0] == "gcloud")


def test_all_with_a_bucket_mounts_it_in_setup_before_training():
    commands = dry_run("all", *POD, "--bucket", "my-bucket", *TRAIN)
    assert [verb(c) for c in commands] == ["create", "tar", "scp", "ssh", "ssh", "ssh", "ssh",
                                           "delete"]
    assert "gcsfuse --implicit-dirs" in remote_script(commands[4])
    assert "--worker=all" in commands[4]
    assert "--workdir /mnt/my-bucket/runs/tiny" in remote_script(commands[5])


def test_all_refuses_a_workdir_in_another_bucket():
    result = launcher("all", *POD, "--bucket", "other", *TRAIN, "--dry-run")
    assert result.returncode == 2
    assert "--bucket my-bucket" in result.stderr.strip().splitlines()[-1]


def test_all_without_a_bucket_warns_that_the_workdir_is_not_mounted():
    result = launcher("all", *POD, *TRAIN, "--dry-run")
    assert result.returncode == 0
    assert "add --bucket my-bucket" in result.stderr


def test_all_with_keep_does_not_delete():
    commands = dry_run("all", *POD, *TRAIN, "--keep")
    assert [verb(c) for c in commands] == ["create", "tar", "scp", "ssh", "ssh", "ssh"]


def test_delete():
    assert dry_run("delete", *POD) == [[*GCLOUD_TPU, "delete", "rs-v4", "--quiet",
                                        "--zone=us-central2-b"]]


# --- setup: copy to every worker, idempotent bootstrap -------------------------------------------

def test_setup_copies_the_code_to_every_worker(tmp_path):
    tar, scp, ssh = dry_run("setup", *POD, env=with_tmpdir(tmp_path))
    tarball = str(tmp_path / "ringstripe-rs-v4.tar.gz")
    assert tar[:3] == ["tar", "-czf", tarball]
    assert scp[:7] == [*GCLOUD_TPU, "scp", tarball, "rs-v4:ringstripe.tar.gz"]
    assert "--worker=all" in scp
    assert ssh[:6] == [*GCLOUD_TPU, "ssh", "rs-v4"] and "--worker=all" in ssh
    # The tar command as printed really runs, ships the code and leaves local state behind.
    subprocess.run(tar, check=True)
    with tarfile.open(tarball) as t:
        names = {n.removeprefix("./") for n in t.getnames()}
    assert {"train.py", "pyproject.toml", "configs/tiny.py", "scripts/tpu_pod.py"} <= names
    assert (REPO / ".venv").exists()  # so that its absence below means something
    assert not any(n.split("/")[0] in (".venv", ".git", "runs") for n in names)


class Worker:
    """A worker's HOME in a temp dir. `python3.11` on PATH is a stub: `-m venv DIR` makes
    DIR/bin/python a copy of the stub, and every call (pip included) is appended to a log."""

    STUB = """#!/bin/bash
echo "$0 $*" >> "$STUB_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
if [ "$1" = -m ] && [ "$2" = pip ] && [ -n "${STUB_PIP_FAIL:-}" ]; then exit 1; fi
exit 0
"""

    def __init__(self, tmp_path: Path, script: str):
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.log = tmp_path / "calls.log"
        self.log.touch()
        bin_dir = tmp_path / "bin"
        write_executable(bin_dir / "python3.11", self.STUB)
        # apt must not be needed when the interpreter exists; a stub sudo would show it.
        write_executable(bin_dir / "sudo", '#!/bin/bash\necho "sudo $*" >> "$STUB_LOG"\nexit 1\n')
        self.env = {"HOME": str(self.home), "PATH": f"{bin_dir}:{SAFE_PATH}",
                    "STUB_LOG": str(self.log)}
        self.script = script

    def bootstrap(self, **env):
        """Runs the bootstrap once; returns (result, the calls it made)."""
        before = self.log.read_text().splitlines()
        result = subprocess.run(["bash", "-c", self.script], env={**self.env, **env},
                                capture_output=True, text=True, timeout=60)
        return result, self.log.read_text().splitlines()[len(before):]


def pip_installs(calls):
    return [c for c in calls if " -m pip install" in c]


def venvs_made(calls):
    return [c for c in calls if " -m venv " in c]


def repack_with(tarball: Path, name: str, extra: str):
    """Rewrites the tarball with `extra` appended to one of its files (a new code version)."""
    with tarfile.open(tarball) as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
    with tarfile.open(tarball, "w:gz") as t:
        for member, data in members:
            if member.name.removeprefix("./") == name:
                data += extra.encode()
                member.size = len(data)
            t.addfile(member, io.BytesIO(data) if data is not None else None)


@pytest.fixture
def worker(tmp_path):
    """A worker after `scp`: the real tarball from the printed tar command in its HOME, and the
    printed bootstrap script."""
    tar, _, ssh = dry_run("setup", *POD, env=with_tmpdir(tmp_path))
    subprocess.run(tar, check=True)
    w = Worker(tmp_path, remote_script(ssh))
    shutil.copy(tar[2], w.home / "ringstripe.tar.gz")
    return w


def test_bootstrap_installs_once_then_only_when_pyproject_changes(worker):
    venv = worker.home / "ringstripe" / ".venv"

    first, calls = worker.bootstrap()
    assert first.returncode == 0, first.stderr
    assert (worker.home / "ringstripe" / "train.py").is_file()  # the code is unpacked
    assert len(venvs_made(calls)) == 1
    (install,) = pip_installs(calls)
    assert install.startswith(f"{venv}/bin/python -m pip install")
    assert install.split()[-3:] == ["-e", ".", "jax[tpu]"]
    assert not any(c.startswith("sudo") for c in calls)

    second, calls = worker.bootstrap()
    assert second.returncode == 0, second.stderr
    assert venvs_made(calls) == [] and pip_installs(calls) == []
    assert "nothing to install" in second.stdout

    # New code with the same pyproject.toml: copied, still nothing installed.
    repack_with(worker.home / "ringstripe.tar.gz", "train.py", "\n# edited\n")
    third, calls = worker.bootstrap()
    assert third.returncode == 0, third.stderr
    assert (worker.home / "ringstripe" / "train.py").read_text().endswith("# edited\n")
    assert venvs_made(calls) == [] and pip_installs(calls) == []

    # pyproject.toml changed: one install into the existing venv.
    repack_with(worker.home / "ringstripe.tar.gz", "pyproject.toml", "\n# new dependency\n")
    fourth, calls = worker.bootstrap()
    assert fourth.returncode == 0, fourth.stderr
    assert venvs_made(calls) == [] and len(pip_installs(calls)) == 1


def test_bootstrap_retries_a_failed_install(worker):
    failed, calls = worker.bootstrap(STUB_PIP_FAIL="1")
    assert failed.returncode != 0 and len(pip_installs(calls)) == 1
    retried, calls = worker.bootstrap()
    assert retried.returncode == 0, retried.stderr
    assert venvs_made(calls) == [] and len(pip_installs(calls)) == 1  # venv kept, install retried
    again, calls = worker.bootstrap()
    assert again.returncode == 0 and pip_installs(calls) == []


def test_bootstrap_refuses_an_old_python(worker):
    write_executable(Path(worker.env["PATH"].split(":")[0]) / "python3.11",
                     '#!/bin/bash\necho "$0 $*" >> "$STUB_LOG"\n[ "$1" != -c ]\n')
    result, calls = worker.bootstrap()
    assert result.returncode != 0 and "older than Python 3.11" in result.stderr
    assert venvs_made(calls) == [] and not (worker.home / "ringstripe" / ".venv").exists()


# --- setup --bucket: gcsfuse mount on every worker ------------------------------------------

def test_setup_with_a_bucket_mounts_it_after_the_bootstrap(tmp_path):
    tar, scp, bootstrap, mount = dry_run("setup", *POD, "--bucket", "b",
                                         env=with_tmpdir(tmp_path))
    assert "pip install" in remote_script(bootstrap)
    assert mount[:6] == [*GCLOUD_TPU, "ssh", "rs-v4"] and "--worker=all" in mount
    script = remote_script(mount)
    # The install only when gcsfuse is missing, the mount only when nothing is mounted there.
    guard, install = script.index("if command -v gcsfuse"), script.index("install -y gcsfuse")
    unmounted, mount_call = (script.index('if mountpoint -q "$M"'),
                             script.index('gcsfuse --implicit-dirs "$B" "$M"'))
    assert guard < install < unmounted < mount_call
    assert "M=/mnt/b" in script
    # gs:// is dropped from the name; a path or a bad name is refused.
    (_, _, _, mount2) = dry_run("setup", *POD, "--bucket", "gs://b/", env=with_tmpdir(tmp_path))
    assert mount2 == mount
    for bad in ("b/runs", "B", "b-", "a b", "a;b"):
        result = launcher("setup", *POD, "--bucket", bad, "--dry-run")
        assert result.returncode == 2
        one_line_error(result, "not a bucket name")


class MountWorker:
    """Runs the printed mount script with stubs on PATH that append each call to a log: sudo
    (runs apt-get, swallows tee's input into a file, does nothing else: /mnt and /etc are not
    the test's), apt-get (`install` puts the gcsfuse stub on PATH), curl, lsb_release, and
    mountpoint, which says mounted for the paths the gcsfuse stub has "mounted"."""

    def __init__(self, tmp_path: Path, script: str):
        self.bin = tmp_path / "bin"
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.log = self.state / "calls.log"
        self.log.touch()
        self.mounts = self.state / "mounts"
        log = 'echo "${0##*/} $*" >> "$STUB_LOG"\n'
        write_executable(self.bin / "sudo", "#!/bin/bash\n" + log + """\
while [[ "$1" == *=* ]]; do shift; done
case "$1" in
  apt-get) exec "$@";;
  tee) cat >> "$STUB_STATE/tee.out";;
esac
""")
        write_executable(self.bin / "apt-get", "#!/bin/bash\n" + log + """\
case " $* " in *" install "*) cp "$STUB_STATE/gcsfuse" "$STUB_BIN/gcsfuse";; esac
""")
        write_executable(self.bin / "curl", "#!/bin/bash\n" + log + "echo KEY\n")
        write_executable(self.bin / "lsb_release", "#!/bin/bash\necho jammy\n")
        write_executable(self.bin / "mountpoint", "#!/bin/bash\n" + log +
                         '[ "$1" = -q ] && grep -qxF "$2" "$STUB_STATE/mounts" 2>/dev/null\n')
        # Not on PATH until apt-get installs it.
        write_executable(self.state / "gcsfuse", "#!/bin/bash\n" + log + """\
if [ -n "${STUB_GCSFUSE_FAIL:-}" ]; then exit 1; fi
echo "$3" >> "$STUB_STATE/mounts"
""")
        self.env = {"HOME": str(tmp_path), "PATH": f"{self.bin}:{SAFE_PATH}",
                    "STUB_LOG": str(self.log), "STUB_STATE": str(self.state),
                    "STUB_BIN": str(self.bin)}
        self.script = script

    def mount(self, **env):
        before = self.log.read_text().splitlines()
        result = subprocess.run(["bash", "-c", self.script], env={**self.env, **env},
                                capture_output=True, text=True, timeout=60)
        return result, self.log.read_text().splitlines()[len(before):]


@pytest.fixture
def mount_worker(tmp_path):
    *_, mount = dry_run("setup", *POD, "--bucket", "b", env=with_tmpdir(tmp_path))
    return MountWorker(tmp_path, remote_script(mount))


def test_mount_installs_gcsfuse_and_mounts_once(mount_worker):
    first, calls = mount_worker.mount()
    assert first.returncode == 0, first.stderr
    installs = [c for c in calls if c.startswith("apt-get") and "install -y gcsfuse" in c]
    assert len(installs) == 1 and any(c.startswith("apt-get") and c.endswith(" update")
                                      for c in calls)
    assert "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg" in calls
    assert ("deb [signed-by=/usr/share/keyrings/cloud.google.asc] "
            "https://packages.cloud.google.com/apt gcsfuse-jammy main") in (
        mount_worker.state / "tee.out").read_text()
    assert "sudo mkdir -p /mnt/b" in calls
    assert any(c.startswith("sudo chown ") and c.endswith(" /mnt/b") for c in calls)
    assert calls.index(installs[0]) < calls.index("gcsfuse --implicit-dirs b /mnt/b")
    assert "mounted gs://b at /mnt/b" in first.stdout

    # Run again: gcsfuse is there and the bucket is mounted, so nothing is installed or mounted.
    second, calls = mount_worker.mount()
    assert second.returncode == 0, second.stderr
    assert calls == ["mountpoint -q /mnt/b"]
    assert "gcsfuse is installed" in second.stdout and "already mounted" in second.stdout

    # After an unmount (a rebooted worker): mounted again, still not reinstalled.
    mount_worker.mounts.unlink()
    third, calls = mount_worker.mount()
    assert third.returncode == 0, third.stderr
    assert not any(c.startswith(("apt-get", "curl")) for c in calls)
    assert calls[-1] == "gcsfuse --implicit-dirs b /mnt/b"


def test_mount_failure_stops_setup(mount_worker):
    failed, calls = mount_worker.mount(STUB_GCSFUSE_FAIL="1")
    assert failed.returncode != 0
    assert "could not mount gs://b at /mnt/b" in failed.stderr


# --- run and logs ---------------------------------------------------------------------------

OVERRIDES = ["--config.num_train_steps=100", "--config.data.source=/data/my corpus/*.txt"]


def test_run_starts_distributed_training_on_every_worker(tmp_path):
    (ssh,) = dry_run("run", *POD, *TRAIN, "--", *OVERRIDES)
    assert ssh[:6] == [*GCLOUD_TPU, "ssh", "rs-v4"] and "--worker=all" in ssh
    script = remote_script(ssh)

    # Run it in a worker's HOME whose venv python records its arguments and waits for `stop`.
    home = tmp_path / "home"
    write_executable(home / "ringstripe" / ".venv" / "bin" / "python", """#!/bin/bash
printf '%s\\n' "$@" > "$HOME/args.tmp" && mv "$HOME/args.tmp" "$HOME/args"
for _ in $(seq 200); do [ -f "$HOME/stop" ] && exit 0; sleep 0.05; done
""")
    env = {"HOME": str(home), "PATH": SAFE_PATH}

    def run_remote():
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                              timeout=30)

    started = run_remote()
    assert started.returncode == 0, started.stderr
    pid = int((home / "train.pid").read_text())
    try:
        deadline = time.monotonic() + 10
        while not (home / "args").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        args = (home / "args").read_text().splitlines()
        assert args == ["train.py", "--config", "configs/tiny.py", "--workdir",
                        "/mnt/my-bucket/runs/tiny", "--distributed", *OVERRIDES]
        assert (home / "train.log").exists()

        again = run_remote()  # a second trainer would fight the first for the TPU
        assert again.returncode != 0 and "already running" in again.stderr
    finally:
        (home / "stop").touch()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(
            ["ps", "-p", str(pid), "-o", "stat="], capture_output=True,
            text=True).stdout.strip() not in ("", "Z"):
        time.sleep(0.05)
    (home / "args").unlink()
    restarted = run_remote()  # the old one is gone: starting again is fine
    assert restarted.returncode == 0, restarted.stderr
    (home / "stop").touch()


def train_workdir(ssh):
    """The --workdir value in the train.py command line of a `run` ssh command."""
    words = shlex.split(remote_script(ssh).split("nohup ", 1)[1].split(" > ", 1)[0])
    return words[words.index("--workdir") + 1]


def test_run_rewrites_a_bucket_workdir_to_its_mount():
    result = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                      "--workdir", "gs://b/runs/x")
    assert result.returncode == 0, result.stderr
    (ssh,) = [shlex.split(line[2:]) for line in result.stdout.splitlines()]
    assert train_workdir(ssh) == "/mnt/b/runs/x"
    assert ".venv/bin/python train.py --config configs/tiny.py --workdir /mnt/b/runs/x " \
           "--distributed" in remote_script(ssh)
    (note,) = result.stderr.strip().splitlines()
    assert "gs://b/runs/x" in note and "/mnt/b/runs/x" in note

    # A path in the mount is kept as it is, without a word.
    mounted = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                       "--workdir", "/mnt/b/runs/x")
    assert mounted.returncode == 0 and mounted.stderr == ""
    assert train_workdir(shlex.split(mounted.stdout[2:])) == "/mnt/b/runs/x"

    # A local path is kept, with the warning that it is each worker's own disk.
    local = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                     "--workdir", "runs/x")
    assert local.returncode == 0 and "each worker's own disk" in local.stderr
    assert train_workdir(shlex.split(local.stdout[2:])) == "runs/x"

    for bad in ("gs://", "gs:///runs/x", "gs://b/../../etc"):
        result = launcher("run", "--dry-run", *POD, "--config", "configs/tiny.py",
                          "--workdir", bad)
        assert result.returncode == 2
        one_line_error(result, "not a bucket path")


def test_logs_follows_worker_0_until_training_ends(tmp_path):
    (ssh,) = dry_run("logs", *POD)
    assert "--worker=0" in ssh
    (ssh3,) = dry_run("logs", *POD, "--worker", "3")
    assert "--worker=3" in ssh3

    home = tmp_path / "home"
    home.mkdir()
    (home / "train.log").write_text("step 10/100  loss 7.1\n")
    trainer = subprocess.Popen(["sleep", "1"])
    (home / "train.pid").write_text(f"{trainer.pid}\n")
    follower = subprocess.Popen(["bash", "-c", remote_script(ssh)],
                                env={"HOME": str(home), "PATH": SAFE_PATH},
                                stdout=subprocess.PIPE, text=True)
    trainer.wait()  # reaped: tail --pid sees it gone
    out, _ = follower.communicate(timeout=20)  # returns by itself: `all` can go on to delete
    assert follower.returncode == 0 and "step 10/100" in out


# --- bad input, no gcloud, failing commands -------------------------------------------------

@pytest.mark.parametrize("command", ["run", "all"])
def test_missing_config_is_one_line_exit_2(command):
    result = launcher(command, *POD, "--config", "configs/nope.py",
                      "--workdir", "gs://b/r", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "configs/nope.py", "does not exist")


def test_config_outside_the_repository_is_refused(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text("")
    result = launcher("run", *POD, "--config", str(config), "--workdir", "gs://b/r", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "outside")


@pytest.mark.parametrize("name", ["RS-v4", "rs_v4", "4rs", "rs-", "r" * 64])
def test_bad_tpu_name_is_refused(name):
    result = launcher("delete", "--name", name, "--zone", "z", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "not a valid TPU name")


def test_overrides_must_be_flags():
    result = launcher("run", *POD, *TRAIN, "--dry-run", "--", "config.num_train_steps=100")
    assert result.returncode == 2
    one_line_error(result, "config.num_train_steps=100")
    assert launcher("delete", *POD, "--dry-run", "--", "--config.x=1").returncode == 2


def test_no_gcloud_without_dry_run_is_an_error():
    assert shutil.which("gcloud", path=SAFE_PATH) is None
    result = launcher("all", *POD, *TRAIN)
    assert result.returncode != 0
    one_line_error(result, "gcloud", "Google Cloud SDK", "--dry-run")
    assert launcher("all", "--dry-run", *POD, *TRAIN).returncode == 0


def test_dry_run_after_the_separator_is_refused():
    result = launcher("all", *POD, *TRAIN, "--", "--config.num_train_steps=100", "--dry-run")
    assert result.returncode == 2
    one_line_error(result, "--dry-run", "before")


def fake_gcloud(tmp_path, fail_on: str, code: int = 7):
    """A gcloud on PATH that logs its calls and exits `code` when its args contain fail_on."""
    log = tmp_path / "gcloud.log"
    write_executable(tmp_path / "bin" / "gcloud", f"""#!/bin/bash
echo "$*" >> {shlex.quote(str(log))}
case " $* " in *" {fail_on} "*) exit {code};; esac
""")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{SAFE_PATH}",
           "TMPDIR": str(tmp_path)}
    return env, log


def test_stops_at_the_first_failing_command(tmp_path):
    env, log = fake_gcloud(tmp_path, fail_on="create")
    result = launcher("create", *POD, env=env)
    assert result.returncode == 1
    assert result.stdout.startswith("+ gcloud compute tpus tpu-vm create rs-v4")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "exited with code 7" in lines[0] and "create rs-v4" in lines[0]
    assert len(log.read_text().splitlines()) == 1


def test_all_stops_after_a_failure_and_says_how_to_delete(tmp_path):
    env, log = fake_gcloud(tmp_path, fail_on="scp")
    result = launcher("all", *POD, *TRAIN, env=env)
    assert result.returncode == 1
    assert [line.split()[3] for line in log.read_text().splitlines()] == ["create", "scp"]
    # The warning that nothing mounts the workdir's bucket (no --bucket), then the failure.
    warning, line = result.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "add --bucket my-bucket" in warning
    assert "exited with code 7" in line
    assert "gcloud compute tpus tpu-vm delete rs-v4 --quiet --zone=us-central2-b" in line
