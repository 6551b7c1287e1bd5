"""The 'tfds:NAME[/CONFIG][:VERSION][:SPLIT]' source kind (data/sources.py dispatches to it): a
prepared TensorFlow Datasets split, one example = one document (its data.tfds_text_field), in the
split's record order.

Splits are read with `tfds.data_source` (array_record or parquet files, no TensorFlow); a split
stored as tfrecord is read with `tfds.load` when TensorFlow is installed, else a DataError says
how to get it. Nothing is ever downloaded.

    iter_documents(source, options) -> the documents      describe(source, options) -> fingerprint
    parse_tfds_source(source) -> TfdsSource(name, config, version, split)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
from typing import Callable, Iterator

import numpy as np

from data.errors import DataError

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


def iter_documents(source: str, options) -> Iterator[str]:
    # Open now, so that a bad name, split or field fails at the call, not at the first next().
    records = _open_checked(source, options)
    field = options.tfds_text_field
    return (_text_of(example, field, source)
            for chunk in records.chunks() for example in chunk)


def _open_checked(source: str, options) -> _TfdsRecords:
    """The opened split, after checking it has examples and its first one has the text field."""
    records = _open_tfds(source, options)
    first = next(records.chunks(), [])
    if not first:
        raise DataError(f"data.source: {source!r} has no examples: choose another split")
    _text_of(first[0], options.tfds_text_field, source)
    return records


def describe(source: str, options) -> str:
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


def _open_tfds(source: str, options) -> _TfdsRecords:
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
        import tensorflow_datasets as tfds  # heavy (TensorFlow), and only for tfds: sources
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
