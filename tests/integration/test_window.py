"""Window mode reading on moto: time slices, closed shards (reader in-process)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.window import plan_window
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


def read_window(kinesis, stream: str, start: datetime, end: datetime, slices: int):
    plan = plan_window(stream_name=stream, consumer_name="w", shards=list_shards(kinesis, stream), start=start, end=end,
                       slices=slices, now=datetime.now(timezone.utc), output_location="memory://w")  # fmt: skip
    rows, reports = [], []
    for rng in plan.ranges:
        records, report = ShardReader(kinesis, stream, rng, min_call_interval=0).read_all()
        rows.extend(records)
        reports.append(report)
    return plan, rows, reports


def key(r):
    return (r.shard_id, int(r.sequence_number), -1 if r.sub_sequence_number is None else r.sub_sequence_number)


def test_four_time_slices_on_one_shard_return_exactly_the_rows_of_one(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    start = datetime.now(timezone.utc)
    produced = []
    for burst in range(6):  # arrivals spread over ~0.6 s, so slice boundaries fall among records
        produced += put_plain(kinesis, unique_name, [(f"k{i}", f"b{burst}-{i}".encode()) for i in range(15)])
        produced += put_aggregated(kinesis, unique_name, [(f"a{burst}", f"agg{burst}-{i}".encode()) for i in range(5)])
        time.sleep(0.1)
    time.sleep(0.05)
    end = datetime.now(timezone.utc)
    _, one, _ = read_window(kinesis, unique_name, start, end, 1)
    plan, four, reports = read_window(kinesis, unique_name, start, end, 4)
    assert len(plan.ranges) == 4 and sum(1 for r in reports if r.records) >= 2  # slices really split the records
    assert sorted(one, key=key) == sorted(four, key=key)
    assert len(four) == len({key(r) for r in four}) == 120
    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in four]
    assert verify(produced, rows).ok


def test_window_excludes_records_outside_it(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    before = put_plain(kinesis, unique_name, [("k", b"before")])
    time.sleep(0.05)
    start = datetime.now(timezone.utc)
    inside = put_plain(kinesis, unique_name, [("k", b"inside1"), ("k", b"inside2")])
    time.sleep(0.05)
    end = datetime.now(timezone.utc)
    time.sleep(0.01)
    put_plain(kinesis, unique_name, [("k", b"after")])
    _, rows, _ = read_window(kinesis, unique_name, start, end, 2)
    assert sorted(r.data for r in rows) == [b"inside1", b"inside2"]
    assert before and inside


def test_window_covering_a_shard_closed_by_a_split_includes_its_records(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    start = datetime.now(timezone.utc)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(40)])
    (parent,) = list_shards(kinesis, unique_name)
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2
    kinesis.split_shard(StreamName=unique_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    kinesis.get_waiter("stream_exists").wait(StreamName=unique_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    time.sleep(0.05)
    end = datetime.now(timezone.utc)
    shards = list_shards(kinesis, unique_name)
    assert next(s for s in shards if s.shard_id == parent.shard_id).is_closed and len(shards) == 3
    plan, rows, reports = read_window(kinesis, unique_name, start, end, 2)
    assert {r.shard_id for r in plan.ranges} == {s.shard_id for s in shards}
    assert {r.shard_id for r in rows} == {parent.shard_id}
    assert verify(produced, [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in rows]).ok


@pytest.mark.parametrize(
    ("start_delta", "end_delta", "error", "message"),
    [
        (timedelta(minutes=-5), timedelta(minutes=-10), ValueError, "is not before its end"),
        (timedelta(minutes=-5), timedelta(minutes=5), ValueError, "is in the future"),
        (timedelta(days=-3), timedelta(days=-2), "AirflowFailException", r"before the trim horizon .*allow_data_loss=True"),
    ],
    ids=["reversed", "future", "before_trim_horizon"],
)
def test_bad_windows_fail_clearly_and_write_nothing(aws_conn, kinesis, unique_name, tmp_path, start_delta, end_delta, error, message):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_kinesis_spark.core.positions import format_timestamp
    from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator

    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")])
    now = datetime.now(timezone.utc)
    op = KinesisWindowToSparkOperator(task_id="w", stream_name=unique_name, output_path=str(tmp_path / "out"),
                                      window_start=format_timestamp(now + start_delta),
                                      window_end=format_timestamp(now + end_delta))  # fmt: skip
    with pytest.raises(AirflowFailException if error == "AirflowFailException" else error, match=message):
        op.execute({})
    assert not (tmp_path / "out").exists()
