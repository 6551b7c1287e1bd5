"""What scripts/tpu_pod.py and scripts/launch.py tpu check on this machine before they touch a
TPU: the slice's name and type (planner/topology.py's table), the config (inside the
repository, so that it is shipped), the workdir, the overrides. Each mistake is an InputError,
one line and exit code 2. Standard library only.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

# The planner's slice table; planner/__init__ imports its names lazily, so this imports no JAX.
from planner.topology import TopologyError, slice_for

REPO = Path(__file__).resolve().parents[1]
# Never shipped: local environments and outputs (the .gitignore list) and git's own data.
EXCLUDES = (".git", ".venv", "runs", "__pycache__", "*.egg-info", ".pytest_cache", "wandb")
# Google's rule for resource names: a lowercase letter first, then letters, digits and hyphens,
# not ending in a hyphen, at most 63 characters.
NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# The characters Cloud Storage allows in bucket names (lowercase letters, digits, -, _ and ., a
# letter or digit at each end), so that a mistyped workdir is one line here and not a failure on
# every worker; the length rules (3 to 63, or 222 with dots) are left to Cloud Storage.
BUCKET_RE = re.compile(r"[a-z0-9](?:[-_.a-z0-9]{0,220}[a-z0-9])?")


class InputError(Exception):
    """A mistake in the command line: reported as one line, exit code 2."""


def check_name(name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise InputError(f"--name {name!r} is not a valid TPU name: use lowercase letters, digits "
                         f"and hyphens, starting with a letter and not ending with a hyphen "
                         f"(at most 63 characters), e.g. rs-v4")


def remote_config_path(config: str) -> str:
    """The config's path relative to the repository root, which is where train.py runs on the
    workers. A config outside the repository, or under an excluded directory, is not shipped."""
    path = Path(config).expanduser()
    if not path.is_file():
        raise InputError(f"config file {config!r} does not exist: give a file such as "
                         f"configs/tiny.py")
    try:
        rel = path.resolve().relative_to(REPO)
    except ValueError:
        raise InputError(f"config {config!r} is outside {REPO}, so it would not be copied to the "
                         f"workers: put it under configs/") from None
    if any(Path(part).match(pattern) for part in rel.parts for pattern in EXCLUDES):
        raise InputError(f"config {config!r} is in a directory that is not copied to the workers "
                         f"({', '.join(EXCLUDES)}): put it under configs/")
    return rel.as_posix()


def check_accelerator_type(name: str) -> None:
    """A slice the planner's topology table knows (v4-32, v5litepod-16, ...): gcloud would
    otherwise be asked for a TPU that does not exist, or the compile check would fail later."""
    try:
        slice_for(name, flag="--accelerator-type")
    except TopologyError as e:
        raise InputError(str(e)) from None


def check_no_bucket(args) -> None:
    """--bucket once mounted the workdir's bucket with gcsfuse; it is refused rather than
    ignored, so that nobody believes something was mounted."""
    if getattr(args, "bucket", None) is not None:
        raise InputError("--bucket is no longer needed: train.py writes --workdir "
                         "gs://BUCKET/PATH directly, nothing is mounted; drop --bucket")


def check_workdir(workdir: str, notes: list[str]) -> None:
    """train.py's --workdir, passed to every worker unchanged. gs://BUCKET/PATH is what a pod
    needs (every process shares it, it outlives the TPU, train.py writes it directly); it must be
    a well-formed bucket path, since `.` and `..` are not resolved in object names. Any other path
    is each worker's own disk: kept, with a one-line warning in `notes`."""
    if workdir.startswith("gs://"):
        bucket, _, rest = workdir.removeprefix("gs://").partition("/")
        if not BUCKET_RE.fullmatch(bucket) or {".", ".."} & set(rest.split("/")):
            raise InputError(f"--workdir {workdir!r} is not a bucket path: use gs://BUCKET/PATH, "
                             f"e.g. gs://my-bucket/runs/tiny")
        return
    local = posixpath.normpath(workdir)
    if local.startswith("/mnt/"):
        # Where the gs:// workdirs of earlier versions ran, through a gcsfuse mount.
        notes.append(f"warning: --workdir {workdir}: tpu_pod.py no longer mounts buckets, so "
                     f"this is each worker's own disk; give the run as gs://BUCKET/PATH "
                     f"(gs://{local.removeprefix('/mnt/')} if it was a bucket's mount), which "
                     f"train.py writes directly")
    else:
        notes.append(f"warning: --workdir {workdir} is on each worker's own disk: each worker "
                     f"keeps only its own part and it is lost with the TPU; use "
                     f"gs://BUCKET/PATH, which train.py writes directly")


def check_run_inputs(args) -> list[str]:
    """Sets args.remote_config. Returns the lines to print once all input is known to be good:
    a warning (which does not stop anything) when the workdir is not a bucket."""
    args.remote_config = remote_config_path(args.config)
    if "--dry-run" in args.overrides:
        # After `--` it would go to train.py, and the TPU would really be created.
        raise InputError("--dry-run is after `--`, where it would be passed to train.py and "
                         "everything would really run: put it before `--`")
    bad = [o for o in args.overrides if not o.startswith("--")]
    if bad:
        # absl would take these as positional arguments, and train.py ignores those silently.
        raise InputError(f"training overrides must be flags such as --config.num_train_steps=100, "
                         f"got {' '.join(map(shlex.quote, bad))}")
    notes = []
    check_workdir(args.workdir, notes)
    return notes
