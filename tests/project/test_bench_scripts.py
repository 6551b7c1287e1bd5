"""Benchmark scripts run small on this CPU: scripts/bench/simulated_ring.py (times every ring step
and reports a share of the ideal) and scripts/bench/gpu_tiles.py (the figures of both need a
GPU, see BENCHMARKS.md), scripts/bench/documents.py (efficiency from the kernel's counters)
and scripts/compare_losses.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scripts.bench import documents as bench_documents  # scripts/ read as a namespace package
from scripts.bench import gpu_tiles as bench_gpu_tiles
from scripts.bench import simulated_ring as bench_simulated_ring
from tests.support import ROOT


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


def test_gpu_tile_sweep_times_every_choice_and_restores_the_table(tmp_path, capsys):
    """Interpreted here: the sweep's bookkeeping, not its figures."""
    from parallel.kernels import pallas_gpu

    out, table = tmp_path / "tiles.json", dict(pallas_gpu.LAUNCH)
    bench_gpu_tiles.main(["--head-dims", "16", "--heads", "2", "--kv-heads", "1", "--block", "64",
                          "--tiles", "32x32", "48x16", "--launches", "4x2", "8x3",
                          "--split", "on", "off", "--reps", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    # 48 does not divide the block: left out; the other tile under both launches, split or not.
    assert sorted((tuple(r["tile"]), tuple(r["launch"]), r["split"]) for r in rows) == [
        ((32, 32), (4, 2), "off"), ((32, 32), (4, 2), "on"),
        ((32, 32), (8, 3), "off"), ((32, 32), (8, 3), "on")]
    assert all(r["forward_ms"] > 0 and r["backward_ms"] > 0 for r in rows)
    assert "best for head_dim 16: tiles " in capsys.readouterr().out
    # The sweep's trial settings do not stay behind.
    assert pallas_gpu.LAUNCH == table and pallas_gpu.SPLIT_FULL_TILES


def test_bench_documents_counts_every_layout(tmp_path, capsys):
    out = tmp_path / "documents.json"
    bench_documents.main(["--sources", "exp:40", "one", "--seq-len", "1024", "--shards", "4",
                          "--tiles", "32", "--rows", "1", "--json", str(out)])
    results = {r["source"]: r for r in json.loads(out.read_text())["results"]}
    short, one = results["exp:40"]["efficiency"], results["one"]["efficiency"]
    assert set(short) == set(bench_documents.LAYOUTS)
    assert short["balanced"] >= 0.9 and short["balanced"] >= max(short.values())
    assert one["balanced"] == pytest.approx(one["zigzag"]) and one["ring"] < 0.7
    assert "| exp:40 | 32 | " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="bench_documents: unknown document length spec"):
        bench_documents.main(["--sources", "gamma:3"])


def write_metrics(workdir, losses):
    workdir.mkdir()
    with open(workdir / "metrics.jsonl", "w") as f:
        for step, loss in losses.items():
            f.write(json.dumps({"step": step, "train/loss": loss}) + "\n")
        f.write(json.dumps({"step": 20, "eval/loss": 4.0}) + "\n")
    return str(workdir)


def test_compare_losses_finds_the_largest_difference(tmp_path):
    a = write_metrics(tmp_path / "a", {10: 5.0, 20: 4.5})
    b = write_metrics(tmp_path / "b", {10: 5.0001, 20: 4.5, 30: 9.0})
    script = [sys.executable, os.path.join(ROOT, "scripts", "compare_losses.py")]
    run = lambda *args: subprocess.run(script + list(args), capture_output=True, text=True)
    same = run(a, b, "--tolerance", "2e-4")
    assert same.returncode == 0, same.stderr
    assert "largest |difference| from a: 1.00e-04 over 2 steps" in same.stdout
    assert run(a, b, "--tolerance", "5e-5").returncode == 1
    missing = run(a, str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "pass the --workdir" in missing.stderr
