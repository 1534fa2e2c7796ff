"""A real Airflow deployment on the local stack, shared by the tests of this package.

PostgreSQL (``make postgres`` installs the server when missing), then Airflow's API server,
scheduler (LocalExecutor), DAG processor and triggerer as separate processes, with the example
DAGs and ``aws_default`` pointing at moto.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.deployment import AirflowDeployment, airflow_deployment, postgres_bin_dir, postgres_server
from tests.conftest import ROOT, aws_connection
from tests.deployment.job_gate import GATE_ENV

#: The example DAGs the deployment runs (kinesis_backfill.py is left out: nothing here unpauses it).
DAG_FILES = ("kinesis_microbatch.py", "kinesis_sensors.py", "kinesis_event_driven.py", "kinesis_asset_downstream.py")
#: This package's own DAG files the deployment runs too (the deferred batch and the slot probe).
TEST_DAG_FILES = ("dag_deferred_batch.py",)

def copy_example_dags(target: Path) -> list[str]:
    """Copy the example DAG files the deployment runs, and this package's, into ``target``;
    returns the names copied.

    A copy, so that edits to dags/ while the deployment runs do not reach it.
    """
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    sources = [ROOT / "dags" / name for name in DAG_FILES] + [Path(__file__).parent / name for name in TEST_DAG_FILES]
    for source in sources:
        (target / source.name).write_text(source.read_text())
        copied.append(source.name)
    return copied


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory) -> Iterator[str]:
    """An empty PostgreSQL database on a free port of 127.0.0.1 (SQLAlchemy URL)."""
    if postgres_bin_dir() is None:
        pytest.fail("PostgreSQL server binaries (initdb, postgres) not found: run 'make postgres' (make test does it)")
    with postgres_server(tmp_path_factory.mktemp("postgres")) as url:
        yield url


@pytest.fixture(scope="module")
def deployment_settings(tmp_path_factory) -> dict[str, str]:
    """The DAGs' settings, in the environment of every component: one stream for the example
    DAGs; the scheduled DAGs share a consumer and output root, the event-driven DAG has its own.
    The deferred batch (``dag_deferred_batch.py``) has a stream, consumer, output root and pool of
    its own, and its job's gate file (``job_gate``)."""
    data = tmp_path_factory.mktemp("deployment_data")
    stream = f"deploy{uuid.uuid4().hex[:10]}"
    return {
        "KINESIS_STREAM": stream,
        "KINESIS_CHECKPOINT_TABLE": f"{stream}_checkpoints",
        "KINESIS_CONSUMER": "lake",
        "KINESIS_OUTPUT_PATH": str(data / "lake"),
        "KINESIS_MICROBATCH_INTERVAL_SECONDS": "20",
        "KINESIS_SENSORS_DEFERRABLE": "true",
        "KINESIS_EVENT_DRIVEN_CONSUMER": "events",
        "KINESIS_EVENT_DRIVEN_OUTPUT_PATH": str(data / "events"),
        "KINESIS_BACKLOG_MIN_RECORDS": "300",
        "KINESIS_BACKLOG_MIN_AGE_SECONDS": "",  # the count alone decides
        "KINESIS_BACKLOG_POLL_SECONDS": "5",
        "KINESIS_DEFERRED_STREAM": f"{stream}deferred",
        "KINESIS_DEFERRED_CONSUMER": "deferred",
        "KINESIS_DEFERRED_OUTPUT_PATH": str(data / "deferred"),
        "KINESIS_DEFERRED_POOL": "kinesis_deferred_slot",
        GATE_ENV: str(data / "job_gate"),
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, moto_endpoint, postgres_url, deployment_settings) -> Iterator[AirflowDeployment]:
    """Airflow's components running the example DAGs (all paused) against moto and PostgreSQL."""
    work = tmp_path_factory.mktemp("deployment")
    dags = work / "dags"
    copy_example_dags(dags)
    env = {
        **deployment_settings,
        "AIRFLOW_CONN_AWS_DEFAULT": aws_connection(moto_endpoint),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # An unpaused event-driven DAG's asset watcher is registered when its file is next parsed.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
    }
    with airflow_deployment(work, moto_endpoint, postgres_url, dags, env) as running:
        yield running
