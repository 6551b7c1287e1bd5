"""Options for the XLA compiler that the attention needs to be fast, per platform; every jit of
a training step passes them (training/loop.py, training/analysis/aot.py).

On a TPU, XLA's latency-hiding scheduler runs before the compiler decides which buffers live in
faster memory, and that decision can leave a ring step's K/V transfer outside the kernel it was
issued beside: in the TPU compiler's schedule of the forward, the hop then starts only after
the step's kernel (seen for striped at 8k tokens per chip without segment ids, zigzag at 49k).
Scheduling again after that assignment hides every hop of the ring strategy, forward and
backward, in each case tests/planner/test_tpu_compile.py compiles. In a whole train step the second
schedule keeps a little more alive at once (under a GB per chip in the v4 configs, as measured
while this was written), a price for transfers that no longer wait for the kernel.
"""

from __future__ import annotations

_TPU = {"xla_tpu_rerun_latency_hiding_scheduler_post_sc_assignment": True}


def compiler_options(platform: str) -> dict:
    """The jax.jit(..., compiler_options=...) for a program on `platform` ('tpu', 'gpu', 'cpu')."""
    return dict(_TPU) if platform == "tpu" else {}
