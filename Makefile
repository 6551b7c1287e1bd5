# ringstripe: `make train` trains the embedded default, `make test` runs the tests.
# Both create .venv on first use; later calls reinstall only when pyproject.toml or
# constraints.txt (the exact versions make test passed with) changed.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python

.PHONY: install test test-cluster test-slow profile train train-passkey bench bench-train lock clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# pip's notes about this machine's unused local indexes are filtered; its failures are not.
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]' 2>&1 | { grep -v '^WARNING: Location' || true; }
	$(PY) -c 'import jax, parallel, model, data, training'
	touch $(STAMP)

test: install
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not heavy and not cluster" tests

# The launcher against a real one-node SLURM cluster the tests start (as root; the packages are
# installed with apt-get where missing): preemption, requeue, resume (about 3 minutes)
test-cluster: install
	$(PY) tests/slurm_cluster.py
	$(PY) -m pytest -q -m cluster tests

# The whole-config TPU compiles that do not fit make test's 15 minutes (about 2 minutes)
test-slow: install
	$(PY) -m pytest -q -m heavy tests

train: install
	$(PY) train.py --config configs/default.py --workdir runs/default

# A model that retrieves from its whole context: passkey retrieval learned at 256 tokens, the
# context extended to 2,048 and 8,192 (configs/passkey.py; about 35 minutes on 2 cores). Then
# scripts/eval_long.py probes it (README: "Does the model use its context?").
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
	$(PY) scripts/bench_attention.py --json runs/bench_attention.json

# train.py end to end per layout, one pinned process per device (about 30 minutes on 2 cores)
bench-train: install
	$(PY) scripts/bench_train.py --json runs/bench_train.json

# After upgrading a dependency and passing make test: record the versions it passed with.
lock: install
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^#'; } > constraints.tmp
	mv constraints.tmp constraints.txt

clean:
	rm -rf $(VENV) runs .pytest_cache
