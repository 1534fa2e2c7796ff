"""Every run removes what killed runs left in the temporary directory (issue 17, item 4), also a
run that finds no new records and starts no Spark job."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_kinesis_spark.hooks import spark_temp
from airflow_kinesis_spark.hooks.spark_temp import TEMP_DIR_OWNER_FILE
from airflow_kinesis_spark.hooks.spark_submit import BatchSparkSubmitHook
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


def test_a_run_without_new_records_removes_a_killed_runs_directory(monkeypatch, aws_conn, kinesis, unique_name, tmp_path):
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(spark_temp.tempfile, "tempdir", str(temp_root))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = temp_root / "kinesis-batch-4-killed"  # a run killed with SIGKILL while its job ran
    leftover.mkdir()
    (leftover / TEMP_DIR_OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": None}))
    (leftover / "airflow_kinesis_spark_core.zip").write_bytes(b"zip")
    monkeypatch.setattr(BatchSparkSubmitHook, "submit", lambda *a, **k: pytest.fail("a run without new records ran Spark"))
    create_stream(kinesis, unique_name, 2)  # no records

    summary = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(tmp_path / "out"), read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip

    assert summary["records"] == 0
    assert not leftover.exists()
    assert list(Path(temp_root).iterdir()) == []  # and the run left nothing of its own
