"""The end-to-end bench (scripts/bench/train.py) and the pictures (scripts/plot_figures.py), run
small: the bench drives real train.py processes; the plots are written as PNG files."""

import json
import os
import subprocess
import sys

import pytest

import parallel

from scripts import plot_figures  # scripts/ read as a namespace package
from scripts.bench import train as bench_train
from tests.support import ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG and os.path.getsize(path) > 10_000


@pytest.mark.filterwarnings("ignore:os.fork")  # the pinned children exec train.py at once
@pytest.mark.programs
def test_bench_train_times_train_py_per_layout(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench_train.main(["--config", "configs/tiny.py", "--seq-lens", "256", "--layouts", "ring",
                      "striped", "auto", "--tiles", "32", "--masked-layouts", "--steps", "2",
                      "--rounds", "1", "--workdir", str(tmp_path / "runs"), "--json", str(out)])
    results = {r["layout"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"ring", "striped", "auto"}
    for r in results.values():
        assert len(r["windows"]) == 2 and all(w > 0 for w in r["windows"])  # step 1 left out
        assert sorted(r["losses"]) == ["1", "2", "3"]
    assert results["ring"]["x_ring"] == 1.0 and results["ring"]["ran"] == "ring ring 32x32"
    pairs = [s / r for s, r in zip(results["striped"]["windows"], results["ring"]["windows"])]
    assert results["striped"]["x_ring"] == pytest.approx(sum(pairs) / 2)  # median of two
    assert results["ring"]["losses"] == pytest.approx(results["striped"]["losses"], rel=1e-4)
    # 'auto': layout, strategy and tile the planner's, as the run's first metrics row says
    layout, *strategy, tiles = results["auto"]["ran"].split()
    assert layout in parallel.LAYOUTS and strategy[0] in parallel.STRATEGIES
    assert results["auto"]["tile"] == "auto" and results["auto"]["strategy"] == "auto"
    assert results["auto"]["losses"] == pytest.approx(results["ring"]["losses"], rel=1e-4)
    assert not (tmp_path / "runs" / "S256-ring-ring-t32-unmasked-r0" / "checkpoints").exists()
    # The same steps as the planner's calibration points (scripts/calibrate.py --train): each
    # predicted, the auto kind as the layout and tile it ran
    from planner.calibration import fit as calibration
    points = calibration.bench_measurements(str(out))
    assert [(p.layout, p.tile) for p in points] == [("ring", "32x32"), ("striped", "32x32"),
                                                    (layout, tiles)]
    rows = calibration.compare(points)
    assert all(r["predicted"] > 0 and r["seconds"] > 0 for r in rows)
    assert rows[0]["seconds"] == pytest.approx(256 / results["ring"]["median_tokens_per_sec"])
    out = capsys.readouterr().out
    assert "x ring" in out and f"auto (256 unmasked) ran {results['auto']['ran']}: " in out
    assert "of the fastest measured (" in out


def test_plot_throughput_and_losses(tmp_path):
    results = [dict(layout=layout, strategy="ring", masked=False, seq_len=s, windows=[w, w * 1.1],
                    median_tokens_per_sec=w * 1.05, x_ring=scale)
               for layout, scale in (("ring", 1.0), ("striped", 1.4))
               for s in (4096, 8192) for w in [1000 * scale * 4096 / s]]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(dict(args=dict(config="configs/default.py", batch=1, tile=512,
                                               processes=2), results=results)))
    figures = os.path.join(ROOT, "docs", "figures")
    shipped = {name: open(os.path.join(figures, name), "rb").read()
               for name in ("tokens_per_sec.png", "losses.png")}
    # Without --out, each figure goes beside what it read, never over the repository's own.
    plot_figures.main(["throughput", str(bench)])
    assert _is_png(tmp_path / "bench.png")
    for name, shift in (("cmp_ring", 0.0), ("cmp_striped", 1e-6)):
        os.makedirs(tmp_path / name)
        rows = [dict(step=s, **{"train/loss": 7.0 - s / 10 + shift}) for s in range(1, 21)]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    plot_figures.main(["losses", str(tmp_path / "cmp_ring"), str(tmp_path / "cmp_striped")])
    assert _is_png(tmp_path / "losses.png")
    assert shipped == {name: open(os.path.join(figures, name), "rb").read() for name in shipped}
    plot_figures.main(["losses", str(tmp_path / "cmp_ring"), "--out", str(tmp_path / "one.png")])
    assert _is_png(tmp_path / "one.png")


def test_plot_work_from_the_kernel_counters(tmp_path):
    plot_figures.main(["work", "--shards", "2", "--seq-len", "512", "--tile", "32",
                       "--documents", "exp:64", "--out", str(tmp_path / "work.png")])
    assert _is_png(tmp_path / "work.png")


@pytest.mark.parametrize("argv,message", [
    (["losses", "nowhere/run"], "no nowhere/run/metrics.jsonl: give train.py workdirs"),
    (["throughput", "nowhere.json"], "no file nowhere.json: give scripts/bench/train.py's --json"),
])
def test_plot_bad_input_is_one_line(tmp_path, argv, message):
    result = subprocess.run([sys.executable, "scripts/plot_figures.py", *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_launcher_stops_its_processes_when_terminated(tmp_path):
    """SIGTERM to scripts/launch_local.py (as when a bench is killed) stops its children."""
    import signal
    import time

    program = ("import os, time; open(os.path.join(%r, str(os.getpid())), 'w').close(); "
               "time.sleep(120)" % str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "scripts/launch_local.py", "--processes", "2",
                                 "--", "-c", program], cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    children = [int(name) for name in os.listdir(tmp_path)]
    assert len(children) == 2
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_plot_positions_draws_each_evals_curve(tmp_path):
    rows = [{"step": s, "eval/loss": 5.0 - s / 10, "eval/position_bucket_tokens": 256.0,
             "eval/loss_by_position": [5.0 - s / 10 - k / 20 for k in range(4)]}
            for s in (10, 20)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_figures.main(["positions", str(tmp_path / "run"), "--out", str(tmp_path / "pos.png")])
    assert _is_png(tmp_path / "pos.png")
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/loss": 1.0}))
    with pytest.raises(SystemExit) as e:
        plot_figures.main(["positions", str(tmp_path / "run"), "--out", str(tmp_path / "x.png")])
    assert e.value.code == 2
