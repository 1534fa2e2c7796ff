"""The PySpark job with typed records (core.records): decoded columns, dead letters under _quarantine,
registry versions named per record; one pass and through the cache; Spark 4 and 3.5 (make test-spark35)."""

from __future__ import annotations

import base64
import io
import json
import uuid
import zlib
from datetime import datetime, timezone

import fastavro
import pytest

from airflow_kinesis_spark.core.records import RecordSettings
from demo.producer import put_plain
from tests.conftest import create_stream
from tests.spark.test_job import OPTIONS, ONE_PASS, _aws_env, _plan, job

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}  # fmt: skip
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]}
JSON_SCHEMA = {"type": "object", "required": ["id"], "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object", "properties": {"score": {"type": "number"}}}}}  # fmt: skip


def gsr(version_id: str, *, compressed: bool = False) -> bytes:
    """The AWS Glue Schema Registry header, written out from its documented layout (not the
    decoder's code): version byte 3, compression 5 (zlib) or 0, the version id's 16 bytes."""
    return bytes([3, 5 if compressed else 0]) + uuid.UUID(version_id).bytes


def _avro(schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def _typed_plan(kinesis, stream, tmp_path, records: dict) -> dict:
    plan = _plan(kinesis, stream, tmp_path)
    plan["output"] = {"format": "parquet", "partition": [], "max_records_per_file": 0, "derived": [], "target_file_size": 0,
                      "records": records}  # fmt: skip
    return plan


@pytest.mark.parametrize("options", [ONE_PASS, OPTIONS], ids=["one_pass", "cached"])
def test_json_records_become_typed_columns_and_bad_ones_dead_letters(spark, kinesis, moto_endpoint, unique_name, tmp_path, options):
    create_stream(kinesis, unique_name, 2)
    good = [{"id": i, "name": f"n{i}", "tags": ["a", str(i)], "meta": {"score": i / 2}} for i in range(60)]
    bad = [b'{"id": "seven"}', b"not json", b'{"name": "no id"}', b"[1, 2]"]
    put_plain(kinesis, unique_name, [(f"k{i}", json.dumps(v).encode()) for i, v in enumerate(good)])
    put_plain(kinesis, unique_name, [(f"b{i}", data) for i, data in enumerate(bad)])
    records = RecordSettings("json", schema=json.dumps(JSON_SCHEMA), max_dead_letter_fraction=0.5).to_dict()
    result = job.run(spark, _typed_plan(kinesis, unique_name, tmp_path, records), None, _aws_env(moto_endpoint), options)
    assert result["records"] == 64 and sum(r["dead_letters"] for r in result["reports"]) == 4
    df = spark.read.parquet(result["output_location"])
    assert "data" not in df.columns and df.schema["meta"].dataType.simpleString() == "struct<score:double>"
    assert df.schema["tags"].dataType.simpleString() == "array<string>"
    rows = {r.id: (r.name, list(r.tags), r.meta.score) for r in df.collect()}
    assert rows == {v["id"]: (v["name"], v["tags"], v["meta"]["score"]) for v in good}
    dead = spark.read.parquet(result["quarantine_location"]).collect()
    assert sorted((bytes(d.data), d.error_kind) for d in dead) == sorted([
        (b'{"id": "seven"}', "wrong_type"), (b"not json", "malformed_payload"), (b'{"name": "no id"}', "wrong_type"),
        (b"[1, 2]", "wrong_type")])  # fmt: skip
    assert all(d.sequence_number and d.shard_id and d.reason for d in dead)


def test_registry_avro_records_decode_with_the_version_each_names(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    v1, v2, deleted = (str(uuid.uuid4()) for _ in range(3))
    at = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
    old = {"order_id": 1, "customer": "ann", "items": [{"sku": "x", "qty": 2}], "placed_at": at}
    new = {"order_id": 2, "customer": "bob", "items": [], "placed_at": at, "channel": "web"}
    put_plain(kinesis, unique_name, [
        ("a", gsr(v1) + _avro(ORDER_V1, old)),
        ("b", gsr(v2, compressed=True) + zlib.compress(_avro(ORDER_V2, new))),
        ("c", gsr(deleted) + _avro(ORDER_V1, old)),  # a version the registry no longer holds
        ("d", gsr(v1, compressed=True) + b"not zlib"),
        ("e", gsr(v1) + _avro(ORDER_V1, old)[:-3]),  # truncated
    ])  # fmt: skip
    records = {**RecordSettings("avro", registry={"schema_arn": "arn:aws:glue:r:1:schema/reg/orders"},
                                max_dead_letter_fraction=1.0).to_dict(),
               "versions": {v1: {"number": 1, "data_format": "AVRO", "definition": json.dumps(ORDER_V1)},
                            v2: {"number": 2, "data_format": "AVRO", "definition": json.dumps(ORDER_V2)}}}  # fmt: skip
    result = job.run(spark, _typed_plan(kinesis, unique_name, tmp_path, records), None, _aws_env(moto_endpoint), ONE_PASS)
    df = spark.read.parquet(result["output_location"])
    assert df.columns[-5:] == ["order_id", "customer", "items", "placed_at", "channel"]
    rows = sorted((r.order_id, r.customer, [(i.sku, i.qty) for i in r.items], r.placed_at, r.channel) for r in df.collect())
    naive = at.replace(tzinfo=None)  # the UTC session time zone, naive in Python
    assert rows == [(1, "ann", [("x", 2)], naive, None), (2, "bob", [], naive, "web")]
    dead = sorted((d.partition_key, d.error_kind) for d in spark.read.parquet(result["quarantine_location"]).collect())
    assert dead == [("c", "unknown_schema_version"), ("d", "bad_compression"), ("e", "malformed_payload")]


def test_protobuf_records_with_an_inline_descriptor(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet()
    proto = files.file.add(name="click.proto", package="demo", syntax="proto3")
    meta = proto.message_type.add(name="Meta")
    meta.field.add(name="browser", number=1, type=9, label=1)
    click = proto.message_type.add(name="Click")
    click.field.add(name="id", number=1, type=3, label=1)
    click.field.add(name="tags", number=2, type=9, label=3)
    click.field.add(name="meta", number=3, type=11, label=1, type_name=".demo.Meta")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.Click"))
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(str(i), cls(id=i, tags=["t"] * i, meta={"browser": f"b{i}"}).SerializeToString())
                                     for i in range(5)] + [("bad", b"\xff\xff\xff")])  # fmt: skip
    schema = base64.b64encode(files.SerializeToString()).decode()
    records = RecordSettings("protobuf", schema=schema, message="demo.Click", keep_raw_data=True, max_dead_letter_fraction=0.5).to_dict()
    result = job.run(spark, _typed_plan(kinesis, unique_name, tmp_path, records), None, _aws_env(moto_endpoint), ONE_PASS)
    df = spark.read.parquet(result["output_location"])
    assert "data" in df.columns  # keep_raw_data
    assert sorted((r.id, len(r.tags), r.meta.browser) for r in df.collect()) == [(i, i, f"b{i}") for i in range(5)]
    assert [d.error_kind for d in spark.read.parquet(result["quarantine_location"]).collect()] == ["malformed_payload"]
