"""KinesisToSparkOperator against a Spark standalone master and worker (executors in their own JVMs).

The executors' Python is this virtualenv, where the package is installed in editable mode. To
show that ``airflow_kinesis_spark.core`` reaches the executors only because the operator ships it
(``--py-files``), the executors start Python through a wrapper whose ``sitecustomize`` lets
``airflow_kinesis_spark`` be imported from a zip on ``sys.path`` only (never from the editable
install) and logs, to the executor's stderr, where each of its modules was imported from.
boto3, aws_kinesis_agg, protobuf and pyarrow still come from the virtualenv: they are ordinary
dependencies that a cluster's Python provides.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import committed_rows, put_aggregated, put_plain, verify
from tests.conftest import create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

#: Prefix of the lines the executors' sitecustomize writes to stderr (the executor log).
MARK = "SHIPPED-CORE-CHECK"
CORE_ZIP = "airflow_kinesis_spark_core.zip"

SITECUSTOMIZE = f'''
"""Executor-side Python of the standalone-cluster test: airflow_kinesis_spark only from a shipped zip."""
import importlib.machinery
import os
import sys

PACKAGE = "airflow_kinesis_spark"


class _ShippedOnly:
    """First on sys.meta_path: finds {{PACKAGE}} in the .zip entries of sys.path only (not in the
    editable install's checkout, nor site-packages), and logs where each of its modules comes from."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        if path is None:  # the top-level package; submodules search its __path__ (inside the zip)
            path = [entry for entry in sys.path if entry.endswith(".zip")]
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        sys.stderr.write("{MARK} pid=%d %s from %s\\n" % (os.getpid(), name, spec.origin if spec else None))
        sys.stderr.flush()
        if spec is None:  # stop here: the later finders would find the installed package
            raise ModuleNotFoundError(f"No module named {{name!r}} in a shipped zip", name=name)
        return spec


sys.meta_path.insert(0, _ShippedOnly)
'''


def executor_python(directory: Path) -> Path:
    """A script to use as ``spark.pyspark.python``: this interpreter with :data:`SITECUSTOMIZE`."""
    site = directory / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    wrapper = directory / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def order(sequence_number: str, sub_sequence_number: int | None) -> tuple[int, int]:
    """Sort key of an extended sequence number (a plain record's comes before sub-sequence 0)."""
    return int(sequence_number), -1 if sub_sequence_number is None else sub_sequence_number


def test_batches_run_on_a_standalone_cluster_with_the_core_shipped(
    spark_standalone, monkeypatch, aws_conn, kinesis, dynamodb, tmp_path, unique_name
):
    cluster = spark_standalone
    python = executor_python(tmp_path / "executor-python")
    # Without the shipped zip, the executors' Python cannot import the core at all.
    hidden = subprocess.run([str(python), "-c", "import airflow_kinesis_spark.core.reader"], capture_output=True, text=True)
    assert hidden.returncode != 0 and "ModuleNotFoundError" in hidden.stderr, hidden.stderr

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", cluster.connection(deploy_mode="client"))
    spark_conf = {
        "spark.pyspark.python": str(python),  # the executors' Python
        "spark.pyspark.driver.python": sys.executable,  # the driver's (spark-submit, client mode)
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.cores.max": str(cluster.cores),
        "spark.ui.enabled": "false",
    }
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"p{i}", f"plain {i}".encode()) for i in range(150)])
    produced += put_aggregated(kinesis, unique_name, [(f"a{i}", f"aggregated {i}".encode()) for i in range(100)])
    output = tmp_path / "out"
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tests")

    def run() -> dict:
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="tests", checkpoint_table=f"{unique_name}_ckpt",
            output_path=str(output), read_options=ReadOptions(min_call_interval=0.0),
            spark_settings=SparkSettings(conf=spark_conf),
        ).execute({})  # fmt: skip

    first = run()
    assert first["status"] == "committed" and first["batch_id"] == 1 and first["records"] == 250
    after_first = store.committed_checkpoints()
    more = put_plain(kinesis, unique_name, [(f"m{i}", f"more {i}".encode()) for i in range(60)])
    second = run()
    assert second["status"] == "committed" and second["batch_id"] == 2 and second["records"] == 60

    # Exactly once: every produced user record in the committed output once, nothing else.
    verdict = verify(produced + more, committed_rows(output, store.head().committed_batch_id))
    assert verdict.ok, verdict
    # The checkpoints advanced to the last record of each shard, batch by batch.
    after_second = store.committed_checkpoints()
    for records, checkpoints in ((produced, after_first), (produced + more, after_second)):
        last: dict[str, tuple[int, int]] = {}
        for p in records:
            last[p.shard_id] = max(last.get(p.shard_id, (0, -1)), order(p.sequence_number, p.sub_sequence_number))
        assert {s: order(c.position.sequence_number, c.position.sub_sequence_number) for s, c in checkpoints.items()} == last

    # Both jobs ran as applications of the standalone master ...
    names = {f"kinesis-batch-{unique_name}-tests-{n}" for n in (1, 2)}
    deadline = time.monotonic() + 30
    while True:
        apps = {a["name"]: a for a in cluster.status()["completedapps"] if a["name"] in names}
        if len(apps) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(apps) == names, cluster.status()
    for name, app in apps.items():
        # ... whose executors were JVMs of the worker: their logs show the tasks ran there ...
        logs = cluster.executor_logs(app["id"])
        assert logs, f"no executor log of {name} under {cluster.work_dir}"
        text = "\n".join(log.read_text(errors="replace") for log in logs)
        assert "Spark Executor Command" in text and "CoarseGrainedExecutorBackend" in text, text[-3000:]
        # ... which logged no INFO of Spark's (the job's logging settings reach the executor JVMs
        # from their start, though the worker fetches --files only with the first task), in
        # stderr or stdout ...
        spark_info = [line for log in logs for out in (log, log.with_name("stdout")) if out.is_file()
                      for line in out.read_text(errors="replace").splitlines() if re.search(r"\bINFO\b", line)]  # fmt: skip
        assert not spark_info, spark_info[:20]
        # ... and imported the core from the zip the operator shipped, which Spark fetched for them.
        assert any((log.parent / CORE_ZIP).is_file() for log in logs)
        # (the executors' Python workers, which ran the tasks, wrote these lines)
        imports = re.findall(rf"{MARK} pid=\d+ (\S+) from (\S+)", text)
        modules = {module for module, _ in imports}
        assert {"airflow_kinesis_spark", "airflow_kinesis_spark.core.reader"} <= modules, imports
        outside = [(module, origin) for module, origin in imports if f"{CORE_ZIP}/airflow_kinesis_spark/" not in origin]
        assert not outside, outside
