"""Our model against Hugging Face transformers' own model (the architecture its config.json names,
any family of model/hf/families/) on the same directory: the check
that what model.hf.save and scripts/hf/export.py write is what transformers reads.

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers -e .
    /tmp/ref/bin/python scripts/hf/check_transformers.py DIR [DIR ...]
    /tmp/ref/bin/python scripts/hf/check_transformers.py --resave tests/fixtures/hf/*/

For each directory: the logits of model.hf.load(DIR) and of transformers' model loaded from DIR,
float32, on random tokens past any RoPE rule's original context, and their largest difference
relative to the largest logit. With --resave the directory is first loaded here and written
again by model.hf.save (bfloat16 too), and the written copy is what both read. A tokenizer in
the directory is loaded with transformers' AutoTokenizer and must encode as ours does.
"""

import argparse
import os
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

import data
from model import hf


def compare(path: str) -> float:
    ours = hf.load(path, param_dtype="float32")
    tokens = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 160))
    mine = np.asarray(ours(tokens))
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    with torch.no_grad():
        reference = theirs(torch.from_numpy(tokens)).logits.numpy()
    return float(np.abs(mine - reference).max() / np.abs(reference).max())


def tokenizer_agrees(path: str) -> str:
    name = next((n for n in ("tokenizer.json", "tokenizer.model")
                 if os.path.exists(os.path.join(path, n))), None)
    if name is None:
        return "no tokenizer"
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    ours = data.load_tokenizer(os.path.join(path, name)).encode(text)
    theirs = AutoTokenizer.from_pretrained(path)(text)["input_ids"]
    return f"{name}: {'same ids' if ours == theirs else f'DIFFERENT ids {ours[:8]} {theirs[:8]}'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--resave", action="store_true")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for path in args.dirs:
        targets = [path]
        if args.resave:
            m, tmp = hf.load(path), tempfile.mkdtemp()
            targets = []
            for dtype in ("float32", "bfloat16"):
                out = os.path.join(tmp, dtype)
                hf.save(m, out, dtype=dtype, max_shard_bytes=60_000)
                targets.append(out)
        for target in targets:
            label = path + (f" saved by hf.save as {os.path.basename(target)}" if args.resave
                            else "")
            print(f"{label}: max |ours - transformers| / max |transformers| = "
                  f"{compare(target):.2e}; {tokenizer_agrees(target)}")


if __name__ == "__main__":
    main()
