"""Where a step's time goes: a jax.profiler trace of config.profile's steps, and its summary.

    profiler = StepProfiler(config.profile, workdir)
    train_step = profiler.wrap(train_step)        # with a profile: compiled ahead of time, once
    for step in ...:
        profiler.before(step)                     # start_trace at profile.start_step
        with profiler.annotate(step):             # a StepTraceAnnotation: TensorBoard's steps
            arrays, metrics = train_step(arrays, batch)
        summary = profiler.after(step, arrays)    # stop, read, sum up

The trace goes to WORKDIR/profile/ (process i > 0: profile/process_i/), in the layout TensorBoard's
profile plugin, XProf and Perfetto read (plugins/profile/RUN/HOST.xplane.pb); a bucket run's
trace is written to this machine's mirror of the workdir and copied to the bucket.

The summary reads the trace of this process's devices: the HLO ops each device ran, with their
start and length. Over the profiled steps' wall time (from before the first to the end of the
last, its results ready) it says, averaged over the devices:

    compute       time inside ops that are not collectives
    collectives   time inside all-reduce, all-gather, reduce-scatter, all-to-all,
                  collective-permute, send/recv (waiting for a peer included: a ring's stall
                  shows here)
    host/idle     the rest: Python, the input pipeline, dispatch, gaps between ops
    attention     the share of op time spent in ops of the attention (parallel.attention's
                  named scope, found in the compiled program's op metadata or the trace's own)

On a CPU, XLA traces its ops only with --xla_cpu_enable_xprof_traceme, which train.py sets when
config.profile asks for a trace (before JAX starts); GPUs and TPUs trace them always.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import time
from collections import defaultdict

import jax

import storage
from storage.run_dir import RunDir

CPU_TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|"
                        r"collective-broadcast|send|recv|ragged-all-to-all)")
SCOPE = "attention"  # parallel.attention's jax.named_scope


class StepProfiler:
    def __init__(self, profile, workdir: str):
        self.steps = profile.steps
        run = RunDir(workdir)
        index = jax.process_index()
        sub = (f"process_{index}",) if index else ()
        self.remote = storage.join(run.profile, *sub) if storage.is_remote(run.root) else None
        self.directory = os.path.join(RunDir(run.local).profile, *sub)
        self._started = None
        self._compiled = None  # the train step, compiled by wrap's step

    def wrap(self, train_step):
        """The train step the loop calls. With a profile asked, the jitted step is compiled
        ahead of time at its first call (the one compile a jit call would make) and that
        executable runs every step, so that the summary can read its optimized program: a
        jit's `lower().compile()` after its calls compiles the program a second time (minutes
        for a large model). Without a profile, the step itself."""
        if not self.enabled:
            return train_step

        def step(arrays, batch):
            if self._compiled is None:
                spec = jax.tree.map(
                    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                    (arrays, batch))
                self._compiled = train_step.lower(*spec).compile()
            return self._compiled(arrays, batch)

        return step

    @property
    def enabled(self) -> bool:
        return len(self.steps) > 0

    def before(self, step: int) -> None:
        if self.enabled and step == self.steps.start:
            os.makedirs(self.directory, exist_ok=True)
            self._known = set(_traces(self.directory))
            jax.profiler.start_trace(self.directory)
            self._started = time.perf_counter()

    def annotate(self, step: int):
        if self._started is None:
            return contextlib.nullcontext()
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def after(self, step: int, arrays) -> dict | None:
        """At the last profiled step: waits for `arrays`, stops the trace and returns its
        summary (the wrapped step's optimized program is read where the trace's ops carry no
        scope of their own); None at every other step."""
        if self._started is None or step != self.steps[-1]:
            return None
        jax.block_until_ready(arrays)
        wall = time.perf_counter() - self._started
        jax.profiler.stop_trace()
        self._started = None
        new = [t for t in _traces(self.directory) if t not in self._known]
        summary = {"steps": len(self.steps), "wall_s": wall}
        if new:
            summary.update(summarize(new[-1], wall, self._compiled.as_text))
            summary["trace"] = os.path.relpath(new[-1], self.directory)
        if self.remote:
            _copy_up(self.directory, self.remote)
        return summary

    def close(self) -> None:
        """A run that ends inside the window: the trace is stopped (and kept)."""
        if self._started is not None:
            jax.profiler.stop_trace()
            self._started = None


def _traces(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "plugins", "profile", "*", "*.xplane.pb")))


def _copy_up(local: str, remote: str) -> None:
    for path in glob.glob(os.path.join(local, "**", "*"), recursive=True):
        if os.path.isfile(path):
            target = storage.path(storage.join(remote, os.path.relpath(path, local)))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(open(path, "rb").read())


def device_ops(trace_file: str) -> dict:
    """{device: [(name, start_ns, duration_ns, scope)]}: the HLO ops of the trace, per device
    of this process (TPU/GPU: the device planes' "XLA Ops" lines; CPU: the host threads' events
    that name an hlo_op and a device_ordinal). scope: the op's source path where the trace
    has it ('tf_op' / 'long_name'), else ''."""
    data = jax.profiler.ProfileData.from_file(trace_file)
    ops = defaultdict(list)
    for plane in data.planes:
        device_plane = plane.name.startswith("/device:") and "CUSTOM" not in plane.name
        for line in plane.lines:
            if device_plane and line.name != "XLA Ops":
                continue
            for event in line.events:
                stats = dict(event.stats)
                if device_plane:
                    device = plane.name
                elif "hlo_op" in stats and "device_ordinal" in stats:
                    device = f"cpu:{stats['device_ordinal']}"
                else:
                    continue
                scope = str(stats.get("tf_op") or stats.get("long_name") or "")
                ops[device].append((event.name, event.start_ns, event.duration_ns, scope))
    return dict(ops)


def scoped_ops(hlo_text: str, scope: str = SCOPE) -> set[str]:
    """The instructions of an optimized HLO module that belong to `scope`: their op_name
    metadata names it, or, for a fusion or call, an instruction of what it calls does."""
    in_scope, calls, current = set(), {}, None
    computations = defaultdict(bool)
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            continue
        m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if not m:
            continue
        name = m.group(1)
        meta = re.search(r'op_name="([^"]*)"', line)
        mine = bool(meta and re.search(rf"\b{scope}\b", meta.group(1)))
        if mine:
            in_scope.add(name)
            computations[current] = True
        called = re.search(r"calls=%?([\w.\-]+)", line)
        if called:
            calls[name] = called.group(1)
    in_scope.update(n for n, c in calls.items() if computations[c])
    return in_scope


def _union(intervals) -> int:
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize(trace_file: str, wall_s: float, compiled_text) -> dict:
    """The trace's time split (module docstring), shares of the wall time, averaged over this
    process's devices; attention: its share of the op time."""
    ops = device_ops(trace_file)
    if not ops:
        return {}
    scoped = None
    if not any(scope for per in ops.values() for *_, scope in per):
        scoped = scoped_ops(compiled_text())
    wall_ns = wall_s * 1e9
    compute = collective = attention = op_total = 0.0
    for per in ops.values():
        coll = [(s, s + d) for name, s, d, _ in per if COLLECTIVE.match(name)]
        busy = [(s, s + d) for name, s, d, _ in per]
        collective += _union(coll)
        compute += _union(busy) - _union(coll)
        for name, _, d, scope in per:
            op_total += d
            if (SCOPE in scope) if scoped is None else (name in scoped):
                attention += d
    n = len(ops)
    compute_s, collective_s = min(compute / n, wall_ns), min(collective / n, wall_ns)
    return {"compute": compute_s / wall_ns, "collectives": collective_s / wall_ns,
            "host_idle": max(0.0, 1 - (compute_s + collective_s) / wall_ns),
            "attention": attention / op_total if op_total else 0.0, "devices": n}


def describe(summary: dict, directory: str) -> str:
    """The one line a run prints about its profile."""
    steps, wall = summary["steps"], summary["wall_s"]
    head = (f"ringstripe: profile of {steps} step{'s' * (steps > 1)} on process 0 "
            f"({wall / steps * 1e3:,.1f} ms a step)")
    if "compute" not in summary:
        return f"{head}: the trace has no device ops to sum; trace in {directory}"
    return (f"{head}: compute {summary['compute']:.0%}, collectives "
            f"{summary['collectives']:.0%}, host/idle {summary['host_idle']:.0%}; attention "
            f"{summary['attention']:.0%} of the op time; trace in {directory} (tensorboard "
            f"--logdir {directory})")
