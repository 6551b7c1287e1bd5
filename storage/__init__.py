"""Where a run's files live: a local directory or an object store (gs://BUCKET/PATH), behind one
filesystem layer (etils.epath, which reaches Cloud Storage through fsspec's gcsfs).

    is_remote("gs://b/run") -> True          join("gs://b/run", "cache") -> "gs://b/run/cache"
    path("gs://b/run/metrics.jsonl").read_text()
    mirror("gs://b/run/cache") -> "~/.cache/ringstripe/mirror/b/run/cache"   (a local directory)
    pull(remote, local, names)  /  push(local, remote, names)  /  push_changed(local, remote, sent)

Checkpoints go to the store directly: Orbax writes gs:// paths through tensorstore, and on Cloud
Storage it commits a save by writing a marker object last instead of renaming a directory (a
rename there is a copy and delete of every object, and not atomic). Files that must be on a local
disk (the token cache is memory-mapped, sentencepiece reads a file path) are built in a local
mirror of their directory and pushed to the store; another host, or a later start on a new
machine, pulls them. Those files are immutable (named by the hash of what made them), so a copy
is never stale.

A GCS emulator is reached the standard way, with STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT:
gcsfs reads it; `use_emulator_if_set()` (called when this module is imported) passes it on to
tensorstore, which has its own variables.
"""

from __future__ import annotations

import logging
import os
import posixpath

from etils import epath

REMOTE_PREFIXES = ("gs://",)


def is_remote(location: str) -> bool:
    return str(location).startswith(REMOTE_PREFIXES)


def path(location: str) -> epath.Path:
    return epath.Path(location)


def join(base: str, *names: str) -> str:
    base = str(base)
    return posixpath.join(base, *names) if is_remote(base) else os.path.join(base, *names)


def absolute(location: str) -> str:
    """A local path made absolute; a remote one as it is."""
    return str(location) if is_remote(location) else os.path.abspath(location)


def relative_to(location: str, root: str) -> str:
    """`location` relative to `root` when it lies inside it (what a run stores, so that a copied
    run still finds its files), else unchanged."""
    location, root = absolute(location), absolute(root)
    prefix = root.rstrip("/") + "/"
    return location[len(prefix):] if location.startswith(prefix) else location


def resolve(location: str, root: str) -> str:
    """The inverse of relative_to: a relative path is taken inside `root`."""
    if not location or is_remote(location) or os.path.isabs(location):
        return location
    return join(root, location)


def use_emulator_if_set() -> None:
    """Points tensorstore (Orbax's array writer) at STORAGE_EMULATOR_HOST when it is set, as
    gcsfs already is; an emulator takes no credentials. Call before the first checkpoint."""
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return
    if "://" not in host:
        host = "http://" + host
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    # gcsfs asks the real service what kind of bucket this is and warns when it cannot.
    logging.getLogger("gcsfs").setLevel(logging.ERROR)


use_emulator_if_set()  # before any client of the store starts


def mirror(remote: str) -> str:
    """The local directory that holds copies of a remote directory's files
    (RINGSTRIPE_MIRROR, default ~/.cache/ringstripe/mirror, then the bucket and path)."""
    root = os.environ.get("RINGSTRIPE_MIRROR") or os.path.join(
        os.path.expanduser("~"), ".cache", "ringstripe", "mirror")
    return os.path.join(root, str(remote).split("://", 1)[1].strip("/"))


def read_range(location: str, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of a file, local or remote (one ranged request: a bucket's object is
    not downloaded whole)."""
    if is_remote(location):
        return _object_store(location).cat_file(location, start=start, end=stop)
    with open(location, "rb") as f:
        f.seek(start)
        return f.read(stop - start)


def exists(location: str) -> bool:
    """Whether a file (or directory) is there, local or remote."""
    return path(location).exists()


def read_text(location: str) -> str:
    return path(location).read_text()


def pull(remote: str, local: str, names=None) -> list[str]:
    """Copies the files of remote directory `remote` (or just `names`) that `local` lacks; returns
    the names copied. A file appears locally only once complete (written aside, then renamed)."""
    source = path(remote)
    if not source.exists():
        return []
    wanted = names if names is not None else [p.name for p in source.iterdir() if p.is_file()]
    os.makedirs(local, exist_ok=True)
    copied = []
    for name in wanted:
        target = os.path.join(local, name)
        if os.path.exists(target) or not (source / name).exists():
            continue
        partial = f"{target}.tmp-{os.getpid()}"
        (source / name).copy(partial, overwrite=True)
        os.replace(partial, target)
        copied.append(name)
    return copied


def push(local: str, remote: str, names) -> list[str]:
    """Uploads `names` from `local` that `remote` lacks, in the order given (put the file whose
    presence says "complete" last); returns the names uploaded."""
    target = path(remote)
    target.mkdir(parents=True, exist_ok=True)
    uploaded = []
    for name in names:
        if (target / name).exists():
            continue
        epath.Path(os.path.join(local, name)).copy(target / name, overwrite=True)
        uploaded.append(name)
    return uploaded


def push_changed(local: str, remote: str, sent: dict) -> list[str]:
    """Uploads every file under directory `local` (subfolders too) that is new or changed since
    the last call with the same `sent` ({relative path: (size, mtime)}, updated here) to the same
    place under `remote`: a folder that another program keeps writing (wandb's offline run).
    Returns the relative paths uploaded; nothing in `remote` is ever deleted."""
    uploaded = []
    for folder, _, names in os.walk(local):
        for name in sorted(names):
            file = os.path.join(folder, name)
            try:
                stat = os.stat(file)
            except FileNotFoundError:  # the writer removed it meanwhile (a temporary file)
                continue
            relative = os.path.relpath(file, local)
            if sent.get(relative) == (stat.st_size, stat.st_mtime_ns):
                continue
            target = path(join(remote, *relative.split(os.sep)))
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                epath.Path(file).copy(target, overwrite=True)
            except FileNotFoundError:
                continue
            sent[relative] = (stat.st_size, stat.st_mtime_ns)
            uploaded.append(relative)
    return uploaded


# Small files that several processes race for (the workdir lock): written whole, read fresh.


def process_running(pid: int) -> bool:
    """Whether `pid` is a live process on this host: the writer of a temporary file or a lock
    may still be at work (another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def create_exclusive(location: str, content: bytes) -> bool:
    """Writes a new file; False when one is there already. Atomic locally (a link to a file
    written aside) and on Cloud Storage (the write carries the precondition "no object of this
    name yet"; a store that ignores it, as emulators do, is why the lock reads its token back)."""
    if is_remote(location):
        fs = _object_store(location)
        if fs.exists(location):
            return False
        try:
            fs.pipe(location, content, mode="create")
        except FileExistsError:
            return False
        return True
    os.makedirs(os.path.dirname(os.path.abspath(location)), exist_ok=True)
    # Written whole aside, then linked to its name (a link fails where a file exists), so no
    # reader ever sees a half-written file, and a failed write leaves nothing under the name.
    partial = f"{location}.tmp-{os.getpid()}"
    try:
        with open(partial, "wb") as f:
            f.write(content)
        os.link(partial, location)
    except FileExistsError:
        return False
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return True


def read_bytes(location: str) -> bytes | None:
    """The file's content now (no cached listing), or None when there is none."""
    if is_remote(location):
        try:
            return _object_store(location).cat(location)
        except FileNotFoundError:
            return None
    try:
        with open(location, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def replace(location: str, content: bytes) -> None:
    """Writes the file whole: a reader sees the old content or the new, never a part."""
    if is_remote(location):
        _object_store(location).pipe(location, content)  # an object is replaced whole
        return
    with open(location + ".tmp", "wb") as f:
        f.write(content)
    os.replace(location + ".tmp", location)


def remove(location: str) -> None:
    if is_remote(location):
        try:
            _object_store(location).rm(location)
        except FileNotFoundError:
            pass
        return
    try:
        os.remove(location)
    except FileNotFoundError:
        pass


def move(source: str, target: str) -> None:
    """Moves a directory (a whole prefix, in a bucket: each object copied, then deleted; only
    for rare moves such as a damaged checkpoint put aside)."""
    if is_remote(source):
        # Copy, then delete: Cloud Storage has no directories to rename (and its per-object
        # move is not offered everywhere, emulators included).
        fs = _object_store(source)
        fs.copy(source, target, recursive=True)
        fs.rm(source, recursive=True)
        # Every client of this store in the process forgets its listings: Orbax's (through
        # epath, another instance with other options) would still list the moved step.
        for instance in list(type(fs)._cache.values()):
            instance.invalidate_cache()
        return
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    os.rename(source, target)


def _object_store(location: str):
    """The fsspec filesystem of a remote location, its listing cache dropped (another process
    may have written since)."""
    import fsspec  # (gcsfs behind it) only a bucket workdir reaches this
    fs = fsspec.filesystem(location.split("://", 1)[0])
    fs.invalidate_cache()
    return fs
