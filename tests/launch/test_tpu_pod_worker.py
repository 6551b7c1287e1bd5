"""The scripts scripts/tpu_pod.py sends to every worker (launch/tpu_worker.py), run here with
bash in a temporary HOME, with stub interpreters that record what they are asked to do: the
bootstrap installs once and only again when pyproject.toml or constraints.txt changes."""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support.tpu_pod_runs import (POD, dry_run, remote_script, tools_path, with_tmpdir,
                                write_executable)


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
        """Runs the bootstrap once with bash (plus `env`); returns (result, the calls its stubs
        appended to the log meanwhile)."""
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


def test_bootstrap_installs_once_then_only_when_pyproject_or_constraints_change(worker):
    venv = worker.home / "ringstripe" / ".venv"

    first, calls = worker.bootstrap()
    assert first.returncode == 0, first.stderr
    assert (worker.home / "ringstripe" / "train.py").is_file()  # the code is unpacked
    assert len(venvs_made(calls)) == 1
    (install,) = pip_installs(calls)
    assert install.startswith(f"{venv}/bin/python -m pip install")
    assert install.split()[-4:] == ["-c", "constraints.txt", "-e", ".[tpu]"]
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
