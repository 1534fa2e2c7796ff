"""LOUD: the operator refuses to plan past lost data unless allow_data_loss=True (moto, no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber
from airflow_kinesis_spark.core.protocol import IncrementalSettings, plan_batch
from airflow_kinesis_spark.core.summaries import incremental_summary
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions, SparkSettings
from demo.producer import put_plain
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _aws(aws_conn):
    return aws_conn


def commit_checkpoints(kinesis, dynamodb, stream: str, checkpoints: dict[str, Checkpoint]) -> DynamoDBCheckpointStore:
    """Commit batch 1 with the given checkpoints, as a run long ago would have."""
    store = DynamoDBCheckpointStore(dynamodb, f"{stream}_ckpt", stream, "lake")
    store.ensure_table()
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=1, stream_name=stream, consumer_name="lake", shards=list_shards(kinesis, stream),
                            checkpoints={}, cutoff=now, now=now, output_location="x")  # fmt: skip
    store.begin(plan, "long-ago")
    store.commit(plan, checkpoints, "long-ago")
    return store


def operator(stream: str, tmp_path, **kwargs) -> KinesisToSparkOperator:
    return KinesisToSparkOperator(task_id="ingest", stream_name=stream, consumer_name="lake", checkpoint_table=f"{stream}_ckpt",
                                  output_path=str(tmp_path / "out"), read_options=ReadOptions(min_call_interval=0.0), **kwargs)  # fmt: skip


def plan(kinesis, store, stream: str, tmp_path, **kwargs):
    """Plan batch 2 as the operator's run would (nothing persisted)."""
    now = datetime.now(timezone.utc)
    settings = IncrementalSettings(stream_name=stream, consumer_name="lake", output_root=str(tmp_path / "out"), cutoff=now,
                                   min_call_interval=0.0, **kwargs)  # fmt: skip
    return plan_batch(kinesis, store, settings, 2, now)


def test_checkpoint_behind_the_trim_horizon_fails_without_allow_data_loss(kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b")])
    (shard,) = list_shards(kinesis, unique_name)
    # The checkpointed record (sequence number 0) is older than every record kept, and the batch
    # that made the checkpoint knew nothing after it for three days: records may have aged out.
    stale = Checkpoint(position=ExtendedSequenceNumber("0"), clear_until=datetime.now(timezone.utc) - timedelta(days=3))
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {shard.shard_id: stale})
    with pytest.raises(AirflowFailException, match=r"fell behind the trim horizon.*shardId-000000000000: checkpoint 0, oldest record kept 1 .*allow_data_loss=True"):
        operator(unique_name, tmp_path).execute({})
    assert store.head().pending_batch_id is None and store.head().committed_batch_id == 1  # nothing planned, nothing moved

    planned = plan(kinesis, store, unique_name, tmp_path, allow_data_loss=True)
    assert list(planned.trim_gaps) == [shard.shard_id] and "oldest record kept 1" in planned.trim_gaps[shard.shard_id]
    assert incremental_summary(planned, [], planned.checkpoints, "committed", reused=False)["trim_gaps"] == dict(planned.trim_gaps)


def test_a_recent_checkpoint_is_not_a_gap_and_costs_no_extra_call(kinesis, dynamodb, unique_name, tmp_path, monkeypatch):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    (shard,) = list_shards(kinesis, unique_name)
    fresh = Checkpoint(position=ExtendedSequenceNumber("0"), clear_until=datetime.now(timezone.utc) - timedelta(hours=1))
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {shard.shard_id: fresh})
    calls = []
    kinesis.meta.events.register("before-call.kinesis.DescribeStreamSummary", lambda **kw: calls.append(kw))
    assert plan(kinesis, store, unique_name, tmp_path).trim_gaps == {}
    assert calls == []  # no DescribeStreamSummary, no probe from TRIM_HORIZON


def test_a_checkpointed_shard_that_vanished_unfinished_is_data_loss(kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    ghost = "shardId-000000000099"
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {ghost: Checkpoint.at("5")})
    with pytest.raises(AirflowFailException, match=rf"shards {ghost} .* no longer listed.*allow_data_loss=True"):
        operator(unique_name, tmp_path).execute({})
    planned = plan(kinesis, store, unique_name, tmp_path, allow_data_loss=True)
    assert planned.lost_shards == (ghost,) and ghost not in planned.checkpoints  # counted as SHARD_END, then retired


def test_with_allow_data_loss_a_gapped_shard_restarts_at_the_oldest_record_kept(kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    (shard,) = list_shards(kinesis, unique_name)
    stale = Checkpoint(position=ExtendedSequenceNumber("0"), clear_until=datetime.now(timezone.utc) - timedelta(days=3))
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {shard.shard_id: stale})
    (rng,) = plan(kinesis, store, unique_name, tmp_path, allow_data_loss=True).ranges
    assert rng.start.iterator_type == "TRIM_HORIZON" and str(rng.start_checkpoint) == "TRIM_HORIZON"


def test_an_idle_consumer_records_hourly_that_its_shards_were_empty(kinesis, dynamodb, unique_name, tmp_path):
    """Without it, a stream idle for longer than its retention would look like lost data."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a")])
    (shard,) = list_shards(kinesis, unique_name)
    it = kinesis.get_shard_iterator(StreamName=unique_name, ShardId=shard.shard_id, ShardIteratorType="TRIM_HORIZON")
    (last,) = kinesis.get_records(ShardIterator=it["ShardIterator"])["Records"]
    old = Checkpoint(position=ExtendedSequenceNumber(last["SequenceNumber"]), clear_until=datetime.now(timezone.utc) - timedelta(hours=2))
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {shard.shard_id: old})
    first = operator(unique_name, tmp_path).execute({})
    assert first["status"] == "committed_without_records" and first["batch_id"] == 2
    refreshed = store.committed_checkpoints()[shard.shard_id]
    assert refreshed == old and refreshed.clear_until > datetime.now(timezone.utc) - timedelta(minutes=1)
    second = operator(unique_name, tmp_path).execute({})
    assert second["status"] == "no_new_records" and store.head().committed_batch_id == 2
    assert not (tmp_path / "out").exists()  # no Spark job, no files


@pytest.mark.spark
@pytest.mark.slow
def test_with_allow_data_loss_the_run_proceeds_and_reports_the_gap(kinesis, dynamodb, unique_name, tmp_path, spark_connect_conn):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"a"), ("k", b"b"), ("k", b"c")])
    (shard,) = list_shards(kinesis, unique_name)
    stale = Checkpoint(position=ExtendedSequenceNumber("0"), clear_until=datetime.now(timezone.utc) - timedelta(days=3))
    store = commit_checkpoints(kinesis, dynamodb, unique_name, {shard.shard_id: stale})
    summary = operator(unique_name, tmp_path, allow_data_loss=True, spark_settings=SparkSettings(conn_id=spark_connect_conn)).execute({})
    assert summary["status"] == "committed" and summary["records"] == 3  # read from the oldest record kept
    assert list(summary["trim_gaps"]) == [shard.shard_id] and "trim horizon" in summary["trim_gaps"][shard.shard_id]
    assert store.head().committed_batch_id == 2
