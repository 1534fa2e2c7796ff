# Everything a fresh machine (Python 3.11+, Java 17+) needs, installed into .venv by `make venv`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.8
KINESALITE_VERSION := 3.3.3
NODE_DIR := .cache/node
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: bench venv lock demo demo-resharding demo-backfill test test-fast test-reliability kinesalite java postgres docs clean

$(VENV)/.installed: pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --quiet --python $(PY) -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	# Bytecode compiled once, here: with PYTHONDONTWRITEBYTECODE set (as on CI) every Python
	# process (Airflow tasks, Spark's Python workers, the tests) would otherwise compile every
	# module it imports from source, each time (pandas alone: ~3 s of CPU per Spark Python worker).
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $@

venv: $(VENV)/.installed java

# Regenerate the lock file after changing dependencies in pyproject.toml.
lock:
	test -x $(VENV)/bin/uv || ($(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet "uv==$(UV_VERSION)")
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --extra openlineage --extra docs --python-version 3.11 --no-header --generate-hashes -o requirements.lock

# PySpark needs Java 17+; install it from the distribution's packages when missing.
java:
	@if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; then \
	  echo "Java 17+ not found: installing openjdk-17-jre-headless"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	fi

# PostgreSQL server binaries for the deployment test (tests/deployment: Airflow's scheduler with the
# LocalExecutor needs a real database); install them from the distribution's packages when missing.
postgres:
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "PostgreSQL not found: installing postgresql"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	fi

# kinesalite (a second, more faithful Kinesis emulator) for the integration tests.
kinesalite: $(NODE_DIR)/node_modules/.bin/kinesalite
$(NODE_DIR)/node_modules/.bin/kinesalite:
	@command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm)
	mkdir -p $(NODE_DIR)
	cd $(NODE_DIR) && npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error kinesalite@$(KINESALITE_VERSION)

demo: venv
	$(PY) -m demo.run_demo

# Split and merge shards while producing and ingesting; checks exactly-once and parent-before-child order.
# Backfill by arrival time: consecutive windows, a re-run, and the union checked against an
# incremental ingestion (real time: several minutes).
demo-backfill: venv
	$(PY) -m demo.run_backfill

demo-resharding: venv kinesalite
	KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m demo.run_resharding

test: venv kinesalite postgres
	KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m pytest -q

# The reliability suite alone (crash points, 50 seeded random kills, faults, concurrency, bad input).
test-reliability: venv kinesalite
	KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m pytest -q -m reliability

test-fast: venv
	$(PY) -m pytest -q -m "not slow"

# The Sphinx documentation (docs/), API reference included; any warning fails the build.
docs: venv
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) .cache build dist demo_output

# Throughput, fixed cost per batch and memory against a proxy enforcing Kinesis's per-shard read
# limits, side by side with a naive consumer; writes docs/benchmarks.md, ends with one JSON line.
bench: venv
	$(PY) -m benchmarks.run
