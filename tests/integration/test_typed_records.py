"""Typed records through the operators (issue 29): AWS Glue Schema Registry versions into Iceberg
and Delta tables, columns added by a new version in the batch's own commit, a version deleted
mid-stream, dead letters kept and counted, a type change refused naming the field, too many dead
letters failing with nothing committed, and a window re-decoding last month's records into today's
table.

Real parts: moto over HTTP for Kinesis and DynamoDB (the session's server), a second moto server on
127.0.0.1 in this process for Glue: moto serves no DeleteSchemaVersions, so the deletion test takes
the version out of that server's state (``demo.typed_producer.delete_schema_version_on_moto``); a
Spark Connect server for the job; pyiceberg (SQL catalog on SQLite) and deltalake."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, ReadOptions, RecordSettings, SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from airflow_kinesis_spark.sinks.iceberg import IcebergSink
from demo.producer import put_plain
from demo.typed_producer import (
    delete_schema_version_on_moto,
    produce_typed,
    register_schemas,
    register_second_versions,
)
from tests.conftest import REGION, create_stream, free_port, make_client

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def glue_moto():
    """moto in this process (ThreadedMotoServer on 127.0.0.1), for Glue: its state can be changed."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def glue(glue_moto, aws_conn, monkeypatch, moto_endpoint):
    """A Glue client of the in-process moto, and ``aws_default`` routing Glue there."""
    from tests.conftest import aws_connection

    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_endpoint, service_config={"glue": {"endpoint_url": glue_moto}}))
    return make_client("glue", glue_moto)


def catalog(tmp_path: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def ingest(name: str, output: Path, connect: str, **kwargs):
    return KinesisToSparkOperator(
        task_id="ingest", stream_name=name, consumer_name="lake", checkpoint_table=f"{name}_cp", output_path=str(output),
        spark_settings=SparkSettings(conn_id=connect), read_options=ReadOptions(min_call_interval=0.0), **kwargs,
    ).execute({})  # fmt: skip


def dead_letters(summary: dict) -> list[tuple[str, str, str]]:
    path = summary["quarantine_path"].removeprefix("file://")
    table = pq.read_table(path)
    return sorted(zip(table.column("shard_id").to_pylist(), table.column("sequence_number").to_pylist(),
                      table.column("error_kind").to_pylist(), strict=True))  # fmt: skip


def broken_of(*produced) -> list[tuple[str, str, str]]:
    return sorted((b.shard_id, b.sequence_number, b.kind) for p in produced for b in p.broken)


def test_registry_avro_into_iceberg_evolves_with_a_new_version_and_a_deleted_one_dead_letters(
    glue, glue_moto, spark_connect_conn, kinesis, tmp_path, unique_name
):
    create_stream(kinesis, unique_name, 2)
    schemas = register_schemas(glue, registry_name=unique_name)
    output, table = tmp_path / "out", f"lake.{unique_name}"
    settings = {"output_settings": OutputSettings(format="iceberg", table=table, catalog_properties=catalog(tmp_path)),
                "record_settings": RecordSettings(format="avro", registry={"registry_name": unique_name, "schema_name": "orders-avro"},
                                                  max_dead_letter_fraction=0.2)}  # fmt: skip
    first = produce_typed(kinesis, unique_name, kind="avro", count=40, broken=4, schemas=schemas, seed=1)
    summary = ingest(unique_name, output, spark_connect_conn, **settings)
    assert summary["records"] == 44 and summary["dead_letters"] == 4
    assert dead_letters(summary) == broken_of(first)
    iceberg = IcebergSink(table, catalog(tmp_path), str(output)).load()
    assert "channel" not in iceberg.schema().column_names and "data" not in iceberg.schema().column_names

    schemas = register_second_versions(glue, schemas)  # mid-stream: version 2 adds "channel"
    second = produce_typed(kinesis, unique_name, kind="avro", count=30, broken=0, schemas=schemas, seed=2, start_id=100, version=2)
    snapshots = len(iceberg.metadata.snapshots)
    summary = ingest(unique_name, output, spark_connect_conn, **settings)
    assert summary["records"] == 30 and summary["dead_letters"] == 0
    iceberg = IcebergSink(table, catalog(tmp_path), str(output)).load()
    assert "channel" in iceberg.schema().column_names  # added in this batch's own snapshot:
    assert len(iceberg.metadata.snapshots) == snapshots + 1  # one commit, the column and the rows
    rows = {r["order_id"]: r for r in iceberg.scan().to_arrow().to_pylist()}
    assert set(rows) == set(first.good) | set(second.good)
    for order_id, value in {**first.good, **second.good}.items():
        got = rows[order_id]
        assert (got["customer"], got["amount"], got["items"], got["channel"]) == (
            value["customer"], value["amount"], value["items"], value.get("channel"))
        assert got["placed_at"] == value["placed_at"]

    # version 2 deleted from the registry; its records written since are dead letters, not lost
    delete_schema_version_on_moto(None, unique_name, "orders-avro", 2, region=REGION)
    third = produce_typed(kinesis, unique_name, kind="avro", count=5, broken=0, schemas=schemas, seed=3, start_id=200, version=2)
    produce_typed(kinesis, unique_name, kind="avro", count=45, broken=0, schemas=schemas, seed=4, start_id=300, version=1)
    summary = ingest(unique_name, output, spark_connect_conn, **settings)
    assert summary["records"] == 50 and summary["dead_letters"] == 5
    assert {k for _, _, k in dead_letters(summary)} == {"unknown_schema_version"}
    assert sorted((s, q) for s, q, _ in dead_letters(summary)) == sorted(third.good_positions.values())


def test_json_into_delta_type_change_fails_naming_the_field_and_too_many_dead_letters_commit_nothing(
    aws_conn, spark_connect_conn, kinesis, dynamodb, tmp_path, unique_name
):
    from airflow.sdk.exceptions import AirflowFailException

    create_stream(kinesis, unique_name, 1)
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "amount": {"type": "integer"}}, "required": ["id"]}
    output = tmp_path / "delta"
    settings = {"output_settings": OutputSettings(format="delta"),
                "record_settings": RecordSettings(format="json", schema=json.dumps(schema))}  # fmt: skip
    put_plain(kinesis, unique_name, [(str(i), json.dumps({"id": i, "amount": i * 10}).encode()) for i in range(20)])
    assert ingest(unique_name, output, spark_connect_conn, **settings)["records"] == 20
    assert DeltaTable(str(output)).schema().to_arrow().field("amount").type.bit_width == 64

    changed = {**schema, "properties": {**schema["properties"], "amount": {"type": "string"}}}
    put_plain(kinesis, unique_name, [(str(i), json.dumps({"id": i, "amount": str(i)}).encode()) for i in range(20, 30)])
    changed_settings = RecordSettings(format="json", schema=json.dumps(changed))
    with pytest.raises(AirflowFailException, match="amount: table has int64, batch has string"):
        ingest(unique_name, output, spark_connect_conn, **{**settings, "record_settings": changed_settings})
    assert DeltaTable(str(output)).version() == 0  # created with batch 1: nothing more
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_cp", unique_name, "lake")
    assert store.head().committed_batch_id == 1 and store.pending_plan() is None  # refused before planning

    # half of the next records are not JSON: a wrong format, not bad records
    put_plain(kinesis, unique_name, [(f"x{i}", b"\x00\x01 not json") for i in range(10)])
    with pytest.raises(AirflowFailException, match=r"did not decode as json records \(max_dead_letter_fraction=0.01\)"):
        ingest(unique_name, output, spark_connect_conn, **settings)
    assert DeltaTable(str(output)).version() == 0
    assert store.head().committed_batch_id == 1 and store.pending_plan() is not None  # pending: nothing committed


def test_window_redecodes_last_months_records_into_todays_table(
    glue, spark_connect_conn, kinesis, tmp_path, unique_name
):
    """Records of version 1 and 2 re-read by a window after version 2 was registered: each record
    decoded with the version it names (version 1's rows have no coupon), into one table with
    version 2's column; the re-run writes the same rows."""
    create_stream(kinesis, unique_name, 1)
    schemas = register_schemas(glue, registry_name=unique_name)
    start = datetime.now(timezone.utc) - timedelta(seconds=1)
    old = produce_typed(kinesis, unique_name, kind="json", count=20, broken=2, schemas=schemas, seed=5)
    schemas = register_second_versions(glue, schemas)
    new = produce_typed(kinesis, unique_name, kind="json", count=20, broken=0, schemas=schemas, seed=6, start_id=100, version=2)
    time.sleep(1.1)
    end = datetime.now(timezone.utc)
    settings = {"output_settings": OutputSettings(format="iceberg", table=f"lake.{unique_name}", catalog_properties=catalog(tmp_path)),
                "record_settings": RecordSettings(format="json", registry={"registry_name": unique_name, "schema_name": "orders-json"},
                                                  max_dead_letter_fraction=0.1)}  # fmt: skip

    def window() -> list[dict]:
        KinesisWindowToSparkOperator(
            task_id="window", stream_name=unique_name, consumer_name="backfill", output_path=str(tmp_path / "out"),
            spark_settings=SparkSettings(conn_id=spark_connect_conn), window_start=start.isoformat(),
            window_end=end.isoformat(), **settings,
        ).execute({})  # fmt: skip
        rows = IcebergSink(settings["output_settings"].table, catalog(tmp_path), str(tmp_path / "out")).load().scan().to_arrow().to_pylist()
        return sorted(({k: v for k, v in r.items() if k != "approximate_arrival_timestamp"} for r in rows), key=lambda r: r["order_id"])

    first = window()
    assert {r["order_id"]: (r["customer"], r["coupon"]) for r in first} == {
        i: (v["customer"], v.get("coupon")) for i, v in {**old.good, **new.good}.items()}
    assert window() == first


def test_typed_records_with_enhanced_fan_out_under_spark_submit(aws_conn, dynamodb, moto_endpoint, unique_name, tmp_path):
    """A Spark DDL schema for JSON records, plain and KPL-aggregated, read with enhanced fan-out
    (SubscribeToShard through demo.subscribe.FanOutProxy, moto has none) by a spark-submit job."""
    from demo.producer import put_aggregated
    from demo.subscribe import FanOutProxy
    from tests.integration.test_efo import client

    proxy = FanOutProxy(moto_endpoint).start()
    try:
        aws_conn(proxy.endpoint)
        kinesis = client(proxy.endpoint)
        create_stream(kinesis, unique_name, 2)
        values = [{"id": i, "tags": [f"t{i}"], "meta": {"score": i * 1.5}} for i in range(60)]
        put_plain(kinesis, unique_name, [(f"p{i}", json.dumps(v).encode()) for i, v in enumerate(values[:30])])
        put_aggregated(kinesis, unique_name, [(f"a{i}", json.dumps(v).encode()) for i, v in enumerate(values[30:])])
        put_plain(kinesis, unique_name, [("bad", b'{"id": "not a number"}')])
        summary = KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="fan-out", checkpoint_table=f"{unique_name}_cp",
            output_path=str(tmp_path / "out"), read_options=ReadOptions(min_call_interval=0.0), consumer_type="efo",
            record_settings=RecordSettings(format="json", schema="id bigint, tags array<string>, meta struct<score: double>",
                                           max_dead_letter_fraction=0.05),
        ).execute({})  # fmt: skip
        assert summary["records"] == 61 and summary["dead_letters"] == 1 and proxy.stats["subscriptions"] >= 2
        table = pq.read_table(summary["output_path"])
        assert "data" not in table.column_names
        assert sorted((r["id"], r["tags"], r["meta"]["score"]) for r in table.to_pylist()) == [
            (v["id"], v["tags"], v["meta"]["score"]) for v in values]
        assert [k for _, _, k in dead_letters(summary)] == ["wrong_type"]
        record = json.loads((tmp_path / "out" / "_committed" / "batch_id=1" / "_batch.json").read_text())
        assert record["record_format"] == "json" and ["meta", "struct<score: double>"] in record["schema"]
    finally:
        proxy.stop()
