"""What the documentation says, read as a test reads it: the pages (README.md, BENCHMARKS.md,
docs/, the package READMEs), their links, the repository paths their prose names, and the
commands of their code blocks, each checked the way the program it runs would check it, without
running it. tests/project/test_docs.py asserts on these; a new page under docs/ is read with no change
here."""

from __future__ import annotations

import ast
import functools
import os
import re
import shlex
import subprocess
from pathlib import Path
from tests.support import ROOT

REPO = Path(ROOT)
SCRIPTS = ("train.py", "scripts/plan.py", "scripts/launch.py")  # the commands checked
# What runs a script: python, python3.11, .venv/bin/python (or `launch_local.py ... -- train.py`)
PYTHON = re.compile(r"(^|/)python[\d.]*$")


def pages() -> list[Path]:
    """Every page a user reads: README.md, BENCHMARKS.md, docs/**, each folder's README.md."""
    found = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md"))]
    found += sorted(p for p in REPO.glob("*/README.md") if _tracked_folder(p.parent.name))
    return found


def _tracked_folder(name: str) -> bool:
    return name in top_folders()


@functools.cache
def top_folders() -> frozenset:
    """The repository's own top-level folders (those git tracks files in)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    return frozenset(line.split("/")[0] for line in listed.splitlines() if "/" in line)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# --- links -----------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(page: Path) -> list[str]:
    """The relative targets of the page's markdown links and images (web addresses left out)."""
    text = _without_code(page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation gone, spaces to -."""
    heads = re.findall(r"^#{1,6} +(.+?) *$", _without_code(page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken_link(page: Path, target: str) -> str | None:
    """Why the link does not lead anywhere, or None."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: {rel(dest)} has no heading #{anchor}"
    return None


def _without_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


# --- repository paths named in prose ---------------------------------------------------------


def named_paths(page: Path) -> list[str]:
    """Every repository path the page names, link or not, code or prose: a word that starts with
    one of the repository's top-level folders and names something inside it (`planner/run.py`,
    `configs/*.py`, `tests/model/test_hf.py::test_x`). Words inside another path or address
    (`/data/books`, `gs://b/data/x`, `runs/x`) are not the repository's."""
    tops = "|".join(map(re.escape, sorted(top_folders())))
    pattern = re.compile(rf"(?<![\w./~$:@-])(?:{tops})/[\w.*/-]*[\w*]")
    found = []
    for match in pattern.finditer(page.read_text()):
        word = match.group(0).split("::")[0]
        found.append(word)
    return found


def missing_path(page: Path, word: str) -> bool:
    """Whether a named path exists nowhere: from the repository's root, or beside the page."""
    module = re.sub(r"\.[A-Za-z_]\w*$", ".py", word)  # model/hf.load: a module's function
    for base, word in [(b, w) for b in (REPO, page.parent) for w in {word, module}]:
        if "*" in word:
            if list(base.glob(word)):
                return False
        elif (base / word).exists():
            return False
    return True


# --- commands --------------------------------------------------------------------------------


def commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, argv from the script on) of every train.py, scripts/plan.py and scripts/launch.py
    command in the page's code blocks and `python ...` code spans, continuation lines joined,
    comments and a shell's `VAR=value` prefix dropped, a `for X in A B; do` loop's commands
    once for each value."""
    text = page.read_text()
    found = []
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        line = text.count("\n", 0, block.start()) + 2
        found += [(line, argv) for argv in _block_commands(block.group(1))]
    prose = _without_code(text)
    for span in re.finditer(r"`(python [^`]+)`", prose):
        found += [(0, argv) for argv in _block_commands(span.group(1).replace("\n", " "))]
    return found


def _block_commands(block: str) -> list[list[str]]:
    block = re.sub(r"\\\n", " ", block)
    loops = re.findall(r"\bfor (\w+) in ([^;\n]+); do", block)
    out = []
    for line in block.splitlines():
        variants = [line]
        for var, values in loops:
            if f"${var}" in line:
                variants = [v.replace(f"${var}", x) for v in variants for x in values.split()]
        for variant in variants:
            out += _line_commands(variant)
    return out


def _line_commands(line: str) -> list[list[str]]:
    """The checked scripts' argvs in one shell line (after `;`, `&&` or `|`, the next command)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: not a command line
        return []
    out, current = [], []
    for word in words + [";"]:
        if word in (";", "&&", "||", "|", "&", ">", ">>", "<"):
            start = next((i for i, w in enumerate(current) if w in SCRIPTS and (
                i and (PYTHON.search(current[i - 1]) or current[i - 1] == "--")
                or i == 0 and current[1:2] and current[1].startswith("--"))), None)
            if start is not None:
                out.append(current[start:])
            current = []
        else:
            current.append(word)
    return out


# --- a command as its program reads it -------------------------------------------------------


class _Bound:
    """A flags module whose DEFINE_* define into one FlagValues (and, for config files, read
    their overrides from one argv), so a script's flag definitions can be run again here."""

    def __init__(self, module, flag_values, **extra):
        self._module, self._values, self._extra = module, flag_values, extra

    def __getattr__(self, name):
        attr = getattr(self._module, name)
        if name.startswith("DEFINE"):
            return functools.partial(attr, flag_values=self._values, **self._extra)
        if name.startswith("mark_"):
            return lambda *a, **k: None
        return attr


def script_flags(script: str, argv: list[str]):
    """A FlagValues holding exactly the flags `script` defines at its top level."""
    from absl import flags
    from ml_collections import config_flags
    values = flags.FlagValues()
    space = {"flags": _Bound(flags, values),
             "config_flags": _Bound(config_flags, values, sys_argv=argv),
             "os": os, "ROOT": str(REPO), "__file__": str(REPO / script)}
    for node in ast.parse((REPO / script).read_text()).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                call.func.attr.startswith("DEFINE"):
            exec(compile(ast.Module([node], []), script, "exec"), space)
    return values


def check_command(argv: list[str]) -> None:
    """Raises SystemExit (after the program's own one-line error on stderr) where the program
    would refuse the command before doing anything: its flags, its config file and overrides,
    and the config against the devices it runs on (the config's DEVICE, as scripts/plan.py
    reads it; a launch: its engine's flags, then the config as train.py reads it)."""
    script = argv[0]
    if script == "scripts/launch.py":
        _check_launch(argv)
        return
    from training.cli import parse_flags
    argv = list(argv)  # one list: parse_flags takes the stage flags out of what absl reads
    values = script_flags(script, argv)
    parse_flags(argv, values)
    _check_config(values, values["device"].value if "device" in values else None,
                  values["devices"].value if "devices" in values else 0)


def _check_config(values, device_name, devices) -> None:
    from ml_collections import config_flags

    import run_config
    from planner import DEVICES
    from planner.reports.plan import module_constant
    from planner.run import device_count, process_count
    from training.cli import fail
    from training.validate import validate_config
    try:
        config = run_config.build(values["config"].value)
        filename = config_flags.get_config_filename(values["config"])
        name = device_name or module_constant(filename, "DEVICE") or "cpu"
        count = device_count(config, name, devices)
        validate_config(config, count, process_count(DEVICES[name], count),
                        platform=DEVICES[name].platform)
    except Exception as e:  # noqa: BLE001 - every refusal here is the program's one line
        fail(f"{type(e).__name__}: {e}")


def _check_launch(argv: list[str]) -> None:
    import importlib.util
    spec = importlib.util.spec_from_file_location("launch_script", REPO / "scripts/launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    own, overrides = launch.split_overrides(argv[1:])
    args = launch.build_parser().parse_args(own)
    train = ["train.py", "--config", args.config, "--workdir", "x", *overrides]
    from training.cli import parse_flags
    values = script_flags("train.py", train)
    parse_flags(train, values)  # the job's devices: the engine's own check (programs)
