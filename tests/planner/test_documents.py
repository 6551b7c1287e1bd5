"""Packed documents as the cost model and the planner see them: length distributions, the run's
own rows, per-row tile counts against the kernel's counters, and scripts/plan.py --documents."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import data
import model
import parallel
import run_config
from configs import tiny
from data.document_lengths import document_lengths, packed_segment_ids, parse_length_spec
from parallel import cost
from planner import flops, step_time
from planner.attention import choice_from_config
from tests.tiers import split
from tests.support import ROOT



# --- length distributions ------------------------------------------------------------------------


@pytest.mark.parametrize("spec, mean", [("exp:64", 64), ("lognormal:4:0.5", np.exp(4.125)),
                                        ("pareto:3:40", 60)])
def test_packed_rows_follow_the_spec(spec, mean):
    seg = packed_segment_ids(spec, 4, 8192)
    assert seg.shape == (4, 8192) and seg.dtype == np.int32
    assert (seg[:, 0] == 0).all() and (np.diff(seg, axis=1) >= 0).all()
    assert (np.diff(seg, axis=1) <= 1).all()  # numbered 0, 1, ... with no gap
    whole = np.concatenate([document_lengths(row[None])[:-1] for row in seg])  # last one is cut
    assert whole.mean() == pytest.approx(mean, rel=0.1)
    assert np.array_equal(seg, packed_segment_ids(spec, 4, 8192))  # a fixed seed
    assert not np.array_equal(seg, packed_segment_ids(spec, 4, 8192, seed=1))


def test_one_document_and_lengths():
    assert not packed_segment_ids("one", 2, 64).any()
    assert document_lengths(np.array([[0, 0, 0, 1, 2, 2], [0, 1, 1, 1, 1, 1]])).tolist() == [
        3, 1, 2, 1, 5]


@pytest.mark.parametrize("spec, match", [
    ("gamma:2", "unknown document length spec 'gamma:2': use one of exp:MEAN"),
    ("exp", "write exp:MEAN with positive numbers, e.g. exp:2048"),
    ("exp:-5", "write exp:MEAN"),
    ("pareto:1.5", "write pareto:ALPHA:MIN"),
    ("lognormal:a:1", "write lognormal:MU:SIGMA with numbers"),
])
def test_bad_length_specs_are_one_line_errors(spec, match):
    with pytest.raises(data.DataError, match=match):
        parse_length_spec(spec)


# --- the run's own rows ---------------------------------------------------------------------------


def test_sample_is_the_runs_first_rows_in_natural_order(tmp_path):
    """sample_segment_ids = step 0's rows as training lays them out (striped), put back."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("cost.py", "attention.py", "spec.py"):
        shutil.copy(os.path.join(ROOT, "parallel", name), corpus / name)
    for i in range(200):  # short documents: several to a 128-token row
        (corpus / f"note{i:03d}.txt").write_text(f"Note {i}: the ring passes keys on.\n")
    config = tiny.get_config()
    config.data.source, config.data.max_bytes = str(corpus), 0
    config.parallel.layout = "striped"
    workdir = str(tmp_path / "work")
    rows = 40  # enough that some fall on the short notes, whatever the files' lengths
    config.global_batch_size = rows
    config = run_config.build(config)
    sample = data.sample_segment_ids(config, workdir, rows)
    choice = choice_from_config(config, 2, "cpu")
    tokenizer, cache, spec = data.prepare_data(config, workdir, 2, choice)
    batch = data.batch_rows(cache.train, spec, 0, np.arange(rows))
    natural = np.argsort(batch["order"], axis=1)
    assert np.array_equal(sample, np.take_along_axis(batch["segment_ids"], natural, 1))
    inputs = np.take_along_axis(batch["inputs"], natural, 1)
    # A new document starts right after each EOS, and only there.
    assert np.array_equal(np.diff(sample, axis=1) == 1, inputs[:, :-1] == tokenizer.eos_id)
    assert sample.max() >= 2  # the rows that fall on the short notes hold several documents


# --- tile counts per row --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", parallel.LAYOUTS)
def test_layout_counts_are_the_kernels_per_row(layout):
    """cost.layout_tile_counts, and the planner's step tiles from it, = attention_with_stats."""
    n, tile, seq_len = 4, 8, 256
    seg = packed_segment_ids("exp:24", 2, seq_len)
    counts = cost.layout_tile_counts(layout, seg, n, tile, tile)
    mesh = parallel.make_mesh(1, n, devices=jax.devices()[:n])
    x = np.zeros((1, seq_len, 1, 8), np.float32)
    for r in range(2):
        order = parallel.row_order(layout, seg[r:r + 1], n, tile=tile)
        _, tiles, _ = parallel.attention_with_stats(
            x, x, x, mesh=mesh, layout=layout, order=order, tile_q=tile, tile_k=tile,
            segment_ids=np.take_along_axis(seg[r:r + 1], order, 1))
        assert np.array_equal(counts[r], np.asarray(tiles))
    steps = step_time.ring_step_tiles(layout, n, seq_len // n, (tile, tile), documents=seg)
    assert steps == pytest.approx(counts.max(axis=1).mean(axis=0))


def test_document_flops_count_each_documents_triangle():
    m = model.ModelConfig.from_config(tiny.get_config().model, switches=model.MemorySwitches())
    causal = flops.flops_per_token(m, 128)
    assert flops.flops_per_token(m, 128, keys_per_query=64) == causal
    halves = (2 * 64 * 65 / 2) / 128  # two documents of 64: 32.5 keys per query
    attention = causal - flops.flops_per_token(m, 128, keys_per_query=0)
    assert flops.flops_per_token(m, 128, keys_per_query=halves) == pytest.approx(
        causal - attention * (1 - halves / 64))


# --- scripts/plan.py --documents ------------------------------------------------------------------


def plan_command(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plan.py"),
                           "--config", "configs/default.py", "--compile", "no", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_planner_reports_document_efficiency_and_chooses(tmp_path):
    import json

    out = tmp_path / "plan.json"
    proc = plan_command("--documents", "exp:256", "--document_rows", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    times = result["time"]
    eff = {layout: t["attention_layer"]["document_efficiency"] for layout, t in times.items()}
    assert set(eff) == set(parallel.LAYOUTS)
    assert eff["balanced"] >= 0.9 and eff["balanced"] >= max(eff.values())
    assert all(0 < t["mfu"] <= 1 for t in times.values())
    best = min(times, key=lambda layout: times[layout]["step_s"])
    assert f"choose {best} (fastest predicted" in proc.stdout
    assert result["documents"]["spec"] == "exp:256" and result["documents"]["rows"] == 2
    assert "documents: exp:256, 2 sample row(s)" in proc.stdout


@pytest.mark.programs
def test_planner_one_document_is_the_closed_form():
    """--documents one prints the same critical paths as no --documents (balanced = zigzag)."""
    lines = {}
    for args in ((), ("--documents", "one")):
        proc = plan_command(*args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines[args] = [line.split()[:4] for line in proc.stdout.splitlines()
                       if line.split()[:1] and line.split()[0] in parallel.LAYOUTS
                       and "x" in line.split()[1]]  # the layouts' rows: layout, tile, ...
    assert lines[()] == lines[("--documents", "one")] and len(lines[()]) == 4
    path = {row[0]: row[3] for row in lines[()]}
    assert path["balanced"] == path["zigzag"]


@pytest.mark.parametrize("args, message", split([
    (["--documents", "exp:x"], "error: document length spec 'exp:x': write exp:MEAN"),
    (["--documents", "exp:256", "--config.data.mask_documents=False"],
     "error: --documents=exp:256 needs data.mask_documents=True"),
    (["--documents", "exp:256", "--document_rows", "0"], "error: --document_rows=0"),
], fast=[0], rest="programs"))
def test_planner_bad_documents_flags_are_one_line_errors(args, message):
    proc = plan_command(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
