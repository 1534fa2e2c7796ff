"""core.records: schemas to column types, the registry wire format, decoding and every dead-letter
kind, the settings' checks, and the registry's versions read from moto's Glue (over HTTP)."""

from __future__ import annotations

import base64
import io
import json
import uuid
import zlib
from datetime import date, datetime, timezone
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest

from airflow_kinesis_spark.core.records import (
    RecordDecoder,
    RecordSettings,
    decoded_schema,
    resolve_registry,
)
from airflow_kinesis_spark.core.record_schemas import parse_ddl, spark_type
from airflow_kinesis_spark.exceptions import TableCommitError
from demo.typed_producer import click_descriptor, encode_click, register_schemas, register_second_versions
from tests.conftest import make_client

def gsr(version_id: str, *, compressed: bool = False) -> bytes:
    """The AWS Glue Schema Registry header, written out from its documented layout (not the
    decoder's code): version byte 3, compression 5 (zlib) or 0, the version id's 16 bytes."""
    return bytes([3, 5 if compressed else 0]) + uuid.UUID(version_id).bytes


AVRO = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "attrs", "type": {"type": "map", "values": "int"}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}]}}},
    {"name": "again", "type": ["null", "Line"], "default": None},
]}  # fmt: skip


def avro_bytes(schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def test_avro_schema_becomes_nullable_typed_columns_with_named_types_and_logical_types():
    schema = decoded_schema(RecordSettings("avro", schema=json.dumps(AVRO)).to_dict())
    assert [(f.name, str(f.type)) for f in schema] == [
        ("id", "int64"), ("note", "string"), ("day", "date32[day]"), ("at", "timestamp[us, tz=UTC]"),
        ("price", "decimal128(9, 2)"), ("kind", "string"), ("attrs", "map<string, int32>"),
        ("lines", "list<item: struct<sku: string>>"), ("again", "struct<sku: string>"),
    ]  # fmt: skip
    assert all(f.nullable for f in schema)
    assert spark_type(schema.field("lines").type) == "array<struct<`sku`:string>>"


def test_avro_records_decode_with_every_type():
    value = {"id": 7, "note": None, "day": date(2026, 11, 1), "at": datetime(2026, 11, 1, 1, 2, 3, 4, tzinfo=timezone.utc),
             "price": Decimal("12.50"), "kind": "B", "attrs": {"x": 1}, "lines": [{"sku": "s"}], "again": {"sku": "t"}}  # fmt: skip
    decoder = RecordDecoder(RecordSettings("avro", schema=json.dumps(AVRO)).to_dict())
    out = decoder.decode([avro_bytes(AVRO, value), avro_bytes(AVRO, value) + b"trailing", b"\x02"])
    row = {f.name: c[0].as_py() for f, c in zip(decoder.schema, out.columns)}
    assert row == {**value, "attrs": [("x", 1)]}
    assert out.kinds == [None, "malformed_payload", "malformed_payload"] and out.dead_letters == 2
    assert "ends at byte" in out.messages[1]
    assert all(c[1].as_py() is None and c[2].as_py() is None for c in out.columns)  # a dead letter has no values


# Every Avro type polars' reader takes (all but ``map``), nested in records, arrays and unions.
AVRO_PAGE = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "n", "type": "int"}, {"name": "f", "type": "float"}, {"name": "ok", "type": "boolean"},
    {"name": "blob", "type": "bytes"}, {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": ["null", "int"]}]}}},
    {"name": "again", "type": ["null", "Line"], "default": None},
]}  # fmt: skip


def page_value(i: int) -> dict:
    return {"id": i, "n": -i, "f": i / 4, "ok": i % 2 == 0, "blob": bytes([i % 256]) * (i % 5), "code": b"abc",
            "note": None if i % 3 else f"note {i}", "day": date(2026, 11, 1 + i % 28),
            "at_ms": datetime(2026, 11, 1, 1, 2, 3, (i % 1000) * 1000, tzinfo=timezone.utc),
            "at": datetime(2026, 11, 1, 1, 2, 3, i % 1_000_000, tzinfo=timezone.utc), "local": 1_700_000_000_000 + i,
            "clock": 3_600_000 + i, "ref": str(uuid.UUID(int=i)), "price": Decimal(i) / 100, "kind": "AB"[i % 2],
            "lines": [{"sku": f"s{i}-{j}", "qty": None if j else j} for j in range(i % 4)],
            "again": None if i % 2 else {"sku": "t", "qty": 1}}  # fmt: skip


def fastavro_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_kinesis_spark.core.record_decoders as decoders

    monkeypatch.setattr(decoders, "_avro_page_reader", lambda schema, struct: None)


def test_avro_pages_through_polars_equal_fastavro_record_by_record(monkeypatch):
    from airflow_kinesis_spark.core.record_decoders import _avro_page_reader

    spec = RecordSettings("avro", schema=json.dumps(AVRO_PAGE)).to_dict()
    decoder = RecordDecoder(spec)
    assert _avro_page_reader(spec["schema"], pa.struct(list(decoder.schema))) is not None  # polars reads this schema
    records = [avro_bytes(AVRO_PAGE, page_value(i)) for i in range(300)]
    paged = decoder.decode(records)
    fastavro_only(monkeypatch)
    one_by_one = RecordDecoder(spec).decode(records)
    assert paged.dead_letters == one_by_one.dead_letters == 0
    for f, a, b in zip(decoder.schema, paged.columns, one_by_one.columns):
        assert a.equals(b), f.name
    row = {f.name: c[7].as_py() for f, c in zip(decoder.schema, paged.columns)}
    assert row["local"] == 1_700_000_000_007 and row["clock"] == 3_600_007 and row["ref"] == str(uuid.UUID(int=7))
    assert row["kind"] == "B" and row["price"] == Decimal("0.07") and row["lines"][1] == {"sku": "s7-1", "qty": None}


def test_a_named_type_used_twice_beside_a_type_named_like_its_copy_decodes_through_polars():
    """polars resolves no named-type reference, so a second use of ``Line`` is copied under a
    name of its own; with a type of the schema already called ``Line_2``, picking that name
    looped forever (the suffix was the count of names seen, which did not change)."""
    from airflow_kinesis_spark.core.record_decoders import _avro_page_reader

    schema = {"type": "record", "name": "R", "fields": [
        {"name": "x", "type": {"type": "record", "name": "Line", "fields": [{"name": "a", "type": "int"}]}},
        {"name": "z", "type": {"type": "record", "name": "Line_2", "fields": [{"name": "b", "type": "int"}]}},
        {"name": "y", "type": "Line"}]}  # fmt: skip
    spec = RecordSettings("avro", schema=json.dumps(schema)).to_dict()
    decoder = RecordDecoder(spec)
    assert _avro_page_reader(spec["schema"], pa.struct(list(decoder.schema))) is not None
    out = decoder.decode([avro_bytes(schema, {"x": {"a": i}, "z": {"b": -i}, "y": {"a": 2 * i}}) for i in range(3)])
    assert out.dead_letters == 0 and out.columns[2].to_pylist() == [{"a": 0}, {"a": 2}, {"a": 4}]


@pytest.mark.parametrize("polars", [True, False], ids=["polars pages", "fastavro only"])
def test_avro_dead_letters_in_a_page_are_the_same_whichever_reader_decodes_it(monkeypatch, polars):
    """A datum with bytes after it, one cut short, and one of another schema: polars' page read
    cannot take the page whole (its end-of-datum markers say so), fastavro names each failure."""
    if not polars:
        fastavro_only(monkeypatch)
    decoder = RecordDecoder(RecordSettings("avro", schema=json.dumps(AVRO_PAGE)).to_dict())
    good = [avro_bytes(AVRO_PAGE, page_value(i)) for i in range(6)]
    other = avro_bytes({"type": "record", "name": "X", "fields": [{"name": "x", "type": "string"}]}, {"x": "hello"})
    out = decoder.decode([good[0], good[1] + b"\x02\x04", good[2], good[3][:-2], good[4], other, good[5]])
    assert out.kinds == [None, "malformed_payload", None, "malformed_payload", None, "malformed_payload", None]
    assert out.columns[0].to_pylist() == [0, None, 2, None, 4, None, 5]
    again = decoder.decode(good)  # the next page: polars again (a page with failures does not turn it off)
    assert again.dead_letters == 0 and again.columns[0].to_pylist() == list(range(6))


def test_avro_time_and_local_timestamp_columns_hold_the_written_numbers():
    """fastavro turns these logical types into datetime.time and naive datetimes, which the
    columns (int and bigint) cannot hold: every such record was a dead letter."""
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "clock_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}}]}  # fmt: skip
    decoder = RecordDecoder(RecordSettings("avro", schema=json.dumps(schema)).to_dict())
    out = decoder.decode([avro_bytes(schema, {"clock": 5, "clock_us": 6, "local": 7})])
    assert out.dead_letters == 0 and [c[0].as_py() for c in out.columns] == [5, 6, 7]
    assert [str(f.type) for f in decoder.schema] == ["int32", "int64", "int64"]


def test_unsupported_avro_union_and_reserved_names_are_refused_when_the_task_is_built():
    union = {"type": "record", "name": "R", "fields": [{"name": "x", "type": ["int", "string"]}]}
    with pytest.raises(ValueError, match=r"Avro field x: a union .* has no one column type"):
        RecordSettings("avro", schema=json.dumps(union))
    taken = {"type": "record", "name": "R", "fields": [{"name": "shard_id", "type": "string"}]}
    with pytest.raises(ValueError, match=r"\['shard_id'\] have the names of the provider's metadata columns"):
        RecordSettings("avro", schema=json.dumps(taken))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"format": "xml"}, "RecordSettings.format must be one of raw, json, avro, protobuf"),
    ({"format": "json"}, r"RecordSettings\(format='json'\) needs a schema: schema \(inline\) or registry"),
    ({"format": "json", "schema": "id bigint", "registry": {"registry_name": "r", "schema_name": "s"}}, "one of the two"),
    ({"format": "avro", "registry": {"registry": "r"}}, "RecordSettings.registry must be"),
    ({"format": "protobuf", "registry": {"schema_arn": "arn"}}, "takes its schema inline"),
    ({"format": "protobuf", "schema": "AAAA"}, r"RecordSettings\(format='protobuf'\) needs message"),
    ({"format": "raw", "keep_raw_data": True}, "RecordSettings.schema, message, registry and keep_raw_data apply to format 'json', 'avro' or 'protobuf'"),
    ({"format": "json", "schema": "id bigint", "max_dead_letter_fraction": 2}, "RecordSettings.max_dead_letter_fraction must be a number from 0 to 1"),
    ({"format": "json", "schema": "id bigint, x frob"}, "unknown type 'frob'"),
    ({"format": "json", "schema": '{"type": "object", "properties": {"x": {}}}'}, "JSON Schema field x: type None"),
    ({"format": "protobuf", "schema": "not base64!", "message": "a.B"}, "base64 of a serialized FileDescriptorSet"),
])  # fmt: skip
def test_settings_name_the_mistake(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RecordSettings(**kwargs)


def test_spark_ddl_parses_nested_types():
    struct = parse_ddl("id bigint, `odd name` string, tags array<string>, m map<string, array<int>>, "
                       "s struct<a: int, b: decimal(10, 2)>, d date, t timestamp, f double, v varchar(9)")  # fmt: skip
    assert str(struct) == ("struct<id: int64, odd name: string, tags: list<item: string>, m: map<string, list<item: int32>>, "
                           "s: struct<a: int32, b: decimal128(10, 2)>, d: date32[day], t: timestamp[us, tz=UTC], f: double, "
                           "v: string>")  # fmt: skip


JSON_SCHEMA = {"type": "object", "required": ["id"], "properties": {
    "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
    "tags": {"type": ["array", "null"], "items": {"type": "string"}},
    "m": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}  # fmt: skip


def test_json_decodes_strictly_and_every_failure_is_a_dead_letter_of_its_kind():
    decoder = RecordDecoder(RecordSettings("json", schema=json.dumps(JSON_SCHEMA)).to_dict())
    records = [b'{"id": 1, "at": "2026-11-27T10:00:00Z", "tags": ["a"], "m": {"ok": true}, "extra": 5}',
               b'{"id":\n 2}',  # a newline in a pretty-printed record is whitespace
               b'{"id": 1.5}', b'{"id": 3, "m": {"ok": 1}}', b'{"tags": []}', b'{"id": 4', b"", b'"text"', b'{"id": 5}{"id": 6}']  # fmt: skip
    out = decoder.decode(records)
    ids = out.columns[0].to_pylist()
    assert ids[:2] == [1, 2] and out.columns[1][0].as_py() == datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
    assert out.columns[3][0].as_py() == {"ok": True}
    assert out.kinds == [None, None, "wrong_type", "wrong_type", "wrong_type", "malformed_payload", "malformed_payload",
                         "wrong_type", "malformed_payload"]  # fmt: skip
    assert "required field 'id'" in out.messages[4]
    assert ids[2:] == [None] * 7


def test_registry_records_decode_by_the_version_each_names_and_bad_headers_are_dead_letters():
    v1 = {"type": "object", "properties": {"id": {"type": "integer"}}}
    v2 = {"type": "object", "properties": {"id": {"type": "integer"}, "coupon": {"type": "string"}}}
    one, two, gone = (str(uuid.uuid4()) for _ in range(3))
    spec = {**RecordSettings("json", registry={"registry_name": "r", "schema_name": "s"}).to_dict(),
            "versions": {one: {"number": 1, "data_format": "JSON", "definition": json.dumps(v1)},
                         two: {"number": 2, "data_format": "JSON", "definition": json.dumps(v2)}}}  # fmt: skip
    decoder = RecordDecoder(spec)
    assert decoder.schema.names == ["id", "coupon"]
    records = [gsr(two, compressed=True) + zlib.compress(b'{"id": 2, "coupon": "X"}'),
               gsr(one) + b'{"id": 1, "coupon": "ignored: not a field of version 1"}',
               gsr(gone) + b'{"id": 3}', gsr(one, compressed=True) + b"plain",
               bytes([3, 9]) + uuid.UUID(one).bytes + b"{}", b'{"id": 4}', bytes([3, 0, 1])]  # fmt: skip
    out = decoder.decode(records)
    assert out.columns[0].to_pylist()[:2] == [2, 1] and out.columns[1].to_pylist()[:2] == ["X", None]
    assert out.kinds[2:] == ["unknown_schema_version", "bad_compression", "bad_compression", "malformed_payload", "malformed_payload"]


def test_registry_versions_that_retype_a_field_are_refused_naming_it():
    v1 = {"type": "record", "name": "R", "fields": [{"name": "amount", "type": "long"}]}
    v2 = {"type": "record", "name": "R", "fields": [{"name": "amount", "type": "string"}]}
    spec = {**RecordSettings("avro", registry={"schema_arn": "arn"}).to_dict(),
            "versions": {"a": {"number": 1, "data_format": "AVRO", "definition": json.dumps(v1)},
                         "b": {"number": 2, "data_format": "AVRO", "definition": json.dumps(v2)}}}  # fmt: skip
    with pytest.raises(TableCommitError, match=r"field 'amount': earlier versions .* give it type int64, version 2 gives string"):
        decoded_schema(spec)


def test_protobuf_from_an_inline_descriptor():
    schema, message = click_descriptor()
    decoder = RecordDecoder(RecordSettings("protobuf", schema=schema, message=message).to_dict())
    value = {"id": 9, "page": "/cart", "tags": ["a", "b"], "meta": {"browser": "firefox", "width": 1280}}
    out = decoder.decode([encode_click(value), encode_click({"id": 1}), b"\x0a\xff\xff\xff\xff"])
    rows = [dict(zip(decoder.schema.names, r)) for r in zip(*(c.to_pylist() for c in out.columns))]
    assert rows[0] == value
    assert rows[1] == {"id": 1, "page": "", "tags": [], "meta": None}  # proto3: scalars default, an unset message is null
    assert out.kinds == [None, None, "malformed_payload"]
    with pytest.raises(ValueError, match=r"RecordSettings.message 'demo.Nope' is not in the descriptor set \(messages: demo.Meta, demo.Click\)"):
        RecordSettings("protobuf", schema=schema, message="demo.Nope")
    assert RecordSettings("protobuf", schema=schema, message=message).to_dict()["schema"] == schema  # stored as given


def test_resolve_registry_reads_every_available_version_from_glue(moto_endpoint, unique_name):
    glue = make_client("glue", moto_endpoint)
    schemas = register_second_versions(glue, register_schemas(glue, registry_name=unique_name))
    settings = RecordSettings("avro", registry={"registry_name": unique_name, "schema_name": "orders-avro"})
    spec = resolve_registry(glue, settings)
    assert {v["number"]: vid for vid, v in spec["versions"].items()} == {1: schemas.avro.version_id(1), 2: schemas.avro.version_id(2)}
    assert "channel" in decoded_schema(spec).names
    by_arn = resolve_registry(glue, RecordSettings("avro", registry={"schema_arn": schemas.avro.arn}))
    assert by_arn["versions"] == spec["versions"]
    with pytest.raises(ValueError, match=r"holds JSON schemas, but the task's RecordSettings.format is 'avro'"):
        resolve_registry(glue, RecordSettings("avro", registry={"registry_name": unique_name, "schema_name": "orders-json"}))
    assert pa.types.is_timestamp(decoded_schema(spec).field("placed_at").type)


def test_protobuf_enums_maps_unsigned_integers_and_timestamps_have_their_documented_columns():
    """docs/typed-records.md: enums become their names, google.protobuf.Timestamp a timestamp, maps
    map columns, uint32 -> bigint, uint64 -> decimal(20,0)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    files = descriptor_pb2.FileDescriptorSet()
    timestamp_pb2.DESCRIPTOR.CopyToProto(files.file.add())
    proto = files.file.add(name="kinds.proto", package="t", syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    proto.enum_type.add(name="Kind", value=[descriptor_pb2.EnumValueDescriptorProto(name="A", number=0),
                                            descriptor_pb2.EnumValueDescriptorProto(name="B", number=1)])  # fmt: skip
    entry = proto.message_type.add(name="Row").nested_type.add(name="TagsEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=9, label=1)
    entry.field.add(name="value", number=2, type=5, label=1)
    row = proto.message_type[0]
    row.field.add(name="kind", number=1, type=14, label=1, type_name=".t.Kind")
    row.field.add(name="tags", number=2, type=11, label=3, type_name=".t.Row.TagsEntry")
    row.field.add(name="small", number=3, type=13, label=1)  # uint32
    row.field.add(name="big", number=4, type=4, label=1)  # uint64
    row.field.add(name="at", number=5, type=11, label=1, type_name=".google.protobuf.Timestamp")
    schema = base64.b64encode(files.SerializeToString()).decode()
    decoder = RecordDecoder(RecordSettings("protobuf", schema=schema, message="t.Row").to_dict())
    assert {f.name: spark_type(f.type) for f in decoder.schema} == {
        "kind": "string", "tags": "map<string,int>", "small": "bigint", "big": "decimal(20,0)", "at": "timestamp"}
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Row"))
    value = cls(kind=1, tags={"x": 7}, small=4_000_000_000, big=2**64 - 1)
    value.at.FromDatetime(datetime(2026, 11, 27, 12, 0, 1, tzinfo=timezone.utc))
    out = decoder.decode([value.SerializeToString()])
    row_value = {f.name: c[0].as_py() for f, c in zip(decoder.schema, out.columns)}
    assert out.kinds == [None]
    assert row_value == {"kind": "B", "tags": [("x", 7)], "small": 4_000_000_000, "big": Decimal(2**64 - 1),
                         "at": datetime(2026, 11, 27, 12, 0, 1, tzinfo=timezone.utc)}  # fmt: skip
