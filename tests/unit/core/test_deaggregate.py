"""KPL de-aggregation (core/kpl.deaggregate) and picklable domain exceptions."""

from __future__ import annotations

import hashlib
import pickle

import aws_kinesis_agg
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from airflow_kinesis_spark.core.kpl import deaggregate
from airflow_kinesis_spark.exceptions import (
    CheckpointConflictError,
    CorruptAggregateError,
    DataLossError,
    KinesisSparkError,
    ReportValidationError,
    StreamNotFoundError,
)

MAGIC = aws_kinesis_agg.MAGIC
DIGEST = aws_kinesis_agg.DIGEST_SIZE


def expected_tuples(vector: dict) -> list[tuple]:
    return [
        (u["sub_sequence_number"], u["partition_key"], u["explicit_hash_key"], u["data"].encode("utf-8"))
        for u in vector["expected_user_records"]
    ]


def aggregate(records: list[tuple[str, bytes, str | None]]) -> tuple[str, bytes]:
    agg = RecordAggregator()
    for key, data, ehk in records:
        agg.add_user_record(key, data, explicit_hash_key=ehk)
    pk, _ehk, blob = agg.clear_and_get().get_contents()
    return pk, blob


def split(blob: bytes) -> bytes:
    assert blob.startswith(MAGIC)
    return blob[len(MAGIC) : -DIGEST]


def reseal(body: bytes) -> bytes:
    """MAGIC + body + a correct MD5 of body."""
    return MAGIC + body + hashlib.md5(body).digest()  # noqa: S324 - the KPL format's checksum


def test_vectors_are_the_four_expected(kpl_vectors):
    assert len(kpl_vectors) == 4
    assert sum(1 for v in kpl_vectors if v["data"].startswith(MAGIC)) == 3


@pytest.mark.parametrize("index", range(4))
def test_kpl_vector_gives_exactly_the_expected_user_records(kpl_vectors, index):
    vector = kpl_vectors[index]
    got = deaggregate(vector["data"], vector["partition_key"])
    assert got == expected_tuples(vector)
    for sub, key, ehk, data in got:
        assert isinstance(data, bytes)  # never aws_kinesis_agg's base64 text
        assert isinstance(key, str)
        assert ehk is None or isinstance(ehk, str)


def test_aggregated_vectors_number_their_sub_records_in_order(kpl_vectors):
    for vector in kpl_vectors:
        got = deaggregate(vector["data"], vector["partition_key"])
        if vector["data"].startswith(MAGIC):
            assert [g[0] for g in got] == list(range(len(got)))
            assert len(got) > 1


def test_plain_vector_gives_one_record_without_sub_sequence(kpl_vectors):
    (plain,) = [v for v in kpl_vectors if not v["data"].startswith(MAGIC)]
    got = deaggregate(plain["data"], plain["partition_key"])
    assert got == [(None, plain["partition_key"], None, plain["data"])]


def test_aggregator_round_trip_with_and_without_explicit_hash_keys():
    records = [
        ("k0", b"\x00\x01binary", None),
        ("k1", "ünïcødé".encode(), "170141183460469231731687303715884105727"),
        ("k0", b"", None),
        ("k2", b"x" * 3000, "0"),
    ]
    pk, blob = aggregate(records)
    assert pk == "k0"
    got = deaggregate(blob, pk)
    assert got == [(i, key, ehk, data) for i, (key, data, ehk) in enumerate(records)]


def test_flipped_byte_in_body_is_md5_mismatch(kpl_vectors):
    vector = kpl_vectors[0]
    blob = bytearray(vector["data"])
    blob[len(MAGIC) + 10] ^= 0x01
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(bytes(blob), vector["partition_key"])
    assert info.value.reason == "md5_mismatch"
    assert info.value.fields == {"reason": "md5_mismatch"}


def test_flipped_byte_in_digest_is_md5_mismatch():
    pk, blob = aggregate([("a", b"one", None), ("b", b"two", None)])
    corrupt = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(corrupt, pk)
    assert info.value.reason == "md5_mismatch"


def test_truncated_protobuf_with_valid_md5_is_bad_protobuf():
    pk, blob = aggregate([("a", b"first user record", None), ("b", b"second user record", None)])
    body = split(blob)
    truncated = reseal(body[:-3])  # cut inside the last Record message
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(truncated, pk)
    assert info.value.reason == "bad_protobuf"


def test_garbage_protobuf_with_valid_md5_is_bad_protobuf():
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(reseal(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), "pk")
    assert info.value.reason == "bad_protobuf"


def test_partition_key_index_out_of_table_is_bad_protobuf():
    from aws_kinesis_agg import messages_pb2

    message = messages_pb2.AggregatedRecord()
    message.partition_key_table.append("only-key")
    record = message.records.add()
    record.partition_key_index = 3  # no such key
    record.data = b"payload"
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(reseal(message.SerializeToString()), "pk")
    assert info.value.reason == "bad_protobuf"


def test_corrupt_aggregate_is_never_returned_as_a_user_record(kpl_vectors):
    # aws_kinesis_agg returns the blob as one user record on an MD5 mismatch; we must not.
    vector = kpl_vectors[1]
    blob = bytearray(vector["data"])
    blob[-5] ^= 0x10
    with pytest.raises(CorruptAggregateError):
        deaggregate(bytes(blob), vector["partition_key"])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"plain text record",
        b"\x00\x01\x02\x03\x04\xff" * 10,
        MAGIC,  # magic only
        MAGIC + b"\x00" * DIGEST,  # magic + a digest's worth of bytes: too short to be an aggregate
        b"\xf3\x89\x9a",  # a prefix of the magic
        b"x" + MAGIC + b"\x00" * 40,  # magic not at the start
    ],
    ids=["empty", "text", "binary", "magic-only", "magic-plus-digest", "magic-prefix", "magic-inside"],
)
def test_non_aggregates_flow_through_as_plain_records(data):
    assert deaggregate(data, "pk-1") == [(None, "pk-1", None, data)]


# -- exceptions pickle (Spark ships task errors between processes) -----------------------------


def _round_trip(err: Exception) -> Exception:
    return pickle.loads(pickle.dumps(err))


def test_corrupt_aggregate_error_pickles():
    err = CorruptAggregateError(
        "shard shardId-000000000001, sequence number 49581544954143914480256700934210366840104395343224897586: bad",
        shard_id="shardId-000000000001",
        sequence_number="49581544954143914480256700934210366840104395343224897586",
        reason="md5_mismatch",
    )
    copy = _round_trip(err)
    assert type(copy) is CorruptAggregateError
    assert str(copy) == str(err)
    assert copy.args == err.args
    assert copy.fields == err.fields
    assert copy.reason == "md5_mismatch"
    assert copy.shard_id == "shardId-000000000001"
    assert copy.sequence_number == err.sequence_number


def test_corrupt_aggregate_error_from_deaggregate_pickles(kpl_vectors):
    blob = bytearray(kpl_vectors[0]["data"])
    blob[len(MAGIC) + 1] ^= 0x01
    with pytest.raises(CorruptAggregateError) as info:
        deaggregate(bytes(blob), "a")
    copy = _round_trip(info.value)
    assert str(copy) == str(info.value)
    assert copy.reason == "md5_mismatch"


def test_stream_not_found_error_pickles():
    class Meta:
        region_name = "eu-west-1"
        endpoint_url = "http://127.0.0.1:4567"

    class Client:
        meta = Meta()

    err = StreamNotFoundError.for_client("orders", Client())
    assert "'orders'" in str(err) and "'eu-west-1'" in str(err) and "http://127.0.0.1:4567" in str(err)
    copy = _round_trip(err)
    assert type(copy) is StreamNotFoundError
    assert str(copy) == str(err)
    assert (copy.stream_name, copy.region, copy.endpoint) == ("orders", "eu-west-1", "http://127.0.0.1:4567")
    assert copy.fields == err.fields


def test_checkpoint_conflict_error_pickles():
    err = CheckpointConflictError(
        "could not commit batch 7: pending batch 7 held by run-b",
        stream_name="orders",
        consumer_name="lake",
        committed_batch_id=6,
        pending_batch_id=7,
        other_owner="run-b",
    )
    copy = _round_trip(err)
    assert type(copy) is CheckpointConflictError
    assert str(copy) == str(err)
    assert copy.fields == err.fields
    assert copy.other_owner == "run-b"
    assert copy.pending_batch_id == 7
    assert copy.committed_batch_id == 6


@pytest.mark.parametrize("cls", [DataLossError, ReportValidationError, KinesisSparkError])
def test_other_domain_errors_pickle(cls):
    err = cls("message with no fields")
    copy = _round_trip(err)
    assert type(copy) is cls
    assert str(copy) == "message with no fields"
    assert copy.fields == {}


def test_domain_errors_share_a_base_class():
    for cls in (StreamNotFoundError, CheckpointConflictError, DataLossError, CorruptAggregateError, ReportValidationError):
        assert issubclass(cls, KinesisSparkError)
