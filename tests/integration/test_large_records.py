"""10 MiB records end to end (issue 31, item 1): Kinesis takes records up to 10 MiB since
October 2025 (``UpdateMaxRecordSize``, ``MaxRecordSizeInKiB`` 1,024..10,240). kinesalite, as
``make kinesalite`` sets it up, stores them; the limits proxy in front of it
(``benchmarks.kinesis_limits.ThrottlingProxy``, response caps only) holds each stream to its
MaxRecordSizeInKiB and cuts GetRecords answers at 10 MiB, as the service does. Batches run with
real spark-submit, as the operator runs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from aws_kinesis_agg.aggregator import AggRecord
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from benchmarks.kinesis_limits import KinesisLimits, ThrottlingProxy
from demo.producer import committed_rows, put_raw, verify
from tests.conftest import create_stream, make_client

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

MIB = 1024 * 1024


@pytest.fixture
def large_records(kinesalite_endpoint, aws_conn, unique_name):
    """A one-shard stream on kinesalite behind the limits proxy, MaxRecordSizeInKiB 10,240."""
    with ThrottlingProxy(kinesalite_endpoint, KinesisLimits(throttle=False)) as proxy:
        kinesis = make_client("kinesis", proxy.endpoint)
        aws_conn(proxy.endpoint)
        create_stream(kinesis, unique_name, 1)
        yield proxy, kinesis, unique_name


def aggregate(pk: str, datas: list[bytes]) -> bytes:
    """A KPL aggregate of ``datas`` as one Kinesis record, built with aws_kinesis_agg's AggRecord
    (its RecordAggregator refuses sizes over 1 MiB; the KPL now sends larger aggregates to
    streams that take them)."""
    record = AggRecord(max_size=10 * MIB)
    for data in datas:
        assert record.add_user_record(pk, data)
    return record.get_contents()[2]


def test_the_stream_takes_what_its_max_record_size_allows(large_records):
    proxy, kinesis, stream = large_records
    summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    assert summary["MaxRecordSizeInKiB"] == 1024
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_record(StreamName=stream, PartitionKey="k", Data=b"x" * (MIB + 1))
    kinesis.update_max_record_size(StreamARN=summary["StreamARN"], MaxRecordSizeInKiB=10240)
    assert kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["MaxRecordSizeInKiB"] == 10240
    kinesis.put_record(StreamName=stream, PartitionKey="k", Data=b"x" * (10 * MIB))  # the emulator stores it
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_record(StreamName=stream, PartitionKey="k", Data=b"x" * (10 * MIB + 1))
    with pytest.raises(ClientError, match="InvalidArgumentException"):  # PutRecords: 10 MiB a request
        kinesis.put_records(StreamName=stream, Records=[{"PartitionKey": "k", "Data": b"x" * (6 * MIB)}] * 2)


def test_10_mib_records_plain_aggregated_and_over_the_byte_cap_are_read_exactly_once(large_records, dynamodb, tmp_path):
    """Plain 10 MiB records, a KPL aggregate of 3.6 MiB and records larger than
    ``max_bytes_per_shard`` (4 MiB): each capped batch still takes its first Kinesis record whole,
    the checkpoint moves past it, and every user record is committed once. The last batch, uncapped,
    writes three 10 MiB records with a 16 MiB Parquet row group size: the writer flushes a row
    group once it holds 16 MiB (at most one record more), not after its first 100 rows
    (``parquet.page.size.row.check.min``), which would hold 100 such records (1,000 MiB)."""
    proxy, kinesis, stream = large_records
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=10240)
    rng = os.urandom
    plain = [(f"p{i}", rng(10 * MIB - i)) for i in range(4)]
    users = [rng(1200 * 1024 + i) for i in range(3)]
    blob = aggregate("a", users)
    assert len(blob) > 3 * MIB
    produced = put_raw(kinesis, stream, [(plain[0][0], plain[0][1], [(None, *plain[0])])])
    produced += put_raw(kinesis, stream, [("a", blob, [(i, "a", d) for i, d in enumerate(users)])])
    produced += put_raw(kinesis, stream, [(pk, data, [(None, pk, data)]) for pk, data in plain[1:]])
    output = tmp_path / "out"
    store = DynamoDBCheckpointStore(dynamodb, f"{stream}_ckpt", stream, "tests")

    def batch(**kwargs):
        return KinesisToSparkOperator(task_id="ingest", stream_name=stream, consumer_name="tests",
                                      checkpoint_table=f"{stream}_ckpt", output_path=str(output),
                                      read_options=ReadOptions(min_call_interval=0.0, read_bytes_per_second=None), **kwargs).execute({})  # fmt: skip

    first = batch(max_bytes_per_shard=4 * MIB)  # the first record is 10 MiB: taken whole, the cap then holds
    assert (first["status"], first["records"]) == ("committed", 1)
    second = batch(max_bytes_per_shard=4 * MIB)  # the aggregate (3.6 MiB), not the 10 MiB record after it
    assert (second["status"], second["records"]) == ("committed", 3)
    third = batch(spark_settings=SparkSettings(conf={"spark.hadoop.parquet.block.size": str(16 * MIB)}))
    assert (third["status"], third["records"]) == ("committed", 3)
    assert batch()["status"] == "no_new_records"

    verdict = verify(produced, committed_rows(output, store.head().committed_batch_id))
    assert verdict.ok and verdict.records_out == 7, verdict
    row_groups = [f.metadata.row_group(i) for f in map(pq.ParquetFile, Path(output, "batch_id=3").glob("*.parquet"))
                  for i in range(f.metadata.num_row_groups)]  # fmt: skip
    assert sum(g.num_rows for g in row_groups) == 3
    assert max(g.total_byte_size for g in row_groups) <= 16 * MIB + 10 * MIB + MIB, [g.total_byte_size for g in row_groups]
    assert proxy.stats["GetRecords.largest_response_bytes"] <= 10 * MIB


def test_10_mib_records_over_enhanced_fan_out_through_botocore_event_streams(kinesalite_endpoint, aws_conn, unique_name,
                                                                              dynamodb, tmp_path):  # fmt: skip
    """The same records pushed by SubscribeToShard: the proxy registers the stream consumer itself
    (kinesalite has no stream consumers) and pushes each 10 MiB record in an event of its own (a
    message of about 13.4 MiB of base64 JSON; botocore's event-stream decoder takes messages up to
    16 MiB), as the service must. Plain 10 MiB records and a KPL aggregate of 3.6 MiB, read by
    the operator with consumer_type="efo" over spark-submit, capped at 4 MiB a shard so a batch
    takes its first Kinesis record whole; every user record committed once, the records pushed by
    subscriptions."""
    with ThrottlingProxy(kinesalite_endpoint, KinesisLimits(throttle=False), own_consumers=True) as proxy:
        kinesis = make_client("kinesis", proxy.endpoint)
        aws_conn(proxy.endpoint)
        stream = unique_name
        create_stream(kinesis, stream, 1)
        arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
        kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=10240)
        plain = [(f"p{i}", os.urandom(10 * MIB - i)) for i in range(2)]
        users = [os.urandom(1200 * 1024 + i) for i in range(3)]
        produced = put_raw(kinesis, stream, [(plain[0][0], plain[0][1], [(None, *plain[0])])])
        produced += put_raw(kinesis, stream, [("a", aggregate("a", users), [(i, "a", d) for i, d in enumerate(users)])])
        produced += put_raw(kinesis, stream, [(plain[1][0], plain[1][1], [(None, *plain[1])])])
        output = tmp_path / "out"
        store = DynamoDBCheckpointStore(dynamodb, f"{stream}_ckpt", stream, "tests")

        def batch():
            return KinesisToSparkOperator(task_id="ingest", stream_name=stream, consumer_name="tests", consumer_type="efo",
                                          checkpoint_table=f"{stream}_ckpt", output_path=str(output), max_bytes_per_shard=4 * MIB,
                                          read_options=ReadOptions(min_call_interval=0.0, read_bytes_per_second=None)).execute({})  # fmt: skip

        assert [(s["status"], s["records"]) for s in (batch(), batch(), batch())] == [("committed", 1), ("committed", 3),
                                                                                        ("committed", 1)]  # fmt: skip
        assert batch()["status"] == "no_new_records"
        verdict = verify(produced, committed_rows(output, store.head().committed_batch_id))
        assert verdict.ok and verdict.records_out == 5, verdict
        assert proxy.stats["SubscribeToShard.subscriptions"] >= 3 and proxy.stats["SubscribeToShard.records"] >= 3
        consumers = kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
        assert [(c["ConsumerStatus"], c["ConsumerARN"].startswith(f"{arn}/consumer/")) for c in consumers] == [("ACTIVE", True)]
