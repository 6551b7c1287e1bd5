"""Step-indexed batches: a pure function of (seed, step, rows, columns), never of history.

The token stream is cut into W non-overlapping windows of S+1 tokens; window w is
tokens[w*S : w*S + S + 1] (consecutive windows share one token: the last target of one is the
first input of the next). Sample i = step * global_batch + row reads window
`rng([seed, i // W]).permutation(W)[i % W]`: every window once per epoch, in a new order each
epoch. Resuming at step t needs only t; any number of processes or devices, and any attention
layout, see the same tokens in the same order.

For each row, in natural order (worked example, S=8, EOS=1, window [5 6 1 7 8 9 1 3 4]):

    inputs      [5 6 1 7 8 9 1 3]      window[:-1]
    targets     [6 1 7 8 9 1 3 4]      window[1:]: shifted BEFORE any permutation
    weights     [1 1 1 1 1 1 1 1]
    segment_ids [0 0 0 1 1 1 1 2]      EOS tokens before the slot (mask_documents; else zeros)
    positions   [0 1 2 0 1 2 3 0]      restart after each EOS (reset_positions; else 0..S-1)

An EOS belongs to the document it ends. Then every field is put into the attention layout's
order with the same permutation, `field[:, parallel.permutation(layout, S, N)]`; for striped, N=2:
perm [0 2 4 6 1 3 5 7], so inputs become [5 1 8 1 6 7 9 3] and positions [0 2 1 3 1 0 2 0].
The permutation itself travels as the field 'order' (the original index of every slot), which
attention masks by. For 'balanced' it is per row, made from the row's segment ids and aligned to
the attention tile (BatchSpec.tile): a function of the window, so resume stays exact.

`columns` asks for some laid-out slots only (what a process's seq shards hold when a row is split
over hosts): the row's window, its EOS prefix sums and balanced's order are made for the whole
row, the fields only at the original positions `order[:, columns]`. In the striped example,
columns [4 5 6 7] (seq shard 1) are positions [1 3 5 7]: inputs [6 7 9 3], equal to the whole
row's inputs[:, 4:8].
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

import parallel
from data.errors import DataError
from data.passkey import PasskeyMix

FIELDS = ("inputs", "targets", "weights", "positions", "segment_ids", "order")


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    seq_len: int            # tokens per sequence S
    global_batch: int       # sequences per step, all processes together
    seed: int
    layout: str             # parallel.LAYOUTS: 'ring' | 'striped' | 'zigzag' | 'balanced'
    num_seq_shards: int     # N, devices on the mesh's 'seq' axis
    mask_documents: bool    # segment ids from EOS boundaries (else one segment per row)
    reset_positions: bool   # positions restart at 0 after each EOS (else 0..S-1)
    eos_id: int | None = None  # the tokenizer's EOS; needed by mask_documents / reset_positions
    tile: int | None = None  # the attention tile 'balanced' aligns documents to (None: default)
    passkey: PasskeyMix | None = None  # training rows that become passkey examples (passkey.py)


def num_windows(tokens: np.ndarray, seq_len: int) -> int:
    """W: windows of seq_len+1 tokens starting at 0, S, 2S, ... that fit in `tokens`."""
    return max(0, (len(tokens) - 1) // seq_len)


def batch_rows(tokens: np.ndarray, spec: BatchSpec, step: int, rows,
               columns=None) -> dict[str, np.ndarray]:
    """Rows `rows` (global row indices) of training step `step`, in layout order.

    Returns 'inputs', 'targets', 'positions', 'segment_ids', 'order' int32 [R, C] and 'weights'
    float32 [R, C], R = len(rows): the laid-out columns `columns` (sorted slot indices; seq
    shard s holds slots s*S/N .. (s+1)*S/N - 1), C = len(columns); None = all S of them.
    Always equal to batch_rows(tokens, spec, step, rows)[name][:, columns].
    """
    rows = _check_rows(spec, rows)
    columns = _check_columns(spec, columns)
    count = _check_windows(tokens, spec)
    samples = step * spec.global_batch + rows          # int64: no overflow for long runs
    epochs, offsets = np.divmod(samples, count)
    windows = np.empty_like(samples)
    for epoch in np.unique(epochs):                     # a batch spans at most two epochs
        here = epochs == epoch
        windows[here] = _epoch_order(spec.seed, int(epoch), count)[offsets[here]]
    return _rows_for_windows(tokens, spec, windows, columns, training=True)


def process_batch(tokens: np.ndarray, spec: BatchSpec, step: int, process_index: int,
                  process_count: int) -> dict[str, np.ndarray]:
    """This process's share of step `step`: rows [p*B/P, (p+1)*B/P) of the global batch."""
    if process_count < 1 or spec.global_batch % process_count:
        raise DataError(f"global_batch {spec.global_batch} is not divisible by the "
                        f"{process_count} processes: use a multiple of {process_count}")
    if not 0 <= process_index < process_count:
        raise DataError(f"process_index {process_index} is outside 0..{process_count - 1}")
    per = spec.global_batch // process_count
    return batch_rows(tokens, spec, step, np.arange(process_index * per, (process_index + 1) * per))


def eval_rows(tokens: np.ndarray, spec: BatchSpec, index: int, rows,
              columns=None) -> dict[str, np.ndarray]:
    """Rows of eval batch `index`: windows index*B + row, in order, no shuffle; `columns` as in
    batch_rows."""
    rows = _check_rows(spec, rows)
    columns = _check_columns(spec, columns)
    count = _check_windows(tokens, spec)
    windows = index * spec.global_batch + rows
    if index < 0 or windows.max(initial=0) >= count:
        raise DataError(f"eval batch {index} needs window {windows.max()} but the eval tokens hold "
                        f"{count} windows: ask for fewer eval batches or raise data.eval_fraction")
    return _rows_for_windows(tokens, spec, windows, columns)


def num_eval_batches(tokens: np.ndarray, spec: BatchSpec, num_batches: int) -> int:
    """min(num_batches, full batches in `tokens`); DataError if not even one fits."""
    available = num_windows(tokens, spec.seq_len) // spec.global_batch
    if available < 1:
        windows = num_windows(tokens, spec.seq_len)
        raise DataError(f"the eval split has {len(tokens)} tokens, {windows} windows of "
                        f"{spec.seq_len + 1}: fewer than one batch of "
                        f"{spec.global_batch}: raise data.eval_fraction or lower the batch size")
    return min(num_batches, available)


def eval_batches(tokens: np.ndarray, spec: BatchSpec, num_batches: int) -> list[dict]:
    """The first num_batches full batches of eval windows, in order (fewer if fewer exist)."""
    rows = np.arange(spec.global_batch)
    count = num_eval_batches(tokens, spec, num_batches)
    return [eval_rows(tokens, spec, b, rows) for b in range(count)]


# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, count: int) -> np.ndarray:
    """The order of the W windows in `epoch`: depends on (seed, epoch) only, never on history."""
    order = np.random.default_rng([seed, epoch]).permutation(count)
    order.flags.writeable = False  # shared through the cache
    return order


def _rows_for_windows(tokens: np.ndarray, spec: BatchSpec, windows: np.ndarray,
                      columns: np.ndarray, training: bool = False) -> dict:
    """Cuts the windows (training rows: some made passkey examples, spec.passkey) and finds
    their documents (whole rows), then makes every field at the original positions the
    laid-out `columns` hold, and only there."""
    S = spec.seq_len
    starts = windows[:, None] * S + np.arange(S + 1)           # [R, S+1] token indices
    window = np.asarray(tokens)[starts].astype(np.int32)      # reads only these rows of a memmap
    weights = None
    if training and spec.passkey is not None:
        window, weights = spec.passkey.insert(window, windows, spec.seed)
    segments, span_start = _documents(window[:, :-1], spec)   # natural order, whole rows
    order = _order(spec, segments, columns)                   # [R, C] original positions

    def at(x):  # x [R, S or S+1] in natural order -> its values at `order`
        return np.take_along_axis(x, order, axis=1)

    positions = order - at(span_start) if spec.reset_positions else order.copy()
    return {"inputs": at(window), "targets": at(window[:, 1:]),  # shifted before permuting
            "weights": (np.ones(order.shape, np.float32) if weights is None else at(weights)),
            "positions": positions,
            "segment_ids": at(segments), "order": order}


def _order(spec: BatchSpec, segments: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """int32 [R, C]: the original position of each requested laid-out column, per row. Only
    balanced needs the whole row's documents; the static layouts index their [S] permutation."""
    try:
        if parallel.get_layout(spec.layout).data_dependent:
            whole = parallel.row_order(spec.layout, segments, spec.num_seq_shards, tile=spec.tile)
            return np.ascontiguousarray(whole[:, columns])
        perm = parallel.permutation(spec.layout, spec.seq_len, spec.num_seq_shards)
    except ValueError as e:
        raise DataError(f"batch: {e}") from e
    return np.ascontiguousarray(np.broadcast_to(perm[columns], (len(segments), len(columns))),
                                np.int32)


def _documents(inputs: np.ndarray, spec: BatchSpec):
    """(segment_ids, span_start) int32 [R, S], natural order, from the EOS tokens in `inputs`:
    prefix sums over whole rows. segment_ids are zeros without mask_documents; span_start (the
    slot after the last EOS before each slot; reset positions are slot - span_start) is None
    without reset_positions.

    Example, EOS=1: inputs [5 1 7 1 1 3] -> is_eos [0 1 0 1 1 0], segments [0 0 1 1 2 3];
    a segment starts after each EOS, span_start [0 0 2 2 4 5], reset positions [0 1 0 1 0 0].
    """
    R, S = inputs.shape
    if not (spec.mask_documents or spec.reset_positions):
        return np.zeros((R, S), np.int32), None
    if spec.eos_id is None:
        raise DataError("BatchSpec.eos_id is None but mask_documents or reset_positions needs it: "
                        "pass eos_id=tokenizer.eos_id")
    is_eos = (inputs == spec.eos_id).astype(np.int32)
    if spec.mask_documents:
        segment_ids = np.cumsum(is_eos, axis=1, dtype=np.int32) - is_eos  # EOS strictly before
    else:
        segment_ids = np.zeros((R, S), np.int32)
    if not spec.reset_positions:
        return segment_ids, None
    index = np.arange(S, dtype=np.int32)
    after_eos = np.zeros((R, S), np.int32)
    after_eos[:, 1:] = np.where(is_eos[:, :-1] == 1, index[1:], 0)
    return segment_ids, np.maximum.accumulate(after_eos, axis=1)


def _check_layout(layout: str, seq_len: int, num_shards: int) -> None:
    try:
        parallel.check_divisible(layout, seq_len, num_shards)
    except ValueError as e:
        raise DataError(f"batch: {e}") from e


def _check_rows(spec: BatchSpec, rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if spec.seq_len < 1 or spec.global_batch < 1:
        raise DataError(f"seq_len {spec.seq_len} and global_batch {spec.global_batch} must be >= 1")
    if rows.size and (rows.min() < 0 or rows.max() >= spec.global_batch):
        raise DataError(f"rows must lie in 0..{spec.global_batch - 1} (global_batch), "
                        f"got {rows.min()}..{rows.max()}")
    _check_layout(spec.layout, spec.seq_len, spec.num_seq_shards)  # divisibility, early
    return rows


def _check_columns(spec: BatchSpec, columns) -> np.ndarray:
    if columns is None:
        return np.arange(spec.seq_len)
    columns = np.asarray(columns, dtype=np.int64).reshape(-1)
    if columns.size and (columns.min() < 0 or columns.max() >= spec.seq_len):
        raise DataError(f"columns must lie in 0..{spec.seq_len - 1} (seq_len), "
                        f"got {columns.min()}..{columns.max()}")
    return columns


def _check_windows(tokens: np.ndarray, spec: BatchSpec) -> int:
    count = num_windows(tokens, spec.seq_len)
    if count < 1:
        raise DataError(f"corpus of {len(tokens)} tokens is smaller than one sequence of "
                        f"{spec.seq_len + 1}: use a larger corpus or a smaller seq_len")
    return count
