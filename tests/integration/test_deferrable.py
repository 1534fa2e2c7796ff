"""KinesisToSparkOperator(deferrable=...) chooses before anything is planned (moto; no Spark job runs:
the connections below point nowhere, and the choice is made from their master and deploy mode)."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings
from demo.producer import put_plain
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


def _operator(name: str, tmp_path, **kwargs) -> KinesisToSparkOperator:
    return KinesisToSparkOperator(task_id="t", stream_name=name, consumer_name="c", checkpoint_table=f"{name}_t",
                                  output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_client_mode"), **kwargs)  # fmt: skip


@pytest.fixture
def client_mode(monkeypatch):
    """A standalone master in client deploy mode: the driver would run in the worker."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLIENT_MODE", json.dumps({"conn_type": "spark", "host": "spark://10.0.0.9", "port": 7077}))


def test_an_explicit_deferrable_with_a_driver_in_the_worker_fails_before_planning(aws_conn, client_mode, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    with pytest.raises(ValueError, match=r"deferrable=True needs a Spark driver that does not run in this worker.*deploy-mode"):
        _operator(unique_name, tmp_path, deferrable=True).execute({})
    head = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "c").head()
    assert head.pending_batch_id is None and head.committed_batch_id == 0  # nothing planned, no lease to wait out


def test_default_deferrable_falls_back_to_blocking_where_the_driver_runs_here(aws_conn, client_mode, monkeypatch, unique_name, tmp_path, caplog, capfd):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    op = _operator(unique_name, tmp_path)
    assert op.deferrable is None and op._defers() is False
    captured = capfd.readouterr()
    assert "Not deferring ([operators] default_deferrable is on" in caplog.text + captured.out + captured.err
    assert _operator(unique_name, tmp_path, deferrable=False)._defers() is False
