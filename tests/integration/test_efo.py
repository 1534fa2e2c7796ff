"""Enhanced fan-out against a local SubscribeToShard (demo.subscribe.FanOutProxy in front of a moto
server over HTTP): the reader's EFO path reads what polling reads, renews ended subscriptions
without loss or duplicates, and waits out ResourceInUseException."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import boto3
import pytest

from airflow_kinesis_spark.core.consumers import deregister_stream_consumer, ensure_stream_consumer
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel
from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition
from airflow_kinesis_spark.core.reader import ShardReader
from demo.producer import put_aggregated, put_plain
from demo.subscribe import FanOutProxy
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration]

FAR = __import__("datetime").datetime(2100, 1, 1, tzinfo=__import__("datetime").timezone.utc)


def client(endpoint: str):
    return boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                        aws_secret_access_key=TEST_SECRET_KEY)  # fmt: skip


def whole_shard(shard_id: str) -> ShardRange:
    start = Checkpoint(Sentinel.TRIM_HORIZON)
    return ShardRange(shard_id=shard_id, start=StartPosition.after(start), start_checkpoint=start, cutoff=FAR)


def read(kinesis, stream: str, shard_id: str, consumer_arn: str | None = None):
    records, report = ShardReader(kinesis, stream, whole_shard(shard_id), min_call_interval=0, read_bytes_per_second=None,
                                  consumer_arn=consumer_arn, backoff_base=0.2).read_all()  # fmt: skip
    return [(r.sequence_number, r.sub_sequence_number, r.data) for r in records], report


@pytest.fixture
def fan_out(moto_endpoint, unique_name):
    proxy = FanOutProxy(moto_endpoint, subscription_seconds=300).start()
    kinesis = client(proxy.endpoint)
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"p{i}", f"plain {i}".encode()) for i in range(40)])
    put_aggregated(kinesis, unique_name, [(f"a{i}", f"aggregated {i}".encode()) for i in range(60)])
    arn = ensure_stream_consumer(kinesis, unique_name, "efo-lake")
    yield proxy, kinesis, unique_name, arn
    proxy.stop()


def test_efo_reads_what_polling_reads(fan_out):
    proxy, kinesis, stream, arn = fan_out
    shard_id = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    polled, polled_report = read(kinesis, stream, shard_id)
    pushed, report = read(kinesis, stream, shard_id, arn)
    assert pushed == polled and len(pushed) == 100
    assert (report.first, report.last, report.records, report.stop_reason) == (
        polled_report.first, polled_report.last, polled_report.records, polled_report.stop_reason)  # fmt: skip
    assert proxy.stats["subscriptions"] == 1 and report.get_records_calls >= 1
    assert ensure_stream_consumer(kinesis, stream, "efo-lake") == arn  # registered once, reused
    assert deregister_stream_consumer(kinesis, stream, "efo-lake") is True


def test_a_subscription_that_ends_mid_shard_is_renewed_without_loss_or_duplicates(fan_out):
    proxy, kinesis, stream, arn = fan_out
    limits = proxy.subscriptions.limits
    proxy.subscriptions.limits = replace(limits, subscription_seconds=0.3, records_per_event=7, bytes_per_second=2_000)  # a few events each
    shard_id = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    pushed, report = read(kinesis, stream, shard_id, arn)
    polled, _ = read(kinesis, stream, shard_id)
    assert pushed == polled and len(set(pushed)) == 100
    assert proxy.stats["subscriptions"] >= 2 and report.expired_iterators == proxy.stats["subscriptions"] - 1


def test_resource_in_use_is_waited_out(fan_out):
    proxy, kinesis, stream, arn = fan_out
    proxy.subscriptions.limits = replace(proxy.subscriptions.limits, subscription_seconds=1.5)
    shard_id = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    other = kinesis.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"})
    holder = threading.Thread(target=lambda: [None for _ in other["EventStream"]], daemon=True)
    holder.start()  # another subscription of this consumer to the shard, open for 1.5 s
    time.sleep(0.2)
    pushed, report = read(kinesis, stream, shard_id, arn)
    assert len(pushed) == 100 and proxy.stats["refused"] >= 1 and report.throttled_calls >= 1


@pytest.mark.spark
@pytest.mark.slow
def test_operator_batches_with_efo_equal_polling_and_a_consumer_switches_between_them(
    aws_conn, spark_connect_conn, dynamodb, moto_endpoint, unique_name, tmp_path
):
    """KinesisToSparkOperator with consumer_type="efo" (the Spark job subscribes through the local
    SubscribeToShard) against a polling consumer of the same stream; then the EFO consumer goes
    back to polling and on with its own checkpoints."""
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
    from demo.producer import committed_rows, verify

    proxy = FanOutProxy(moto_endpoint).start()
    try:
        aws_conn(proxy.endpoint)  # Kinesis through the proxy (SubscribeToShard), DynamoDB straight to moto
        kinesis = client(proxy.endpoint)
        create_stream(kinesis, unique_name, 2)
        produced = put_plain(kinesis, unique_name, [(f"p{i}", f"plain {i}".encode()) for i in range(50)])
        produced += put_aggregated(kinesis, unique_name, [(f"a{i}", f"agg {i}".encode()) for i in range(50)])

        def run(consumer: str, consumer_type: str) -> dict:
            return KinesisToSparkOperator(
                task_id="ingest", stream_name=unique_name, consumer_name=consumer, checkpoint_table=f"{unique_name}_t",
                output_path=str(tmp_path / consumer), min_call_interval=0.0, spark_conn_id=spark_connect_conn,
                consumer_type=consumer_type,
            ).execute({})  # fmt: skip

        efo = run("fan-out", "efo")
        polling = run("polling", "polling")
        assert efo["records"] == polling["records"] == 100 and proxy.stats["subscriptions"] >= 2  # one per shard range
        produced += put_plain(kinesis, unique_name, [(f"q{i}", f"more {i}".encode()) for i in range(20)])
        again = run("fan-out", "polling")  # back to polling, from the EFO batches' checkpoints
        assert again["batch_id"] == 2 and again["records"] == 20
        for consumer in ("fan-out", "polling"):
            from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

            store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, consumer)
            rows = committed_rows(tmp_path / consumer, store.head().committed_batch_id)
            expected = produced if consumer == "fan-out" else produced[:100]
            verdict = verify(expected, rows)
            assert verdict.ok, (consumer, verdict)
    finally:
        proxy.stop()
