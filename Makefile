# Everything a fresh machine (Python 3.11+, Java 17+) needs, installed into .venv by `make venv`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.8
KINESALITE_VERSION := 3.3.3
NODE_DIR := .cache/node
KINESALITE_10MIB := $(NODE_DIR)/.kinesalite-$(KINESALITE_VERSION)-10mib-records
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
# The Spark job also runs on Spark 3.5 (EMR 7, Glue 5, Databricks LTS): tests/spark run a second
# time in a small environment with pyspark 3.5 and only what those tests import (no Airflow),
# locked in requirements-spark35.lock. Under .cache/ (ignored by git, removed by `make clean`).
# pyspark 3.5 needs numpy < 2, and recent pyarrow needs numpy 2: pyarrow and pandas at the oldest
# versions pyproject.toml allows (15, 2.1), which is also about what the managed 3.5 platforms ship.
VENV35 := .cache/venv-spark35
PY35 := $(VENV35)/bin/python
# The oldest Airflow and provider lines pyproject.toml accepts (make test-oldest): Airflow 3.2.0
# (airflow.sdk's configuration, exceptions and skipmixin exports), amazon 9.4.0 (9.0-9.2 do not
# import on Airflow 3; 9.3 was never released), apache-spark 5.0.0; everything else resolved fresh.
VENVOLD := .cache/venv-oldest
PYOLD := $(VENVOLD)/bin/python
OLDEST_PINS := 'apache-airflow==3.2.0' 'apache-airflow-providers-amazon==9.4.0' 'apache-airflow-providers-apache-spark==5.0.0'
#: what tests/unit imports beyond the base install and the spark extra (the Connect client's own
#: dependencies), pyspark at the dev lock's version (one download for both environments)
OLDEST_TEST_REQUIREMENTS = 'pyspark[connect]==$(shell sed -n 's/^pyspark==\([^ ]*\).*/\1/p' requirements.lock)' 'pytest>=8' 'pytest-timeout>=2.3' 'pytest-xdist>=3.5' 'moto[server]>=5.0'
SPARK35_REQUIREMENTS := 'pyspark==3.5.9' 'numpy<2' 'pandas>=2.1,<2.2' 'pyarrow>=15,<16' 'boto3>=1.34' 'aws-kinesis-agg>=1.2' \
  'protobuf>=4.21' 'fastavro>=1.9' 'tenacity>=8' 'pytest>=8' 'pytest-timeout>=2.3' 'moto[server]>=5.0'

.PHONY: typecheck test-durations bench venv venv-spark35 venv-oldest test-oldest lock demo demo-resharding demo-backfill demo-split demo-tables demo-typed test test-fast test-spark35 test-reliability kinesalite java postgres docs clean

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
	# The same for pyspark's own zips, which spark-submit puts first on its Python processes' path
	# (zipimport never writes bytecode: importing pyspark.sql and pyspark.worker took 0.72 s of CPU
	# per process, 0.39 s with it; tests/pyspark_zip_bytecode.py).
	$(PY) tests/pyspark_zip_bytecode.py
	touch $@

venv: $(VENV)/.installed java

# Regenerate the lock files after changing dependencies in pyproject.toml (or SPARK35_REQUIREMENTS).
# The dev environment has every extra. pyspark and pyspark-client (pulled in by the apache-spark
# provider) ship the same files: the lock must hold them at one version (checked here).
lock:
	test -x $(VENV)/bin/uv || ($(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet "uv==$(UV_VERSION)")
	$(VENV)/bin/uv pip compile pyproject.toml --extra spark --extra connect --extra test --extra openlineage --extra docs \
	  --python-version 3.11 --no-header --generate-hashes --quiet -o requirements.lock
	@pyspark=$$(sed -n 's/^pyspark==\([^ ]*\).*/\1/p' requirements.lock); \
	  client=$$(sed -n 's/^pyspark-client==\([^ ]*\).*/\1/p' requirements.lock); \
	  test "$$pyspark" = "$$client" || { echo "requirements.lock: pyspark $$pyspark but pyspark-client $$client (pin them together in pyproject.toml)"; exit 1; }
	printf '%s\n' $(SPARK35_REQUIREMENTS) | $(VENV)/bin/uv pip compile - --python-version 3.11 --no-header --generate-hashes --quiet -o requirements-spark35.lock
	mkdir -p .cache && printf '%s\n' $(OLDEST_PINS) $(OLDEST_TEST_REQUIREMENTS) > .cache/oldest-requirements.in
	$(VENV)/bin/uv pip compile pyproject.toml .cache/oldest-requirements.in --extra spark --extra avro --extra iceberg --extra delta \
	  --python-version 3.11 --no-header --generate-hashes --quiet -o requirements-oldest.lock

$(VENVOLD)/.installed: requirements-oldest.lock pyproject.toml | $(VENV)/.installed
	test -x $(PYOLD) || $(PYTHON) -m venv --without-pip $(VENVOLD)
	$(VENV)/bin/uv pip install --quiet --python $(PYOLD) -r requirements-oldest.lock
	$(VENV)/bin/uv pip install --quiet --python $(PYOLD) --no-deps -e .
	touch $@

$(VENV35)/.installed: requirements-spark35.lock pyproject.toml | $(VENV)/.installed
	test -x $(PY35) || $(PYTHON) -m venv --without-pip $(VENV35)
	$(VENV)/bin/uv pip install --quiet --python $(PY35) -r requirements-spark35.lock
	# the job's executors import airflow_kinesis_spark (core, transforms) from this checkout
	$(VENV)/bin/uv pip install --quiet --python $(PY35) --no-deps -e .
	$(PY35) -m compileall -q -j 0 $(VENV35)/lib > /dev/null || true
	$(PY35) tests/pyspark_zip_bytecode.py
	touch $@

venv-spark35: $(VENV35)/.installed java
venv-oldest: $(VENVOLD)/.installed

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
kinesalite: $(KINESALITE_10MIB)
$(NODE_DIR)/node_modules/.bin/kinesalite:
	@command -v npm >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm)
	mkdir -p $(NODE_DIR)
	cd $(NODE_DIR) && npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error kinesalite@$(KINESALITE_VERSION)

# Records up to 10 MiB (Kinesis since October 2025: MaxRecordSizeInKiB up to 10,240; PutRecords
# requests up to 10 MiB). kinesalite has no option for either limit: it refuses a record's Data over
# 1 MiB (validations/putRecord.js and putRecords.js, lengthLessThanOrEqual 1048576) and a request
# body over 7 MiB (index.js, MAX_REQUEST_BYTES; a 10 MiB record is about 13.4 MiB of JSON's
# base64). This raises both to the service's maxima in the pinned version's files, fails on any
# other version or content, and is idempotent. A stream's own MaxRecordSizeInKiB (default 1,024,
# UpdateMaxRecordSize) is the limits proxy's to enforce (benchmarks/kinesis_limits.py).
$(KINESALITE_10MIB): $(NODE_DIR)/node_modules/.bin/kinesalite
	cd $(NODE_DIR)/node_modules/kinesalite && grep -q '"version": "$(KINESALITE_VERSION)"' package.json \
	  && sed -i 's/lengthLessThanOrEqual: 1048576,$$/lengthLessThanOrEqual: 10485760,/' validations/putRecord.js validations/putRecords.js \
	  && sed -i 's/^var MAX_REQUEST_BYTES = 7 \* 1024 \* 1024$$/var MAX_REQUEST_BYTES = 16 * 1024 * 1024/' index.js \
	  && grep -q 'lengthLessThanOrEqual: 10485760,' validations/putRecord.js && grep -q 'lengthLessThanOrEqual: 10485760,' validations/putRecords.js \
	  && ! grep -q 1048576, validations/putRecord.js validations/putRecords.js \
	  && grep -qx 'var MAX_REQUEST_BYTES = 16 \* 1024 \* 1024' index.js
	touch $@

demo: venv
	$(PY) -m demo.run_demo

# Split and merge shards while producing and ingesting; checks exactly-once and parent-before-child order.
# Backfill by arrival time: consecutive windows, a re-run, and the union checked against an
# incremental ingestion (real time: several minutes).
demo-backfill: venv
	$(PY) -m demo.run_backfill

demo-resharding: venv kinesalite
	KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m demo.run_resharding

# Split tasks (plan, the apache-spark provider's SparkSubmitOperator as the job task, commit) for
# several batches, checked exactly-once against the producer.
demo-split: venv
	$(PY) -m demo.run_split

# The example DAG into an Iceberg table (SQL catalog on SQLite) and a Delta table, two runs killed
# between the table commit and the checkpoint commit, a window re-run; read back and checked.
demo-tables: venv
	$(PY) -m demo.run_tables

# Typed records (Glue Schema Registry JSON/Avro, protobuf) into Iceberg and Delta tables: dead letters, an added column, a kill, a window re-run.
demo-typed: venv
	$(PY) -m demo.run_typed

# The suite runs on one more worker than the machine has cores (pytest-xdist, work stealing): many
# tests wait (on emulators, leases that expire, windows of real time, killed processes), and with
# one worker per core a clean `make test` kept 2 cores only about 60 % busy (42 CPU-minutes in 35).
# Two more gained nothing: on an idle 2-core machine the suite took 33:25 on 4 workers and 33:59
# on 3 (same tests); the cores were idle under 5 % of nearly every 10 s sample (up to 30 % in
# the last minutes).
# Each worker starts its own emulators on free ports. TEST_WORKERS=1 runs it in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
XDIST := -n $(TEST_WORKERS) --dist worksteal

# The tests start a few hundred short-lived Spark JVMs (spark-submit, PySpark's gateway, Connect
# servers), each on a few hundred records. For them, and only in the tests (spark-submit adds
# SPARK_SUBMIT_OPTS to the JVM it starts; `make demo` and `make bench` run Spark as users do), the
# JVM compiles with C1 only and the serial collector (no C2 and no parallel GC threads competing
# for 2 cores), and maps Spark's classes from a class-data-sharing archive dumped once per
# environment by tests/spark_class_archive.py: a spark-submit takes about half the CPU time.
# A missing or stale archive only turns sharing off (-Xshare:auto). Unified JVM logging is quiet
# but for errors, on stderr (CDS warnings would otherwise go to stdout).
TEST_JVM_OPTS := -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:disable -Xlog:all=error:stderr
SPARK_CDS := $(abspath .cache/spark-test-classes.jsa)
$(SPARK_CDS): $(VENV)/.installed tests/spark_class_archive.py
	rm -f $@
	SPARK_SUBMIT_OPTS="$(TEST_JVM_OPTS) -XX:ArchiveClassesAtExit=$@" $(VENV)/bin/spark-submit --master 'local[2]' \
	  --conf spark.ui.enabled=false tests/spark_class_archive.py > .cache/spark-class-archive.log 2>&1 \
	  || { tail -20 .cache/spark-class-archive.log; rm -f $@; echo "warning: no class-data-sharing archive; the Spark tests run without it"; }
TEST_ENV := SPARK_SUBMIT_OPTS="$${SPARK_SUBMIT_OPTS-$(TEST_JVM_OPTS) -XX:SharedArchiveFile=$(SPARK_CDS)}"

# The reliability suite's seeded random kills: 6 in `make test` (a cold spark-submit per kill;
# the suite's time budget), all 50 in `make test-reliability`. With enhanced fan-out
# (consumer_type="efo"), `make test` runs one crash point (mid_read), the fault rates and the
# reader's SubscribeToShard faults; `make test-reliability` every crash point and 20 random kills.
test: venv venv-spark35 venv-oldest kinesalite postgres $(SPARK_CDS)
	$(MAKE) --no-print-directory typecheck
	$(TEST_ENV) KILL_POINTS=$${KILL_POINTS:-6} EFO_CRASH_POINTS=$${EFO_CRASH_POINTS:-mid_read} EFO_KILL_POINTS=$${EFO_KILL_POINTS:-0} KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m pytest -q --durations=25 $(XDIST)
	$(MAKE) --no-print-directory test-spark35
	$(MAKE) --no-print-directory test-oldest

# make test, recording every test's seconds in tests/durations.json (how make test deals the long
# tests out to its workers: tests/conftest.py); commit the file after a run on a machine like CI's.
test-durations:
	RECORD_TEST_DURATIONS=$(abspath tests/durations.json) $(MAKE) --no-print-directory test

# The PySpark job's tests (tests/spark) on Spark 3.5; `make test` runs them on Spark 4 and then here.
test-spark35: venv-spark35
	SPARK_SUBMIT_OPTS="$${SPARK_SUBMIT_OPTS-$(TEST_JVM_OPTS)}" PYSPARK_PYTHON=$(abspath $(PY35)) PYSPARK_DRIVER_PYTHON=$(abspath $(PY35)) $(PY35) -m pytest -q \
	  -W "ignore:The distutils package is deprecated:DeprecationWarning" tests/spark

# The unit tests that meet Airflow and its providers (hooks, operators, sensors, triggers, settings,
# error policy, CLI) on the oldest lines pyproject.toml accepts (.cache/venv-oldest,
# requirements-oldest.lock); make test runs the same tests on the newest lines (requirements.lock).
OLDEST_TESTS := tests/unit
test-oldest: $(VENVOLD)/.installed
	AIRFLOW_HOME=$(abspath .cache/airflow-home-oldest) $(PYOLD) -m pytest -q -p no:cacheprovider -n 2 $(OLDEST_TESTS)

# The reliability suite alone (crash points, 50 seeded random kills, faults, concurrency, bad input).
test-reliability: venv kinesalite $(SPARK_CDS)
	$(TEST_ENV) KINESALITE_BIN=$(abspath $(NODE_DIR))/node_modules/.bin/kinesalite $(PY) -m pytest -q -m reliability

# mypy on the Airflow-free core, the sinks and the Spark job ([tool.mypy] in pyproject.toml); make test runs it first.
typecheck: venv
	$(PY) -m mypy

test-fast: venv
	$(PY) -m pytest -q -m "not slow" $(XDIST)

# The Sphinx documentation (docs/), API reference included; any warning fails the build.
docs: venv
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) .cache build dist demo_output

# Throughput, fixed cost per batch and memory against a proxy enforcing Kinesis's per-shard read
# limits, side by side with a naive consumer; writes docs/benchmarks.md, ends with one JSON line.
# kinesalite: the 10 MiB records section runs on it (moto refuses records over 1 MiB).
bench: venv kinesalite
	$(PY) -m benchmarks.run
