"""What scripts/tpu_pod.py and scripts/launch.py tpu send to every worker of a TPU slice: the
working tree as a tarball, and shell scripts, each one line of bash (`;` joins statements under
`set -e` exactly like newlines, and --dry-run prints one line per command), each safe to run any
number of times:

    local_tarball(name), tar_command(tarball)
                               the working tree, tarred here to be copied to every worker
    bootstrap_script(python)   unpack the code, make the venv if missing, install if
                               pyproject.toml or constraints.txt changed
    run_script(config, workdir, overrides, env)
                               start train.py under nohup unless one is running, with the
                               launching shell's wandb variables
    logs_script()              follow ~/train.log until the trainer exits

Nothing is mounted: a --workdir gs://BUCKET/PATH reaches train.py as it is, and train.py writes
the bucket itself (see run_script).

Standard library only.
"""

from __future__ import annotations

import os
import shlex
import tempfile

from launch.tpu_inputs import EXCLUDES, REPO

REMOTE_DIR = "ringstripe"            # on each worker, relative to $HOME
REMOTE_TARBALL = "ringstripe.tar.gz"  # scp'd into $HOME, relative paths land there
# A pid file lets `run` refuse to start a second trainer (both would claim the TPU chips) and
# lets `logs` stop following when the trainer exits, which is what lets `all` reach `delete`.
PID_FILE = "$HOME/train.pid"
LOG_FILE = "$HOME/train.log"
EXIT_FILE = "$HOME/train.exit"  # train.py's exit code, once it has ended
# The forwarded variables (launch.run_env: wandb's, its API key among them), read by the trainer
# at its start: in a file only this user reads, so the key is on no long-lived command line.
ENV_FILE = "$HOME/train.env"


def local_tarball(name: str) -> str:
    """Where the code tarball is built locally; under the temp dir (TMPDIR is honoured), named
    after the TPU so two pods set up at once don't overwrite each other's."""
    return os.path.join(tempfile.gettempdir(), f"ringstripe-{name}.tar.gz")


def tar_command(tarball: str) -> list[str]:
    """Tars the working tree rather than `git archive HEAD`: uncommitted edits and new configs
    are what one usually wants to try on the pod. Both GNU tar and macOS bsdtar accept this."""
    return ["tar", "-czf", tarball, *(f"--exclude={p}" for p in EXCLUDES), "-C", str(REPO), "."]


def bootstrap_script(python: str) -> str:
    """The per-worker setup, safe to run any number of times (it is a single line: `;` joins
    statements under `set -e` exactly like newlines, and --dry-run prints one line per command).

    Unpacks the code over ~/ringstripe (files made on the worker, such as a local workdir, are
    kept), makes ~/ringstripe/.venv only if it has no python yet, and installs (the versions of
    constraints.txt) only when the sha256 of pyproject.toml and constraints.txt differs from the
    one stored after the last successful install.
    The stamp lives inside the venv so a removed or rebuilt venv always gets a fresh install,
    and it is written last so a failed install is retried by the next setup."""
    lines = [
        "set -euo pipefail",
        f'R="$HOME/{REMOTE_DIR}"; V="$R/.venv"; PY={shlex.quote(python)}; '
        'STAMP="$V/.pyproject.sha256"; W="$(hostname)"',
        f'mkdir -p "$R"; tar -xzf "$HOME/{REMOTE_TARBALL}" -C "$R"',
        'if [ -x "$V/bin/python" ]; then echo "$W: $V exists, kept"; else '
        # TPU images ship Ubuntu's Python 3.10 and ringstripe needs 3.11+. apt waits for the
        # lock that unattended-upgrades holds for a while after a VM boots instead of failing.
        'if ! command -v "$PY" >/dev/null; then '
        'sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq update && '
        'sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq install -y '
        '"$PY" "$PY-venv"; fi; '
        # Checked before the venv exists: a venv of the wrong Python would otherwise be kept
        # (it "exists") and fail every later install.
        '"$PY" -c "import sys; sys.exit(sys.version_info < (3, 11))" || '
        '{ echo "$W: $PY is older than Python 3.11: give another --python" >&2; exit 1; }; '
        'echo "$W: creating $V with $PY"; "$PY" -m venv "$V" || { rm -rf "$V"; exit 1; }; fi',
        'H="$(cat "$R/pyproject.toml" "$R/constraints.txt" | sha256sum | cut -d" " -f1)"',
        'if [ "$(cat "$STAMP" 2>/dev/null)" = "$H" ]; then '
        'echo "$W: pyproject.toml and constraints.txt unchanged since the last install, nothing '
        'to install"; else '
        # One resolver run for the project and its tpu extra (jax[tpu]), so that cannot move jax
        # past what pyproject.toml allows behind the back of an earlier install; -c: the versions
        # make test passed with (jax[tpu] then brings the libtpu of that jax). -e: later code
        # copies need no reinstall.
        'echo "$W: installing ringstripe with its tpu extra"; cd "$R"; '
        '"$V/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt '
        '-e ".[tpu]"; echo "$H" > "$STAMP"; fi',
    ]
    return "; ".join(lines)


def run_script(config: str, workdir: str, overrides: list[str], distributed: bool = True,
               env: dict | None = None) -> str:
    """Starts train.py in the background so it outlives the ssh session (nohup, stdin from
    /dev/null so ssh need not wait), unless a trainer from an earlier `run` is still alive.

    `workdir` is passed as it is, gs:// included: train.py writes a bucket itself (checkpoints
    through Orbax/tensorstore, which commits a save with a marker object; the rest through
    gcsfs), so every process of the pod shares it without a mount. A gcsfuse mount would turn
    Orbax's directory renames into non-atomic copies, and Orbax deletes half-renamed saves.

    When train.py ends, its exit code goes to ~/train.exit (what `launch.py tpu` watches: 0
    finished, 75 stopped on a notice, else failed). distributed: jax.distributed.initialize()
    from the TPU's environment, for slices of more than one host. env: variables train.py
    gets (launch.run_env.forwarded()), through ENV_FILE."""
    train = [".venv/bin/python", "train.py", "--config", config, "--workdir", workdir,
             *(["--distributed"] if distributed else []), *overrides]
    wrapped = f'{shlex.join(train)}; echo $? > "{EXIT_FILE}"'
    exports = [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    if exports:
        wrapped = f'. "{ENV_FILE}"; {wrapped}'
    # written afresh each start (none: removed), so an earlier launch's key does not linger;
    # one printf argument a line, so that the script stays one line
    write_env = (f'(umask 077; printf "%s\\n" {shlex.join(exports)} > "{ENV_FILE}")'
                 if exports else f'rm -f "{ENV_FILE}"')

    return "; ".join([
        "set -euo pipefail",
        f'cd "$HOME/{REMOTE_DIR}"',
        f'P="$(cat "{PID_FILE}" 2>/dev/null || true)"',
        'if [ -n "$P" ] && ps -p "$P" -o args= | grep -q train.py; then '
        'echo "$(hostname): train.py is already running (pid $P, ~/train.log): wait for it, '
        'stop it with kill $P on every worker, or delete the TPU" >&2; exit 1; fi',
        # `&` ends a statement itself (`&;` is a syntax error), so the pid is saved after it.
        f'rm -f "{EXIT_FILE}"',
        write_env,
        f'nohup bash -c {shlex.quote(wrapped)} > "{LOG_FILE}" 2>&1 < /dev/null & '
        f'echo $! > "{PID_FILE}"',
        'echo "$(hostname): started train.py (pid $!), log in ~/train.log"',
    ])


def logs_script() -> str:
    """Prints ~/train.log from its start and follows it until the trainer exits (tail --pid),
    so that `all` goes on to `delete` when training is over."""
    return "; ".join([
        "set -euo pipefail",
        f'if [ ! -f "{LOG_FILE}" ]; then echo "$(hostname): no ~/train.log yet: start training '
        'with the run subcommand" >&2; exit 1; fi',
        f'P="$(cat "{PID_FILE}" 2>/dev/null || true)"',
        f'if [ -z "$P" ]; then exec cat "{LOG_FILE}"; fi',
        f'exec tail -n +1 -f --pid="$P" "{LOG_FILE}"',
    ])
