"""Enhanced fan-out under faults, at the reader (no Spark): every SubscribeToShard fault the fault
proxy injects (a failed call, a subscription cut mid-stream, an exception event inside the stream)
leaves the EFO reader with exactly the records a polling reader reads (EXACT), and a fault no
retry cures fails the read loudly (LOUD).

The stack: ``ShardReader(consumer_arn=...)`` -> ``FaultProxy`` -> ``demo.subscribe.FanOutProxy``
(SubscribeToShard) -> moto, all over HTTP on 127.0.0.1.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.consumers import ensure_stream_consumer
from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.ranges import ShardRange
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import list_shards
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import create_stream, make_client
from tests.reliability.fault_proxy import CONSUMER_GONE, SUBSCRIBE_FAULTS
from tests.reliability.harness import fault_stack

pytestmark = pytest.mark.reliability


@pytest.fixture
def efo_shard(moto_endpoint, unique_name):
    """One shard of 40 plain and 60 aggregated user records, a registered consumer, the stack."""
    # 10 Kinesis records per event: the shard's 43 in several events, so a cut after the first is mid-shard
    with fault_stack(moto_endpoint, "efo", fan_out={"records_per_event": 10}, seed=11) as proxy:
        proxy_client = make_client("kinesis", proxy.endpoint)
        create_stream(proxy_client, unique_name, 1)
        produced = put_plain(proxy_client, unique_name, [(f"p{i}", f"plain {i}".encode()) for i in range(40)])
        produced += put_aggregated(proxy_client, unique_name, [(f"a{i % 3}", f"agg {i}".encode()) for i in range(60)])
        arn = ensure_stream_consumer(proxy_client, unique_name, "efo-lake")
        yield proxy, proxy_client, unique_name, arn, produced


def whole_shard(client, stream: str) -> ShardRange:
    """The stream's one shard, from TRIM_HORIZON to now."""
    now = datetime.now(timezone.utc)
    (rng,) = plan_incremental(batch_id=1, stream_name=stream, consumer_name="c", shards=list_shards(client, stream),
                              checkpoints={}, cutoff=now, now=now, output_location="x").ranges  # fmt: skip
    return rng


def read(client, stream: str, rng: ShardRange, consumer_arn: str | None = None):
    """The range's records (as output rows) and its report."""
    records, report = ShardReader(client, stream, rng, min_call_interval=0, read_bytes_per_second=None, backoff_base=0.05,
                                  consumer_arn=consumer_arn).read_all()  # fmt: skip
    return [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records], report


@pytest.mark.parametrize("fault", SUBSCRIBE_FAULTS, ids=[f[1] for f in SUBSCRIBE_FAULTS])
def test_each_subscribe_fault_leaves_the_records_a_polling_reader_reads(efo_shard, fault):
    proxy, client, stream, arn, produced = efo_shard
    rng = whole_shard(client, stream)
    polled, _ = read(client, stream, rng)
    proxy.subscribe_faults = [(fault, 2)]  # the first subscription: its fault (a cut: after one event)
    pushed, report = read(client, stream, rng, arn)
    assert proxy.injected == {"SubscribeToShard:" + fault[1]: 1}
    assert pushed == polled and verify(produced, pushed).ok  # EXACT: nothing lost, nothing twice, in order
    assert report.records == 100 and report.stop_reason == "caught_up"


def test_every_subscribe_fault_in_turn_on_one_read_loses_and_repeats_nothing(efo_shard):
    """Subscriptions of a few events each, and every fault kind in turn: one read through all of them."""
    proxy, client, stream, arn, produced = efo_shard
    rng = whole_shard(client, stream)
    polled, _ = read(client, stream, rng)
    subscriptions = proxy.fan_out.subscriptions
    # 2 Kinesis records per event, paced to 300 bytes/s (the shard's 1,092 bytes in ~3.6 s), subscriptions of
    # 0.3 s: a few events each; renewals not held to one call a second (the service's limit; faster here)
    subscriptions.limits = replace(subscriptions.limits, subscription_seconds=0.3, records_per_event=2, bytes_per_second=300,
                                   call_interval_seconds=None)  # fmt: skip
    proxy.subscribe_faults = [(fault, 2) for fault in SUBSCRIBE_FAULTS]
    pushed, report = read(client, stream, rng, arn)
    assert proxy.injected == {"SubscribeToShard:" + fault[1]: 1 for fault in SUBSCRIBE_FAULTS}, proxy.injected
    assert pushed == polled and verify(produced, pushed).ok
    assert report.records == 100 and report.stop_reason == "caught_up"


def test_a_consumer_gone_mid_stream_fails_the_read_loudly(efo_shard):
    """ResourceNotFoundException inside the stream (the consumer was deregistered): no retry
    cures it; the read raises instead of reporting the records before it as the whole range."""
    proxy, client, stream, arn, _ = efo_shard
    proxy.subscribe_faults = [(CONSUMER_GONE, 2)] * 50
    rng = whole_shard(client, stream)
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        read(client, stream, rng, arn)
