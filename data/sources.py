"""Where documents come from: a source string -> an iterator of documents (str).

Source strings (`config.data.source`):

    'stdlib'          every .py file of the running Python's standard library (about 31 MB), the
                      default corpus that exists on every machine
    '/path/file.txt'  one file = one document
    '/path/dir'       every regular file below it, recursively, sorted; hidden files and files that
                      are not valid utf-8 (binaries) are skipped
    '/path/*.txt'     a glob (contains * ? or [); '**' recurses
    'tfds:NAME[/CONFIG][:VERSION][:SPLIT]'
                      a prepared TensorFlow Datasets split, e.g. 'tfds:pg19:train'; one example =
                      one document (its data.tfds_text_field); VERSION is X.Y.Z, SPLIT defaults
                      to 'train' and may use TFDS slicing ('train[:10%]'); read from
                      data.tfds_data_dir ('' = the TFDS default; a local path or gs://)

The TFDS kind lives in data/tfds_source.py. Documents always come in the same order (sorted paths; a TFDS split's record order), so a corpus
tokenizes to the same token stream on every host and every run. `describe_source` fingerprints a
source (paths, sizes, mtimes; a TFDS split's name, config, version, split, example count and
data_dir) so caches built from it are rebuilt when it changes.

TFDS splits are read with `tfds.data_source` (array_record or parquet files, no TensorFlow). A
split stored as tfrecord is read with `tfds.load` when TensorFlow is installed, else a DataError
says how to get it. Nothing is ever downloaded: prepare datasets beforehand, e.g.
`tfds build pg19 --data_dir=DIR --file_format=array_record`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import sysconfig
from typing import Callable, Iterator

from data import tfds_source
from data.errors import DataError
from data.tfds_source import TFDS_FORM, TfdsSource, parse_tfds_source

__all__ = ["SOURCE_KINDS", "TFDS_FORM", "SourceOptions", "TfdsSource", "describe_source",
           "iter_documents", "parse_tfds_source", "source_options", "take_bytes"]

_HINT = f"point data.source at a text file, a directory, a glob, 'stdlib' or {TFDS_FORM!r}"


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Settings some source kinds read besides the source string (config.data.tfds_*)."""
    tfds_data_dir: str = ""          # where TFDS datasets are prepared; '' = the TFDS default
    tfds_text_field: str = "text"    # the feature holding each example's text


def source_options(config_data) -> SourceOptions:
    """SourceOptions from config.data (a run_config.DataConfig)."""
    return SourceOptions(tfds_data_dir=config_data.tfds_data_dir,
                         tfds_text_field=config_data.tfds_text_field)


def iter_documents(source: str, options: SourceOptions | None = None) -> Iterator[str]:
    """Yields the documents of `source` in a fixed order. DataError for a bad source."""
    return _kind(source).iter_documents(source, options or SourceOptions())


def describe_source(source: str, options: SourceOptions | None = None) -> str:
    """A stable fingerprint string of `source`: changes when its files (or TFDS split) change."""
    return _kind(source).describe(source, options or SourceOptions())


def take_bytes(documents: Iterator[str], max_bytes: int) -> Iterator[str]:
    """The documents up to `max_bytes` of utf-8 text in all (0: no limit); the last one is cut."""
    if max_bytes <= 0:
        yield from documents
        return
    left = max_bytes
    for doc in documents:
        raw = doc.encode("utf-8")
        if len(raw) >= left:
            # errors='ignore' drops a character cut in half at the end.
            yield raw[:left].decode("utf-8", errors="ignore")
            return
        left -= len(raw)
        yield doc


# ---------------------------------------------------------------------------------------------
# Source kinds. A kind is two functions of (source, options); a new source is one more entry.


class _SourceKind:
    def __init__(self, iter_documents: Callable[[str, SourceOptions], Iterator[str]],
                 describe: Callable[[str, SourceOptions], str],
                 files: Callable[[str], list[str]] | None = None):
        self.iter_documents = iter_documents
        self.describe = describe
        self.files = files  # the files it reads, where it reads files (their size bounds it)


def _kind(source: str) -> _SourceKind:
    if not isinstance(source, str) or not source:
        raise DataError(f"data.source: expected a non-empty string, got {source!r}: {_HINT}")
    if source == "stdlib":
        return SOURCE_KINDS["stdlib"]
    if source.startswith("tfds:"):
        return SOURCE_KINDS["tfds"]
    return SOURCE_KINDS["files"]


# --- files: a file, a directory or a glob -----------------------------------------------------


def _is_glob(source: str) -> bool:
    return any(c in source for c in "*?[")


def _is_hidden(path: str, root: str) -> bool:
    rel = os.path.relpath(path, root)
    return any(part.startswith(".") for part in rel.split(os.sep) if part not in (".", ".."))


def _list_files(source: str) -> list[str]:
    """Absolute paths of the regular files `source` names, sorted. DataError if there are none."""
    source = os.path.expanduser(source)
    if _is_glob(source):
        paths = [p for p in glob.glob(source, recursive=True) if os.path.isfile(p)]
        if not paths:
            raise DataError(f"data.source: the glob {source!r} matches no files: {_HINT}")
    elif os.path.isdir(source):
        paths = []
        for root, dirs, files in os.walk(source):
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # skip .git and friends
            paths += [os.path.join(root, f) for f in files if not f.startswith(".")]
        paths = [p for p in paths if os.path.isfile(p)]
        if not paths:
            raise DataError(f"data.source: the directory {source!r} holds no files: {_HINT}")
    elif os.path.isfile(source):
        paths = [source]
    else:
        raise DataError(f"data.source: no such file or directory {source!r}: {_HINT}")
    return sorted(os.path.abspath(p) for p in paths)


def _read_text(path: str, errors: str) -> str | None:
    """The file's text; None when it is not utf-8 (errors='strict'). DataError if unreadable."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"data.source: cannot read {path!r} ({e.strerror}): "
                        f"fix its permissions or remove it from data.source") from e
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        return None


def _iter_file_documents(source: str, options: SourceOptions) -> Iterator[str]:
    # List the files now, so that a bad source fails at the call, not at the first next().
    return _read_files(_list_files(source), source)


def _read_files(paths: list[str], source: str) -> Iterator[str]:
    count = 0
    for path in paths:
        text = _read_text(path, errors="strict")
        if text is None:  # a binary file in a directory of text: skip it quietly
            continue
        count += 1
        yield text
    if count == 0:
        raise DataError(f"data.source: no utf-8 text file in {source!r}: {_HINT}")


def _describe_files(source: str, options: SourceOptions) -> str:
    entries = []
    for path in _list_files(source):
        st = os.stat(path)
        entries.append(f"({path!r}, {st.st_size}, {st.st_mtime_ns})")
    return "files:[" + ", ".join(entries) + "]"


# --- stdlib: the default corpus, present wherever Python is -----------------------------------


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "site-packages")
        paths += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    if not paths:
        raise DataError(f"data.source: no .py files under the standard library {root!r}: "
                        f"choose another data.source")
    return sorted(paths)


def _iter_stdlib_documents(source: str, options: SourceOptions) -> Iterator[str]:
    return (_read_text(path, errors="replace") for path in _stdlib_files())


def _describe_stdlib(source: str, options: SourceOptions) -> str:
    paths = _stdlib_files()
    total = sum(os.path.getsize(p) for p in paths)
    root = sysconfig.get_paths()["stdlib"]
    return f"stdlib:python {sys.version.split()[0]} at {root}, {len(paths)} files, {total} bytes"


def most_tokens(source: str, max_bytes: int = 0) -> int | None:
    """An upper bound on the tokens any tokenizer makes of `source` (None where it is not
    cheap to know: TFDS), from file sizes alone, before anything is read: a piece covers at
    least one character and a character at least one byte, except where an undecodable byte
    becomes U+FFFD, three byte-fallback pieces at most; plus an EOS per document."""
    kind = _kind(source)
    if kind.files is None:
        return None
    paths = kind.files(source)
    total = sum(os.path.getsize(p) for p in paths)
    if max_bytes:
        total = min(total, max_bytes)
    return 3 * total + len(paths)


SOURCE_KINDS: dict[str, _SourceKind] = {
    "stdlib": _SourceKind(_iter_stdlib_documents, _describe_stdlib, lambda _: _stdlib_files()),
    "files": _SourceKind(_iter_file_documents, _describe_files, _list_files),
    "tfds": _SourceKind(tfds_source.iter_documents, tfds_source.describe),
}
