"""Typed test records for decoding by schema: Glue Schema Registry JSON and Avro, plain protobuf.

The demos and tests of decoding records by schema in the Spark job put records through this
module and compare what the job decoded with what was produced. It covers three kinds:

* ``"json"``: JSON documents in the AWS Glue Schema Registry (GSR) wire format (an 18-byte
  header naming the schema version, then the payload, zlib-compressed or not);
* ``"avro"``: Avro binary (``fastavro.schemaless_writer``) in the same wire format;
* ``"protobuf"``: plain protobuf messages (``demo.Click``) with no header; the decoder gets the
  message's descriptor inline, from ``click_descriptor()``.

The schemas are registered in moto's Glue Schema Registry (``register_schemas``,
``register_second_versions``). Among the good records go broken ones, each labelled with how it
is broken, for the job's handling of records it cannot decode to be checked as well.

moto 5.2 serves CreateRegistry, CreateSchema, RegisterSchemaVersion, GetSchemaVersion,
GetSchemaByDefinition, GetSchema, UpdateSchema, DeleteSchema and DeleteRegistry, but neither
ListSchemaVersions nor DeleteSchemaVersions (both answer HTTP 500, which boto3 retries four
times). So nothing here lists versions: the version ids are kept from the calls that registered
them. ``delete_schema_version_on_moto`` removes a version from an in-process moto's state
instead of calling DeleteSchemaVersions.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import fastavro
from botocore.exceptions import ClientError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

# ---------------------------------------------------------------------------------------------
# The GSR wire format
# ---------------------------------------------------------------------------------------------

#: Byte 0 of a GSR record: the header version.
GSR_HEADER_VERSION = 3
#: Byte 1 of a GSR record: the payload is zlib-compressed.
GSR_COMPRESSION_ZLIB = 5
#: Byte 1 of a GSR record: the payload is not compressed.
GSR_COMPRESSION_NONE = 0
#: Bytes before the payload: header version, compression, the schema version id's 16 bytes.
GSR_HEADER_LENGTH = 18


def gsr_encode(payload: bytes, version_id: str, *, compress: bool) -> bytes:
    """A record in the Glue Schema Registry wire format.

    :param payload: the serialized value (JSON text as UTF-8, or Avro binary).
    :param version_id: the schema version id, a UUID string (``"1b4e28ba-2fa1-11d2-..."``).
    :param compress: zlib-compress the payload (``zlib.compress``, the zlib format with its
        2-byte header and Adler-32 trailer) and say so in byte 1.
    :return: 18 header bytes, then the payload: byte 0 = 3 (header version), byte 1 = 5
        (zlib) or 0 (none), bytes 2..17 = ``uuid.UUID(version_id).bytes`` (big-endian, as the
        UUID is written), bytes 18.. = the payload, compressed when ``compress``.
    """
    body = zlib.compress(payload) if compress else payload
    flag = GSR_COMPRESSION_ZLIB if compress else GSR_COMPRESSION_NONE
    return bytes((GSR_HEADER_VERSION, flag)) + uuid.UUID(version_id).bytes + body


# ---------------------------------------------------------------------------------------------
# Schemas in the Glue Schema Registry
# ---------------------------------------------------------------------------------------------

JSON_SCHEMA_NAME = "orders-json"
AVRO_SCHEMA_NAME = "orders-avro"
#: Compatibility of both schemas: a new version must read the data of the one before it. moto
#: takes the setting but checks nothing (it registers any definition that parses as JSON).
COMPATIBILITY = "BACKWARD"

#: ``orders-json`` version 1: a JSON Schema (draft-07) of an order. ``placed_at`` is an RFC 3339
#: date-time string, ``amount`` a number (currency units, 2 decimals in produced records).
JSON_SCHEMA_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
        "placed_at": {"type": "string", "format": "date-time"},
    },
    "required": ["order_id", "customer"],
}

#: ``orders-json`` version 2: version 1 and an optional ``coupon`` (string).
JSON_SCHEMA_V2: dict[str, Any] = {
    **JSON_SCHEMA_V1,
    "properties": {**JSON_SCHEMA_V1["properties"], "coupon": {"type": "string"}},
}

#: ``orders-avro`` version 1: record ``Order``. ``placed_at`` is a long of milliseconds since the
#: Unix epoch (``timestamp-millis``; fastavro reads it as an aware UTC datetime).
AVRO_SCHEMA_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {
            "name": "items",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Item",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

#: ``orders-avro`` version 2: version 1 and ``channel`` (``["null", "string"]``, default null),
#: so a version 2 reader reads version 1 data (``channel`` None).
AVRO_SCHEMA_V2: dict[str, Any] = {
    **AVRO_SCHEMA_V1,
    "fields": [*AVRO_SCHEMA_V1["fields"], {"name": "channel", "type": ["null", "string"], "default": None}],
}

_DEFINITIONS = {
    (JSON_SCHEMA_NAME, 1): JSON_SCHEMA_V1,
    (JSON_SCHEMA_NAME, 2): JSON_SCHEMA_V2,
    (AVRO_SCHEMA_NAME, 1): AVRO_SCHEMA_V1,
    (AVRO_SCHEMA_NAME, 2): AVRO_SCHEMA_V2,
}


def schema_definition(schema_name: str, version: int) -> str:
    """The definition registered as ``version`` (1 or 2) of ``schema_name``, as the registry holds it (JSON text)."""
    return json.dumps(_DEFINITIONS[(schema_name, version)], sort_keys=True)


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema of the registry and the versions registered through this module."""

    name: str
    arn: str
    #: ``"JSON"`` or ``"AVRO"``.
    data_format: str
    #: Version number (1, 2) -> schema version id (a UUID string).
    version_ids: dict[int, str]

    def version_id(self, version: int) -> str:
        """The id of ``version``; KeyError when it was not registered through this module."""
        return self.version_ids[version]

    def definition(self, version: int) -> str:
        """The definition of ``version`` (JSON text), as registered."""
        return schema_definition(self.name, version)


@dataclass(frozen=True)
class TypedSchemas:
    """The registry and its two schemas: ``json`` (``orders-json``) and ``avro`` (``orders-avro``)."""

    registry_name: str
    registry_arn: str
    json: RegisteredSchema
    avro: RegisteredSchema

    def schema(self, kind: str) -> RegisteredSchema:
        """The schema of a GSR kind, ``"json"`` or ``"avro"``."""
        if kind not in ("json", "avro"):
            raise ValueError(f"no registry schema for kind {kind!r}")
        return self.json if kind == "json" else self.avro


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _wait_available(glue: Any, version_id: str, timeout: float = 30.0) -> None:
    """Wait for a new schema version to be AVAILABLE (Glue checks compatibility in the background;
    moto answers AVAILABLE at once)."""
    deadline = time.monotonic() + timeout
    while True:
        status = glue.get_schema_version(SchemaVersionId=version_id)["Status"]
        if status == "AVAILABLE":
            return
        if status == "FAILURE" or time.monotonic() > deadline:
            raise RuntimeError(f"schema version {version_id} is {status}")
        time.sleep(0.2)


def _create_schema(glue: Any, registry_name: str, name: str, data_format: str) -> RegisteredSchema:
    definition = schema_definition(name, 1)
    schema_id = {"RegistryName": registry_name, "SchemaName": name}
    try:
        response = glue.create_schema(
            RegistryId={"RegistryName": registry_name},
            SchemaName=name,
            DataFormat=data_format,
            Compatibility=COMPATIBILITY,
            SchemaDefinition=definition,
        )
        arn, version_id = response["SchemaArn"], response["SchemaVersionId"]
    except ClientError as error:
        if _error_code(error) != "AlreadyExistsException":
            raise
        # Registered before (a demo run again against the same moto): the version of this
        # definition; EntityNotFoundException when the schema holds other definitions only.
        found = glue.get_schema_by_definition(SchemaId=schema_id, SchemaDefinition=definition)
        arn, version_id = found["SchemaArn"], found["SchemaVersionId"]
    return RegisteredSchema(name=name, arn=arn, data_format=data_format, version_ids={1: version_id})


def register_schemas(glue: Any, registry_name: str = "demo-registry") -> TypedSchemas:
    """Create the registry and version 1 of ``orders-json`` (JSON) and ``orders-avro`` (AVRO).

    Compatibility ``BACKWARD`` for both. A registry or schema that exists already is kept (the
    registry's ARN is then read with GetRegistry, the version id found by its definition with
    GetSchemaByDefinition), so a demo can run twice against one moto.

    :param glue: a boto3 Glue client (moto's endpoint, or AWS).
    :param registry_name: the registry; moto holds at most 10 registries per account and region.
    :return: both schemas' names, ARNs and ``version_ids == {1: <uuid>}``.
    """
    try:
        registry_arn = glue.create_registry(RegistryName=registry_name)["RegistryArn"]
    except ClientError as error:
        if _error_code(error) != "AlreadyExistsException":
            raise
        registry_arn = glue.get_registry(RegistryId={"RegistryName": registry_name})["RegistryArn"]
    return TypedSchemas(
        registry_name=registry_name,
        registry_arn=registry_arn,
        json=_create_schema(glue, registry_name, JSON_SCHEMA_NAME, "JSON"),
        avro=_create_schema(glue, registry_name, AVRO_SCHEMA_NAME, "AVRO"),
    )


def register_second_versions(glue: Any, schemas: TypedSchemas) -> TypedSchemas:
    """Register version 2 of both schemas (RegisterSchemaVersion) and wait until they are AVAILABLE.

    ``orders-json`` v2 adds the optional ``coupon`` (string); ``orders-avro`` v2 adds ``channel``
    (``["null", "string"]``, default null). Registering a definition the schema already holds
    returns that version (Glue and moto both), so calling this twice is harmless.

    :return: a copy of ``schemas`` whose schemas' ``version_ids`` also hold 2 (the input is not
        changed).
    """
    updated = {}
    for kind in ("json", "avro"):
        schema = schemas.schema(kind)
        response = glue.register_schema_version(
            SchemaId={"RegistryName": schemas.registry_name, "SchemaName": schema.name},
            SchemaDefinition=schema.definition(2),
        )
        if response["VersionNumber"] != 2:
            raise RuntimeError(f"{schema.name}: the second definition registered as version {response['VersionNumber']}")
        _wait_available(glue, response["SchemaVersionId"])
        updated[kind] = dataclasses.replace(schema, version_ids={**schema.version_ids, 2: response["SchemaVersionId"]})
    return dataclasses.replace(schemas, **updated)


#: The account moto answers for when the caller's credentials name none (moto's default).
MOTO_ACCOUNT_ID = "123456789012"


def delete_schema_version_on_moto(
    backend: Any,
    registry_name: str,
    schema_name: str,
    version_number: int,
    *,
    account_id: str = MOTO_ACCOUNT_ID,
    region: str = "us-east-1",
) -> str:
    """Remove one schema version from the state of a moto running in THIS process.

    Stands in for Glue's DeleteSchemaVersions, which moto (5.2) does not serve: a test that
    needs a registered version to disappear (records naming a version the registry no longer
    has) removes it here; GetSchemaVersion then fails with EntityNotFoundException, by id and by
    number. It works only when moto runs in the caller's process: ``moto.server.ThreadedMotoServer``
    or ``moto.mock_aws``, whose state is ``moto.backends.get_backend("glue")``. A moto server in
    another process (``demo/moto_server.py``, as ``demo.stack.moto_server`` and the tests'
    ``moto_endpoint`` fixture start it) keeps its state there, and no HTTP call of moto removes
    one version (DeleteSchema removes the schema with all of them): an endpoint URL is refused
    with TypeError.

    As DeleteSchemaVersions does, it refuses the schema's checkpoint version (moto keeps the
    checkpoint at version 1; Glue deletes the first version only with DeleteSchema). moto keeps
    schema versions in ``GlueBackend.registries[registry].schemas[schema].schema_versions``
    (schema version id -> ``FakeSchemaVersion``, with ``version_number``); this removes the entry
    and lowers the backend's version count. When the latest version is removed, the schema's
    latest becomes the highest version left. (moto's RegisterSchemaVersion moves the latest up
    by one from there while numbering the new version from NextSchemaVersion, so register new
    versions before removing the latest one, not after.) Call it between requests, not while
    the server answers a Glue call.

    :param backend: ``moto.backends.get_backend("glue")`` (indexed with ``account_id`` and
        ``region``), a GlueBackend taken from it, or None for the former.
    :param version_number: the version to remove (2, 3, ...).
    :return: the removed version's id.
    """
    if isinstance(backend, str):
        raise TypeError(
            "delete_schema_version_on_moto needs moto's in-process backend, not an endpoint: "
            "moto serves no DeleteSchemaVersions, and a moto server in another process keeps its state there"
        )
    if backend is None:
        from moto.backends import get_backend

        backend = get_backend("glue")
    if not hasattr(backend, "registries"):
        backend = backend[account_id][region]
    try:
        schema = backend.registries[registry_name].schemas[schema_name]
    except KeyError:
        raise LookupError(f"moto holds no schema {schema_name!r} in registry {registry_name!r} ({account_id}, {region})") from None
    if version_number == schema.schema_checkpoint:
        raise ValueError(f"version {version_number} of {schema_name} is the schema's checkpoint; DeleteSchemaVersions refuses it")
    for version_id, version in list(schema.schema_versions.items()):
        if version.version_number == version_number:
            del schema.schema_versions[version_id]
            backend.num_schema_versions -= 1
            if schema.latest_schema_version == version_number:
                schema.latest_schema_version = max(v.version_number for v in schema.schema_versions.values())
            return version_id
    raise LookupError(f"{schema_name} has no version {version_number} in moto")


# ---------------------------------------------------------------------------------------------
# Protobuf: demo.Click with an inline descriptor
# ---------------------------------------------------------------------------------------------

CLICK_MESSAGE = "demo.Click"
_CLICK_FILE = "demo/click.proto"


@cache
def _click_descriptor_set() -> bytes:
    field_type = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name=_CLICK_FILE, package="demo", syntax="proto3")
    meta = proto.message_type.add(name="Meta")
    meta.field.add(name="browser", number=1, type=field_type.TYPE_STRING, label=field_type.LABEL_OPTIONAL, json_name="browser")
    meta.field.add(name="width", number=2, type=field_type.TYPE_INT32, label=field_type.LABEL_OPTIONAL, json_name="width")
    click = proto.message_type.add(name="Click")
    click.field.add(name="id", number=1, type=field_type.TYPE_INT64, label=field_type.LABEL_OPTIONAL, json_name="id")
    click.field.add(name="page", number=2, type=field_type.TYPE_STRING, label=field_type.LABEL_OPTIONAL, json_name="page")
    click.field.add(name="tags", number=3, type=field_type.TYPE_STRING, label=field_type.LABEL_REPEATED, json_name="tags")
    click.field.add(
        name="meta", number=4, type=field_type.TYPE_MESSAGE, label=field_type.LABEL_OPTIONAL, type_name=".demo.Meta", json_name="meta"
    )
    return descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString()


def click_descriptor() -> tuple[str, str]:
    """The protobuf descriptor of ``demo.Click``, built with ``descriptor_pb2`` (no protoc).

    The file ``demo/click.proto`` (proto3, package ``demo``)::

        message Meta { string browser = 1; int32 width = 2; }
        message Click { int64 id = 1; string page = 2; repeated string tags = 3; Meta meta = 4; }

    :return: (standard base64, with padding, of a serialized ``google.protobuf.FileDescriptorSet``
        holding that one file; the message's full name ``"demo.Click"``).
    """
    return base64.b64encode(_click_descriptor_set()).decode("ascii"), CLICK_MESSAGE


@cache
def _click_class() -> type[Message]:
    # From the serialized set, as a decoder given click_descriptor() builds it; a pool of its
    # own, so the default pool (and any other demo.Click in it) is not touched.
    files = descriptor_pb2.FileDescriptorSet.FromString(_click_descriptor_set())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(CLICK_MESSAGE))


def encode_click(value: dict) -> bytes:
    """Serialize ``value`` as a ``demo.Click``.

    :param value: ``{"id": int (int64), "page": str, "tags": [str, ...], "meta": {"browser": str,
        "width": int (int32, pixels)}}``; every key optional, any other key is a ValueError.
    :return: the protobuf wire encoding (fields in field-number order).
    """
    value = dict(value)
    meta = value.pop("meta", None)
    message = _click_class()(**value)
    if meta is not None:
        message.meta.CopyFrom(type(message.meta)(**meta))
    return message.SerializeToString()


# ---------------------------------------------------------------------------------------------
# Producing
# ---------------------------------------------------------------------------------------------

KINDS = ("json", "avro", "protobuf")
#: How a broken record is broken (``BrokenRecord.kind``).
BROKEN_KINDS = ("malformed_payload", "bad_compression", "unknown_schema_version", "wrong_type")
#: PutRecords takes at most 500 records per call.
PUT_RECORDS_MAX = 500
#: PutRecords calls per chunk before records that keep failing are an error.
PUT_ATTEMPTS = 10

#: The breakages of each kind, in the order broken records cycle through them:
#: (``BrokenRecord.kind``, ``BrokenRecord.detail``).
BREAKAGES = {
    "json": (
        ("malformed_payload", "garbage"),
        ("bad_compression", "not_zlib"),
        ("unknown_schema_version", "random_uuid"),
        ("wrong_type", "customer_is_number"),
    ),
    # An Avro writer cannot put a value of the wrong type, so the fourth is a payload cut short.
    "avro": (
        ("malformed_payload", "garbage"),
        ("bad_compression", "not_zlib"),
        ("unknown_schema_version", "random_uuid"),
        ("malformed_payload", "truncated"),
    ),
    # Protobuf parsers take a field of another wire type as an unknown field, not as an error.
    "protobuf": (
        ("malformed_payload", "garbage"),
        ("malformed_payload", "truncated"),
    ),
}

_CUSTOMERS = ("alice", "bob", "chloé", "dmitri", "eve", "fatima", "günter", "hiro")
_COUPONS = ("SPRING10", "WELCOME", "FREESHIP", "VIP25")
_CHANNELS = ("web", "mobile", "store")
_PAGES = ("/", "/cart", "/checkout", "/search", "/product/42", "/help")
_TAGS = ("promo", "new", "returning", "ab-test", "mobile")
_BROWSERS = ("firefox", "chrome", "safari", "edge")
#: Produced ``placed_at`` values lie in the 30 days from this instant.
_EPOCH = datetime(2024, 5, 1, tzinfo=UTC)


@dataclass(frozen=True)
class BrokenRecord:
    """A record put to be rejected by a decoder."""

    shard_id: str
    sequence_number: str
    #: One of ``BROKEN_KINDS``.
    kind: str
    #: How, more closely: ``"garbage"`` (bytes no decoder reads), ``"truncated"`` (a good
    #: encoding cut short), ``"not_zlib"`` (compression byte 5, payload the plain encoding),
    #: ``"random_uuid"`` (a version id the registry does not have; payload good),
    #: ``"customer_is_number"`` (JSON valid, but ``customer`` a number).
    detail: str
    partition_key: str
    #: The Kinesis record's data, as put.
    data: bytes


@dataclass
class Produced:
    """What ``produce_typed`` put."""

    kind: str
    #: The schema version of the good records (1 for protobuf).
    version: int
    #: Order or click id -> the value as a Python dict: what the writer's schema version holds.
    #: JSON: ``placed_at`` an RFC 3339 string (``"2024-05-03T10:11:12.345Z"``), ``amount`` a
    #: float; version 2 adds ``coupon``. Avro: ``placed_at`` an aware UTC datetime (whole
    #: milliseconds), version 2 adds ``channel``. Protobuf: the ``encode_click`` dict.
    good: dict[int, dict] = field(default_factory=dict)
    #: Id -> (shard id, sequence number) of its Kinesis record.
    good_positions: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: Ids of the good GSR records whose payload is zlib-compressed.
    compressed: set[int] = field(default_factory=set)
    #: The broken records, in the order they were put.
    broken: list[BrokenRecord] = field(default_factory=list)


def _put_records(kinesis: Any, stream_name: str, entries: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """PutRecords in chunks of 500; entries of a chunk that fail (``FailedRecordCount``) are put
    again, with back-off. Returns (shard id, sequence number) per entry, in order."""
    results: list[tuple[str, str] | None] = [None] * len(entries)
    for start in range(0, len(entries), PUT_RECORDS_MAX):
        pending = list(range(start, min(start + PUT_RECORDS_MAX, len(entries))))
        for attempt in range(PUT_ATTEMPTS):
            response = kinesis.put_records(StreamName=stream_name, Records=[entries[i] for i in pending])
            failed = []
            for index, result in zip(pending, response["Records"], strict=True):
                if result.get("ErrorCode") or "SequenceNumber" not in result:
                    failed.append(index)
                else:
                    results[index] = (result["ShardId"], result["SequenceNumber"])
            if not response.get("FailedRecordCount") and not failed:
                break
            pending = failed
            time.sleep(min(1.0, 0.05 * 2**attempt))
        else:
            raise RuntimeError(f"{len(pending)} records still failed after {PUT_ATTEMPTS} PutRecords calls")
    # Kinesis stamps arrival times in whole milliseconds; a batch planned within the millisecond
    # of the last put may leave that record for the next batch. Return in a later millisecond.
    time.sleep(0.002)
    return results  # type: ignore[return-value]


def _order(rng: random.Random, order_id: int, version: int, *, avro: bool) -> dict[str, Any]:
    placed_at = _EPOCH + timedelta(milliseconds=rng.randrange(30 * 86_400_000))
    value: dict[str, Any] = {
        "order_id": order_id,
        "customer": rng.choice(_CUSTOMERS),
        "amount": rng.randrange(100, 100_000) / 100,
        "items": [{"sku": f"SKU-{rng.randrange(1000):03d}", "qty": rng.randint(1, 5)} for _ in range(rng.randint(0, 3))],
        "placed_at": placed_at if avro else placed_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    if version == 2:
        value["channel" if avro else "coupon"] = rng.choice(_CHANNELS if avro else _COUPONS)
    return value


def _click(rng: random.Random, click_id: int) -> dict[str, Any]:
    return {
        "id": click_id,
        "page": rng.choice(_PAGES),
        "tags": rng.sample(_TAGS, rng.randint(0, 3)),
        "meta": {"browser": rng.choice(_BROWSERS), "width": rng.choice((360, 768, 1280, 1920))},
    }


def _avro_bytes(value: dict[str, Any], version: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _parsed_avro(version), value)
    return out.getvalue()


@cache
def _parsed_avro(version: int) -> Any:
    return fastavro.parse_schema(_DEFINITIONS[(AVRO_SCHEMA_NAME, version)])


def _avro_rejects(payload: bytes, version: int) -> bool:
    try:
        fastavro.schemaless_reader(io.BytesIO(payload), _parsed_avro(version))
    except (EOFError, IndexError, ValueError, TypeError):  # what fastavro raises on short or bad input
        return True
    return False


def _protobuf_rejects(payload: bytes) -> bool:
    try:
        _click_class().FromString(payload)
    except DecodeError:
        return True
    return False


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _not_zlib(payload: bytes) -> bytes:
    """``payload`` unchanged if ``zlib.decompress`` rejects it (it always has so far), else with a
    first byte naming no zlib compression method."""
    try:
        zlib.decompress(payload)
    except zlib.error:
        return payload
    return b"\xff" + payload


def _broken_data(
    rng: random.Random, kind: str, breakage: tuple[str, str], schemas: TypedSchemas | None, version: int, order_id: int
) -> bytes:
    how, detail = breakage
    if kind == "protobuf":
        if detail == "garbage":
            # Tag 0x07: field number 0, wire type 7; both invalid, so parsing stops at byte 0.
            data = b"\x07" + rng.randbytes(7)
        else:
            good = encode_click(_click(rng, order_id))
            # A cut at a field boundary parses (protobuf has no end marker): cut until it fails.
            # The last field, meta, is length-delimited, so one byte short already does.
            data = next(good[:cut] for cut in range(len(good) - 1, 0, -1) if _protobuf_rejects(good[:cut]))
        if not _protobuf_rejects(data):
            raise AssertionError(f"protobuf parsed the {detail} record {data!r}")
        return data

    assert schemas is not None
    avro = kind == "avro"
    version_id = schemas.schema(kind).version_id(version)
    value = _order(rng, order_id, version, avro=avro)
    good = _avro_bytes(value, version) if avro else json.dumps(value, ensure_ascii=False).encode()
    if how == "malformed_payload" and detail == "garbage":
        if avro:
            # order_id 1, then a customer string said to be 1 MiB long, of which 8 bytes follow:
            # every Avro reader runs out of bytes.
            payload = b"\x02" + _varint(2 * (1 << 20)) + rng.randbytes(8)
        else:
            # 0x80 starts no UTF-8 character, and no JSON text starts with it.
            payload = b"\x80" + rng.randbytes(11)
        return gsr_encode(payload, version_id, compress=False)
    if how == "malformed_payload":  # Avro, truncated
        # An Avro record has no end marker but needs all its bytes: any cut fails; check anyway.
        payload = next(good[:cut] for cut in range(len(good) // 2, 0, -1) if _avro_rejects(good[:cut], version))
        return gsr_encode(payload, version_id, compress=False)
    if how == "bad_compression":
        header = gsr_encode(b"", version_id, compress=True)[:GSR_HEADER_LENGTH]
        return header + _not_zlib(good)
    if how == "unknown_schema_version":
        unknown = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if unknown in schemas.json.version_ids.values() or unknown in schemas.avro.version_ids.values():
            raise AssertionError("a random version id is registered")  # 2**-122: not seen
        return gsr_encode(good, unknown, compress=False)
    # wrong_type (JSON): valid JSON, customer a number where the schema says string
    value["customer"] = rng.randrange(10_000, 99_999)
    return gsr_encode(json.dumps(value).encode(), version_id, compress=False)


def produce_typed(
    kinesis: Any,
    stream_name: str,
    *,
    kind: str,
    count: int,
    broken: int,
    schemas: TypedSchemas | None,
    seed: int,
    start_id: int = 0,
    version: int = 1,
    compress_every: int = 2,
) -> Produced:
    """Put ``count`` good records of one kind and ``broken`` broken ones among them.

    Good records have ids ``start_id .. start_id + count - 1`` (order_id, or the click's id), and
    partition key ``str(id)``. Their values come from ``random.Random(seed)``: the same
    arguments give the same values (and the same broken records), on any stream.

    * ``"json"``: GSR records of ``schemas.json`` version ``version``: UTF-8 JSON.
    * ``"avro"``: GSR records of ``schemas.avro`` version ``version``: Avro binary
      (``fastavro.schemaless_writer`` with that version's schema).
    * ``"protobuf"``: plain ``demo.Click`` messages, no header (``version`` must be 1,
      ``schemas`` is not used).

    Version 2 records fill the field version 2 adds (``coupon``, ``channel``). Every
    ``compress_every``-th good GSR record (the 2nd, 4th, ... for 2; none for 0) has its payload
    zlib-compressed.

    Broken records go at random places among the good ones and cycle through the kind's
    breakages. GSR kinds: ``malformed_payload`` (valid header, garbage payload),
    ``bad_compression`` (compression byte 5, payload not zlib), ``unknown_schema_version`` (a
    random version id; payload good), ``wrong_type`` (JSON: ``customer`` a number) and, for Avro,
    where no wrong type can be written, ``malformed_payload`` again with a truncated payload.
    Protobuf: ``malformed_payload`` as garbage and as a truncated message, each checked to make
    protobuf's parser raise. The n-th broken record (n from 0) has partition key
    ``broken-<seed>-<n>``, and the order or click it holds, if any, the id ``-(n + 1)``: outside
    every range of good ids.

    Records go in PutRecords calls of at most 500, failed ones put again.

    :param start_id: first good id, >= 0.
    :param version: schema version of the good records: 1, or 2 after ``register_second_versions``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if count < 0 or broken < 0 or start_id < 0:
        raise ValueError("count, broken and start_id must be >= 0")
    if kind == "protobuf":
        if version != 1:
            raise ValueError("protobuf records have one version: 1")
    else:
        if schemas is None:
            raise ValueError(f"{kind} records need the registered schemas")
        if version not in schemas.schema(kind).version_ids:
            raise ValueError(f"version {version} of {schemas.schema(kind).name} is not registered (register_second_versions)")

    rng = random.Random(seed)
    produced = Produced(kind=kind, version=version)
    breakages = BREAKAGES[kind]
    broken_at = set(rng.sample(range(count + broken), broken))
    # (partition key, data, good id or None, breakage or None), in the order put
    records: list[tuple[str, bytes, int | None, tuple[str, str] | None]] = []
    good_index = broken_index = 0
    for position in range(count + broken):
        if position in broken_at:
            breakage = breakages[broken_index % len(breakages)]
            data = _broken_data(rng, kind, breakage, schemas, version, -(broken_index + 1))
            records.append((f"broken-{seed}-{broken_index}", data, None, breakage))
            broken_index += 1
            continue
        record_id = start_id + good_index
        good_index += 1
        if kind == "protobuf":
            value = _click(rng, record_id)
            data = encode_click(value)
        else:
            assert schemas is not None
            avro = kind == "avro"
            value = _order(rng, record_id, version, avro=avro)
            payload = _avro_bytes(value, version) if avro else json.dumps(value, ensure_ascii=False).encode()
            compress = compress_every > 0 and good_index % compress_every == 0
            data = gsr_encode(payload, schemas.schema(kind).version_id(version), compress=compress)
            if compress:
                produced.compressed.add(record_id)
        produced.good[record_id] = value
        records.append((str(record_id), data, record_id, None))

    positions = _put_records(kinesis, stream_name, [{"PartitionKey": pk, "Data": data} for pk, data, _, _ in records])
    for (pk, data, record_id, breakage), (shard_id, sequence_number) in zip(records, positions, strict=True):
        if record_id is not None:
            produced.good_positions[record_id] = (shard_id, sequence_number)
        else:
            assert breakage is not None
            produced.broken.append(BrokenRecord(shard_id, sequence_number, breakage[0], breakage[1], pk, data))
    return produced
