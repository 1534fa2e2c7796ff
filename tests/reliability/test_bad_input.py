"""Bad input: nothing dropped silently, no corrupt aggregate emitted as a user record (real Spark)."""

from __future__ import annotations

import hashlib

import aws_kinesis_agg
import pyarrow.parquet as pq
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import Produced, digest, put_plain, put_raw, verify
from tests.conftest import create_stream

pytestmark = [pytest.mark.reliability, pytest.mark.spark, pytest.mark.slow]

MAX_RECORD = 1024 * 1024  # the largest record a stream accepts by default (Kinesis API reference, PutRecord)


def aggregate(records: list[tuple[str, bytes, str | None]]) -> tuple[str, str | None, bytes]:
    agg = RecordAggregator()
    for pk, data, ehk in records:
        agg.add_user_record(pk, data, ehk)
    return agg.clear_and_get().get_contents()


def test_bad_and_odd_input(connections, kinesis, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    (shard,) = list_shards(kinesis, unique_name)
    produced: list[Produced] = []
    # valid odd records flow through untouched
    produced += put_plain(kinesis, unique_name, [("empty", b""), ("binary", bytes(range(256)) + b"\xff\xfe\x80"),
                                                 ("huge", b"x" * (MAX_RECORD - len("huge")))])  # fmt: skip
    # corrupt aggregates: MD5 mismatch, and a truncated protobuf behind a valid MD5
    pk, ehk, blob = aggregate([("a", b"one", None), ("b", b"two", None)])
    md5_bad = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    body = blob[len(aws_kinesis_agg.MAGIC) : -aws_kinesis_agg.DIGEST_SIZE][:-5]
    truncated = aws_kinesis_agg.MAGIC + body + hashlib.md5(body).digest()
    for bad in (md5_bad, truncated):
        kinesis.put_record(StreamName=unique_name, PartitionKey=pk, Data=bad)
    # an aggregate whose second user record's explicit hash key lies outside the shard's range
    outside = str(int(shard.ending_hash_key) + 1)  # beyond the only shard: 2**128
    _, _, mixed = aggregate([("in", b"inside", "5"), ("out", b"outside", outside)])
    produced += put_raw(kinesis, unique_name, [("in", mixed, [(0, "in", b"inside"), (1, "out", b"outside")])])

    summary = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_test"),
        read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip
    assert summary["records"] == 5 and summary["quarantined"] == 2 and summary["out_of_range"] == 1
    assert summary["shards"][shard.shard_id]["quarantined"] == 2

    data = pq.read_table(tmp_path / "out" / "batch_id=1")
    rows = list(zip(*data.select(["shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"]).to_pydict().values(), strict=True))
    verdict = verify(produced, rows)
    assert verdict.ok, verdict  # every valid record once, byte for byte; nothing corrupt among them
    assert {digest(bytes(r[4])) for r in rows} == {p.digest for p in produced}
    quarantine = pq.read_table(summary["quarantine_path"]).to_pylist()
    assert sorted(q["reason"] for q in quarantine) == ["bad_protobuf", "md5_mismatch"]
    assert sorted(bytes(q["data"]) for q in quarantine) == sorted([md5_bad, truncated])  # raw bytes kept
    assert all(q["shard_id"] == shard.shard_id and q["sequence_number"] for q in quarantine)

    # the checkpoint moved past the quarantined records: the next run reads nothing again
    again = KinesisToSparkOperator(
        task_id="ingest", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        output_path=str(tmp_path / "out"), spark_settings=SparkSettings(conn_id="spark_connect_test"),
        read_options=ReadOptions(min_call_interval=0.0),
    ).execute({})  # fmt: skip
    assert again["status"] == "no_new_records"
