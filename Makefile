# `make run`: the main job. `make test`: the test suite (CPU is enough). `make notebooks`: run the
# notebooks in place, keeping their figures. Each creates .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test notebooks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,plots]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) experiments/speculative_sweep.py --config=configs/sweep_default.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m 'not slow' --durations=15

notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
