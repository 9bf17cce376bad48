# Each check is defined once here; .ci/run calls these targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs dtq and its API only, not the developer toolchain (mypy, playwright, ...).
DEMO_VENV ?= build/demo-venv
DEMO_STAMP := $(DEMO_VENV)/.installed
# The documentation site's tools (the `docs` extra) go into the developer venv.
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: install lint docs test test-fast test-lanes-off test-oldest demo bench chaos chaos-ci chaos-long model clean docker-test docker-clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[api,dev,otel]"
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install -q -e ".[api,testing]"
	touch $(DEMO_STAMP)

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e ".[api,dev,otel,docs]"
	touch $(DOCS_STAMP)

install: $(STAMP)
	@echo "dtq is installed in $(VENV): run 'source $(VENV)/bin/activate' to put dtq, dtq-worker and dtq-api on your PATH (or call $(BIN)/dtq ...)"

lint: install $(DOCS_STAMP)  # (mypy checks docs/hooks against mkdocs)
	$(BIN)/ruff check libs apps tests docs/examples docs/hooks bench/dtq_bench tools
	$(BIN)/ruff format --check libs apps tests docs/examples docs/hooks bench/dtq_bench tools
	$(BIN)/mypy
	$(BIN)/mypy docs/examples
	$(BIN)/mypy docs/hooks

# The documentation site (mkdocs.yml) into build/site; --strict: a broken link, a missing page
# or reference, a docstring MkDocs cannot read fails the build. Offline: no fonts, no CDN.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

test: install
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: install
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow"

# The script and lane tests on redis-py's usual path (no fast lane: dtq/store/transport.py).
LANE_TESTS := tests/store/test_transport.py tests/store/test_lane.py tests/store/test_cluster_lane.py \
	tests/lua/test_scripts.py tests/lua/test_script_replay.py tests/sdk/test_sdk.py \
	tests/faults/test_sdk_blips.py
test-lanes-off: install
	DTQ_FAST_LANE=0 $(BIN)/pytest -q -p no:cacheprovider $(LANE_TESTS)

# The same tests, both ways, with the oldest redis-py pyproject.toml accepts (its own venv).
OLDEST_REDIS ?= 8.0.0
OLDEST_VENV ?= build/oldest-venv
OLDEST_STAMP := $(OLDEST_VENV)/.installed-$(OLDEST_REDIS)
$(OLDEST_STAMP): pyproject.toml
	$(PY) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install -q -e . "redis[hiredis]==$(OLDEST_REDIS)" pytest pytest-asyncio pytest-timeout
	touch $(OLDEST_STAMP)
test-oldest: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -c "import redis; assert redis.__version__ == '$(OLDEST_REDIS)', redis.__version__"
	$(OLDEST_VENV)/bin/pytest -q -p no:cacheprovider $(LANE_TESTS)
	DTQ_FAST_LANE=0 $(OLDEST_VENV)/bin/pytest -q -p no:cacheprovider $(LANE_TESTS)

# Runs until Ctrl-C (dtq dev --keep). Uses the developer venv when `make install` made one.
# API_PORT=N fixes the dashboard's port (a free one otherwise). The recipe's shell traps SIGINT
# so that Ctrl-C ends dtq dev (exit 0) and not the shell with it ("make: *** Interrupt").
DEMO_ARGS = $(if $(API_PORT),--api-port $(API_PORT))
demo:
	@trap 'true' INT; \
	if [ -f $(STAMP) ]; then $(BIN)/python -m dtq.cli.dev --keep $(DEMO_ARGS); \
	else $(MAKE) --no-print-directory $(DEMO_STAMP) && $(DEMO_VENV)/bin/python -m dtq.cli.dev --keep $(DEMO_ARGS); fi

# The suite runs from the checkout (bench/dtq_bench); it is not in the wheel.
bench: install
	PYTHONPATH=bench $(BIN)/python -m dtq_bench $(BENCH_ARGS)

# Both lines with fair groups (tests/chaos/groups.py): 80% of the tasks in 16 groups (3 heavy),
# each group capped at 4 running tasks fleet-wide, random groups paused and resumed meanwhile.
CHAOS_GROUPS ?= --group-share 0.8 --group-cap 4 --group-holds
chaos: install
	$(BIN)/python -m tests.chaos.run --minutes 1 $(CHAOS_GROUPS)
	$(BIN)/python -m tests.chaos.run --minutes 1 --cluster --chord-share 0.2 $(CHAOS_GROUPS) \
		--out build/chaos-cluster

# CI's soak (about 2.5 min): Redis restarts only, every 2-4 s, half the work as chords. Chords
# enqueued while Redis loads after a restart are what it catches (docs/faults.md, "The chaos
# soak"); a 1-minute mixed run seldom restarts Redis while one is sent. Fair groups as in
# `make chaos`, with a cap of 6 (the run stays as long as without groups).
chaos-ci: install
	$(BIN)/python -m tests.chaos.run --minutes 2 --seed 23 --chord-share 0.5 --faults redis \
		--group-share 0.8 --group-cap 6 --group-holds --out build/chaos-ci

chaos-long: install
	$(BIN)/python -m tests.chaos.run --minutes 15

# The model test (tests/model/) for as long as asked: MODEL_EXAMPLES randomized sequences of up
# to MODEL_STEPS steps (MODEL_SEED: a fixed seed). `make test` runs its bounded CI profile.
MODEL_EXAMPLES ?= 2000
MODEL_STEPS ?= 60
model: install
	DTQ_MODEL_EXAMPLES=$(MODEL_EXAMPLES) DTQ_MODEL_STEPS=$(MODEL_STEPS) DTQ_MODEL_SEED=$(MODEL_SEED) \
		$(BIN)/pytest -q -p no:cacheprovider -o timeout=0 tests/model/test_state_machine.py

# Builds the image and the compose stack with a private dockerd and runs them (root, Debian;
# installs docker.io, docker-compose, debootstrap, prometheus if missing). tests/docker_stack.py.
docker-test: install
	$(BIN)/pip install -q -e ".[api,dev,deploy]"
	$(BIN)/python -m tests.docker_stack

# Drops the cached debootstrap base and the docker-test image store.
docker-clean:
	rm -rf build/docker /tmp/dtq-docker-cache

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache
