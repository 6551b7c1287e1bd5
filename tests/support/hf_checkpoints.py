"""A Hugging Face model directory with a tokenizer, for the training tests: a fixture checkpoint
(tests/fixtures/hf, saved by transformers) and a small BPE tokenizer.json trained here with the
`tokenizers` library on a text file, its vocabulary no larger than the model's."""

import json
import os
import shutil
from tests.support import FIXTURES as FIXTURES_DIR

FIXTURES = os.path.join(FIXTURES_DIR, "hf")


def write_text(path: str, size: int = 200_000) -> str:
    """A text corpus: the Python standard library's own modules, concatenated."""
    import sysconfig
    root, parts, total = sysconfig.get_paths()["stdlib"], [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and total < size:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
            total += len(parts[-1])
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts)[:size])
    return path


def make_model_dir(target: str, corpus: str, case: str = "linear_tied",
                   vocab_size: int = 120) -> str:
    """FIXTURES/case copied to `target`, with a tokenizer.json of `vocab_size` pieces (ids 0, 1,
    2 = <unk>, <s>, </s>: config.json's eos_token_id is 2) trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    shutil.copytree(os.path.join(FIXTURES, case), target)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, limit_alphabet=vocab_size // 2,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train([corpus], trainer)
    tok.save(os.path.join(target, "tokenizer.json"))
    with open(os.path.join(target, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>"}, f)
    return target
