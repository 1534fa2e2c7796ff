"""A pending plan planted in the checkpoint table is checked field by field before it is re-used
(issue 28, docs/security.md): a pending batch id that does not follow the committed one, a
sentinel start smuggled in through a recorded trim gap, and an enhanced fan-out consumer ARN of
another stream are each refused with ``PendingPlanMismatchError`` before anything is read or
written, and no checkpoint moves.

The protocol runs for real against moto over HTTP (Kinesis, DynamoDB, stream consumers); the job
is the test's ``ReaderJob`` (the real reader, no Spark), which records every plan it is given."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel
from airflow_kinesis_spark.core.protocol import run_incremental
from airflow_kinesis_spark.core.ranges import StartPosition
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import PendingPlanMismatchError
from demo.producer import put_plain
from tests.conftest import create_stream
from tests.integration.test_protocol import ReaderJob, settings

pytestmark = pytest.mark.integration


@pytest.fixture
def committed(kinesis, dynamodb, unique_name):
    """A stream of 2 shards, batch 1 committed (20 records), 10 more records produced."""
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(20)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    assert run_incremental(kinesis, store, ReaderJob(kinesis, dynamodb), settings(unique_name), "first")["records"] == 20
    put_plain(kinesis, unique_name, [(f"m{i}", f"s{i}".encode()) for i in range(10)])
    return store


def next_plan(kinesis, store, batch_id: int):
    now = datetime.now(timezone.utc)
    return plan_incremental(batch_id=batch_id, stream_name=store.stream_name, consumer_name=store.consumer_name,
                            shards=list_shards(kinesis, store.stream_name), checkpoints=store.committed_checkpoints(),
                            cutoff=now, now=now, output_location=f"mem://out/batch_id={batch_id}")  # fmt: skip


def refused(kinesis, store, unique_name, match: str, **kwargs) -> None:
    job = ReaderJob(kinesis, store.client)
    before = (store.head().committed_batch_id, store.committed_checkpoints())
    with pytest.raises(PendingPlanMismatchError, match=match) as info:
        run_incremental(kinesis, store, job, settings(unique_name, **kwargs), "next-run")
    assert "someone else wrote the checkpoint table" in str(info.value)
    assert job.runs == []  # nothing read or written
    assert (store.head().committed_batch_id, store.committed_checkpoints()) == before


def test_a_pending_batch_id_that_does_not_follow_the_committed_one_is_refused(committed, kinesis, unique_name):
    store = committed
    plan = replace(next_plan(kinesis, store, 1), checkpoints=store.committed_checkpoints())  # batch 1 again
    store._write_chunks(1, "PLAN", "planted", plan.to_dict())
    store._update_head("SET pending_batch_id = :n, pending_plan_owner = :o, pending_owner = :o, pending_heartbeat = :z",
                       "attribute_not_exists(pending_batch_id)", {":n": {"N": "1"}, ":o": {"S": "planted"}, ":z": {"N": "0"}},
                       action="plant", owner="planted")  # fmt: skip
    refused(kinesis, store, unique_name, "pending batch 1 does not follow committed batch 1")


@pytest.mark.parametrize("allow_data_loss", [False, True])
def test_a_sentinel_start_through_a_trim_gap_that_is_not_there_is_refused(committed, kinesis, unique_name, allow_data_loss):
    """The planted range skips to AT_TIMESTAMP(now) (the 10 new records unread) and records a
    trim gap to explain it; the stream has none."""
    store = committed
    plan = next_plan(kinesis, store, 2)
    skip = Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=datetime.now(timezone.utc) + timedelta(seconds=1))
    shard = plan.ranges[0].shard_id
    ranges = (replace(plan.ranges[0], start_checkpoint=skip, start=StartPosition.after(skip)), *plan.ranges[1:])
    store.begin(replace(plan, ranges=ranges, trim_gaps={shard: "planted"}), "planted")
    store.release(2, "planted")  # no live holder: the next run would take the plan over at once
    match = "not allow" if not allow_data_loss else "not from TRIM_HORIZON"
    refused(kinesis, store, unique_name, match, allow_data_loss=allow_data_loss)


def test_a_recorded_trim_gap_must_be_real_even_with_allow_data_loss(committed, kinesis, unique_name):
    store = committed
    plan = next_plan(kinesis, store, 2)
    horizon = Checkpoint(Sentinel.TRIM_HORIZON)
    shard = plan.ranges[0].shard_id
    ranges = (replace(plan.ranges[0], start_checkpoint=horizon, start=StartPosition.after(horizon)), *plan.ranges[1:])
    store.begin(replace(plan, ranges=ranges, trim_gaps={shard: "planted"}), "planted")
    store.release(2, "planted")
    refused(kinesis, store, unique_name, "is not behind the stream's trim horizon", allow_data_loss=True)


def test_an_enhanced_fan_out_consumer_arn_of_another_stream_is_refused(committed, kinesis, unique_name):
    store = committed
    other = f"{unique_name}o"
    create_stream(kinesis, other, 1)
    other_arn = kinesis.describe_stream_summary(StreamName=other)["StreamDescriptionSummary"]["StreamARN"]
    foreign = kinesis.register_stream_consumer(StreamARN=other_arn, ConsumerName="lake")["Consumer"]["ConsumerARN"]
    store.begin(replace(next_plan(kinesis, store, 2), consumer_arn=foreign), "planted")
    store.release(2, "planted")
    refused(kinesis, store, unique_name, "consumer ARN: the plan has", consumer_type="efo")
