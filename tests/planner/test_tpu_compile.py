"""The TPU compiler (XLA:TPU and Mosaic, from libtpu; no TPU attached) on our programs: the
attention with kernel='pallas_tpu' forward and backward for every layout and strategy, the
ring's transfers hidden behind its kernel in the compiled schedule, host offload, and the train
steps of the TPU configs through scripts/plan.py --compile tpu."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import parallel
from planner import topology
from training.analysis.hlo_overlap import loop_overlaps
from tests.support import ROOT

# Each compile here takes from seconds to minutes: all but the checks that need no compile are
# in the heavy tier (`make test-slow`).
heavy = pytest.mark.heavy


@pytest.fixture(scope="module")
def v4_8():
    return topology.devices(topology.slice_for("v4-8"))


def compile_attention(devices, layout, strategy, *, causal, segments, tile, head_dim,
                      seq_per_device=2048, q_heads=8, kv_heads=2, window=None):
    """jit(grad of the attention) for the devices, compiled: the jax Compiled."""
    n = len(devices)
    mesh = parallel.make_mesh(1, n, devices=devices)
    rows = jax.NamedSharding(mesh, jax.P("data", "seq"))
    s = n * seq_per_device
    q = jax.ShapeDtypeStruct((1, s, q_heads, head_dim), jnp.bfloat16, sharding=rows)
    kv = jax.ShapeDtypeStruct((1, s, kv_heads, head_dim), jnp.bfloat16, sharding=rows)
    ids = jax.ShapeDtypeStruct((1, s), jnp.int32, sharding=rows)

    def grads(q, k, v, seg, order):
        def loss(q, k, v):
            out = parallel.attention(q, k, v, mesh=mesh, layout=layout, strategy=strategy,
                                     kernel="pallas_tpu", tile_q=tile, tile_k=tile,
                                     causal=causal, segment_ids=seg, order=order,
                                     ulysses_degree=2 if strategy == "usp" else None,
                                     window=window)
            return out.astype(jnp.float32).sum()
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    with jax.set_mesh(mesh):
        return jax.jit(grads, compiler_options=parallel.compiler_options("tpu")).lower(
            q, kv, kv, ids if segments else None, ids if layout == "balanced" else None).compile()


def _cases():
    """Four compiles that meet every layout and every strategy once; causal or not, tiles
    (512/1024), head_dim (64/128) and segment ids (always with balanced, whose order is per row)
    alternate; the ring layout's case has a sliding window (its halo exchange and the kernel's
    window mask through Mosaic)."""
    layouts, strategies = list(parallel.LAYOUTS), list(parallel.STRATEGIES)
    for li, layout in enumerate(layouts):
        even = li % 2 == 0
        yield pytest.param(layout, strategies[li % len(strategies)], even,
                           layout == "balanced" or not even, 512 if even else 1024,
                           64 if even else 128, 1024 if layout == "ring" else None,
                           id=f"{layout}-{strategies[li % len(strategies)]}")


@pytest.mark.parametrize("layout,strategy,causal,segments,tile,head_dim,window", list(_cases()))
@heavy
def test_attention_compiles_for_v4(v4_8, layout, strategy, causal, segments, tile, head_dim,
                                   window):
    compiled = compile_attention(v4_8, layout, strategy, causal=causal, segments=segments,
                                 tile=tile, head_dim=head_dim, window=window)
    text = compiled.as_text()
    assert text.count('custom_call_target="tpu_custom_call"') >= 3  # forward, dQ, dK/dV
    assert compiled.memory_analysis().temp_size_in_bytes < 16e9


def test_the_cases_cover_every_value_with_every_layout_and_strategy():
    cases = [c.values for c in _cases()]
    assert {c[0] for c in cases} == set(parallel.LAYOUTS)
    assert {c[1] for c in cases} == set(parallel.STRATEGIES)
    for field in (2, 3, 4, 5):  # causal, segments, tile, head_dim
        assert len({c[field] for c in cases}) == 2, field
    assert any(c[6] for c in cases)


@heavy
def test_ring_transfers_overlap_the_kernel_forward_and_backward(v4_8):
    """In the scheduled program, each ring step's K/V transfer (and in the backward the dK/dV
    one) starts before the step's kernel call and completes after it, with and without
    segment ids, causal or not (parallel/xla_options.py says what it takes)."""
    for causal, segments, layout in ((True, False, "striped"), (False, True, "zigzag")):
        compiled = compile_attention(v4_8, layout, "ring", causal=causal, segments=segments,
                                     tile=512, head_dim=128, seq_per_device=8192)
        check_ring_overlap(compiled)


def check_ring_overlap(compiled):
    loops = {loop.pass_: loop for loop in loop_overlaps(compiled.as_text())}
    assert set(loops) == {"forward", "backward"}
    for pass_, loop in loops.items():
        assert loop.kernels >= 1 and loop.transfers, (pass_, loop)
        assert all(t.overlapped for t in loop.transfers), (pass_, loop.transfers)
        assert not any(t.copies_before for t in loop.transfers), (pass_, loop.transfers)
    backward_kinds = {t.shape.split("[")[0] for t in loops["backward"].transfers}
    assert {"bf16", "f32"} <= backward_kinds  # K/V and the float32 dK/dV both travel


def plan(*args, timeout=600):
    return subprocess.run([sys.executable, "scripts/plan.py", "--compile=tpu", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# The README's compile check for configs/tiny.py on a v4-8 (scripts/README.md).
TINY_V4_8 = ["--config=configs/tiny.py", "--topology=v4-8", "--config.mesh.data=1",
             "--config.mesh.seq=4", "--config.seq_len=4096", "--config.data.eval_fraction=0.05"]


@heavy
def test_plan_compiles_tiny_for_a_v4_8_and_says_it_fits():
    result = plan(*TINY_V4_8)
    assert result.returncode == 0, result.stderr
    out = result.stdout  # the analytic tables first, then the compile's progress and figures
    assert out.index("for v4-8: compiles after these tables") \
        < out.index("plan: compiled by the TPU compiler in ") \
        < out.index("TPU compiler (XLA:TPU + Mosaic) for v4-8, per chip")
    assert ": FITS;" in out


@heavy
def test_plan_names_what_the_tpu_compiler_refused():
    # The whole stdlib corpus (max_bytes 0), so that validation lets 4,096 rows through.
    result = plan(*TINY_V4_8, "--config.global_batch_size=4096", "--config.data.max_bytes=0")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: the TPU compiler refused the train step")
    assert "HBM" in line and "remat" in line


@heavy
def test_plan_names_the_kernel_that_runs_out_of_vmem():
    """2048 x 2048 tiles: the forward kernel's float32 scores alone fill a v4 core's 16 MiB."""
    result = plan(*[a for a in TINY_V4_8 if "seq_len" not in a], "--config.seq_len=8192",
                  "--config.parallel.tile=2048")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "memory space vmem" in line and "the attention kernel (pallas_call) in the forward " \
        "pass" in line and "smaller attention tiles" in line


def test_plan_refuses_a_topology_that_is_not_a_slice():
    result = plan("--config=configs/tiny.py", "--topology=v4-7")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --topology=v4-7")


@heavy
def test_the_7b_paper_config_compiles_and_fits_a_v4_32(tmp_path):
    """The 7B v4 config at its real size: 786,432 tokens on 16 v4 chips, its block inputs in
    host memory (remat_policy 'offload'): the TPU compiler's host bytes are every layer's block
    input, as the planner counts them. (The 1.1B config compiles the same way, in 75 s more of
    make test: its figures are in BENCHMARKS.md, from `scripts/plan.py --config
    configs/tpu/paper_tpuv4_786k.py --compile tpu`.)"""
    result = plan("--config=configs/tpu/paper_tpuv4_786k_7b.py", f"--json={tmp_path / 'plan.json'}")
    assert result.returncode == 0, result.stderr
    assert "for v4-32, per chip" in result.stdout and ": FITS;" in result.stdout
    figures = json.loads((tmp_path / "plan.json").read_text())
    compiled = figures["compiled"]
    assert compiled["total"] <= 32e9 and compiled["host_total"] > 10e9
    assert compiled["host_total"] == pytest.approx(figures["host_offload_bytes"], rel=0.01)


@heavy
def test_plan_compiles_for_two_slices_with_the_ring_inside_each():
    """Multi-slice: 'data' spans the slices (the data-centre network), each 'seq' ring stays
    on one slice's links; a ring across slices is refused in one line."""
    base = [a for a in TINY_V4_8 if not a.startswith("--config.mesh")] + ["--num_slices=2"]
    result = plan(*base, "--config.mesh.data=2", "--config.mesh.seq=4")
    assert result.returncode == 0, result.stderr
    assert "for v4-8 x 2 slices, per chip" in result.stdout and ": FITS;" in result.stdout
    across = plan(*base, "--config.mesh.data=1", "--config.mesh.seq=8")
    assert across.returncode == 2
    assert across.stderr.strip().splitlines()[-1].startswith(
        "error: mesh: data 1 is not a multiple of the 2 slices")


@heavy
@pytest.mark.parametrize("config", ["configs/tpu/qwen3_30b_a3b_v5p.py", "configs/tpu/gpt_oss_20b_v5p.py",
                                    "configs/tpu/deepseek_v2_lite_v5p.py"])
def test_the_mixture_of_experts_configs_fit_a_v5p_128(config, tmp_path):
    """Qwen3-30B-A3B, GPT-OSS-20B and DeepSeek-V2-Lite (latent attention, the ring passing
    latents) at their real sizes, 131,072 tokens, the experts over the 4 data-parallel groups'
    chips: the TPU compiler's train step fits a v5p chip."""
    result = plan(f"--config={config}", "--topology=v5p-128", f"--json={tmp_path / 'plan.json'}")
    assert result.returncode == 0, result.stderr
    assert "for v5p-128, per chip" in result.stdout and ": FITS;" in result.stdout
    compiled = json.loads((tmp_path / "plan.json").read_text())["compiled"]
    assert compiled["total"] <= 95e9 * 0.9


@heavy
def test_the_128k_recipe_fits_the_slice_its_mesh_names(tmp_path):
    """configs/tpu/llama3_8b_128k_v5p.py as its docstring runs it (no other flag: the config's
    device and mesh fix the slice, 64 chips): Llama-3-8B at 131,072 tokens, the TPU compiler's
    per-chip bytes within a v5p's HBM."""
    result = plan("--config=configs/tpu/llama3_8b_128k_v5p.py", f"--json={tmp_path / 'plan.json'}")
    assert result.returncode == 0, result.stderr
    assert "for v5p-128, per chip" in result.stdout and ": FITS;" in result.stdout
    assert json.loads((tmp_path / "plan.json").read_text())["compiled"]["total"] <= 95e9
