"""The pod commands the documentation gives (scripts/README.md, config docstrings) pass train.py's
own validation for the slice they name, with its chip count, host count and platform: a user who
copies one does not find the mistake on a paid slice."""

import ast
import re
import shlex
from pathlib import Path

import pytest

from training.validate import validate_config

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ACCELERATOR = "v4-32"  # tpu_pod.py create's default


def documented_commands():
    """(where, argv) of every `python scripts/tpu_pod.py run|all ...` in the docs, continuation
    lines joined."""
    sources = [REPO / "scripts" / "README.md", *sorted((REPO / "configs").glob("*.py"))]
    found = []
    for path in sources:
        text = path.read_text()
        if path.suffix == ".py":
            text = ast.get_docstring(ast.parse(text)) or ""
        text = re.sub(r"\\\\?\n\s*", " ", text)  # a command continued over lines
        for line in text.splitlines():
            at = line.find("python scripts/tpu_pod.py ")
            if at >= 0 and line[at:].split()[2] in ("run", "all"):
                found.append((path.name, shlex.split(line[at:].split("#")[0])[2:]))
    return found


def chips(accelerator: str) -> int:
    """Chips of a Cloud TPU accelerator type: v4 and v5p count TensorCores (2 a chip)."""
    kind, count = accelerator.rsplit("-", 1)
    return int(count) // 2 if kind in ("v4", "v5p") else int(count)


def load_config(path: str, overrides: list[str]):
    import importlib
    config = importlib.import_module(f"configs.{Path(path).stem}").get_config()
    for override in overrides:
        key, value = override.removeprefix("--config.").split("=", 1)
        section, _, name = key.rpartition(".")
        target = config[section] if section else config
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        target[name] = type(target[name])(value)
    return config


COMMANDS = documented_commands()


def test_the_docs_have_pod_commands():
    assert {where for where, _ in COMMANDS} >= {"README.md", "paper_tpuv4_786k.py",
                                               "llama3_8b_v5p.py"}


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in
                                                      enumerate(COMMANDS)])
def test_a_documented_pod_command_validates_for_its_slice(where, argv):
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = argv[:cut], argv[cut + 1:]
    flags = {}
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" not in arg and i + 1 < len(args):
            flags[arg] = args[i + 1]
    overrides += [a for a in args if a.startswith("--config.")]
    accelerator = flags.get("--accelerator-type", DEFAULT_ACCELERATOR)
    devices = chips(accelerator)
    config = load_config(flags["--config"], overrides)
    validate_config(config, devices, max(1, devices // 4), platform="tpu")
