"""Streams addressed by ARN (a stream shared from another account is named so): the same batches
and the same checkpoints as by name. Moto over HTTP, a real Spark Connect server."""

from __future__ import annotations

import pytest

from airflow_kinesis_spark.core.lag import measure_lag
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import committed_rows, put_aggregated, put_plain, verify
from tests.conftest import create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def ingest(stream: str, output, table: str, connect: str) -> dict:
    return KinesisToSparkOperator(task_id="ingest", stream_name=stream, consumer_name="arns", checkpoint_table=table,
                                  output_path=str(output), read_options=ReadOptions(min_call_interval=0.0),
                                  spark_settings=SparkSettings(conn_id=connect)).execute({})  # fmt: skip


def test_runs_by_name_and_by_arn_share_checkpoints_and_read_each_record_once(
    aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    create_stream(kinesis, unique_name, 2)
    arn = kinesis.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
    table, output = f"{unique_name}_ckpt", tmp_path / "out"
    produced = put_plain(kinesis, unique_name, [(f"n{i}", f"by name {i}".encode()) for i in range(60)])

    first = ingest(unique_name, output, table, spark_connect_conn)
    assert first["batch_id"] == 1 and first["records"] == 60
    produced += put_aggregated(kinesis, unique_name, [(f"a{i}", f"by arn {i}".encode()) for i in range(40)])
    second = ingest(arn, output, table, spark_connect_conn)  # the same consumer, addressed by ARN
    assert second["batch_id"] == 2 and second["records"] == 40, second  # continues from batch 1's checkpoints
    produced += put_plain(kinesis, unique_name, [(f"m{i}", f"by name again {i}".encode()) for i in range(10)])
    third = ingest(unique_name, output, table, spark_connect_conn)
    assert third["batch_id"] == 3 and third["records"] == 10

    store = DynamoDBCheckpointStore(dynamodb, table, arn, "arns")
    assert store.stream_name == unique_name and store.head().committed_batch_id == 3
    rows = committed_rows(output, 3)
    verdict = verify(produced, rows)
    assert verdict.ok and verdict.records_out == 110, verdict
    import pyarrow.parquet as pq

    names = set(pq.read_table(str(output / "batch_id=2")).column("stream_name").to_pylist())
    assert names == {unique_name}  # rows name the stream, not the ARN
    lag = measure_lag(kinesis, store)  # the lag of an ARN-addressed consumer: its shards, read by ARN
    assert lag["shards_with_unconsumed"] == [] or not lag["shards_with_unconsumed"], lag


def test_the_cli_and_a_rewind_take_a_stream_arn(moto_endpoint, kinesis, dynamodb, unique_name, monkeypatch):
    import json

    from click.testing import CliRunner

    from airflow_kinesis_spark.cli import main as cli
    from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)  # the command's default chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    create_stream(kinesis, unique_name, 2)
    arn = kinesis.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
    put_plain(kinesis, unique_name, [(f"c{i}", f"cli {i}".encode()) for i in range(12)])
    base = ["--endpoint-url", moto_endpoint, "--region", REGION]
    args = [arn, "-c", "arns", "-t", f"{unique_name}_ckpt"]
    rewind = CliRunner().invoke(cli, [*base, "rewind", *args, "--to", "TRIM_HORIZON", "--yes", "--json"])
    assert rewind.exit_code == 0, rewind.output
    shown = CliRunner().invoke(cli, [*base, "checkpoints", *args, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert len(data["lag"]["shards_with_unconsumed"]) == 2  # the shards listed and probed by ARN
    by_name = CliRunner().invoke(cli, [*base, "checkpoints", unique_name, "-c", "arns", "-t", f"{unique_name}_ckpt", "--json"])
    assert json.loads(by_name.stdout)["committed_batch_id"] == data["committed_batch_id"] == 1  # the same checkpoints
