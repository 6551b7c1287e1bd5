"""The test suite's tiers, declared once: what each `make test-*` target runs, and the check that
no test falls outside all of them.

    python tests/tiers.py run fast        # make test: the tier a newcomer runs
    python tests/tiers.py run programs    # make test-programs, and so on for each tier
    python tests/tiers.py check           # .ci/run: every collected test is in some tier
    python tests/tiers.py targets         # the make targets, in the order .ci/run runs them

A test belongs to the tier whose pytest marker it carries (a file's `pytestmark` or a test's
decorator); a test that carries none is in the fast tier. The fast tier is each package's unit
and exactness tests with a few whole-program runs that stand for the rest; the others hold the
whole programs, the wide exactness sweeps, the TPU compiles and the real cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Tier:
    target: str  # the make target
    marker: str | None  # the pytest marker its tests carry (None: those that carry no tier's)
    workers: int  # pytest-xdist workers (the machine the suite is made for has 2 cores)
    covers: str  # what --help says of it (docs/reference/tests.md says the same, with times)


TIERS = {
    "fast": Tier("test", None, 2,
                 "every package's unit and exactness tests (attention against float64 in each "
                 "layout, strategy and kernel; the model against one device and transformers' "
                 "files) and a few whole train.py/sample.py runs"),
    "programs": Tier("test-programs", "programs", 2,
                     "whole programs as users run them: train.py, sample.py and the scripts as "
                     "subprocesses (resume, faults, preemption, several processes, a bucket on a "
                     "local Cloud Storage emulator, the benchmark scripts, the figures)"),
    "sweeps": Tier("test-sweeps", "sweeps", 2,
                   "the exactness sweeps' other cases (ring sizes, meshes, families with "
                   "experts or recurrent layers, decoding each kind) beyond the representative "
                   "ones the fast tier keeps, and the planner's calibration fit"),
    # libtpu lets one process at a time hold it: two workers compiling would wait for each other
    "heavy": Tier("test-slow", "heavy", 1,
                  "compiles of a minute or more: TPU compiles of the attention and of whole "
                  "configs at their real sizes (libtpu, no TPU needed), the bytes a compiled "
                  "Gated DeltaNet step moves"),
    "cluster": Tier("test-cluster", "cluster", 1,
                    "scripts/launch.py slurm against a real one-node SLURM cluster the tests "
                    "start (as root; packages installed with apt-get where missing)"),
}


def expression(name: str) -> str:
    """The tier's pytest -m expression: its marker, or for the fast tier no other tier's."""
    tier = TIERS[name]
    if tier.marker:
        return tier.marker
    return " and ".join(f"not {t.marker}" for t in TIERS.values() if t.marker)


def pytest_args(name: str) -> list[str]:
    """What the tier's make target passes to pytest."""
    tier = TIERS[name]
    workers = ["-n", str(tier.workers), "--dist", "loadfile", "--no-loadscope-reorder"] if (
        tier.workers > 1) else []
    return [*workers, "-q", "-m", expression(name), "tests"]


def run(name: str, extra: list[str]) -> int:
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "pytest", *pytest_args(name), *extra], cwd=ROOT)
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    print(f"make {TIERS[name].target} ({name} tier): {minutes}m{seconds:02d}s, "
          f"{'passed' if code == 0 else f'failed (exit {code})'}")
    return code


def collected(args: list[str]) -> set[str]:
    """The node ids pytest collects with these arguments (workers dropped: collection only)."""
    if "-n" in args:
        args = args[args.index("--no-loadscope-reorder") + 1:]
    args = [arg for arg in args if arg != "-q"]  # -qq would list files, not tests
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 5):  # 5: nothing collected (a tier with no tests yet)
        sys.exit(f"collecting {' '.join(args)} failed:\n{out.stdout[-4000:]}{out.stderr[-4000:]}")
    return {line for line in out.stdout.splitlines() if "::" in line}


def check() -> int:
    """Collects the whole suite and each tier as its target runs it: fails on a test that no
    tier runs (an unknown marker, a tier's arguments narrowed) and on one that two tiers run."""
    everything = collected(["tests"])
    tiers = {name: collected(pytest_args(name)) for name in TIERS}
    missing = everything - set().union(*tiers.values())
    twice = {test for test in everything if sum(test in ids for ids in tiers.values()) > 1}
    print(f"{len(everything)} tests: " + ", ".join(f"{name} {len(ids)}"
                                                   for name, ids in tiers.items()))
    for test in sorted(missing)[:20]:
        print(f"in no tier: {test}")
    for test in sorted(twice)[:20]:
        print(f"in two tiers: {test}")
    if missing or twice:
        print(f"error: {len(missing)} tests in no tier, {len(twice)} in two: mark each with "
              f"exactly one of the markers in tests/tiers.py ({', '.join(marks())}) or none "
              f"(the fast tier)")
        return 1
    return 0


def split(cases, *keys, fast=(), rest="sweeps"):
    """A parametrize list split between the tiers: the first case of each value each key takes
    (a key is a case's position in its tuple, or a function of the case), and the cases at the
    indices `fast`, stay in the fast tier; the others go to the tier `rest`. So the fast tier
    keeps, say, a case of every layout and of every option, and the sweeps tier the rest. The
    test ids are unchanged."""
    import pytest
    kept = set(fast)
    for key in keys:
        seen = set()
        for i, case in enumerate(cases):
            value = repr(key(case) if callable(key) else case[key])
            if value not in seen:
                seen.add(value)
                kept.add(i)
    mark = getattr(pytest.mark, TIERS[rest].marker)
    return [case if i in kept else pytest.param(*(case if isinstance(case, tuple) else (case,)),
                                                marks=mark)
            for i, case in enumerate(cases)]


def marks() -> list[str]:
    return [t.marker for t in TIERS.values() if t.marker]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
        epilog="\n".join(f"{name} (make {t.target}): {t.covers}" for name, t in TIERS.items()))
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="run one tier")
    runner.add_argument("tier", choices=TIERS)
    sub.add_parser("check", help="fail on a test that no tier runs")
    listing = sub.add_parser("targets", help="the tiers' make targets")
    listing.add_argument("--except", dest="skip", nargs="*", default=[], choices=TIERS)
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        return run(args.tier, extra)
    if args.command == "check":
        return check()
    print(" ".join(t.target for name, t in TIERS.items() if name not in args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
