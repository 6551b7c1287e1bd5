"""The pod commands the documentation gives (scripts/README.md, config docstrings) pass train.py's
own validation for the slice they name, with its chip count, host count and platform, and
scripts/tpu_pod.py itself takes them; the dry-run output pasted in scripts/README.md is what the
script prints. A user who copies one does not find the mistake on a paid slice."""

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from configs import module_named
from tests.support.docs_text import commands, pages
from tests.support.tpu_pod_runs import launcher, tools_path
from training.validate import validate_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ACCELERATOR = "v4-32"  # tpu_pod.py create's default


def documented_commands():
    """(where, argv) of every `python scripts/tpu_pod.py run|all ...` in the docs, continuation
    lines joined."""
    sources = [REPO / "scripts" / "README.md", *sorted((REPO / "configs").rglob("*.py"))]
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
    config = module_named(Path(path).stem).get_config()
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


# What the docs leave to the user, as whole words (gs://BUCKET/PATH, --zone ZONE).
PLACEHOLDERS = {"BUCKET": "my-bucket", "ZONE": "us-central2-b"}
# The shell variables the docs set before their commands use them (POD="--name ... --zone ...").
VARIABLES = dict(re.findall(r'^([A-Z_]+)="([^"]*)"$',
                            (REPO / "scripts" / "README.md").read_text(), re.M))


def dry_run(argv, *flags, env=None):
    """tpu_pod.py COMMAND --dry-run FLAGS ARGS for a documented argv, placeholders and shell
    variables filled in."""
    argv = [word for a in argv for word in (
        shlex.split(VARIABLES[a[1:]]) if a.startswith("$") else
        [re.sub(r"\b(BUCKET|ZONE)\b", lambda m: PLACEHOLDERS[m[1]], a)])]
    return launcher(argv[0], "--dry-run", *flags, *argv[1:], env=env)


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in
                                                      enumerate(COMMANDS)])
def test_a_documented_pod_command_is_taken_by_tpu_pod(where, argv):
    """No retired or misplaced argument (a --bucket, an override before `--`), and a workdir
    that needs no warning: a gs:// path, which train.py writes directly."""
    result = dry_run(argv, "--skip-compile-check")
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_pasted_dry_run_output_is_what_the_script_prints():
    """The `+ ` block in scripts/README.md against the real --dry-run output of the README's
    `all` command: line by line, with `...` (and a `... (note)`) standing for any text, the
    repository as /path/to/ringstripe and the temp dir as /tmp."""
    text = (REPO / "scripts" / "README.md").read_text()
    blocks = [b.strip().splitlines() for b in re.findall(r"^```\n(.*?)^```$", text, re.M | re.S)]
    (pasted,) = [b for b in blocks if b and all(line.startswith("+ ") for line in b)]
    (argv,) = [argv for where, argv in COMMANDS if where == "README.md" and argv[0] == "all"]
    result = dry_run(argv, env={**os.environ, "PATH": tools_path(), "TMPDIR": "/tmp"})
    assert result.returncode == 0, result.stderr
    printed = result.stdout
    for python in (str(REPO / ".venv" / "bin" / "python"), sys.executable):
        printed = printed.replace(python, "/path/to/ringstripe/.venv/bin/python")
    printed = printed.replace(str(REPO), "/path/to/ringstripe").splitlines()
    assert len(pasted) == len(printed), "\n".join(printed)
    for doc, line in zip(pasted, printed):
        pattern = ".*".join(map(re.escape, re.split(r"\.\.\.(?: \([^)]*\))?", doc)))
        assert re.fullmatch(pattern, line), f"README.md has\n{doc}\nthe script prints\n{line}"


def documented_launch_commands():
    """(where, argv) of every `python scripts/launch.py ENGINE ...` in the pages a user reads
    (README.md, docs/, the package READMEs: tests/support/docs_text.py finds them) and the config
    docstrings, continuation lines joined (a WANDB_...=... prefix left out); a command given
    twice is checked once."""
    found = {}
    for page in pages():
        for _, argv in commands(page):
            if argv[0] == "scripts/launch.py":
                found.setdefault(tuple(argv[1:]), []).append(page.name)
    for path in sorted((REPO / "configs").rglob("*.py")):
        text = re.sub(r"\\\\?\n\s*", " ", ast.get_docstring(ast.parse(path.read_text())) or "")
        for line in text.splitlines():
            at = line.find("python scripts/launch.py ")
            if at >= 0:
                argv = tuple(shlex.split(line[at:].split(" #")[0])[2:])
                found.setdefault(argv, []).append(path.name)
    return [(",".join(dict.fromkeys(where)), list(argv)) for argv, where in found.items()]


LAUNCHES = documented_launch_commands()
# What makes each engine run its checks and print what it would do, paying for nothing
SHOW = {"slurm": "--print", "tpu": "--dry-run", "gke": "--print"}


def test_the_docs_launch_the_128k_recipes_with_every_engine():
    assert {(w, argv[0]) for where, argv in LAUNCHES for w in where.split(",")} >= {
        ("slurm.md", "slurm"), ("tpu.md", "tpu"), ("gke.md", "gke"),
        ("extend-to-128k.md", "slurm"), ("extend-to-128k.md", "tpu"),
        ("llama3_8b_128k_v5p.py", "tpu"), ("llama3_8b_128k_h100.py", "slurm")}


@pytest.mark.programs
@pytest.mark.parametrize("where,argv", LAUNCHES, ids=[f"{w}:{i}" for i, (w, _) in
                                                      enumerate(LAUNCHES)])
def test_a_documented_launch_command_passes_its_checks(where, argv):
    """As written, with --print or --dry-run added: no scheduler, gcloud or kubectl on PATH, so
    nothing can be submitted; SLURM's runs the planner's check of the job's devices (the H100
    recipe's docstring: the 8 GPUs of one node, no --workdir: runs/CONFIG beside the code)."""
    engine, rest = argv[0], argv[1:]
    show = [] if SHOW[engine] in rest else [SHOW[engine]]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{tools_path()}",
           "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "scripts/launch.py", engine, *show, *rest],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if engine == "slurm":
        assert "FITS (the planner's estimate)" in result.stderr
