"""Table outputs end to end: real Spark writes the files (spark-submit, or a Spark Connect server
for the recovery tests: warm, so they stay quick), pyiceberg (SQL catalog on SQLite) and
deltalake commit them on the worker, moto serves Kinesis and DynamoDB over HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions, SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from airflow_kinesis_spark.sinks.iceberg import SUMMARY_BATCH, IcebergSink
from airflow_kinesis_spark.sinks.parquet import committed_files
from demo.producer import KEY_COLUMNS, put_aggregated, put_plain, verify
from tests.conftest import create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def catalog(tmp_path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def ingest(name, output, **kwargs) -> KinesisToSparkOperator:
    return KinesisToSparkOperator(task_id="ingest", stream_name=name, consumer_name="tables", checkpoint_table=f"{name}_ckpt",
                                  output_path=str(output), read_options=ReadOptions(min_call_interval=0.0), **kwargs)  # fmt: skip


def rows_of(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS), strict=True))


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_batches_commit_one_table_snapshot_each_exactly_once(output_format, aws_conn, kinesis, dynamodb, tmp_path, unique_name):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"10.0.0.{i % 5}", f"line {i}".encode()) for i in range(120)])
    iceberg = {"table": f"lake.{unique_name}", "catalog_properties": catalog(tmp_path)} if output_format == "iceberg" else {}
    settings = {"output_settings": OutputSettings(format=output_format, **iceberg)}
    output = tmp_path / "table"

    first = ingest(unique_name, output, **settings).execute({})
    assert first["status"] == "committed" and first["records"] == 120
    assert first["table"]["format"] == output_format and first["table"]["files"] >= 1
    produced += put_aggregated(kinesis, unique_name, [(f"k{i}", f"agg {i}".encode()) for i in range(60)])
    second = ingest(unique_name, output, **settings).execute({})
    assert second["records"] == 60 and not second["table"]["already_committed"]

    if output_format == "iceberg":
        table = IcebergSink(f"lake.{unique_name}", catalog(tmp_path), str(output)).load()
        data = table.scan().to_arrow()
        batches = [s.summary.additional_properties.get(SUMMARY_BATCH) for s in table.metadata.snapshots]
        assert batches == ["1", "2"]
        assert first["table"]["snapshot_id"] == table.metadata.snapshots[0].snapshot_id
        assert [f.name for f in table.spec().fields] == ["approximate_arrival_timestamp_day"]
    else:
        table = DeltaTable(str(output))
        data = pa.table(table.to_pyarrow_table())
        assert table.version() == 1 and second["table"]["version"] == 1
        assert table.transaction_version(f"airflow-kinesis-spark:{unique_name}:tables") == 2
        assert table.metadata().partition_columns == ["arrival_date"]
    verdict = verify(produced, rows_of(data))
    assert verdict.ok and verdict.records_out == 180, verdict
    assert not list(output.rglob("_SUCCESS"))


def test_a_crash_between_the_table_commit_and_the_checkpoint_commit_rolls_forward(
    aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name, monkeypatch
):
    """The table commit succeeded, the checkpoint commit did not (the process died): the re-run
    commits the checkpoints without adding the batch to the table again."""
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"p{i}", f"r{i}".encode()) for i in range(50)])
    settings = {"output_settings": OutputSettings(format="iceberg", table=f"lake.{unique_name}", catalog_properties=catalog(tmp_path)),
                "spark_settings": SparkSettings(conn_id=spark_connect_conn)}  # fmt: skip
    output = tmp_path / "table"
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "tables")

    def crash(*args, **kwargs):
        raise SystemExit("killed after the table commit")

    with monkeypatch.context() as m:
        m.setattr(DynamoDBCheckpointStore, "commit", crash)
        with pytest.raises(SystemExit):
            ingest(unique_name, output, **settings, lease_seconds=1.0).execute({})
    assert store.head().committed_batch_id == 0 and store.head().pending_batch_id == 1
    table = IcebergSink(f"lake.{unique_name}", catalog(tmp_path), str(output)).load()
    assert len(table.metadata.snapshots) == 1  # the table holds the batch; the checkpoints do not

    import time

    time.sleep(1.1)  # the dead run's lease expires
    again = ingest(unique_name, output, **settings, lease_seconds=1.0).execute({})
    assert again["status"] == "committed" and again["reused_plan"] and again["table"]["already_committed"]
    table = table.refresh()
    assert len(table.metadata.snapshots) == 1
    verdict = verify(produced, rows_of(table.scan().to_arrow()))
    assert verdict.ok and verdict.records_out == 50, verdict
    assert store.head().committed_batch_id == 1


def test_parquet_readers_that_follow_the_committed_records_see_only_committed_rows(
    aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name, monkeypatch
):
    """A job wrote batch 2's folder, then the run died before the checkpoint commit: a plain
    reader of the folder sees its rows; a reader of the committed records does not."""
    import pyarrow.parquet as pq

    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"p{i}", f"r{i}".encode()) for i in range(40)])
    output = tmp_path / "out"
    ingest(unique_name, output, spark_settings=SparkSettings(conn_id=spark_connect_conn)).execute({})
    put_plain(kinesis, unique_name, [(f"q{i}", f"s{i}".encode()) for i in range(30)])

    def crash(*args, **kwargs):
        raise SystemExit("killed before the checkpoint commit")

    with monkeypatch.context() as m:
        m.setattr(DynamoDBCheckpointStore, "commit", crash)
        with pytest.raises(SystemExit):
            ingest(unique_name, output, spark_settings=SparkSettings(conn_id=spark_connect_conn)).execute({})
    assert (output / "batch_id=2").is_dir() and not (output / "batch_id=2" / "_SUCCESS").exists()
    assert (output / "batch_id=1" / "_SUCCESS").exists()
    plain = pq.read_table(str(output), partitioning="hive")
    assert plain.num_rows == 70  # what a reader that lists the folder gets
    files = committed_files(str(output))
    committed = pq.ParquetDataset(files).read()
    verdict = verify(produced, rows_of(committed))
    assert verdict.ok and committed.num_rows == 40, verdict


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_a_window_rerun_replaces_its_rows_atomically(output_format, aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name):
    create_stream(kinesis, unique_name, 2)
    start = datetime.now(timezone.utc) - timedelta(seconds=2)
    produced = put_plain(kinesis, unique_name, [(f"w{i}", f"win {i}".encode()) for i in range(80)])
    import time

    time.sleep(1.1)
    end = datetime.now(timezone.utc)
    iceberg = {"table": f"lake.{unique_name}", "catalog_properties": catalog(tmp_path)} if output_format == "iceberg" else {}
    settings = {"output_settings": OutputSettings(format=output_format, **iceberg),
                "spark_settings": SparkSettings(conn_id=spark_connect_conn)}
    output = tmp_path / "table"

    def window():
        return KinesisWindowToSparkOperator(task_id="window", stream_name=unique_name, consumer_name="backfill",
                                            output_path=str(output), window_start=start.isoformat(), window_end=end.isoformat(),
                                            read_options=ReadOptions(min_call_interval=0.0), **settings).execute({})  # fmt: skip

    def read():
        if output_format == "iceberg":
            return IcebergSink(f"lake.{unique_name}", catalog(tmp_path), str(output)).load().scan().to_arrow()
        return pa.table(DeltaTable(str(output)).to_pyarrow_table())

    first = window()
    assert first["records"] == 80 and first["table"]["files"] >= 1
    rows = sorted(rows_of(read()))
    second = window()
    assert second["records"] == 80
    assert sorted(rows_of(read())) == rows
    verdict = verify(produced, rows)
    assert verdict.ok and verdict.records_out == 80, verdict
