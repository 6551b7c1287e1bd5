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

Documents always come in the same order (sorted paths; a TFDS split's record order), so a corpus
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
import hashlib
import importlib.util
import os
import re
import sys
import sysconfig
from typing import Callable, Iterator

import numpy as np

from data.errors import DataError

_HINT = ("point data.source at a text file, a directory, a glob, 'stdlib' or "
         "'tfds:NAME[/CONFIG][:VERSION][:SPLIT]'")


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Settings some source kinds read besides the source string (config.data.tfds_*)."""
    tfds_data_dir: str = ""          # where TFDS datasets are prepared; '' = the TFDS default
    tfds_text_field: str = "text"    # the feature holding each example's text


def source_options(config_data) -> SourceOptions:
    """SourceOptions from config.data; absent fields take their defaults."""
    return SourceOptions(
        tfds_data_dir=str(getattr(config_data, "tfds_data_dir", "") or ""),
        tfds_text_field=str(getattr(config_data, "tfds_text_field", "") or "text"))


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
                 describe: Callable[[str, SourceOptions], str]):
        self.iter_documents = iter_documents
        self.describe = describe


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


# --- tfds: a prepared TensorFlow Datasets split --------------------------------------------------

TFDS_FORM = "tfds:NAME[/CONFIG][:VERSION][:SPLIT]"
_TFDS_EXAMPLES = ("e.g. 'tfds:pg19:train', 'tfds:wiki40b/en:1.3.0:validation', "
                  "'tfds:lm1b:train[:1%]'")
_TFDS_PATTERN = re.compile(
    r"tfds:(?P<name>[A-Za-z0-9_]+)"          # the registered name, snake_case
    r"(?:/(?P<config>[A-Za-z0-9_.\-]+))?"     # a builder config, e.g. 'en' or 'de-en'
    r"(?::(?P<version>\d+\.\d+\.\d+))?"       # X.Y.Z: anything else after ':' is the split
    r"(?::(?P<split>[^:\s]\S*))?")           # 'train', 'validation', 'train[:10%]', ...
_READ_CHUNK = 1024          # records fetched at once (array_record reads them in parallel)


@dataclasses.dataclass(frozen=True)
class TfdsSource:
    """A parsed 'tfds:...' source string."""
    name: str
    config: str | None
    version: str | None
    split: str

    @property
    def tfds_name(self) -> str:
        """The name as TFDS spells it: 'name[/config][:version]'."""
        return (self.name + (f"/{self.config}" if self.config else "")
                + (f":{self.version}" if self.version else ""))


def parse_tfds_source(source: str) -> TfdsSource:
    """'tfds:NAME[/CONFIG][:VERSION][:SPLIT]' -> TfdsSource; the split defaults to 'train'.

        'tfds:pg19'                    -> pg19, newest prepared version, split 'train'
        'tfds:pg19:0.1.1:test'         -> pg19 version 0.1.1, split 'test'
        'tfds:wiki40b/en:validation'   -> config 'en', split 'validation'
        'tfds:lm1b:train[:10%]'        -> TFDS slicing syntax is passed through

    A VERSION is three dot-separated numbers; any other text after a ':' is the split.
    """
    match = _TFDS_PATTERN.fullmatch(source) if isinstance(source, str) else None
    if match is None:
        raise DataError(f"data.source: {source!r} is not a TFDS source: expected "
                        f"{TFDS_FORM!r}, {_TFDS_EXAMPLES}")
    return TfdsSource(name=match["name"], config=match["config"], version=match["version"],
                      split=match["split"] or "train")


class _TfdsRecords:
    """An opened split: its examples (dicts of numpy values or bytes) and how many there are."""

    def __init__(self, parsed: TfdsSource, builder, num_examples: int,
                 chunks: Callable[[], Iterator[list[dict]]]):
        self.parsed, self.builder, self.num_examples = parsed, builder, num_examples
        self.chunks = chunks    # a fresh iterator over lists of examples, in the split's order


def _iter_tfds_documents(source: str, options: SourceOptions) -> Iterator[str]:
    # Open now, so that a bad name, split or field fails at the call, not at the first next().
    records = _open_checked(source, options)
    field = options.tfds_text_field
    return (_text_of(example, field, source)
            for chunk in records.chunks() for example in chunk)


def _open_checked(source: str, options: SourceOptions) -> _TfdsRecords:
    """The opened split, after checking it has examples and its first one has the text field."""
    records = _open_tfds(source, options)
    first = next(records.chunks(), [])
    if not first:
        raise DataError(f"data.source: {source!r} has no examples: choose another split")
    _text_of(first[0], options.tfds_text_field, source)
    return records


def _describe_tfds(source: str, options: SourceOptions) -> str:
    records = _open_checked(source, options)
    parsed, builder = records.parsed, records.builder
    info_hash = "none"
    try:  # records shard lengths and sizes: changes when the split is prepared again
        from etils import epath  # a tensorflow-datasets dependency; reads gs:// too
        info_bytes = (epath.Path(builder.data_dir) / "dataset_info.json").read_bytes()
        info_hash = hashlib.sha256(info_bytes).hexdigest()[:16]
    except Exception:  # noqa: BLE001  (mocked or read-only: the other fields still key it)
        pass
    return (f"tfds:name={parsed.name} config={_config_name(builder) or '-'} "
            f"version={builder.info.version} split={parsed.split} "
            f"examples={records.num_examples} text_field={options.tfds_text_field} "
            f"data_dir={builder.data_dir} dataset_info={info_hash}")


def _open_tfds(source: str, options: SourceOptions) -> _TfdsRecords:
    """The split through tfds.data_source (array_record or parquet, no TensorFlow), else through
    tfds.load when the dataset is stored as tfrecord and TensorFlow is installed. Never downloads.
    """
    parsed = parse_tfds_source(source)
    tfds = _import_tfds()
    data_dir = options.tfds_data_dir or None
    try:
        data_source = tfds.data_source(parsed.tfds_name, split=parsed.split, data_dir=data_dir,
                                       download=False, try_gcs=False)
    except Exception as e:  # noqa: BLE001  (diagnosed below, then raised as a DataError)
        error = e
    else:
        builder = _tfds_builder(tfds, parsed, data_dir, source)
        return _TfdsRecords(parsed, builder, len(data_source),
                            lambda: _array_record_chunks(data_source))
    # Why did it fail? Each case below raises a DataError naming the fix.
    builder = _tfds_builder(tfds, parsed, data_dir, source)
    where = options.tfds_data_dir or "the TFDS default data_dir (~/tensorflow_datasets)"
    if not builder.is_prepared():
        raise DataError(
            f"data.source: {source!r}: TFDS dataset {parsed.tfds_name!r} is not prepared under "
            f"{where} and ringstripe never downloads: prepare it first (e.g. `tfds build "
            f"{parsed.name} --data_dir=DIR --file_format=array_record`), then set "
            f"data.tfds_data_dir=DIR")
    file_format = _file_format(builder)
    if file_format not in _RANDOM_ACCESS_FORMATS:
        return _open_with_tensorflow(tfds, parsed, builder, data_dir, source, file_format)
    raise DataError(f"data.source: {source!r}: TFDS could not open {parsed.tfds_name!r} split "
                    f"{parsed.split!r} under {where} ({_one_line(error)}): check the split "
                    f"name and data.tfds_data_dir; expected {TFDS_FORM!r}") from error


_RANDOM_ACCESS_FORMATS = ("array_record", "parquet")


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError("data.source: TFDS sources need tensorflow-datasets and array_record: "
                        "pip install tensorflow-datasets array_record") from e
    return tfds


def _tfds_builder(tfds, parsed: TfdsSource, data_dir: str | None, source: str):
    try:
        return tfds.builder(parsed.tfds_name, data_dir=data_dir, try_gcs=False)
    except Exception as e:  # noqa: BLE001  (DatasetNotFoundError, bad config, bad version ...)
        where = data_dir or "the TFDS default data_dir (~/tensorflow_datasets)"
        raise DataError(
            f"data.source: {source!r}: no TFDS dataset {parsed.tfds_name!r} is registered or "
            f"prepared under {where} ({_one_line(e)}): check NAME, CONFIG and VERSION in "
            f"{TFDS_FORM!r} and point data.tfds_data_dir at the folder holding "
            f"{parsed.name}/") from e


def _file_format(builder) -> str:
    fmt = builder.info.file_format
    return str(getattr(fmt, "value", fmt) or "tfrecord")


def _config_name(builder) -> str | None:
    config = getattr(builder, "builder_config", None)
    return getattr(config, "name", None)


def _open_with_tensorflow(tfds, parsed: TfdsSource, builder, data_dir: str | None, source: str,
                          file_format: str) -> _TfdsRecords:
    if importlib.util.find_spec("tensorflow") is None:
        raise DataError(
            f"data.source: {source!r}: {parsed.tfds_name!r} is stored as {file_format} under "
            f"{builder.data_dir}, which only TensorFlow can read: pip install tensorflow-cpu, or "
            f"prepare it again with file_format='array_record' (e.g. `tfds build {parsed.name} "
            f"--file_format=array_record`), which reads without TensorFlow")
    try:
        num_examples = builder.info.splits[parsed.split].num_examples
    except Exception as e:  # noqa: BLE001
        raise DataError(f"data.source: {source!r}: no split {parsed.split!r} in "
                        f"{parsed.tfds_name!r} ({_one_line(e)}): choose one of "
                        f"{sorted(builder.info.splits)}") from e

    def chunks() -> Iterator[list[dict]]:
        dataset = tfds.load(parsed.tfds_name, split=parsed.split, data_dir=data_dir,
                            download=False, try_gcs=False, shuffle_files=False)
        return _chunks(iter(tfds.as_numpy(dataset)), _READ_CHUNK)

    return _TfdsRecords(parsed, builder, num_examples, chunks)


def _array_record_chunks(data_source) -> Iterator[list[dict]]:
    get_many = getattr(data_source, "__getitems__", None)
    for lo in range(0, len(data_source), _READ_CHUNK):
        keys = range(lo, min(lo + _READ_CHUNK, len(data_source)))
        if get_many is not None:
            try:
                yield list(get_many(keys))
                continue
            except TypeError:   # tfds.testing.mock_data's mock has no working __getitems__
                get_many = None
        yield [data_source[k] for k in keys]


def _text_of(example, field: str, source: str) -> str:
    try:
        value = example[field]
    except (KeyError, TypeError, IndexError):
        fields = sorted(example) if isinstance(example, dict) else type(example).__name__
        raise DataError(f"data.source: {source!r} has no field {field!r} (its fields: {fields}): "
                        f"set data.tfds_text_field to the field holding the text") from None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    raise DataError(f"data.source: {source!r}: field {field!r} holds {type(value).__name__}, "
                    f"not text: set data.tfds_text_field to a text field")


def _one_line(error: BaseException) -> str:
    """The error's first line (DatasetNotFoundError goes on to list every dataset), shortened."""
    lines = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    text = " ".join(lines[0].split())
    return text if len(text) <= 300 else text[:297] + "..."


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


SOURCE_KINDS: dict[str, _SourceKind] = {
    "stdlib": _SourceKind(_iter_stdlib_documents, _describe_stdlib),
    "files": _SourceKind(_iter_file_documents, _describe_files),
    "tfds": _SourceKind(_iter_tfds_documents, _describe_tfds),
}
