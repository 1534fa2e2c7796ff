"""demo/typed_producer.py: GSR JSON and Avro and plain protobuf records, put to moto's Kinesis,
read back and decoded here (json, fastavro, protobuf, zlib: not with the module's own code), good
ones to what was produced, broken ones failing where their label says."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import uuid
import zlib

import fastavro
import jsonschema
import pytest
from botocore.exceptions import ClientError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from demo import typed_producer as tp
from tests.conftest import REGION, create_stream, make_client

# ---------------------------------------------------------------------------------------------
# A decoder of the test's own
# ---------------------------------------------------------------------------------------------


class DecodeFailure(Exception):
    """Decoding failed at ``stage``: header, schema, decompress, payload or validate."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"{stage}: {cause!r}")
        self.stage = stage
        self.cause = cause


class Registry:
    """Schema versions by id, read from the registry with GetSchemaVersion (cached)."""

    def __init__(self, glue):
        self.glue = glue
        self.versions: dict[str, tuple[str, dict]] = {}

    def lookup(self, version_id: str) -> tuple[str, dict]:
        if version_id not in self.versions:
            response = self.glue.get_schema_version(SchemaVersionId=version_id)
            self.versions[version_id] = (response["DataFormat"], json.loads(response["SchemaDefinition"]))
        return self.versions[version_id]


def gsr_header(data: bytes) -> tuple[int, str]:
    """(compression byte, schema version id) of a GSR record."""
    assert len(data) >= 18 and data[0] == 3, data[:18]
    return data[1], str(uuid.UUID(bytes=data[2:18]))


def decode_gsr(data: bytes, registry: Registry) -> dict:
    try:
        compression, version_id = gsr_header(data)
        assert compression in (0, 5)
    except AssertionError as error:
        raise DecodeFailure("header", error) from error
    try:
        data_format, schema = registry.lookup(version_id)
    except ClientError as error:
        raise DecodeFailure("schema", error) from error
    body = data[18:]
    if compression == 5:
        try:
            body = zlib.decompress(body)
        except zlib.error as error:
            raise DecodeFailure("decompress", error) from error
    try:
        if data_format == "JSON":
            value = json.loads(body)
        else:
            reader = io.BytesIO(body)
            value = fastavro.schemaless_reader(reader, fastavro.parse_schema(schema))
            assert reader.read() == b"", "bytes after the record"
    except Exception as error:
        raise DecodeFailure("payload", error) from error
    if data_format == "JSON":
        try:
            jsonschema.Draft7Validator(schema).validate(value)
        except jsonschema.ValidationError as error:
            raise DecodeFailure("validate", error) from error
    return value


def click_class():
    """demo.Click from click_descriptor() alone, in a pool of the test's own."""
    encoded, name = tp.click_descriptor()
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(encoded)).file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def click_dict(message) -> dict:
    return {"id": message.id, "page": message.page, "tags": list(message.tags),
            "meta": {"browser": message.meta.browser, "width": message.meta.width}}  # fmt: skip


#: Where decoding must fail for each kind of breakage.
STAGE = {"malformed_payload": "payload", "bad_compression": "decompress", "unknown_schema_version": "schema", "wrong_type": "validate"}


def read_stream(kinesis, stream: str) -> dict[tuple[str, str], dict]:
    """Every record of the stream, by (shard id, sequence number)."""
    records = {}
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            response = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            for record in response["Records"]:
                records[(shard["ShardId"], record["SequenceNumber"])] = record
            if not response["Records"]:
                break
            iterator = response.get("NextShardIterator")
    return records


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glue(moto_endpoint):
    return make_client("glue", moto_endpoint)


@pytest.fixture(scope="module")
def registered(glue):
    """Both schemas with both versions, in a registry of this module (moto holds at most 10)."""
    v1 = tp.register_schemas(glue, f"typed-{uuid.uuid4().hex[:10]}")
    return v1, tp.register_second_versions(glue, v1)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_gsr_encode_lays_out_the_header():
    version_id = "0f8fad5b-d9cb-469f-a165-70867728950e"
    plain = tp.gsr_encode(b'{"a":1}', version_id, compress=False)
    assert plain[:2] == b"\x03\x00" and plain[2:18] == uuid.UUID(version_id).bytes and plain[18:] == b'{"a":1}'
    packed = tp.gsr_encode(b"x" * 100, version_id, compress=True)
    assert packed[:2] == b"\x03\x05" and packed[2:18] == plain[2:18]
    assert zlib.decompress(packed[18:]) == b"x" * 100 and len(packed) < 18 + 100


def test_click_descriptor_alone_decodes_encode_click():
    encoded, name = tp.click_descriptor()
    assert name == "demo.Click"
    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(encoded, validate=True))
    assert [f.package for f in files.file] == ["demo"]
    fields = {m.name: [(f.name, f.number) for f in m.field] for m in files.file[0].message_type}
    assert fields == {"Meta": [("browser", 1), ("width", 2)], "Click": [("id", 1), ("page", 2), ("tags", 3), ("meta", 4)]}
    value = {"id": 2**40 + 3, "page": "/cart", "tags": ["a", "b"], "meta": {"browser": "firefox", "width": 1280}}
    assert click_dict(click_class().FromString(tp.encode_click(value))) == value
    with pytest.raises(ValueError):
        tp.encode_click({"id": 1, "no_such_field": 2})


def test_registers_both_versions_of_both_schemas(glue, registered):
    v1, v2 = registered
    assert (v1.json.name, v1.avro.name) == ("orders-json", "orders-avro")
    assert set(v1.json.version_ids) == {1} and set(v2.json.version_ids) == set(v2.avro.version_ids) == {1, 2}
    assert v2.json.version_id(1) == v1.json.version_id(1)
    for kind, data_format in (("json", "JSON"), ("avro", "AVRO")):
        for version in (1, 2):
            got = glue.get_schema_version(SchemaVersionId=v2.schema(kind).version_id(version))
            assert (got["DataFormat"], got["VersionNumber"], got["Status"]) == (data_format, version, "AVAILABLE")
            assert got["SchemaArn"] == v2.schema(kind).arn
            assert json.loads(got["SchemaDefinition"]) == json.loads(tp.schema_definition(v2.schema(kind).name, version))
        schema = glue.get_schema(SchemaId={"SchemaArn": v2.schema(kind).arn})
        assert (schema["Compatibility"], schema["LatestSchemaVersion"]) == ("BACKWARD", 2)
    # Avro v2 reads v1 data (channel defaults to null): the change is backward compatible.
    writer, reader = fastavro.parse_schema(tp.AVRO_SCHEMA_V1), fastavro.parse_schema(tp.AVRO_SCHEMA_V2)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, writer, {"order_id": 1, "customer": "a", "amount": 1.0, "items": [], "placed_at": 0})
    assert fastavro.schemaless_reader(io.BytesIO(out.getvalue()), writer, reader)["channel"] is None
    # Run again against the same registry: the same ids, nothing registered twice.
    assert tp.register_schemas(glue, v1.registry_name) == v1
    assert tp.register_second_versions(glue, v1) == v2
    # The moto of these tests runs in another process: the in-process helper cannot see its schemas.
    with pytest.raises(LookupError):
        tp.delete_schema_version_on_moto(None, v1.registry_name, "orders-avro", 2)


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_gsr_records_round_trip_and_broken_ones_fail_as_labelled(kind, glue, registered, kinesis, unique_name):
    _, schemas = registered
    create_stream(kinesis, unique_name, 2)
    first = tp.produce_typed(kinesis, unique_name, kind=kind, count=6, broken=4, schemas=schemas, seed=1)
    second = tp.produce_typed(kinesis, unique_name, kind=kind, count=5, broken=4, schemas=schemas, seed=2,
                              start_id=6, version=2, compress_every=3)  # fmt: skip
    records = read_stream(kinesis, unique_name)
    assert len(records) == 6 + 4 + 5 + 4
    registry = Registry(glue)
    added = "coupon" if kind == "json" else "channel"

    for produced, version in ((first, 1), (second, 2)):
        assert produced.version == version
        assert sorted(produced.compressed) == ([1, 3, 5] if version == 1 else [8])
        for record_id, value in produced.good.items():
            record = records[produced.good_positions[record_id]]
            assert record["PartitionKey"] == str(record_id)
            compression, version_id = gsr_header(record["Data"])
            assert compression == (5 if record_id in produced.compressed else 0)
            assert version_id == schemas.schema(kind).version_id(version)
            assert decode_gsr(record["Data"], registry) == value
            assert value["order_id"] == record_id and (added in value) == (version == 2)
        for broken in produced.broken:
            record = records[(broken.shard_id, broken.sequence_number)]
            assert record["Data"] == broken.data and record["PartitionKey"] == broken.partition_key
            with pytest.raises(DecodeFailure) as failure:
                decode_gsr(record["Data"], registry)
            assert failure.value.stage == STAGE[broken.kind], (broken.kind, broken.detail, failure.value)
            if broken.kind == "unknown_schema_version":
                assert failure.value.cause.response["Error"]["Code"] == "EntityNotFoundException"
        labels = {(b.kind, b.detail) for b in produced.broken}
        assert labels == set(tp.BREAKAGES[kind])

    assert set(first.good) == set(range(6)) and set(second.good) == set(range(6, 11))
    value = first.good[0]
    if kind == "json":
        assert isinstance(value["placed_at"], str) and value["placed_at"].endswith("Z")
        assert {b.kind for b in first.broken} == set(tp.BROKEN_KINDS)
    else:
        assert value["placed_at"].utcoffset().total_seconds() == 0 and value["placed_at"].microsecond % 1000 == 0
        assert {b.detail for b in first.broken if b.kind == "malformed_payload"} == {"garbage", "truncated"}


def test_protobuf_records_round_trip_and_broken_ones_fail_to_parse(kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    produced = tp.produce_typed(kinesis, unique_name, kind="protobuf", count=7, broken=3, schemas=None, seed=5, start_id=100)
    records = read_stream(kinesis, unique_name)
    assert len(records) == 10 and set(produced.good) == set(range(100, 107)) and not produced.compressed
    click = click_class()
    for record_id, value in produced.good.items():
        record = records[produced.good_positions[record_id]]
        assert record["PartitionKey"] == str(record_id)
        assert click_dict(click.FromString(record["Data"])) == value
    assert [b.detail for b in produced.broken] == ["garbage", "truncated", "garbage"]
    assert {b.kind for b in produced.broken} == {"malformed_payload"}
    for broken in produced.broken:
        with pytest.raises(DecodeError):
            click.FromString(records[(broken.shard_id, broken.sequence_number)]["Data"])

    # The same seed gives the same records.
    create_stream(kinesis, unique_name + "b", 1)
    again = tp.produce_typed(kinesis, unique_name + "b", kind="protobuf", count=7, broken=3, schemas=None, seed=5, start_id=100)
    assert again.good == produced.good and [b.data for b in again.broken] == [b.data for b in produced.broken]


class FakeKinesis:
    """PutRecords into one list; with ``flaky``, every 7th record of a call fails the first time."""

    def __init__(self, flaky: bool = False):
        self.flaky = flaky
        self.calls: list[int] = []
        self.stored: list[bytes] = []
        self.failed_once: set[str] = set()

    def put_records(self, StreamName, Records):  # boto3's argument names
        self.calls.append(len(Records))
        results, failed = [], 0
        for index, entry in enumerate(Records):
            if self.flaky and index % 7 == 3 and entry["PartitionKey"] not in self.failed_once:
                self.failed_once.add(entry["PartitionKey"])
                results.append({"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow down"})
                failed += 1
            else:
                self.stored.append(entry["Data"])
                results.append({"ShardId": "shardId-000000000000", "SequenceNumber": str(len(self.stored))})
        return {"FailedRecordCount": failed, "Records": results}


def test_puts_in_chunks_of_500_and_puts_failed_records_again():
    client = FakeKinesis(flaky=True)
    produced = tp.produce_typed(client, "s", kind="protobuf", count=1100, broken=0, schemas=None, seed=3)
    failing = sum(1 for i in range(500) if i % 7 == 3)
    assert client.calls == [500, failing, 500, failing, 100, sum(1 for i in range(100) if i % 7 == 3)]
    assert len(client.stored) == 1100 and len({seq for _, seq in produced.good_positions.values()}) == 1100
    click = click_class()
    for record_id, (_, seq) in produced.good_positions.items():
        assert click.FromString(client.stored[int(seq) - 1]).id == record_id


def test_broken_records_go_among_the_good_ones(registered):
    _, schemas = registered
    client = FakeKinesis()
    produced = tp.produce_typed(client, "s", kind="json", count=40, broken=8, schemas=schemas, seed=11)
    broken_at = sorted(int(b.sequence_number) for b in produced.broken)
    assert len(broken_at) == 8 and broken_at != list(range(broken_at[0], broken_at[0] + 8))
    assert broken_at[0] < 40 and broken_at[-1] > 8
    assert [b.kind for b in produced.broken] == list(tp.BROKEN_KINDS) * 2


def test_refuses_what_it_cannot_produce(registered):
    v1, _ = registered
    with pytest.raises(ValueError):
        tp.produce_typed(FakeKinesis(), "s", kind="avro", count=1, broken=0, schemas=v1, seed=1, version=2)
    with pytest.raises(ValueError):
        tp.produce_typed(FakeKinesis(), "s", kind="json", count=1, broken=0, schemas=None, seed=1)
    with pytest.raises(ValueError):
        tp.produce_typed(FakeKinesis(), "s", kind="xml", count=1, broken=0, schemas=None, seed=1)


def test_delete_schema_version_on_an_in_process_moto():
    from moto.backends import get_backend
    from moto.server import ThreadedMotoServer

    from demo.stack import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    glue = make_client("glue", f"http://127.0.0.1:{port}")
    registry_name = f"typed-{uuid.uuid4().hex[:10]}"
    try:
        schemas = tp.register_second_versions(glue, tp.register_schemas(glue, registry_name))
        removed = tp.delete_schema_version_on_moto(get_backend("glue"), schemas.registry_name, "orders-avro", 2, region=REGION)
        assert removed == schemas.avro.version_id(2)
        for lookup in ({"SchemaVersionId": removed},
                       {"SchemaId": {"SchemaArn": schemas.avro.arn}, "SchemaVersionNumber": {"VersionNumber": 2}}):  # fmt: skip
            with pytest.raises(ClientError) as error:
                glue.get_schema_version(**lookup)
            assert error.value.response["Error"]["Code"] == "EntityNotFoundException"
        assert glue.get_schema_version(SchemaVersionId=schemas.avro.version_id(1))["VersionNumber"] == 1
        assert glue.get_schema_version(SchemaVersionId=schemas.json.version_id(2))["VersionNumber"] == 2
        assert glue.get_schema(SchemaId={"SchemaArn": schemas.avro.arn})["LatestSchemaVersion"] == 1
        latest = glue.get_schema_version(SchemaId={"SchemaArn": schemas.avro.arn}, SchemaVersionNumber={"LatestVersion": True})
        assert latest["SchemaVersionId"] == schemas.avro.version_id(1)
        # a GlueBackend, or None for moto's backends, does as well
        tp.delete_schema_version_on_moto(None, schemas.registry_name, "orders-json", 2)
        with pytest.raises(ClientError):
            glue.get_schema_version(SchemaVersionId=schemas.json.version_id(2))
        with pytest.raises(ValueError):  # DeleteSchemaVersions keeps the checkpoint (version 1)
            tp.delete_schema_version_on_moto(get_backend("glue")["123456789012"][REGION], schemas.registry_name, "orders-json", 1)
        with pytest.raises(LookupError):
            tp.delete_schema_version_on_moto(None, schemas.registry_name, "orders-json", 2)
        with pytest.raises(TypeError):
            tp.delete_schema_version_on_moto(f"http://127.0.0.1:{port}", schemas.registry_name, "orders-json", 2)
    finally:  # moto's in-process state outlives the server: leave none of this test's in it
        for name in ("orders-json", "orders-avro"):
            with contextlib.suppress(ClientError):
                glue.delete_schema(SchemaId={"RegistryName": registry_name, "SchemaName": name})
        with contextlib.suppress(ClientError):
            glue.delete_registry(RegistryId={"RegistryName": registry_name})
        server.stop()
