"""A directory of safetensors files as Hugging Face writes it: one `model.safetensors`, or shards
`model-0000k-of-0000n.safetensors` with `model.safetensors.index.json` naming each tensor's file.

    weights = SafetensorsDir("/models/llama")         # reads headers only
    weights.shape("model.norm.weight")                 # (4096,)
    weights.read("lm_head.weight", (slice(0, 8), slice(None)))   # rows 0..7, memory-mapped
    write(path, iter([("model.norm.weight", array), ...]), max_shard_bytes=5 << 30)

Reading memory-maps each file, so a slice costs its own bytes, never the whole tensor's or file's:
a host loads only the shards of the parameters its devices hold. A directory in a bucket
(gs://BUCKET/PATH, through the storage layer) is read by byte ranges instead: each file's header
once, then for a slice the rows of its first axis that the slice takes (all of them, for a
slice of another axis only), so a host again reads about what its devices hold.

MXFP4 (how GPT-OSS's published checkpoints keep their experts): a matrix W [..., in, out] is
stored as `W_blocks` uint8 [..., out, in / 32, 16] (32 e2m1 values a block, two a byte, the
low nibble first) and `W_scales` uint8 [..., out, in / 32] (e8m0: the block's values times
2^(s - 127)). The directory shows such a pair as the one float32 tensor `W` [..., in, out],
the layout of the unquantized files, dequantized as it is read (exact: every value is a
float32).
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

import storage

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"
BLOCKS, SCALES = "_blocks", "_scales"  # an MXFP4 tensor's two parts (module docstring)
# e2m1: sign, 2 exponent bits, 1 mantissa bit; the 16 codes' values
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


class SafetensorsDir:
    """The tensors of a checkpoint directory: names, shapes, dtypes, and slices of them."""

    def __init__(self, path: str):
        self.path = path
        index = storage.join(path, INDEX)
        if storage.exists(index):
            weight_map = json.loads(storage.read_text(index))["weight_map"]
        elif storage.exists(storage.join(path, SINGLE)):
            weight_map = None
        else:
            raise FileNotFoundError(f"{path} has neither {SINGLE} nor {INDEX}")
        files = sorted(set(weight_map.values())) if weight_map else [SINGLE]
        opener = RangeFile if storage.is_remote(path) else (lambda f: safe_open(f, "np"))
        self._files = {name: opener(storage.join(path, name)) for name in files}
        if weight_map is None:
            weight_map = {key: SINGLE for key in self._files[SINGLE].keys()}
        self._where = weight_map
        # MXFP4 pairs, by the name of the tensor they make (module docstring)
        self._mxfp4 = {name[:-len(BLOCKS)] for name in weight_map if name.endswith(BLOCKS)
                       and name[:-len(BLOCKS)] + SCALES in weight_map}

    def names(self) -> list[str]:
        parts = {name + suffix for name in self._mxfp4 for suffix in (BLOCKS, SCALES)}
        return sorted((set(self._where) - parts) | self._mxfp4)

    def _slice(self, name: str):
        return self._files[self._where[name]].get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._mxfp4:
            *lead, out, groups, pair_bytes = self.shape(name + BLOCKS)
            return (*lead, groups * 2 * pair_bytes, out)
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """safetensors' name for it: 'F32', 'BF16', 'F16', ... ('MXFP4' for a pair)."""
        return "MXFP4" if name in self._mxfp4 else self._slice(name).get_dtype()

    def read(self, name: str, index=None) -> np.ndarray:
        """The tensor, or the part `index` (a tuple of slices) selects."""
        if name in self._mxfp4:
            return self._read_mxfp4(name, index)
        part = self._slice(name)
        return np.asarray(part[index if index is not None else tuple(
            slice(None) for _ in part.get_shape())])

    def _read_mxfp4(self, name: str, index) -> np.ndarray:
        """Part `index` of [..., in, out]: the blocks of its rows `out`, dequantized whole
        along `in` (a row's blocks are contiguous), then sliced."""
        shape = self.shape(name)
        index = tuple(index or ()) + (slice(None),) * (len(shape) - len(index or ()))
        *lead, inner, out = index
        rows = (*lead, out)
        values = dequantize_mxfp4(self.read(name + BLOCKS, rows), self.read(name + SCALES, rows))
        return np.swapaxes(values, -1, -2)[..., inner, :]


# safetensors' dtype names -> numpy's (bfloat16: ml_dtypes', as JAX has it)
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}


class RangeFile:
    """A safetensors file read by byte ranges (a bucket's object), as safe_open(path, "np")
    reads a local one: keys(), get_slice(name) with get_shape(), get_dtype() and [index]."""

    def __init__(self, location: str):
        self.location = location
        length = int.from_bytes(storage.read_range(location, 0, 8), "little")
        header = json.loads(storage.read_range(location, 8, 8 + length))
        header.pop("__metadata__", None)
        self._tensors, self._data = header, 8 + length

    def keys(self):
        return list(self._tensors)

    def get_slice(self, name: str) -> "_RangeSlice":
        return _RangeSlice(self, name, self._tensors[name])


class _RangeSlice:
    def __init__(self, file: RangeFile, name: str, entry: dict):
        self.file, self.name = file, name
        self.shape, self.dtype = tuple(entry["shape"]), entry["dtype"]
        self.start = file._data + entry["data_offsets"][0]

    def get_shape(self):
        return list(self.shape)

    def get_dtype(self):
        return self.dtype

    def __getitem__(self, index) -> np.ndarray:
        """The rows of the first axis `index` takes (one ranged read), then the rest of it."""
        index = index if isinstance(index, tuple) else (index,)
        dtype = np.dtype(DTYPES[self.dtype])
        if not self.shape:
            data = storage.read_range(self.file.location, self.start, self.start + dtype.itemsize)
            return np.frombuffer(data, dtype).reshape(())
        first = index[0] if index else slice(None)
        rows = range(self.shape[0])[first] if isinstance(first, slice) else None
        if rows is None or rows.step != 1:  # an integer or a strided first index: every row
            rows, rest = range(self.shape[0]), index
        else:
            rest = (slice(None), *index[1:])
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * dtype.itemsize
        begin = self.start + rows.start * row_bytes
        data = storage.read_range(self.file.location, begin, begin + len(rows) * row_bytes)
        block = np.frombuffer(data, dtype).reshape(len(rows), *self.shape[1:])
        return block[rest]


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """uint8 blocks [..., G, 16] and scales [..., G] -> float32 [..., G * 32] (module
    docstring: e2m1 pairs, the low nibble first; e8m0 scales)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # [..., G, 16, 2]
    values = E2M1[codes].reshape(*blocks.shape[:-1], -1)  # [..., G, 32]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1)


def write(path: str, tensors: Iterable[tuple[str, np.ndarray]],
          max_shard_bytes: int = 5 << 30) -> list[str]:
    """Writes (name, array) pairs into `path` (which must exist), in order, a shard at a time:
    at most max_shard_bytes per file (a larger tensor gets a file of its own), the index file
    when there is more than one. Holds one shard in memory. Returns the files written."""
    shards, current, size, total = [], {}, 0, 0

    def flush():
        if current:
            name = f"shard-{len(shards):05d}.tmp"
            save_file(current, os.path.join(path, name), metadata={"format": "pt"})
            # safetensors creates its files readable by their owner only (0600): give them the
            # permissions any other file written here gets, so that another account on a shared
            # machine, or an upload to a bucket, can read the weights beside config.json.
            os.chmod(os.path.join(path, name), _ordinary_file_mode())
            shards.append((name, list(current)))

    for name, array in tensors:
        if current and size + array.nbytes > max_shard_bytes:
            flush()
            current, size = {}, 0
        current[name] = np.ascontiguousarray(array)
        size += array.nbytes
        total += array.nbytes
    flush()
    if len(shards) == 1:
        os.replace(os.path.join(path, shards[0][0]), os.path.join(path, SINGLE))
        return [SINGLE]
    weight_map, files = {}, []
    for k, (tmp, names) in enumerate(shards):
        final = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(path, tmp), os.path.join(path, final))
        weight_map.update({name: final for name in names})
        files.append(final)
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return files + [INDEX]


def _ordinary_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
