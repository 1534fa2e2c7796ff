"""Output that no mistake can destroy (SAFE, docs/guarantees.md): the ordinary mistakes of a DAG
author — a re-created checkpoint table, two consumers on one output, a transform that changes
the columns, a window ahead of the consumer — fail before anything is written, for Parquet,
Iceberg (pyiceberg, SQL catalog on SQLite) and Delta (deltalake). After each scenario every file
a committed snapshot, version or committed Parquet record references exists, and the output
reads back with exactly the committed rows.

Real parts: moto over HTTP for Kinesis and DynamoDB, a Spark Connect server for the job (warm,
so the tests stay quick), the operators as a DAG author calls them."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions, SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from airflow_kinesis_spark.sinks.iceberg import IcebergSink
from airflow_kinesis_spark.sinks.parquet import committed_files
from demo.producer import KEY_COLUMNS, put_plain, verify
from tests.conftest import create_stream

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

FORMATS = ["parquet", "iceberg", "delta"]


def catalog(tmp_path: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def output_settings(output_format: str, tmp_path: Path, name: str) -> OutputSettings:
    if output_format == "iceberg":
        return OutputSettings(format="iceberg", table=f"lake.{name}", catalog_properties=catalog(tmp_path))
    return OutputSettings(format=output_format)


def ingest(name: str, output: Path, connect: str, *, checkpoint_table: str | None = None, consumer: str = "lake", **kwargs):
    return KinesisToSparkOperator(
        task_id="ingest", stream_name=name, consumer_name=consumer, checkpoint_table=checkpoint_table or f"{name}_a",
        output_path=str(output), spark_settings=SparkSettings(conn_id=connect), read_options=ReadOptions(min_call_interval=0.0),
        **kwargs,
    ).execute({})  # fmt: skip


def _local(uri: str) -> str:
    return uri.removeprefix("file://")


def committed_references(output_format: str, output: Path, tmp_path: Path, name: str) -> list[str]:
    """Every data file any committed snapshot (all of them), Delta version (all of them) or
    committed Parquet record references."""
    if output_format == "parquet":
        return [_local(u) for u in committed_files(str(output))]
    if output_format == "iceberg":
        table = IcebergSink(f"lake.{name}", catalog(tmp_path), str(output)).load()
        return sorted({_local(t.file.file_path) for s in table.metadata.snapshots
                       for t in table.scan(snapshot_id=s.snapshot_id).plan_files()})  # fmt: skip
    latest = DeltaTable(str(output)).version()
    return sorted({_local(u) for v in range(latest + 1) for u in DeltaTable(str(output), version=v).file_uris()})


def committed_rows(output_format: str, output: Path, tmp_path: Path, name: str) -> pa.Table:
    if output_format == "parquet":
        return pa.concat_tables([pq.read_table(_local(u), columns=list(KEY_COLUMNS)) for u in committed_files(str(output))])
    if output_format == "iceberg":
        return IcebergSink(f"lake.{name}", catalog(tmp_path), str(output)).load().scan().to_arrow()
    return pa.table(DeltaTable(str(output)).to_pyarrow_table())


def rows_of(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS), strict=True))


def assert_intact(output_format: str, output: Path, tmp_path: Path, name: str, produced: list) -> None:
    """Every committed reference exists and the output holds exactly ``produced``, once each."""
    references = committed_references(output_format, output, tmp_path, name)
    assert references, "nothing committed"
    missing = [r for r in references if not os.path.exists(r)]
    assert not missing, f"{len(missing)} committed files are gone, e.g. {missing[:2]}"
    verdict = verify(produced, rows_of(committed_rows(output_format, output, tmp_path, name)))
    assert verdict.ok and verdict.records_out == len(produced), verdict


def listing(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_fresh_checkpoint_table_fails_before_the_job_and_deletes_nothing(
    output_format, aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    """Checkpoint table A committed batch 1; the same output with a new checkpoint table B (a
    re-created table, a new environment) fails before its Spark job with the output's position."""
    from airflow.sdk.exceptions import AirflowFailException

    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"first {i}".encode()) for i in range(40)])
    output = tmp_path / "out"
    settings = output_settings(output_format, tmp_path, unique_name)
    assert ingest(unique_name, output, spark_connect_conn, output_settings=settings)["records"] == 40
    put_plain(kinesis, unique_name, [(f"k{i}", f"second {i}".encode()) for i in range(10)])
    before = listing(output)

    with pytest.raises(AirflowFailException) as info:
        ingest(unique_name, output, spark_connect_conn, checkpoint_table=f"{unique_name}_b", output_settings=settings)
    message = str(info.value)
    assert "already holds batch 1" in message and "ahead of the checkpoint store" in message, message
    assert f"{unique_name}_b" in message and "Nothing was read, written or deleted" in message
    assert "new output_path" in message and "point-in-time recovery" in message
    store_b = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_b", unique_name, "lake")
    assert store_b.head().pending_batch_id is None  # refused before planning: nothing pending in B
    assert listing(output) == before  # no file written, replaced or deleted
    assert_intact(output_format, output, tmp_path, unique_name, produced)


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_second_consumer_on_one_output_fails_before_reading_unless_the_output_is_shared(
    output_format, aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    from airflow.sdk.exceptions import AirflowFailException

    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"r {i}".encode()) for i in range(30)])
    output = tmp_path / "out"
    settings = output_settings(output_format, tmp_path, unique_name)
    ingest(unique_name, output, spark_connect_conn, consumer="one", output_settings=settings)
    before = listing(output)
    with pytest.raises(AirflowFailException) as info:
        ingest(unique_name, output, spark_connect_conn, consumer="two", output_settings=settings)
    message = str(info.value)
    assert "belongs to stream" in message and "'one'" in message and "'two'" in message, message
    assert "another output_path" in message and "Nothing was read or written" in message
    assert listing(output) == before
    assert_intact(output_format, output, tmp_path, unique_name, produced)
    two = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_a", unique_name, "two")
    assert two.head().pending_batch_id is None and two.head().committed_batch_id == 0

    # Declared shared: each consumer writes its own folder; nothing collides.
    shared = tmp_path / "shared"
    name = f"{unique_name}s"
    settings = output_settings(output_format, tmp_path, name)
    for consumer in ("one", "two"):
        result = ingest(unique_name, shared, spark_connect_conn, consumer=consumer, checkpoint_table=f"{unique_name}_s",
                        output_settings=replace(settings, shared_output=True))  # fmt: skip
        assert result["records"] == 30 and f"stream={unique_name}/consumer={consumer}/" in result["output_path"]
    if output_format == "parquet":  # each consumer's committed records hold its own rows
        for consumer in ("one", "two"):
            assert_intact("parquet", shared / f"stream={unique_name}" / f"consumer={consumer}", tmp_path, name, produced)
    else:  # one table, both consumers' batches: every record once per consumer
        references = committed_references(output_format, shared, tmp_path, name)
        assert references and all(os.path.exists(r) for r in references)
        counts = Counter(rows_of(committed_rows(output_format, shared, tmp_path, name)))
        assert set(counts.values()) == {2} and verify(produced, list(counts)).ok
    with pytest.raises(AirflowFailException, match=r"OutputSettings\(shared_output=True\) on every task"):  # an undeclared third
        ingest(unique_name, shared, spark_connect_conn, consumer="three", checkpoint_table=f"{unique_name}_s", output_settings=settings)


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_a_batch_with_a_new_column_fails_unless_schema_evolution_adds_it(
    output_format, aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    """Delta used to commit a batch with a column the table lacks (the column invisible to
    readers); both formats now refuse it, nothing committed, and add it when asked to."""
    from airflow.sdk.exceptions import AirflowFailException

    create_stream(kinesis, unique_name, 1)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"r {i}".encode()) for i in range(20)])
    output = tmp_path / "out"
    settings = output_settings(output_format, tmp_path, unique_name)
    ingest(unique_name, output, spark_connect_conn, output_settings=settings)
    more = put_plain(kinesis, unique_name, [(f"m{i}", f"s {i}".encode()) for i in range(15)])
    transform = "tests.integration.column_transforms:add_country"
    with pytest.raises(AirflowFailException) as info:
        ingest(unique_name, output, spark_connect_conn, transform=transform, output_settings=settings)
    assert "does not hold: country string" in str(info.value) and "OutputSettings(schema_evolution='add_columns')" in str(info.value)
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_a", unique_name, "lake")
    assert store.head().committed_batch_id == 1 and store.head().pending_batch_id == 2  # pending, not committed
    assert_intact(output_format, output, tmp_path, unique_name, produced)

    result = ingest(unique_name, output, spark_connect_conn, transform=transform,
                    output_settings=replace(settings, schema_evolution="add_columns"))  # fmt: skip
    assert result["batch_id"] == 2 and result["records"] == 15 and result["reused_plan"]
    data = committed_rows(output_format, output, tmp_path, unique_name)
    assert "country" in data.column_names
    countries = dict(zip(data.column("partition_key").to_pylist(), data.column("country").to_pylist(), strict=True))
    assert {countries[p.partition_key] for p in more} == {"nl"} and {countries[p.partition_key] for p in produced} == {None}
    assert_intact(output_format, output, tmp_path, unique_name, produced + more)

    # A changed type still fails, with the column named.
    put_plain(kinesis, unique_name, [("x", b"y")])
    with pytest.raises(AirflowFailException, match="partition_key: table has string, batch has int64"):
        ingest(unique_name, output, spark_connect_conn, transform="tests.integration.column_transforms:partition_key_as_long",
               output_settings=replace(settings, schema_evolution="add_columns"))  # fmt: skip
    assert_intact(output_format, output, tmp_path, unique_name, produced + more)


@pytest.mark.parametrize("output_format", FORMATS)
def test_a_window_ahead_of_the_consumer_fails_and_one_within_it_adds_no_row_twice(
    output_format, aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    from airflow.sdk.exceptions import AirflowFailException

    create_stream(kinesis, unique_name, 2)
    start = datetime.now(timezone.utc) - timedelta(seconds=5)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"r {i}".encode()) for i in range(30)])
    time.sleep(1.1)
    output = tmp_path / "out"
    settings = output_settings(output_format, tmp_path, unique_name)
    first = ingest(unique_name, output, spark_connect_conn, output_settings=settings)
    cutoff = first["cutoff"]
    time.sleep(1.1)
    later = put_plain(kinesis, unique_name, [(f"m{i}", f"s {i}".encode()) for i in range(20)])
    time.sleep(1.1)

    def window(end: str) -> dict:
        return KinesisWindowToSparkOperator(
            task_id="window", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_a",
            output_path=str(output), spark_settings=SparkSettings(conn_id=spark_connect_conn),
            read_options=ReadOptions(min_call_interval=0.0), window_start=format_timestamp(start), window_end=end,
            output_settings=settings,
        ).execute({})  # fmt: skip

    before = listing(output)
    with pytest.raises(AirflowFailException) as info:
        window(format_timestamp(datetime.now(timezone.utc)))
    message = str(info.value)
    assert "reaches past what consumer 'lake' has committed" in message and "or earlier" in message, message
    assert listing(output) == before
    assert window(cutoff)["records"] == 30  # the committed part: allowed

    second = ingest(unique_name, output, spark_connect_conn, output_settings=settings)
    assert second["records"] == 20
    # Tables: the window replaced batch 1's rows with the same rows; Parquet: the committed records
    # name the batches only. Either way every row once.
    assert_intact(output_format, output, tmp_path, unique_name, produced + later)


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_a_table_that_would_refuse_the_batchs_columns_fails_before_planning(output_format, kinesis, dynamodb, tmp_path, unique_name):
    """No transform: the job's columns are known, so a table made for other data (here: ``data``
    a string, ``country`` required by nobody) is refused before anything is planned or read."""
    from deltalake import write_deltalake

    from airflow_kinesis_spark.core.protocol import IncrementalSettings, prepare_incremental
    from airflow_kinesis_spark.exceptions import TableCommitError
    from airflow_kinesis_spark.sinks.build import build_sink

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"v")])
    output = tmp_path / "out"
    other = pa.table({"stream_name": ["s"], "data": ["not bytes"]})
    if output_format == "delta":
        write_deltalake(str(output), other)
        sink = build_sink("delta", str(output), stream_name=unique_name, consumer_name="lake")
    else:
        sink = build_sink("iceberg", str(output), table=f"lake.{unique_name}", catalog_properties=catalog(tmp_path),
                          stream_name=unique_name, consumer_name="lake")  # fmt: skip
        sink.catalog().create_namespace_if_not_exists("lake")
        sink.catalog().create_table(f"lake.{unique_name}", schema=other.schema)
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root=sink.batch_root,
                                   cutoff=datetime.now(timezone.utc), sink=sink)  # fmt: skip
    with pytest.raises(TableCommitError, match="data: table has string, batch has binary"):
        prepare_incremental(kinesis, store, settings, "run")
    assert store.head().pending_batch_id is None
