"""Start N local processes of a JAX program joined by jax.distributed on 127.0.0.1.

    python scripts/launch_local.py --processes 2 -- \
        train.py --config configs/tiny.py --workdir runs/mp --config.cpu_devices=2

Each process gets --coordinator_address=127.0.0.1:PORT --num_processes=N --process_id=I appended
to its arguments (train.py understands them), its own fake CPU devices (the program's config
decides how many), and its output prefixed with [I]. If any process fails, the others are
stopped: a JAX process whose peer died would otherwise wait, or abort, on its own. Exit code: the
first non-zero exit code, or 0.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.local import launch  # noqa: E402  (the launcher itself: launch/local.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None, help="seconds before all are killed")
    parser.add_argument("--pin", action="store_true",
                        help="process i runs on core i only (one device per core, as on a pod)")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="-- then the script and its arguments")
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("give the program after --, e.g. -- train.py --config configs/tiny.py ...")
    sys.exit(launch(program, args.processes, args.timeout, pin=args.pin))


if __name__ == "__main__":
    main()
