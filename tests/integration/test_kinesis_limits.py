"""The benchmark's Kinesis-limits proxy answers like the service, and our readers live within it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.concurrent_read import read_concurrently
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import list_shards
from benchmarks.kinesis_limits import MIB, KinesisLimits, LimitsProxyProcess, ThrottlingProxy
from benchmarks.workload import access_log_lines, load_backlog, naive_consume
from demo.producer import put_plain
from tests.conftest import DATA_DIR, REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.integration]


def client(endpoint: str, attempts: int = 1):
    """A Kinesis client through the proxy; ``attempts`` counts the first call (botocore's
    ``total_max_attempts``: 1 leaves every throttle to the reader, where the tests count them)."""
    import boto3

    return boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                        aws_secret_access_key=TEST_SECRET_KEY,
                        config=Config(retries={"mode": "standard", "total_max_attempts": attempts}))  # fmt: skip


@pytest.fixture(scope="module")
def lines():
    return access_log_lines(DATA_DIR / "apache_access_log.gz")


@pytest.fixture
def stream(kinesis, unique_name):
    """This test's stream, deleted after it: moto keeps every record in memory, and tens of MiB
    there make each of its calls slower for the tests that follow."""
    yield unique_name
    kinesis.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def ranges(kinesis, stream):
    now = datetime.now(timezone.utc)
    return plan_incremental(batch_id=1, stream_name=stream, consumer_name="c", shards=list_shards(kinesis, stream),
                            checkpoints={}, cutoff=now, now=now, output_location="unused").ranges  # fmt: skip


def test_paced_readers_stay_within_the_limits_and_unpaced_ones_are_throttled(kinesis, moto_endpoint, stream, lines):
    create_stream(kinesis, stream, 2)
    loaded = load_backlog(kinesis, stream, 8, lines)
    with ThrottlingProxy(moto_endpoint) as proxy:
        c = client(proxy.endpoint)
        # Responses of about 1 MiB: several calls per shard, so the pacing between them is what is tested.
        readers = [ShardReader(c, stream, r, initial_limit=10, target_response_bytes=MIB) for r in ranges(kinesis, stream)]
        started = time.monotonic()
        read = sum(len(page) for _, page in read_concurrently(readers) if page)
        elapsed = time.monotonic() - started
        assert read == loaded["user_records"]
        assert proxy.stats["GetRecords.throttled"] <= 1, proxy.stats
        assert min(r.report.get_records_calls for r in readers) >= 3, [(r.report.get_records_calls, r.report.kinesis_bytes, r.report.kinesis_records) for r in readers]
        # 2 shards x 2 MiB/s is the ceiling; paced readers come close to it without passing it.
        # A reader stops at the response that reaches the tip, before the pause that response
        # owes the shard (the service's debt rule lets a response exceed the rate, repaid after).
        owed = sum(r.last_response_bytes for r in readers)
        assert loaded["bytes"] - owed <= 2 * 2 * MIB * 1.05 * elapsed
        assert proxy.read_rate(stream) >= 0.6 * 2 * 2 * MIB

        proxy.reset_stats()
        unpaced = [ShardReader(c, stream, r, min_call_interval=0, read_bytes_per_second=None, backoff_base=0.05)
                   for r in ranges(kinesis, stream)]  # fmt: skip
        read = sum(len(page) for _, page in read_concurrently(unpaced) if page)
        assert read == loaded["user_records"]  # throttling costs time, never records
        assert proxy.stats["GetRecords.throttled"] > 0
        assert sum(r.report.throttled_calls for r in unpaced) > 0


def test_responses_are_cut_at_10_mib_and_the_naive_consumer_still_reads_everything(kinesis, moto_endpoint, stream, lines):
    create_stream(kinesis, stream, 1)
    # Small records first: the proxy's first pieces then ask the emulator for many records, and
    # the ~50 KiB aggregates after them overflow 10 MiB: the answer is cut.
    small = put_plain(kinesis, stream, [(f"k{i}", b"x" * 100) for i in range(20)])
    loaded = load_backlog(kinesis, stream, 14, lines)
    with ThrottlingProxy(moto_endpoint, KinesisLimits(throttle=False)) as proxy:
        result = naive_consume(client(proxy.endpoint, attempts=4), stream)
        assert result.user_records == loaded["user_records"] + len(small)
        assert result.bytes == loaded["bytes"] + 20 * 100
        assert proxy.stats["GetRecords.cut_at_10MiB"] >= 1
        assert 9 * MIB < proxy.stats["GetRecords.largest_response_bytes"] <= 10 * MIB
        assert proxy.stats["GetRecords.throttled"] == 0


def test_the_emulator_is_asked_for_about_what_one_answer_serves(kinesis, moto_endpoint, stream, lines):
    """``Limit=10000`` over ~50 KiB records: each answer is filled to ~10 MiB, but the emulator is
    never asked for the whole shard (moto would serialize all of it for every call)."""
    create_stream(kinesis, stream, 1)
    loaded = load_backlog(kinesis, stream, 30, lines)
    with ThrottlingProxy(moto_endpoint, KinesisLimits(throttle=False)) as proxy:
        result = naive_consume(client(proxy.endpoint, attempts=4), stream)
        assert result.user_records == loaded["user_records"]
        assert 9 * MIB < proxy.stats["GetRecords.largest_response_bytes"] <= 10 * MIB
        # ~30 MiB in 10 MiB answers: 4 calls (the last finds the tip); a piece or two per call
        assert result.get_records_calls <= 5
        assert proxy.stats["GetRecords.upstream_pieces"] <= 2 * result.get_records_calls
        # what the emulator serialized: each record once (forwarding Limit=10000 as it is: ~2x)
        assert proxy.stats["GetRecords.upstream_records"] == proxy.stats["GetRecords.records"] == loaded["kinesis_records"]


def test_limit_over_10000_is_rejected_and_iterators_expire(kinesis, moto_endpoint, unique_name):
    create_stream(kinesis, unique_name, 1)
    shard = kinesis.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    with ThrottlingProxy(moto_endpoint, KinesisLimits(iterator_ttl_seconds=0.5)) as proxy:
        c = client(proxy.endpoint)
        iterator = c.get_shard_iterator(StreamName=unique_name, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        with pytest.raises(ClientError, match="InvalidArgumentException"):
            c.get_records(ShardIterator=iterator, Limit=10_001)
        time.sleep(0.6)
        with pytest.raises(c.exceptions.ExpiredIteratorException):
            c.get_records(ShardIterator=iterator, Limit=10)
        assert proxy.stats["GetRecords.expired"] == 1


def test_five_calls_per_second_per_shard(kinesis, moto_endpoint, unique_name):
    create_stream(kinesis, unique_name, 1)
    shard = kinesis.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    with ThrottlingProxy(moto_endpoint) as proxy:
        c = client(proxy.endpoint)
        iterator = c.get_shard_iterator(StreamName=unique_name, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        # Seven calls at once: the proxy decides at arrival, however slow the emulator answers.
        barrier = threading.Barrier(7)

        def call(_: int) -> str:
            barrier.wait()
            try:
                c.get_records(ShardIterator=iterator, Limit=10)
                return "ok"
            except c.exceptions.ProvisionedThroughputExceededException:
                return "throttled"

        with ThreadPoolExecutor(7) as pool:
            outcomes = sorted(pool.map(call, range(7)))
        assert outcomes == ["ok"] * 5 + ["throttled"] * 2, outcomes
        # a second later the shard takes calls again
        time.sleep(1.1)
        assert c.get_records(ShardIterator=iterator, Limit=10)["Records"] == []


def test_enhanced_fan_out_consumers_each_have_their_own_2_mib_per_second(kinesis, moto_endpoint, stream, lines):
    """Two EFO consumers and a paced polling consumer read one backlog at once through the proxy:
    each EFO consumer is paced to 2 MiB/s per shard of its own (SubscribeToShard, served by
    demo.subscribe), none of them takes from the polling consumer's budget, all read everything."""
    from airflow_kinesis_spark.core.consumers import ensure_stream_consumer

    create_stream(kinesis, stream, 2)
    loaded = load_backlog(kinesis, stream, 6, lines)
    with ThrottlingProxy(moto_endpoint) as proxy:
        c = client(proxy.endpoint, attempts=4)
        arns = [ensure_stream_consumer(c, stream, name, poll_seconds=0.1) for name in ("efo-a", "efo-b")]
        readers = {consumer: [ShardReader(c, stream, r, consumer_arn=consumer_arn) for r in ranges(kinesis, stream)]
                   for consumer, consumer_arn in (("polling", None), ("efo-a", arns[0]), ("efo-b", arns[1]))}  # fmt: skip
        read: dict[str, int] = dict.fromkeys(readers, 0)
        owner = {id(reader): consumer for consumer, group in readers.items() for reader in group}
        started = time.monotonic()
        for reader, page in read_concurrently([reader for group in readers.values() for reader in group]):
            if page:
                read[owner[id(reader)]] += len(page)
        elapsed = time.monotonic() - started
        assert read == dict.fromkeys(readers, loaded["user_records"])  # everything, once each
        assert proxy.stats[f"SubscribeToShard.bytes:{stream}"] == 2 * loaded["bytes"]
        assert proxy.stats[f"SubscribeToShard.subscriptions:{stream}"] == 4  # one per consumer and shard
        assert proxy.stats["GetRecords.throttled"] <= 1, proxy.stats  # the EFO reads took nothing from polling
        # Each EFO consumer is held to 2 shards x 2 MiB/s: its ~6 MiB took at least about 1.5 s
        # (less the first event of each shard, which goes at once).
        assert elapsed >= 0.9 * (loaded["bytes"] - 2 * MIB) / (2 * 2 * MIB), elapsed


def test_the_proxy_in_a_process_of_its_own_serves_and_counts(kinesis, moto_endpoint, stream):
    """``make bench`` runs the proxy as LimitsProxyProcess: its counts are asked from the process, current each time."""
    create_stream(kinesis, stream, 1)
    kinesis.put_record(StreamName=stream, Data=b"x", PartitionKey="k")
    with LimitsProxyProcess(moto_endpoint) as proxy:
        c = client(proxy.endpoint)
        assert proxy.stats["GetShardIterator"] == 0
        (rng,) = ranges(kinesis, stream)
        records, report = ShardReader(c, stream, rng, min_call_interval=0).read_all()
        assert [r.data for r in records] == [b"x"] and report.stop_reason == "caught_up"
        assert proxy.stats["GetShardIterator"] == 1 and proxy.stats[f"GetRecords:{stream}"] == report.get_records_calls == 1
        assert proxy.read_rate(stream) > 0
        process = proxy._process
    assert process is not None and process.poll() is not None  # stopped with the block


def test_polling_consumers_of_one_shard_share_its_read_budget(kinesis, moto_endpoint, stream, lines):
    """Three polling consumers read one shard's backlog at once through the proxy, each with a
    client as the Spark job makes it (botocore standard retries, ``own_throttling``): every
    throttle reaches the readers' reports, and each consumer gets about a third of the shard's
    2 MiB/s, none of them the shard to itself while the others wait."""
    from airflow_kinesis_spark.core.read_options import own_throttling

    create_stream(kinesis, stream, 1)
    loaded = load_backlog(kinesis, stream, 8, lines)
    with ThrottlingProxy(moto_endpoint) as proxy:
        c = own_throttling(client(proxy.endpoint, attempts=10))
        (rng,) = ranges(kinesis, stream)
        readers = [ShardReader(c, stream, rng, target_response_bytes=MIB) for _ in range(3)]
        read = [0, 0, 0]
        for reader, page in read_concurrently(readers):
            if page:
                read[readers.index(reader)] += len(page)
        assert read == [loaded["user_records"]] * 3
        reports = [r.report for r in readers]
        assert sum(r.throttled_calls for r in reports) == proxy.stats["GetRecords.throttled"] > 0, proxy.stats
        # A read lasts until its last response is paid for at the shard's rate (the proxy's debt rule).
        rates = [r.kinesis_bytes / (r.read_ended - r.read_started + reader.last_response_bytes / (2 * MIB)) / (2 * MIB)
                 for r, reader in zip(reports, readers)]  # fmt: skip
        # Each about a third (alone, a paced reader gets ~0.9); with botocore's or exponential
        # backoff, one got 0.37 and another 0.2.
        assert max(rates) <= 0.45 and max(rates) <= 1.5 * min(rates), rates
        assert sum(rates) >= 0.6, rates  # the shard is not left idle
