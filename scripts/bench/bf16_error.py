"""Error of bfloat16 ring attention against float64 as the ring grows: it must stay flat in N.

Usage:
  python scripts/bench/bf16_error.py                          # N = 2, 4, 8, 16, every layout
  python scripts/bench/bf16_error.py --kernel pallas_tpu --seq-len 2048 --json runs/err.json

One causal problem of --seq-len tokens (batch 1, GQA 8 query heads over 2 KV heads of 64,
standard-normal q, k, v, dO) is rounded to bfloat16 once. The float64 reference (the tests'
dense attention, forward and analytic backward) runs on those same rounded inputs, so the
figures measure what the computation loses, not the rounding of the inputs. Each ring size N
runs `parallel.attention` and its VJP in bfloat16 on N fake CPU devices, in the layout's token
order, and reports, for the output and dq, dk, dv, max |ours - reference| / max |reference| (the
tests' measure) and the RMS error over the RMS of the reference (which averages out the final
rounding to bfloat16 and so shows accumulated error sooner).

The row `dense bf16` is the same problem through `jax.nn.dot_product_attention` on one device in
bfloat16: the error a single-device bf16 attention has anyway. A ring that accumulated in
bfloat16 would grow with N (every step's merge rounds); ours merges in float32.
"""

from __future__ import annotations

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("out", "dq", "dk", "dv")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8, 16], help="ring sizes N")
    p.add_argument("--layouts", nargs="+", default=None, help="default: every layout")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--kernel", default="xla", help="parallel.attention's kernel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every figure to this JSON file")
    return p.parse_args(argv)


def bf16_inputs(args):
    """q, k, v, dO as bfloat16-representable float32 numpy arrays (natural token order)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(args.seed)
    shape = lambda heads: (1, args.seq_len, heads, args.head_dim)
    arrays = [rng.standard_normal(shape(h)).astype(np.float32)
              for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)]
    return [np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in arrays]


def ring_result(inputs, layout, num_shards, kernel):
    """out, (dq, dk, dv) of parallel.attention in bfloat16 on N devices, natural order, f32."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import parallel

    seq_len = inputs[0].shape[1]
    mesh = parallel.make_mesh(1, num_shards, devices=jax.devices()[:num_shards])
    # One document (every layout, balanced included, places it from the same row order).
    order = parallel.row_order(layout, np.zeros((1, seq_len), np.int32), num_shards)
    perm, inv = order[0], np.argsort(order[0])
    attend = lambda q, k, v: parallel.attention(q, k, v, mesh=mesh, layout=layout, order=order,
                                                kernel=kernel)

    @jax.jit
    def forward_backward(q, k, v, do):
        out, vjp = jax.vjp(attend, q, k, v)
        return out, vjp(do)

    out, grads = forward_backward(*(jnp.asarray(x[:, perm], jnp.bfloat16) for x in inputs))
    back = lambda x: np.asarray(x.astype(jnp.float32))[:, inv]
    return back(out), tuple(back(g) for g in grads)


def dense_bf16_result(inputs):
    """The same problem through jax.nn.dot_product_attention on one device, in bfloat16."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    attend = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)

    @jax.jit
    def forward_backward(q, k, v, do):
        out, vjp = jax.vjp(attend, q, k, v)
        return out, vjp(do)

    out, grads = forward_backward(*(jnp.asarray(x, jnp.bfloat16) for x in inputs))
    as_f32 = lambda x: np.asarray(x.astype(jnp.float32))
    return as_f32(out), tuple(as_f32(g) for g in grads)


def errors(result, reference):
    """max |error| / max |reference| and RMS error / RMS reference of out, dq, dk, dv."""
    import numpy as np

    from tests.support import dense_reference as ref

    rms = lambda got, want: float(np.sqrt(np.mean((np.asarray(got, np.float64) - want) ** 2)
                                          / np.mean(want ** 2)))
    (out, grads), (want_out, want_grads) = result, reference
    row = {}
    for name, got, want in zip(KEYS, (out, *grads), (want_out, *want_grads)):
        row[name] = ref.relative_error(got, want)
        row[name + " rms"] = rms(got, want)
    return row


def _dense_reference():
    """tests/support/dense_reference.py, the float64 reference the tests use (a file, not a package)."""
    import importlib.util
    path = os.path.join(ROOT, "tests", "dense_reference.py")
    spec = importlib.util.spec_from_file_location("dense_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={max(args.shards)}")
    import parallel
    ref = _dense_reference()

    layouts = args.layouts or list(parallel.LAYOUTS)
    inputs = bf16_inputs(args)
    q, k, v, do = inputs
    reference = ref.attention(q, k, v, None, True, do)
    rows = [dict(layout="dense bf16", shards=1, **errors(dense_bf16_result(inputs), reference))]
    for layout in layouts:
        for n in args.shards:
            result = ring_result(inputs, layout, n, args.kernel)
            rows.append(dict(layout=layout, shards=n, **errors(result, reference)))
    print(f"bf16 inputs, S = {args.seq_len}, {args.heads} query / {args.kv_heads} KV heads of "
          f"{args.head_dim}, causal, kernel {args.kernel}; error against float64: max |error| / "
          f"max |reference|, and RMS error / RMS reference")
    print("\n| layout | N | " + " | ".join(KEYS) + " | " + " | ".join(k + " rms" for k in KEYS)
          + " |\n|---|---|" + "---|" * 2 * len(KEYS))
    for r in rows:
        figures = [r[k] for k in KEYS] + [r[k + " rms"] for k in KEYS]
        print(f"| {r['layout']} | {r['shards']} | " + " | ".join(f"{x:.2e}" for x in figures)
              + " |")
    first, last = min(args.shards), max(args.shards)
    print(f"\nerror at N = {last} / error at N = {first} (flat: near 1; the bar is 2):")
    for layout in layouts:
        at = {r["shards"]: r for r in rows if r["layout"] == layout}
        print(f"  {layout}: " + ", ".join(f"{key} {at[last][key] / at[first][key]:.2f}"
                                          for key in (*KEYS, *(k + " rms" for k in KEYS))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
