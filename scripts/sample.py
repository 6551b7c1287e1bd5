"""The sampler, sample.py at the repository's root, under scripts/ as well: the same program and
flags (python scripts/sample.py --workdir runs/passkey --seq_shards 4 --prompt_file p.txt
--temperature 0)."""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    runpy.run_path(os.path.join(ROOT, "sample.py"), run_name="__main__")
