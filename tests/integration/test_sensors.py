"""Sensors and their triggers against the emulators over HTTP (moto; kinesalite for lag)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_kinesis_spark.core.planner import plan_incremental, validate_report
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.exceptions import CheckpointStoreCorruptError
from airflow_kinesis_spark.sensors.kinesis import (
    KinesisReshardingSensor,
    KinesisRetentionGuardSensor,
    KinesisShardLagSensor,
)
from airflow_kinesis_spark.triggers.kinesis import (
    KinesisReshardingTrigger,
    KinesisBatchReportTrigger,
    KinesisRetentionTrigger,
    KinesisShardLagTrigger,
)
from demo.producer import put_plain
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


def consume_everything(kinesis, dynamodb, stream: str, table: str, batch_id: int = 1) -> None:
    """Commit a batch that read every shard to the tip (the operator's protocol without Spark)."""
    store = DynamoDBCheckpointStore(dynamodb, table, stream, "c")
    store.ensure_table()
    now = datetime.now(timezone.utc)
    plan = plan_incremental(batch_id=batch_id, stream_name=stream, consumer_name="c", shards=list_shards(kinesis, stream),
                            checkpoints=store.committed_checkpoints(), cutoff=now, now=now, output_location="x")  # fmt: skip
    reports = [ShardReader(kinesis, stream, r, min_call_interval=0).read_all()[1] for r in plan.ranges]
    owner = f"test{batch_id}"
    store.begin(plan, owner)
    store.commit(plan, validate_report(plan, reports), owner)


def sensor_args(stream: str, **kwargs) -> dict:
    return {"task_id": "s", "stream_name": stream, "consumer_name": "c", "checkpoint_table": f"{stream}_t", **kwargs}


def first_event(trigger):
    async def run():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(run(), timeout=60))


def test_lag_sensor_waits_for_records_and_reports_per_shard_lag(aws_conn, kinesis, dynamodb, unique_name):
    create_stream(kinesis, unique_name, 2)
    idle = KinesisShardLagSensor(**sensor_args(unique_name)).poke({})
    assert idle.is_done is False and idle.xcom_value["shards_with_unconsumed"] == []
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(20)])
    ready = KinesisShardLagSensor(**sensor_args(unique_name)).poke({})
    assert ready.is_done is True
    lag = ready.xcom_value
    assert set(lag["shards"]) == {s.shard_id for s in list_shards(kinesis, unique_name)}
    assert lag["shards_with_unconsumed"] and lag["max_age_ms"] >= 0
    assert all(v["checkpoint"] == "TRIM_HORIZON" for v in lag["shards"].values())
    too_young = KinesisShardLagSensor(**sensor_args(unique_name, min_age_seconds=3600)).poke({})
    assert too_young.is_done is False
    consume_everything(kinesis, dynamodb, unique_name, f"{unique_name}_t")
    caught_up = KinesisShardLagSensor(**sensor_args(unique_name)).poke({})
    assert caught_up.is_done is False and caught_up.xcom_value["shards_with_unconsumed"] == []
    assert all(v["checkpoint"] != "TRIM_HORIZON" for v in caught_up.xcom_value["shards"].values())


def test_lag_sensor_on_kinesalite_measures_age_although_millis_behind_latest_is_always_zero(
    aws_conn, kinesalite_endpoint, kinesalite, unique_name
):
    aws_conn(kinesalite_endpoint)
    create_stream(kinesalite, unique_name, 1)
    put_plain(kinesalite, unique_name, [("k", b"x")])
    result = KinesisShardLagSensor(**sensor_args(unique_name)).poke({})
    assert result.is_done is True
    (lag,) = result.xcom_value["shards"].values()
    assert lag["has_unconsumed"] and lag["age_ms"] is not None and lag["millis_behind_latest"] == 0
    kinesalite.delete_stream(StreamName=unique_name)


def test_lag_trigger_fires_with_the_same_summary(aws_conn, kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [("k1", b"x"), ("k2", b"y")])
    trigger = KinesisShardLagSensor(**sensor_args(unique_name, poke_interval=1)).trigger()
    event = first_event(trigger)
    assert event["status"] == "success"
    assert event["lag"]["shards_with_unconsumed"] == KinesisShardLagSensor(**sensor_args(unique_name)).poke({}).xcom_value["shards_with_unconsumed"]


def test_resharding_sensor_reports_a_split(aws_conn, kinesis, dynamodb, unique_name):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(10)])
    sensor = KinesisReshardingSensor(**sensor_args(unique_name))
    assert sensor.poke({}).is_done is False  # no committed batch to compare with
    consume_everything(kinesis, dynamodb, unique_name, f"{unique_name}_t")
    assert sensor.poke({}).is_done is False  # same shards as the committed batch
    parent = list_shards(kinesis, unique_name)[0]
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2
    kinesis.split_shard(StreamName=unique_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    kinesis.get_waiter("stream_exists").wait(StreamName=unique_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    result = KinesisReshardingSensor(**sensor_args(unique_name)).poke({})
    assert result.is_done is True
    change = result.xcom_value
    assert change["closed_shards"] == [parent.shard_id]
    assert len(change["new_shards"]) == 2 and change["children"] == {parent.shard_id: change["new_shards"]}
    assert change["committed_batch_id"] == 1
    event = first_event(KinesisReshardingSensor(**sensor_args(unique_name, poke_interval=1)).trigger())
    assert event["status"] == "success" and event["change"]["new_shards"] == change["new_shards"]


def test_resharding_sensor_waits_while_the_stream_is_updating(aws_conn, kinesis, dynamodb, unique_name, monkeypatch):
    """A real split: the children are listed. While the stream still says UPDATING (as AWS does
    while an UpdateShardCount goes on, children of some shards listed and others not yet; moto
    ends every reshard at once, so its status is held here) the sensor waits; once ACTIVE it fires."""
    create_stream(kinesis, unique_name, 1)
    consume_everything(kinesis, dynamodb, unique_name, f"{unique_name}_t")
    parent = list_shards(kinesis, unique_name)[0]
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2
    kinesis.split_shard(StreamName=unique_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    kinesis.get_waiter("stream_exists").wait(StreamName=unique_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    assert len(list_shards(kinesis, unique_name)) == 3
    sensor = KinesisReshardingSensor(**sensor_args(unique_name))
    real = type(sensor.kinesis_hook).describe_stream_summary
    with monkeypatch.context() as patched:
        patched.setattr(type(sensor.kinesis_hook), "describe_stream_summary",
                        lambda self, name, max_age=0.0: {**real(self, name), "StreamStatus": "UPDATING"})  # fmt: skip
        assert sensor.poke({}).is_done is False
    assert KinesisReshardingSensor(**sensor_args(unique_name)).poke({}).is_done is True


def test_retention_guard_passes_fails_and_soft_fails(aws_conn, kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    ok = KinesisRetentionGuardSensor(**sensor_args(unique_name)).poke({})
    assert ok.is_done is True and ok.xcom_value["at_risk"] == {} and ok.xcom_value["retention_period_hours"] == 24
    # A margin as long as the retention period puts every waiting record at risk.
    with pytest.raises(AirflowFailException, match=r"within 1 day, 0:00:00 of the 24.0 h retention period on shardId-"):
        KinesisRetentionGuardSensor(**sensor_args(unique_name, margin=timedelta(hours=24))).poke({})
    with pytest.raises(AirflowSkipException):
        KinesisRetentionGuardSensor(**sensor_args(unique_name, margin=timedelta(hours=24), soft_fail=True)).poke({})
    event = first_event(KinesisRetentionGuardSensor(**sensor_args(unique_name, margin=timedelta(hours=24))).trigger())
    assert event["status"] == "success" and list(event["at_risk"]) == [s.shard_id for s in list_shards(kinesis, unique_name)]


def test_sync_and_async_fail_alike_when_the_committed_checkpoints_are_missing(aws_conn, kinesis, dynamodb, unique_name):
    """A head that points at checkpoints no longer in the table is an error in the sensor and in
    its trigger alike (never "no checkpoints": that would measure from TRIM_HORIZON)."""
    create_stream(kinesis, unique_name, 1)
    consume_everything(kinesis, dynamodb, unique_name, f"{unique_name}_t")
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "c")
    head = store.head()
    chunks = dynamodb.query(**store.chunks_request(head.committed_batch_id, "CKPT", head.committed_owner))["Items"]
    assert chunks
    for item in chunks:
        dynamodb.delete_item(TableName=store.table_name, Key={"pk": item["pk"], "sk": item["sk"]})
    with pytest.raises(CheckpointStoreCorruptError, match="the checkpoints of committed batch 1 are missing"):
        KinesisShardLagSensor(**sensor_args(unique_name)).poke({})
    event = first_event(KinesisShardLagSensor(**sensor_args(unique_name, poke_interval=1)).trigger())
    assert event["status"] == "error" and event["message"].startswith("CheckpointStoreCorruptError: ")
    assert "the checkpoints of committed batch 1 are missing" in event["message"]


TRIGGERS = [
    KinesisShardLagTrigger(stream_name="s", consumer_name="c", checkpoint_table="t", min_age_seconds=30.0, poke_interval=5),
    KinesisReshardingTrigger(stream_name="s", consumer_name="c", checkpoint_table="t", region_name="eu-west-1"),
    KinesisRetentionTrigger(stream_name="s", consumer_name="c", checkpoint_table="t", margin_seconds=3600.0),
    KinesisBatchReportTrigger(stream_name="s", consumer_name="c", checkpoint_table="t", batch_id=4, lease_owner="dag.task.run.try1.ab12",
                              lease_seconds=120.0, handed_at=1_790_000_000.5, job_start_timeout=600.0, poke_interval=10.0),
]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: type(t).__name__)
def test_triggers_serialize_and_round_trip(trigger):
    import importlib

    path, kwargs = trigger.serialize()
    json.dumps(kwargs)  # JSON-serialisable only
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert all(getattr(rebuilt, key) == value for key, value in kwargs.items())  # every argument an attribute of its name


@pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: type(t).__name__)
def test_triggers_refuse_unknown_arguments(trigger):
    path, kwargs = trigger.serialize()
    with pytest.raises(TypeError, match="min_age_secs"):
        type(trigger)(**kwargs, min_age_secs=5)


def test_a_trigger_serialized_by_the_previous_version_still_deserializes():
    """The arguments as the previous version (settings in an untyped ``extra``) wrote them."""
    old = {"stream_name": "apache-access-log", "consumer_name": "parquet-lake", "checkpoint_table": "kinesis_spark_checkpoints",
           "poke_interval": 5.0, "aws_conn_id": "aws_default", "region_name": None, "min_age_seconds": None,
           "initial_position": "LATEST"}  # fmt: skip
    trigger = KinesisShardLagTrigger(**old)
    assert trigger.initial_position == "LATEST" and trigger.min_age_seconds is None
    assert trigger.serialize()[1] == {**old, "verify": None, "botocore_config": None}  # the AWS arguments added since


def test_sensors_hand_their_settings_to_their_triggers_by_name():
    lag = KinesisShardLagSensor(**sensor_args("s", min_age_seconds=90, initial_position="LATEST", poke_interval=7)).trigger()
    assert lag.serialize()[1] == {"stream_name": "s", "consumer_name": "c", "checkpoint_table": "s_t", "poke_interval": 7.0,
                                  "aws_conn_id": "aws_default", "region_name": None, "verify": None, "botocore_config": None,
                                  "min_age_seconds": 90, "initial_position": "LATEST"}  # fmt: skip
    guard = KinesisRetentionGuardSensor(**sensor_args("s", margin=timedelta(minutes=30), initial_position="LATEST")).trigger()
    assert guard.margin_seconds == 1800.0 and guard.initial_position == "LATEST"
    assert KinesisReshardingSensor(**sensor_args("s", region_name="eu-west-1")).trigger().region_name == "eu-west-1"


@pytest.mark.parametrize("trigger_class", [KinesisShardLagTrigger, KinesisRetentionTrigger], ids=lambda c: c.__name__)
def test_triggers_check_initial_position_when_built(trigger_class):
    """In the worker, when the sensor defers: not as an error event from the triggerer later."""
    args = {"stream_name": "s", "consumer_name": "c", "checkpoint_table": "t"}
    if trigger_class is KinesisRetentionTrigger:
        args["margin_seconds"] = 60.0
    with pytest.raises(ValueError, match="initial_position must be TRIM_HORIZON or LATEST"):
        trigger_class(**args, initial_position="AT_TIMESTAMP")
