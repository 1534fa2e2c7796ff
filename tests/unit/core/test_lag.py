"""Lag, backlog, retention and trim-horizon rules (pure: no emulator)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.lag import (
    backlog_ready,
    count_reader,
    lag_plan,
    lag_summary,
    retention_risks,
    shard_lag,
    topology_change,
    trim_gap,
)
from airflow_kinesis_spark.core.planner import advance
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber, Sentinel
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.shards import Shard

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def shard(n: int, parent: int | None = None, adjacent: int | None = None, closed: bool = False) -> Shard:
    name = lambda i: f"shardId-{i:012d}"  # noqa: E731
    return Shard(name(n), name(parent) if parent is not None else None, name(adjacent) if adjacent is not None else None,
                 "100", "900" if closed else None, "0", "99")  # fmt: skip


def report(shard_id: str, records: int, arrival: datetime | None = None, stop: str = "max_records", behind: int | None = None) -> ShardReport:
    pos = ExtendedSequenceNumber("500") if records else None
    return ShardReport(shard_id, pos, pos, records, records * 10, records, records * 10, stop == "shard_end", stop,
                       millis_behind_latest=behind, first_arrival=arrival, last_arrival=arrival)  # fmt: skip


def summary_of(reports: dict[int, ShardReport], checkpoints: dict | None = None):
    shards = [shard(n) for n in sorted(reports)]
    plan = lag_plan("s", "c", shards, checkpoints or {}, NOW)
    lags = [shard_lag(r, reports[int(r.shard_id[-3:])], NOW) for r in plan.ranges]
    return lag_summary(lags, plan, NOW)


def test_lag_is_the_age_of_the_first_unconsumed_record_per_shard():
    s = summary_of({0: report("shardId-000000000000", 1, NOW - timedelta(seconds=90), behind=1234),
                    1: report("shardId-000000000001", 0, stop="caught_up", behind=0)})  # fmt: skip
    assert s["shards"]["shardId-000000000000"]["age_ms"] == 90_000
    assert s["shards"]["shardId-000000000000"]["millis_behind_latest"] == 1234
    assert s["shards"]["shardId-000000000001"] == {
        "checkpoint": "TRIM_HORIZON", "has_unconsumed": False, "oldest_unconsumed_arrival": None,
        "age_ms": None, "millis_behind_latest": 0,
    }  # fmt: skip
    assert s["shards_with_unconsumed"] == ["shardId-000000000000"] and s["max_age_ms"] == 90_000


@pytest.mark.parametrize(("min_age", "age_s", "expected"), [(None, 1, True), (60, 59, False), (60, 60, True), (0, 0, True)])
def test_backlog_ready(min_age, age_s, expected):
    s = summary_of({0: report("shardId-000000000000", 1, NOW - timedelta(seconds=age_s))})
    assert backlog_ready(s, min_age) is expected


def test_no_backlog_is_never_ready():
    s = summary_of({0: report("shardId-000000000000", 0, stop="caught_up")})
    assert backlog_ready(s, None) is False and backlog_ready(s, 0) is False


def test_retention_risks_name_shards_within_the_margin():
    s = summary_of({0: report("shardId-000000000000", 1, NOW - timedelta(hours=23, minutes=30)),
                    1: report("shardId-000000000001", 1, NOW - timedelta(hours=2))})  # fmt: skip
    risks = retention_risks(s, 24, timedelta(hours=1))
    assert list(risks) == ["shardId-000000000000"] and risks["shardId-000000000000"] == 30 * 60_000
    assert retention_risks(s, 24, timedelta(minutes=10)) == {}


HORIZON = NOW - timedelta(hours=24)


def test_trim_gap_when_the_checkpointed_record_is_gone_and_nothing_was_known_after_it():
    stale = Checkpoint(position=ExtendedSequenceNumber("500"), clear_until=HORIZON - timedelta(hours=1))
    assert trim_gap(stale, "700", HORIZON, HORIZON) is True
    assert trim_gap(stale, "500", HORIZON, HORIZON) is False  # the checkpointed record is still there
    assert trim_gap(stale, None, None, HORIZON) is False  # empty shard


def test_no_trim_gap_when_the_stream_was_known_empty_after_the_checkpoint_past_the_horizon():
    fresh = Checkpoint(position=ExtendedSequenceNumber("500"), clear_until=HORIZON + timedelta(minutes=1))
    assert trim_gap(fresh, "700", HORIZON, HORIZON) is False


def test_trim_gap_for_at_timestamp_and_sentinels():
    at = Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=HORIZON - timedelta(hours=2))
    assert trim_gap(at, "700", HORIZON - timedelta(hours=1), HORIZON) is True
    assert trim_gap(at, "700", HORIZON - timedelta(hours=3), HORIZON) is False
    assert trim_gap(Checkpoint(Sentinel.TRIM_HORIZON), "700", HORIZON, HORIZON) is False
    assert trim_gap(Checkpoint(Sentinel.SHARD_END), "700", HORIZON, HORIZON) is False


def test_advance_records_what_is_known_empty_after_the_checkpoint():
    plan = lag_plan("s", "c", [shard(0)], {}, NOW)
    rng = plan.ranges[0]
    at_cutoff = advance(rng, report("shardId-000000000000", 3, NOW - timedelta(seconds=5), stop="cutoff"))
    assert at_cutoff.clear_until == NOW
    capped = advance(rng, report("shardId-000000000000", 3, NOW - timedelta(seconds=5), stop="max_records"))
    assert capped.clear_until == NOW - timedelta(seconds=5)
    assert capped == at_cutoff  # clear_until is metadata, not position
    nothing = advance(rng, report("shardId-000000000000", 0, stop="caught_up"))
    assert nothing.sentinel is Sentinel.TRIM_HORIZON and nothing.clear_until == NOW
    assert Checkpoint.from_dict(capped.to_dict()).clear_until == capped.clear_until


def test_topology_change_after_a_split_and_a_merge():
    before = ["shardId-000000000000", "shardId-000000000001", "shardId-000000000002"]
    shards = [shard(0, closed=True), shard(1, closed=True), shard(2, closed=True),
              shard(3, parent=0), shard(4, parent=0), shard(5, parent=1, adjacent=2)]  # fmt: skip
    change = topology_change(shards, before)
    assert change["changed"] is True
    assert change["new_shards"] == ["shardId-000000000003", "shardId-000000000004", "shardId-000000000005"]
    assert change["closed_shards"] == before
    assert change["children"] == {
        "shardId-000000000000": ["shardId-000000000003", "shardId-000000000004"],
        "shardId-000000000001": ["shardId-000000000005"],
        "shardId-000000000002": ["shardId-000000000005"],
    }
    assert topology_change(shards, change["open_shards"])["changed"] is False


@pytest.mark.parametrize("bound", [1, 250, 10_000])
def test_count_reader_asks_for_its_bound_in_the_first_call(bound):
    """The count's budget is a few calls: its first call asks for the whole bound, not the batch
    readers' cautious first Limit."""
    from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition

    rng = ShardRange(shard_id="shardId-000000000000", start=StartPosition("TRIM_HORIZON"),
                     start_checkpoint=Checkpoint(Sentinel.TRIM_HORIZON), cutoff=datetime.now(timezone.utc))  # fmt: skip
    reader = count_reader("s", rng, bound)
    assert reader.records_request("it")["Limit"] == bound
