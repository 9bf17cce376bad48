# Each check is defined once here; .ci/run calls these targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint test test-fast demo bench chaos chaos-long clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[api,dev]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check libs apps tests
	$(BIN)/ruff format --check libs apps tests
	$(BIN)/mypy

test: install
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: install
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow"

demo: install
	$(BIN)/python -m dtq.dev

bench: install
	$(BIN)/python -m dtq.benchmark $(BENCH_ARGS)

chaos: install
	$(BIN)/python -m tests.chaos.run --minutes 1
	$(BIN)/python -m tests.chaos.run --minutes 1 --cluster --out build/chaos-cluster

chaos-long: install
	$(BIN)/python -m tests.chaos.run --minutes 15

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache
