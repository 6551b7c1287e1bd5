"""config.profile: a jax.profiler trace of chosen steps in WORKDIR/profile/, in the layout
TensorBoard's profile plugin lists (plugins/profile/RUN/HOST.xplane.pb), and the one line that
says where the profiled steps' time went; with wandb, the trace and the shares go there too."""

import glob
import re

import jax
import pytest

from tests.support.train_runs import clean_env, read_metrics, run_train
from training.analysis import profile


@pytest.mark.programs
def test_a_profiled_run_writes_a_trace_and_says_where_the_time_went(tmp_path):
    result = run_train(tmp_path, "--config.profile.start_step=3", "--config.profile.num_steps=2",
                       "--config.num_train_steps=6", "--config.eval_every_steps=100",
                       "--config.tracker=wandb", env={**clean_env(), "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [ln for ln in result.stdout.splitlines() if "profile of" in ln]
    m = re.search(r"profile of 2 steps on process 0 \(([\d.,]+) ms a step\): compute (\d+)%, "
                  r"collectives (\d+)%, host/idle (\d+)%; attention (\d+)% of the op time; "
                  r"trace in (\S+) ", line)
    assert m, line
    compute, collectives, idle, attention = map(int, m.groups()[1:5])
    assert 98 <= compute + collectives + idle <= 102 and compute > 0 and collectives > 0
    assert 0 < attention < 100  # the ring's steps and its MLP/loss around them
    assert m.group(6) == str(tmp_path / "profile")
    (trace,) = glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    ops = profile.device_ops(trace)
    assert sorted(ops) == [f"cpu:{i}" for i in range(4)]  # the mesh's 4 devices, each traced
    names = {name for per in ops.values() for name, *_ in per}
    assert any(profile.COLLECTIVE.match(n) for n in names), names  # the data axis' reductions
    (row,) = [r for r in read_metrics(tmp_path) if r.get("event") == "profiled"]
    assert row["step"] == 4 and row["profile/steps"] == 2
    assert abs(row["profile/compute"] * 100 - compute) <= 0.5 + 1e-9
    # the trace goes with the wandb run (offline: its files, uploaded at sync)
    uploaded = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "plugins"
                             / "profile" / "*" / "*.xplane.pb"))
    assert [open(p, "rb").read() for p in uploaded] == [open(trace, "rb").read()]


def test_the_ops_of_a_scope_are_found_in_the_compiled_program_fusions_included():
    x = jax.numpy.ones((8, 8))

    def f(x):
        with jax.named_scope("attention"):
            y = jax.numpy.tanh(x @ x)
        return jax.numpy.exp(y).sum() + jax.numpy.cos(x).sum()

    text = jax.jit(f).lower(x).compile().as_text()
    scoped = profile.scoped_ops(text)
    entry = text[text.index("ENTRY"):]
    called = {name for name in re.findall(r"%([\w.\-]+) = ", entry)}
    assert scoped and scoped <= called | set(re.findall(r"%([\w.\-]+) = ", text))
    # every instruction of the entry that is or calls a scoped op carries the scope: the tanh
    # and the dot are in, the cos is not
    for line in entry.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
        if m and " cosine(" in line:
            assert m.group(1) not in scoped
    assert profile._union([(0, 10), (5, 15), (20, 25)]) == 20
