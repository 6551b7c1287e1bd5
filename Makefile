# ringstripe: `make train` trains the embedded default, `make test` runs the tests.
# Both create .venv on first use; later calls reinstall only when pyproject.toml changed.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python

.PHONY: install test train bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -n 2 --dist loadfile -q tests

train: install
	$(PY) train.py --config configs/default.py --workdir runs/default

bench: install
	$(PY) scripts/bench_attention.py --json runs/bench_attention.json

clean:
	rm -rf $(VENV) runs .pytest_cache
