# fieldhmc: every target sets up .venv first (only Python 3.11, make and pip needed).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-slow bench lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

RUN_DIR ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)

run: $(STAMP)
	$(PY) -m fieldhmc run configs/quickstart.yaml --out $(RUN_DIR)

# Two pytest workers (the XLA compiles and Python tracing that dominate the suite are
# single-threaded), one test file each at a time so module fixtures compile once, the
# longest files first (tests/conftest.py).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

bench: $(STAMP)
	$(PY) benchmarks/ops.py
	$(PY) benchmarks/logprob_precision.py
	$(PY) benchmarks/nuts_resonance.py
	$(PY) benchmarks/sampling.py
	$(PY) benchmarks/nuts_field.py
	$(PY) benchmarks/forward_model.py
	$(PY) benchmarks/sbc_scaling.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/microcanonical.py
	$(PY) benchmarks/driver_overhead.py
	$(PY) benchmarks/normal_draws.py --kernels
	$(PY) benchmarks/dense_params.py
	$(PY) benchmarks/sharded.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
