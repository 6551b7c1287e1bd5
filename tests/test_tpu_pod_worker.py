"""The scripts scripts/tpu_pod.py sends to every worker (scripts/tpu_pod_worker.py), run here with
bash in a temporary HOME, with stub interpreters that record what they are asked to do: the
bootstrap installs once and only again when pyproject.toml changes, the bucket is mounted once."""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.tpu_pod_runs import (GCLOUD_TPU, POD, dry_run, launcher, one_line_error,
                                remote_script, tools_path, with_tmpdir, write_executable)


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
        self.env = {"HOME": str(self.home), "PATH": f"{bin_dir}:{tools_path()}",
                    "STUB_LOG": str(self.log)}
        self.script = script

    def bootstrap(self, **env):
        """Runs the bootstrap once; returns (result, the calls it made)."""
        return run_logged(self, env)


def run_logged(stub, env):
    """Runs `stub.script` with bash in its environment (plus `env`); returns (result, the
    lines its stubs appended to `stub.log` meanwhile)."""
    before = stub.log.read_text().splitlines()
    result = subprocess.run(["bash", "-c", stub.script], env={**stub.env, **env},
                            capture_output=True, text=True, timeout=60)
    return result, stub.log.read_text().splitlines()[len(before):]


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


def test_bootstrap_installs_once_then_only_when_pyproject_or_constraints_change(worker):
    venv = worker.home / "ringstripe" / ".venv"

    first, calls = worker.bootstrap()
    assert first.returncode == 0, first.stderr
    assert (worker.home / "ringstripe" / "train.py").is_file()  # the code is unpacked
    assert len(venvs_made(calls)) == 1
    (install,) = pip_installs(calls)
    assert install.startswith(f"{venv}/bin/python -m pip install")
    assert install.split()[-5:] == ["-c", "constraints.txt", "-e", ".", "jax[tpu]"]
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

    # pyproject.toml changed: one install into the existing venv; the same for constraints.txt.
    repack_with(worker.home / "ringstripe.tar.gz", "pyproject.toml", "\n# new dependency\n")
    fourth, calls = worker.bootstrap()
    assert fourth.returncode == 0, fourth.stderr
    assert venvs_made(calls) == [] and len(pip_installs(calls)) == 1
    repack_with(worker.home / "ringstripe.tar.gz", "constraints.txt", "\nnumpy==2.4.6\n")
    fifth, calls = worker.bootstrap()
    assert fifth.returncode == 0, fifth.stderr
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
        self.env = {"HOME": str(tmp_path), "PATH": f"{self.bin}:{tools_path()}",
                    "STUB_LOG": str(self.log), "STUB_STATE": str(self.state),
                    "STUB_BIN": str(self.bin)}
        self.script = script

    def mount(self, **env):
        return run_logged(self, env)


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
