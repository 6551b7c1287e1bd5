"""scripts/bench_simulated_ring.py, run small on this CPU: it times every step of the ring and
reports a share of the ideal (the figures themselves need a GPU; see BENCHMARKS.md)."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
import bench_simulated_ring  # noqa: E402  (scripts/bench_simulated_ring.py)


def test_simulated_ring_times_every_step(tmp_path):
    out = tmp_path / "ring.json"
    bench_simulated_ring.main(["--shards", "2", "--seq-len", "256", "--heads", "2",
                               "--kv-heads", "1", "--head-dim", "16", "--kernel", "xla",
                               "--layouts", "zigzag", "--reps", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert [r["layout"] for r in result["layouts"]] == ["zigzag"]
    for row in result["layouts"]:
        assert len(row["step_s"]) == 2 and all(t > 0 for t in row["step_s"])
        assert np.isclose(row["share"], row["ideal_s"] / sum(row["step_s"]))
        assert 0 < row["model_share"] <= 1
    assert result["block_pair"]["block"] == 128
