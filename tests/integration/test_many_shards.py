"""Many shards against moto: the probes stay within the Kinesis client's connection pool, and the
batch log stores a plan and the checkpoints of 1,000 shards within DynamoDB's item limit
(issue 17, item 5; the timed figures are in ``make bench``'s scale section)."""

from __future__ import annotations

import logging
import re
import threading
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from botocore.config import Config
from tests.helpers import InProcessJob, checkpoints_after, make_plan, open_shards, read_plan, reports_for

from airflow_kinesis_spark.core.protocol import IncrementalSettings, run_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook
from demo.producer import put_aggregated, put_plain
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, aws_connection, create_stream

pytestmark = pytest.mark.integration

#: DynamoDB's item size limit (DynamoDB developer guide, "Service, account, and table quotas"):
#: 400 KB, counting attribute names and values (UTF-8).
ITEM_LIMIT_BYTES = 400 * 1024


class NoJob:
    """The Spark job of a run that must not need one."""

    def run_handed(self, arguments: Any, *, output_location: str | None = None) -> None:
        raise AssertionError(f"a run without new records started a job for batch {arguments.batch_id}")

    def kill(self) -> None:
        pass


def pool_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config_kwargs", "pool"), [(None, 10), ({"max_pool_connections": 32}, 32)], ids=["botocore-default", "connection-32"]
)
def test_runs_without_new_records_at_256_shards_stay_within_the_connection_pool(
    monkeypatch, moto_endpoint, kinesis, unique_name, caplog, config_kwargs, pool
):
    """Through the hooks (AwsBaseHook builds the clients from the ``aws`` connection; its
    ``config_kwargs`` set botocore's ``max_pool_connections``): the first run records the 256 new
    shards' start positions, the second finds no new records; both probe every shard, and no
    connection is opened and thrown away ("Connection pool is full")."""
    extra = {"config_kwargs": config_kwargs} if config_kwargs else {}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_endpoint, **extra))
    create_stream(kinesis, unique_name, 256)
    kinesis_client = KinesisStreamHook(aws_conn_id="aws_default").conn
    assert kinesis_client.meta.config.max_pool_connections == pool
    store = DynamoDBCheckpointHook(aws_conn_id="aws_default").get_store(f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    caplog.set_level(logging.WARNING, logger="urllib3")
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0)  # fmt: skip

    first = run_incremental(kinesis_client, store, NoJob(), settings, "run-1")
    assert first["status"] == "committed_without_records" and len(first["shards"]) == 256
    second = run_incremental(kinesis_client, store, NoJob(), settings, "run-2")
    assert second["status"] == "no_new_records" and len(second["shards"]) == 256
    assert pool_warnings(caplog) == []


def _item_bytes(item: dict[str, Any]) -> int:
    """An item's size as DynamoDB counts it: attribute names plus values (strings in UTF-8,
    numbers about their digits)."""
    size = 0
    for name, value in item.items():
        (kind, raw), = value.items()
        size += len(name.encode()) + len(str(raw).encode()) + (1 if kind == "N" else 0)
    return size


def _items(store: DynamoDBCheckpointStore, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in store.client.get_paginator("query").paginate(
        TableName=store.table_name, KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues={":pk": {"S": store.pk}, ":p": {"S": prefix}}, ConsistentRead=True,
    ):  # fmt: skip
        out.extend(page["Items"])
    return out


def test_a_plan_and_the_checkpoints_of_1000_shards_are_chunked_within_the_item_limit_and_read_back_equal(
    dynamodb, unique_name
):
    """A synthetic batch of 1,000 shard ranges with real-sized (56-digit) sequence numbers: begin,
    report, commit; every batch-log item is under 400 KB (the plan takes more than one), and
    another process's store reads the plan, the report and the checkpoints back equal."""
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    plan = make_plan(1, open_shards(1000), stream_name=unique_name, consumer_name="lake")
    checkpoints = checkpoints_after(plan, 10**6, sub=3)
    reports = reports_for(plan, checkpoints)
    store.begin(plan, "run-a")
    store.record_report(1, "run-a", reports)
    store.commit(plan, checkpoints, "run-a")

    batch_log = _items(store, "BATCH#00000000000000000001#")
    plan_items = [i for i in batch_log if "#PLAN#" in i["sk"]["S"]]
    assert len(plan_items) >= 2 and {i["chunks"]["N"] for i in plan_items} == {str(len(plan_items))}
    assert {"#PLAN#", "#REPORT#", "#CKPT#"} <= {k for i in batch_log for k in ("#PLAN#", "#REPORT#", "#CKPT#") if k in i["sk"]["S"]}
    sizes = [_item_bytes(i) for i in [*batch_log, *_items(store, "HEAD")]]
    assert max(sizes) < ITEM_LIMIT_BYTES, max(sizes)

    reader = DynamoDBCheckpointStore(dynamodb, store.table_name, unique_name, "lake")
    assert reader.committed_plan() == plan
    assert reader.committed_report() == reports
    assert reader.committed_checkpoints() == checkpoints


class CountingReaderJob(InProcessJob):
    """Reads every planned range in this process (``tests.helpers.read_plan``; a
    ``tests.helpers.InProcessJob``) and notes how many ``GetShardIterator`` calls the run had made
    before it started: the probes' calls."""

    def __init__(self, kinesis: Any, dynamodb: Any, calls: dict[str, int]) -> None:
        super().__init__(dynamodb)
        self.kinesis, self.calls = kinesis, calls
        self.probe_iterators: int | None = None

    def run_handed(self, arguments: Any, *, output_location: str | None = None) -> None:
        assert arguments.records_expected
        super().run_handed(arguments, output_location=output_location)

    def write_reports(self, plan: Any, location: str) -> list:
        self.probe_iterators = self.calls["GetShardIterator"]
        return read_plan(self.kinesis, plan)[1]


def test_a_batch_probes_only_until_the_first_record_and_the_job_reads_every_range(moto_endpoint, dynamodb, unique_name, caplog):
    """A batch's probes stop at the first range with a user record (the job reads every planned
    range anyway): with a Kinesis client pooling 2 connections (2 calls in flight) and records in
    all 16 shards, a few ranges are probed instead of 16, and the batch still reads every record."""
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                           aws_secret_access_key=TEST_SECRET_KEY, config=Config(max_pool_connections=2))  # fmt: skip
    calls = {"GetShardIterator": 0}

    def count(**kwargs: Any) -> None:
        calls["GetShardIterator"] += 1

    kinesis.meta.events.register("before-call.kinesis.GetShardIterator", count)
    create_stream(kinesis, unique_name, 16)
    shards = list_shards(kinesis, unique_name)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"v{i}".encode()) for i in range(400)])
    assert {p.shard_id for p in produced} == {s.shard_id for s in shards}  # a record in every shard
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    job = CountingReaderJob(kinesis, dynamodb, calls)
    caplog.set_level(logging.INFO, logger="airflow_kinesis_spark.core.reader")
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.0)  # fmt: skip

    summary = run_incremental(kinesis, store, job, settings, "run-1")

    # At most 2 probes at once (one per connection; a third may start while the first turns from
    # its GetShardIterator to its GetRecords), then none: 16 without the stop. The first probe
    # may find its record before a second one starts (moto answers in about a millisecond).
    assert 1 <= job.probe_iterators <= 4, job.probe_iterators
    assert summary["status"] == "committed" and summary["records"] == 400 and len(summary["shards"]) == 16
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Probed ")]
    probed = re.fullmatch(r"Probed (\d) of 16 shard ranges .*; (\d+) not probed \(a record was found: the job reads every range\)", line)
    assert probed and 1 <= int(probed[1]) <= 4 and int(probed[1]) + int(probed[2]) == 16, line


def test_idle_probes_overlap_their_pauses_and_keep_within_the_connection_pool(moto_endpoint, dynamodb, unique_name, monkeypatch):
    """A run without new records probes every shard; a probe whose checkpoint points into a KPL
    aggregate re-reads it and waits ``min_call_interval`` before its second ``GetRecords``. Other
    probes run meanwhile (more probes at once than the client pools connections), while no more
    calls are in flight at once than it pools (2 here)."""
    import airflow_kinesis_spark.core.probes as probes

    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                           aws_secret_access_key=TEST_SECRET_KEY, config=Config(max_pool_connections=2))  # fmt: skip
    create_stream(kinesis, unique_name, 8)
    put_aggregated(kinesis, unique_name, [(f"k{i}", f"v{i}".encode()) for i in range(200)], per_aggregate=5)
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    calls: dict[str, int] = {"GetShardIterator": 0}  # CountingReaderJob's; not counted here

    def settings() -> IncrementalSettings:
        return IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root="mem://out",
                                   cutoff=datetime.now(timezone.utc), min_call_interval=0.2)  # fmt: skip

    first = run_incremental(kinesis, store, CountingReaderJob(kinesis, dynamodb, calls), settings(), "run-1")
    assert first["status"] == "committed" and first["records"] == 200
    assert sum(c.position is not None and c.position.sub_sequence_number is not None
               for c in store.committed_checkpoints().values()) >= 3  # fmt: skip

    lock, now, most = threading.Lock(), {"probes": 0, "calls": 0}, {"probes": 0, "calls": 0}

    def enter(kind: str) -> None:
        with lock:
            now[kind] += 1
            most[kind] = max(most[kind], now[kind])

    def leave(kind: str) -> None:
        with lock:
            now[kind] -= 1

    probe_range = probes.probe_range

    def counted_probe(*args: Any, **kwargs: Any) -> Any:
        enter("probes")
        try:
            return probe_range(*args, **kwargs)
        finally:
            leave("probes")

    monkeypatch.setattr(probes, "probe_range", counted_probe)
    kinesis.meta.events.register("before-call.kinesis", lambda **kwargs: enter("calls"))
    kinesis.meta.events.register("after-call.kinesis", lambda **kwargs: leave("calls"))
    kinesis.meta.events.register("after-call-error.kinesis", lambda **kwargs: leave("calls"))

    idle = run_incremental(kinesis, store, NoJob(), settings(), "run-2")

    assert idle["status"] == "no_new_records" and len(idle["shards"]) == 8
    assert most["calls"] <= 2, most
    assert most["probes"] > 2, most  # probes waiting between two calls leave the connections to others
