# ringstripe: `make train` trains the embedded default, `make test` runs the tests.
# Both create .venv on first use (make train with what a run needs, make test with the test
# extra too); later calls reinstall only when pyproject.toml or constraints.txt (the exact
# versions make test passed with) changed.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
RUN_STAMP := $(VENV)/.installed
STAMP := $(VENV)/.installed-test
PY := $(VENV)/bin/python

.PHONY: install install-test test test-programs test-sweeps test-slow test-cluster test-check test-all profile \
	train train-passkey bench bench-train lock clean

# Two installs into one .venv: what a run needs (`pip install -e .`: no test tools, no libtpu),
# and that with the test extra. Each reinstalls only when pyproject.toml or constraints.txt
# changed; pip's notes about this machine's unused local indexes are filtered, its failures not.
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt
install: $(RUN_STAMP)
install-test: $(STAMP)

$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e . 2>&1 | { grep -v '^WARNING: Location' || true; }
	$(PY) -c 'import jax, parallel, model, data, training'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(PIP) -e '.[test]' 2>&1 | { grep -v '^WARNING: Location' || true; }
	touch $(STAMP)

# The tiers of the tests (tests/tiers.py says what each covers; README.md, how long each takes).
# make test is the fast one: every package's unit and exactness tests and a few whole runs.
test: install-test
	$(PY) tests/tiers.py run fast

# Whole programs as users run them: train.py, sample.py and the scripts as subprocesses
test-programs: install-test
	$(PY) tests/tiers.py run programs

# The exactness sweeps' cases beyond the representative ones make test keeps
test-sweeps: install-test
	$(PY) tests/tiers.py run sweeps

# TPU compiles of whole configs at their real sizes (libtpu, no TPU needed)
test-slow: install-test
	$(PY) tests/tiers.py run heavy

# The launcher against a real one-node SLURM cluster the tests start (as root; the packages are
# installed with apt-get where missing): preemption, requeue, resume
test-cluster: install-test
	$(PY) tests/support/slurm_cluster.py
	$(PY) tests/tiers.py run cluster

# Fails on a test that no tier runs (a marker no tier knows, a tier's arguments narrowed)
test-check: install-test
	$(PY) tests/tiers.py check

# Everything .ci/run runs: the check, then every tier, make test first
test-all: install-test
	$(MAKE) test-check
	for target in $$($(PY) tests/tiers.py targets); do $(MAKE) $$target || exit 1; done

train: install
	$(PY) train.py --config configs/default.py --workdir runs/default

# A model that retrieves from its whole context: passkey retrieval learned at 256 tokens, the
# context extended to 2,048 and 8,192 (configs/passkey.py; about 35 minutes on 2 cores). Then
# scripts/eval_long.py probes it (docs/reference/evaluation.md).
train-passkey: install
	$(PY) train.py --config configs/passkey.py --workdir runs/passkey

# Where a step's time goes: the default run's steps 5 and 6 traced by jax.profiler, in a fresh
# run directory each time (runs/profile/TIME/profile/: tensorboard --logdir there), and one line
# that splits their time; the token cache is shared between them
profile: install
	$(PY) train.py --config configs/default.py --workdir runs/profile/$$(date +%Y%m%d-%H%M%S) \
	    --config.data.cache_dir=runs/profile/cache --config.profile.start_step=5 \
	    --config.profile.num_steps=2 --config.stop_at_step=8

bench: install
	$(PY) scripts/bench/attention.py --json runs/bench_attention.json

# train.py end to end per layout, one pinned process per device (about 30 minutes on 2 cores)
bench-train: install
	$(PY) scripts/bench/train.py --json runs/bench_train.json

# After upgrading a dependency and passing make test: record the versions it passed with.
lock: install-test
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^#'; } > constraints.tmp
	mv constraints.tmp constraints.txt

clean:
	rm -rf $(VENV) runs .pytest_cache
