"""The benchmark scripts that check numbers, run small: bf16 error stays flat in the ring size,
and the simulated ring produces a share for every layout."""

import json
import os
import sys

import numpy as np

import parallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import bench_bf16_error  # noqa: E402  (scripts/bench_bf16_error.py)
import bench_simulated_ring  # noqa: E402


def test_bf16_error_is_flat_in_the_ring_size(tmp_path):
    out = tmp_path / "err.json"
    bench_bf16_error.main(["--shards", "2", "8", "--layouts", "striped", "--seq-len", "512",
                           "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                           "--json", str(out)])
    rows = {r["shards"]: r for r in json.loads(out.read_text())["rows"]}
    dense = rows.pop(1)  # jax.nn.dot_product_attention in bf16: the error bf16 has anyway
    for key in bench_bf16_error.KEYS:
        assert 0 < rows[2][key] < 1e-2 and 0 < rows[8][key] < 1e-2, key  # bf16, not garbage
        assert rows[8][key] <= 2 * rows[2][key], key  # flat in N: merges are float32
        assert rows[8][key] <= 2 * dense[key], key


def test_simulated_ring_times_every_step_of_every_layout(tmp_path):
    out = tmp_path / "ring.json"
    bench_simulated_ring.main(["--shards", "2", "--seq-len", "256", "--heads", "2",
                               "--kv-heads", "1", "--head-dim", "16", "--kernel", "xla",
                               "--reps", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert [r["layout"] for r in result["layouts"]] == list(parallel.LAYOUTS)
    for row in result["layouts"]:
        assert len(row["step_s"]) == 2 and all(t > 0 for t in row["step_s"])
        assert np.isclose(row["share"], row["ideal_s"] / sum(row["step_s"]))
        assert 0 < row["model_share"] <= 1
    assert result["block_pair"]["block"] == 128
