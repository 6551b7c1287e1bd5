"""Timing for the benchmarks: programs called interleaved, so that drift on this machine (another
process, clock changes) hits every program alike; the scripts take medians of what it returns."""

from __future__ import annotations

import time


def interleaved(calls: dict, reps: int, warmup: int = 2, after=None) -> dict:
    """{key: call} -> {key: [seconds of each timed call]}.

    Each call runs `warmup` times untimed (compile, caches), then every repetition calls each
    program once in turn. `after()`, if given, runs after every call inside the timed span (the
    multi-process bench passes a barrier there, so the slower process is what is timed).
    Example: times = interleaved({"a": f, "b": g}, reps=7); statistics.median(times["a"]).
    """
    import jax

    for call in calls.values():
        for _ in range(warmup):
            jax.block_until_ready(call())
            if after:
                after()
    times = {key: [] for key in calls}
    for _ in range(reps):
        for key, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            if after:
                after()
            times[key].append(time.perf_counter() - start)
    return times
