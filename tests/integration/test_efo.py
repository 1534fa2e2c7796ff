"""Enhanced fan-out against a local SubscribeToShard (demo.subscribe.FanOutProxy in front of a moto
server over HTTP): the reader's EFO path reads what polling reads, renews ended, failed and
taken-over subscriptions without loss or duplicates, waits out ResourceInUseException, ends a
closed shard at its child shards, and reads across a split and a merge what polling reads
(children after parents); the operator over Spark Connect with consumer_type="efo"."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone

import boto3
import pytest
from botocore.exceptions import ClientError, EventStreamError

from airflow_kinesis_spark.core.consumers import deregister_stream_consumer, ensure_stream_consumer
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel
from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition
from airflow_kinesis_spark.core.reader import ShardReader
from demo.producer import put_aggregated, put_plain
from demo.subscribe import FanOutProxy
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.helpers import InProcessJob

pytestmark = [pytest.mark.integration]

FAR = datetime(2100, 1, 1, tzinfo=timezone.utc)


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


def test_a_subscription_taken_over_mid_shard_is_renewed_without_loss_or_duplicates(fan_out):
    """Another subscription of the consumer to the shard, opened after the takeover time, takes
    the shard over: the reader's subscription ends with a ResourceInUseException event and the
    reader renews it after the last record read (and takes the shard back in turn)."""
    proxy, kinesis, stream, arn = fan_out
    # No wall-clock race: the reader's subscription is paced at 100 B/s (about 27 s for the shard) until
    # the other subscription has taken the shard over, so the takeover always lands mid-shard, however
    # loaded the machine; then the pace goes up and the reader renews and takes the shard back.
    slow = replace(proxy.subscriptions.limits, takeover_seconds=0.5, bytes_per_second=100, records_per_event=5)
    proxy.subscriptions.limits = slow
    shard_id = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    outcome: dict = {}

    def other() -> None:
        deadline = time.monotonic() + 30
        while proxy.stats["subscriptions"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.7)  # the reader's subscription is older than the takeover time now
        try:
            response = kinesis.subscribe_to_shard(ConsumerARN=arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"})
            outcome["subscribed_after_records"] = proxy.stats["records"]
            proxy.subscriptions.limits = replace(slow, bytes_per_second=1_000)
            for _ in response["EventStream"]:
                pass
            outcome["ended"] = "cleanly"
        except (EventStreamError, ClientError) as error:
            outcome["ended"] = error.response["Error"]["Code"]

    holder = threading.Thread(target=other, daemon=True)
    holder.start()
    pushed, report = read(kinesis, stream, shard_id, arn)
    holder.join(timeout=30)
    polled, _ = read(kinesis, stream, shard_id)
    assert pushed == polled and len(set(pushed)) == 100
    assert 0 < outcome.get("subscribed_after_records", 0) < 100, outcome  # taken over mid-shard
    assert proxy.stats["taken_over"] >= 1 and outcome.get("ended") == "ResourceInUseException", outcome
    assert report.throttled_calls >= 1  # the reader's own renewal after the takeover


def test_a_shard_closed_after_planning_ends_with_its_child_shards(fan_out):
    """A range planned while its shard was open (no EndingSequenceNumber in the plan): the
    subscription's last event lists the child shards and has no continuation, and the reader
    reports the shard's end, with every record of it. (Polling on moto ends such a range caught
    up instead: moto never ends a closed shard's iterator chain.)"""
    proxy, kinesis, stream, arn = fan_out
    (parent,) = kinesis.list_shards(StreamName=stream)["Shards"]
    rng = whole_shard(parent["ShardId"])
    assert rng.ending_sequence_number is None
    middle = (int(parent["HashKeyRange"]["StartingHashKey"]) + int(parent["HashKeyRange"]["EndingHashKey"])) // 2
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(middle))
    records, report = ShardReader(kinesis, stream, rng, min_call_interval=0, read_bytes_per_second=None, consumer_arn=arn,
                                  backoff_base=0.2).read_all()  # fmt: skip
    polled, polled_report = read(kinesis, stream, parent["ShardId"])
    assert [(r.sequence_number, r.sub_sequence_number, r.data) for r in records] == polled and len(polled) == 100
    assert report.shard_end and report.stop_reason == "shard_end" and polled_report.stop_reason == "caught_up"
    assert proxy.stats["shard_end"] == 1


@pytest.mark.spark
@pytest.mark.slow
def test_operator_batches_with_efo_equal_polling_and_a_consumer_switches_between_them(
    aws_conn, spark_connect_conn, dynamodb, moto_endpoint, unique_name, tmp_path
):
    """KinesisToSparkOperator with consumer_type="efo" (the Spark job subscribes through the local
    SubscribeToShard) against a polling consumer of the same stream; then the EFO consumer goes
    back to polling and on with its own checkpoints."""
    from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
    from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
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
                output_path=str(tmp_path / consumer), read_options=ReadOptions(min_call_interval=0.0),
                spark_settings=SparkSettings(conn_id=spark_connect_conn),
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


class SubscribingJob(InProcessJob):
    """A job without Spark (``tests.helpers.InProcessJob``) that reads every planned range as the
    Spark job does (``ShardReader`` with the plan's consumer ARN: SubscribeToShard for an EFO plan,
    GetRecords otherwise), in the plan's order, and keeps the rows and reports of each batch."""

    def __init__(self, kinesis, dynamodb) -> None:
        super().__init__(dynamodb)
        self.kinesis = kinesis
        self.plans: dict[int, object] = {}
        self.rows: dict[int, list[tuple]] = {}
        self.reports: dict[int, list] = {}

    def write_reports(self, plan, location: str):
        rows, reports = [], []
        for rng in plan.ranges:
            records, report = ShardReader(self.kinesis, plan.stream_name, rng, min_call_interval=0, read_bytes_per_second=None,
                                          consumer_arn=plan.consumer_arn, backoff_base=0.2).read_all()  # fmt: skip
            rows += [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records]
            reports.append(report)
        self.plans[plan.batch_id], self.rows[plan.batch_id], self.reports[plan.batch_id] = plan, rows, reports
        return reports


def keys_in(low: int, high: int, n: int, prefix: str) -> list[str]:
    """``n`` partition keys whose MD5 falls in ``low <= h < high`` (moto's test of a shard's range)."""
    found, i = [], 0
    while len(found) < n:
        key, i = f"{prefix}{i}", i + 1
        if low <= int(hashlib.md5(key.encode()).hexdigest(), 16) < high:
            found.append(key)
    return found


@pytest.mark.slow
def test_efo_across_a_split_and_a_merge_reads_what_polling_reads_children_after_parents(moto_endpoint, dynamodb, unique_name):
    """The batch protocol (planner, DynamoDB store, probes, commit) with a job that reads like the
    Spark job, one EFO consumer and one polling consumer of one stream on moto, records put
    before, between and after a split and a merge. moto (DESIGN.md, Local stack) keeps writing to
    a closed parent, so a split's children stay empty; a merge copies its parents' records into
    the child, which gives the merged child records to read after its parents."""
    from airflow_kinesis_spark.core.protocol import IncrementalSettings, run_incremental
    from airflow_kinesis_spark.core.shards import list_shards
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from demo.producer import verify

    proxy = FanOutProxy(moto_endpoint).start()
    try:
        kinesis = client(proxy.endpoint)
        stream = unique_name
        create_stream(kinesis, stream, 2)
        shard0, shard1 = list_shards(kinesis, stream)
        consumers = {"efo": "fan-out", "polling": "poller"}
        stores = {kind: DynamoDBCheckpointStore(dynamodb, f"{stream}_{kind}", stream, name) for kind, name in consumers.items()}
        jobs = {kind: SubscribingJob(kinesis, dynamodb) for kind in consumers}
        for store in stores.values():
            store.ensure_table()

        def step() -> None:
            """One batch of each consumer over the same records."""
            time.sleep(0.01)  # the cutoff in a later millisecond than the puts
            cutoff = datetime.now(timezone.utc)
            for kind, name in consumers.items():
                settings = IncrementalSettings(stream_name=stream, consumer_name=name, output_root=f"mem://{kind}", cutoff=cutoff,
                                               min_call_interval=0.0, consumer_type=kind)  # fmt: skip
                run_incremental(kinesis, stores[kind], jobs[kind], settings, f"{kind}-{len(jobs[kind].plans) + 1}")

        produced = put_plain(kinesis, stream, [(f"b{i}", f"before {i}".encode()) for i in range(30)])
        produced += put_aggregated(kinesis, stream, [(f"a{i % 5}", f"aggregated {i}".encode()) for i in range(40)])
        step()  # batch 1: shards 0 and 1
        middle = (int(shard0.starting_hash_key) + int(shard0.ending_hash_key)) // 2
        kinesis.split_shard(StreamName=stream, ShardToSplit=shard0.shard_id, NewStartingHashKey=str(middle))
        produced += put_plain(kinesis, stream, [(f"s{i}", f"between {i}".encode()) for i in range(30)])
        step()  # batch 2: shard 0 to its end, shard 1
        lower, upper = sorted((s for s in list_shards(kinesis, stream) if s.parent_shard_id == shard0.shard_id),
                              key=lambda s: int(s.starting_hash_key))  # fmt: skip
        shard1_keys = keys_in(int(shard1.starting_hash_key), int(shard1.ending_hash_key), 10, "one-")
        produced += put_plain(kinesis, stream, [(k, f"split {k}".encode()) for k in shard1_keys])
        step()  # batch 3: the children (empty on moto) and shard 1
        copied = [r[4] for kind in ("polling",) for b in (1, 2, 3) for r in jobs[kind].rows.get(b, []) if r[0] == shard1.shard_id]
        kinesis.merge_shards(StreamName=stream, ShardToMerge=upper.shard_id, AdjacentShardToMerge=shard1.shard_id)
        merged = next(s for s in list_shards(kinesis, stream) if s.adjacent_parent_shard_id)
        produced += put_plain(kinesis, stream, [(k, f"after {k}".encode()) for k in keys_in(int(shard1.starting_hash_key),
                                                int(shard1.ending_hash_key), 20, "after-")])  # fmt: skip
        step()  # batch 4: shard 1 and the upper child to their ends, the lower child
        step()  # batch 5: the merged child
        step()  # nothing new

        efo, polling = jobs["efo"], jobs["polling"]
        assert sorted(efo.plans) == sorted(polling.plans) == [1, 2, 3, 4, 5]
        assert efo.plans[1].consumer_arn and not polling.plans[1].consumer_arn
        for batch_id in efo.plans:  # the same records, in the same order, with the same reports
            assert efo.rows[batch_id] == polling.rows[batch_id], batch_id
            summary = [[(r.shard_id, r.first, r.last, r.records, r.shard_end, r.stop_reason) for r in job.reports[batch_id]]
                       for job in (efo, polling)]  # fmt: skip
            assert summary[0] == summary[1], batch_id

        # ORDER: children are planned only after their parents' ends are committed
        planned = {b: {r.shard_id for r in plan.ranges} for b, plan in efo.plans.items()}
        ended = {b: {r.shard_id for r in efo.reports[b] if r.shard_end} for b in efo.plans}
        assert planned[1] == planned[2] == {shard0.shard_id, shard1.shard_id} and ended[2] == {shard0.shard_id}
        assert planned[3] == {lower.shard_id, upper.shard_id, shard1.shard_id}
        assert ended[4] == {upper.shard_id, shard1.shard_id} and merged.shard_id not in planned[4]
        assert merged.shard_id in planned[5] and {merged.parent_shard_id, merged.adjacent_parent_shard_id} == {
            upper.shard_id, shard1.shard_id}  # fmt: skip
        # each closed shard's subscription ended with its child shards
        assert proxy.stats["shard_end"] >= 3 and proxy.stats["subscriptions"] >= 9

        # EXACT: every produced record once; the merged child holds moto's copies of shard 1's records
        rows = [row for b in sorted(efo.rows) for row in efo.rows[b]]
        assert len({r[:3] for r in rows}) == len(rows)
        verdict = verify(produced, [r for r in rows if r[0] != merged.shard_id])
        assert verdict.ok, verdict
        assert sorted(r[4] for r in rows if r[0] == merged.shard_id) == sorted(copied) and copied
    finally:
        proxy.stop()
