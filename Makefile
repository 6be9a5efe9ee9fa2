# `make run`: the main job. `make test`: the test suite (CPU is enough). `make notebooks`: run the
# notebooks in place, keeping their figures. Each creates .venv on first use. `make test-lower`: the
# same suite in .venv-lower, on the lower bounds of the dependencies (constraints/lower.txt).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOWER_VENV := .venv-lower
LOWER_PY := $(LOWER_VENV)/bin/python
LOWER_STAMP := $(LOWER_VENV)/.installed
PYTEST_CPU := -m pytest -q -n 2 --dist worksteal -m 'not slow' --durations=15

.PHONY: run test test-lower notebooks clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,plots]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) experiments/speculative_sweep.py --config=configs/sweep_default.py

test: $(STAMP)
	$(PY) $(PYTEST_CPU)

# Built afresh whenever the bounds change, so nothing a newer install left behind stays in it. On 2
# CPU cores: about 35 s to install, 5 minutes of tests.
$(LOWER_STAMP): pyproject.toml constraints/lower.txt
	rm -rf $(LOWER_VENV)
	$(PYTHON) -m venv $(LOWER_VENV)
	$(LOWER_PY) -m pip install -q --upgrade pip
	$(LOWER_PY) -m pip install -q -e '.[test,plots]' -c constraints/lower.txt
	touch $(LOWER_STAMP)

test-lower: $(LOWER_STAMP)
	$(LOWER_PY) $(PYTEST_CPU)

notebooks: $(STAMP)
	$(PY) notebooks/execute.py

clean:
	rm -rf $(VENV) $(LOWER_VENV) .pytest_cache .hypothesis
