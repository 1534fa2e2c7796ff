"""A window whose Spark job takes its plan from the checkpoint table (real spark-submit, moto):
no file passes between the worker and the driver, and the rows are the window's exactly once."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest

from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.core.window import window_label
from airflow_kinesis_spark.operators.settings import ReadOptions
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from demo.producer import KEY_COLUMNS, put_plain, verify
from tests.conftest import create_stream
from tests.integration.test_operator import spark_calls  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def test_a_window_job_takes_its_plan_from_the_store(aws_conn, spark_calls, kinesis, dynamodb, tmp_path, unique_name):  # noqa: F811
    create_stream(kinesis, unique_name, 2)
    before = put_plain(kinesis, unique_name, [(f"b{i}", f"before {i}".encode()) for i in range(10)])
    time.sleep(1.2)
    start = datetime.now(timezone.utc)
    inside = put_plain(kinesis, unique_name, [(f"k{i}", f"inside {i}".encode()) for i in range(60)])
    time.sleep(1.2)
    end = datetime.now(timezone.utc)
    put_plain(kinesis, unique_name, [(f"a{i}", f"after {i}".encode()) for i in range(10)])
    table = f"{unique_name}_ckpt"
    op = KinesisWindowToSparkOperator(
        task_id="w", stream_name=unique_name, output_path=str(tmp_path / "out"), checkpoint_table=table,
        window_start=format_timestamp(start), window_end=format_timestamp(end), time_slices=2,
        read_options=ReadOptions(min_call_interval=0.0),
    )  # fmt: skip
    result = op.execute({})
    assert result["status"] == "written" and result["records"] == 60, result

    # the job's arguments name the table and the window, never a plan or report file
    (call,) = spark_calls
    command = " ".join(call["cmd"])
    assert "--plan-file" not in command and "--report-file" not in command
    assert f"--checkpoint-table {table}" in command and f"--window {window_label(start, end)}" in command

    location = tmp_path / "out" / f"window={window_label(start, end)}"
    rows = pq.read_table(location, columns=list(KEY_COLUMNS)).to_pydict()
    verdict = verify(inside, zip(*(rows[c] for c in KEY_COLUMNS), strict=True))
    assert verdict.ok, verdict
    assert not (tmp_path / "out" / "_staging").exists() or not any((tmp_path / "out" / "_staging").iterdir())
    assert before  # records before and after the window exist and were not read

    # the plan and the report are the window's items (with a TTL); the head and checkpoints untouched
    store = DynamoDBCheckpointStore(dynamodb, table, unique_name, "window")
    items = dynamodb.scan(TableName=table)["Items"]
    kinds = sorted({i["sk"]["S"].split("#")[2] for i in items if i["sk"]["S"].startswith("WINDOW#")})
    assert kinds == ["PLAN", "REPORT"] and all("expires_at" in i for i in items if i["sk"]["S"].startswith("WINDOW#"))
    assert store.head().committed_batch_id == 0 and store.head().pending_batch_id is None
    assert result["time_slices"] == 2 and end - start < timedelta(minutes=1)
