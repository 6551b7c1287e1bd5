"""training/analysis/step_split.py: the train step timed on rows of equal documents and split into a cost
per tile and the rest, and the bound that split puts on a layout's gain over the ring."""

import numpy as np
import pytest

import run_config
from configs import tiny
from training.analysis.step_split import StepSplit, document_rows, layout_bound, measure_split


def test_the_bound_on_hand_counted_rows():
    # One document of 16 tokens over 2 devices, tiles of 4: the ring's devices hold tokens 0-7
    # and 8-15; step 0 each its own block (3 tiles), step 1 device 1 the first block (4): 7.
    # All the row's tiles, 10, shared evenly: 5. Two documents of 8 tokens: no tile crosses
    # them, the ring path is 3 (each device its own document), the even share 3 too.
    split = StepSplit(rest_s=1.0, tile_s=1.0, points=())
    one, two = layout_bound(split, document_rows(16, [16, 8]), num_shards=2, tile=4)
    assert (one["ring_tiles"], one["even_tiles"], one["ring_s"], one["even_s"]) == (7, 5, 8, 6)
    assert one["ratio"] == pytest.approx(8 / 6)
    assert (two["ring_tiles"], two["even_tiles"], two["ratio"]) == (3, 3, 1.0)


def test_the_split_is_a_line_through_the_timed_steps():
    """The real train step of configs/tiny.py on one device, rows of 128, 64 and 32-token
    documents with tiles of 32: causal tiles 10, 3 + 3, 1 x 4; the fit is their least-squares
    line (its residuals sum to zero)."""
    split = measure_split(run_config.build(tiny.get_config()), tokens=128, tile=32, repeats=1)
    lengths, tiles, seconds = map(np.array, zip(*split.points))
    assert lengths.tolist() == [128, 64, 32] and tiles.tolist() == [10, 6, 4]
    assert (seconds > 0).all()
    residuals = seconds - (split.rest_s + split.tile_s * tiles)
    assert abs(residuals.sum()) < 1e-9 and abs((residuals * tiles).sum()) < 1e-9
