"""The documentation stays true: every link and repository path it names exists, every train.py,
scripts/plan.py and scripts/launch.py command it gives is one its program accepts (the launch
commands' own pre-launch checks: tests/launch/test_documented_pod_commands.py), the README's models
table is the family registry's, configs/README.md lists every config, and the README stays a
short page (12,000 characters) that routes to docs/."""

import contextlib
import io

import pytest

from tests.support.docs_text import (REPO, broken_link, check_command, commands, links, missing_path,
                             named_paths, pages, rel)

PAGES = pages()
IDS = [rel(p) for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_links_lead_somewhere(page):
    broken = [why for why in map(lambda t: broken_link(page, t), links(page)) if why]
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_named_repository_paths_exist(page):
    missing = sorted({w for w in named_paths(page) if missing_path(page, w)})
    assert not missing, f"{rel(page)} names paths that do not exist: {', '.join(missing)}"


def refusals(page):
    """The page's commands that their program refuses, with the program's line."""
    bad = []
    for line, argv in commands(page):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                check_command(argv)
        except SystemExit as e:
            bad.append(f"line {line}: {' '.join(argv)[:160]} -> exit {e.code}: "
                       f"{err.getvalue().strip()[-300:]}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_documented_commands_are_accepted(page, monkeypatch):
    monkeypatch.chdir(REPO)
    bad = refusals(page)
    assert not bad, f"{rel(page)}:\n" + "\n".join(bad)


def test_the_checker_refuses_what_the_programs_refuse(tmp_path, monkeypatch):
    """The command check is not a rubber stamp: each of these is refused, as its program
    would refuse it."""
    monkeypatch.chdir(REPO)
    page = tmp_path / "bad.md"
    page.write_text("```bash\n"
                    "python train.py --config configs/tiny.py --workdir x --config.model.tile_q=8\n"
                    "python train.py --config configs/tiny.py --workdir x --config.mesh.seq=3\n"
                    "python scripts/plan.py --config configs/tiny.py --device tpu-v9\n"
                    "python scripts/plan.py --config configs/none.py\n"
                    "python scripts/launch.py tpu --config configs/tiny.py --zone z\n"
                    "python scripts/launch.py slurm --config configs/tiny.py --config.nope=1\n"
                    "for x in ring spiral; do python train.py --config configs/tiny.py \\\n"
                    "  --workdir x --config.parallel.layout=$x; done\n"
                    "```\n"
                    "and `python train.py --config configs/tiny.py --workdir x --bogus`.\n")
    bad = refusals(page)
    assert len(bad) == 8, "\n".join(bad)
    assert "spiral" in bad[6] and "--bogus" in bad[7]
    assert len(commands(page)) == 9  # the loop's ring passes


# --- the README: short, routing, its models table the registry's ----------------------------

README = (REPO / "README.md").read_text()
TASK_PAGES = ("quickstart", "extend-to-128k", "slurm", "tpu", "gke", "wandb", "resume",
              "choosing-a-layout", "troubleshooting")


def test_the_readme_is_a_short_page_that_routes_to_the_tasks():
    assert len(README) <= 12_000, f"README.md has {len(README):,} characters (at most 12,000)"
    assert README.index("make train") < README.index("## ") and "make test" in README[:2000]
    for page in TASK_PAGES:
        assert f"](docs/{page}.md)" in README, f"the README does not link docs/{page}.md"
    assert "](configs/README.md)" in README and "](BENCHMARKS.md)" in README


def test_the_models_table_is_the_family_registry():
    from model.hf.families import FAMILIES, models_table
    table = README.split("<!-- models table:")[1].split("-->", 1)[1]
    table = table.split("<!-- end of the models table -->")[0].strip()
    assert table == models_table(), ("README.md's models table is not the registry's: paste "
                                     "the output of `python scripts/hf/models_table.py`")
    assert all(f"| `{name}` |" in table for name in FAMILIES)
    assert all(f.models and f.attention and f.block for f in FAMILIES.values())


def test_every_family_in_the_table_is_checked_against_transformers():
    """The README says each family is checked against transformers' model: each has a fixture
    (written by transformers, scripts/hf/make_fixtures.py) whose logits tests/model/test_hf.py
    compares."""
    import json

    from model.hf.families import FAMILIES
    fixtures = REPO / "tests" / "fixtures" / "hf"
    types = {json.loads(p.read_text())["model_type"] for p in fixtures.glob("*/config.json")}
    assert set(FAMILIES) <= types


def test_configs_readme_lists_every_config():
    text = (REPO / "configs" / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [`")]
    files = sorted(p.relative_to(REPO / "configs").as_posix()
                   for p in (REPO / "configs").rglob("*.py") if p.name != "__init__.py")
    listed = sorted(row.split("`")[1] for row in rows)
    assert listed == files, "configs/README.md's table and configs/*.py differ"
