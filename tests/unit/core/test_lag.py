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


# -- measuring: one plan-and-summary (lag_plan, lag_from_probes), driven sync and async ----------------


class ProbedKinesis:
    """A Kinesis of ``shards`` open shards, for probes: a shard in ``waiting`` holds one record that
    arrived 90 s before NOW, the others are caught up. Counts concurrent GetRecords calls."""

    def __init__(self, shards: int, waiting: set[int], pool: int = 10) -> None:
        import threading
        from types import SimpleNamespace

        from botocore.exceptions import ClientError

        self.shards = [shard(n) for n in range(shards)]
        self.waiting = {f"shardId-{n:012d}" for n in waiting}
        self.meta = SimpleNamespace(region_name="r", endpoint_url="e", config=SimpleNamespace(max_pool_connections=pool))
        self.exceptions = SimpleNamespace(ClientError=ClientError, ExpiredIteratorException=type("Expired", (ClientError,), {}))
        self.lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self.get_records_calls = 0

    def list_shards(self, **kwargs):
        return {"Shards": [{"ShardId": s.shard_id, "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"},
                            "SequenceNumberRange": {"StartingSequenceNumber": "100"}} for s in self.shards]}  # fmt: skip

    def get_shard_iterator(self, **kwargs):
        return {"ShardIterator": kwargs["ShardId"]}

    def get_records(self, ShardIterator: str, Limit: int, **kwargs):  # noqa: N803 - boto3 names
        import time

        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.get_records_calls += 1
        time.sleep(0.02)
        with self.lock:
            self.active -= 1
        if ShardIterator in self.waiting:
            record = {"SequenceNumber": "500", "ApproximateArrivalTimestamp": NOW - timedelta(seconds=90),
                      "Data": b"x", "PartitionKey": "k"}  # fmt: skip
            return {"Records": [record], "NextShardIterator": ShardIterator, "MillisBehindLatest": 0}
        return {"Records": [], "NextShardIterator": ShardIterator, "MillisBehindLatest": 0}


class Store:
    stream_ref = stream_name = "s"
    consumer_name = "c"

    def __init__(self) -> None:
        self.reads = 0

    def committed_checkpoints(self):
        self.reads += 1
        return {}


def test_lag_from_probes_is_the_summary_of_the_plan_and_needs_one_probe_per_range():
    from airflow_kinesis_spark.core.lag import lag_from_probes

    plan = lag_plan("s", "c", [shard(0), shard(1)], {}, NOW)
    probes = [report("shardId-000000000000", 1, NOW - timedelta(seconds=5)), report("shardId-000000000001", 0, stop="caught_up")]
    summary = lag_from_probes(plan, probes, NOW)
    assert summary["shards_with_unconsumed"] == ["shardId-000000000000"] and summary["max_age_ms"] == 5000
    with pytest.raises(ValueError):
        lag_from_probes(plan, probes[:1], NOW)


def test_measure_lag_probes_in_parallel_within_the_clients_connection_pool():
    from airflow_kinesis_spark.core.lag import measure_lag

    client = ProbedKinesis(shards=12, waiting={1, 7}, pool=3)
    summary = measure_lag(client, Store(), now=NOW)
    assert summary["shards_with_unconsumed"] == ["shardId-000000000001", "shardId-000000000007"]
    assert summary["shards"]["shardId-000000000001"]["age_ms"] == 90_000 and len(summary["shards"]) == 12
    assert client.get_records_calls == 12
    assert 2 <= client.most_active <= 3  # parallel, never more threads than pooled connections


def test_trim_gap_probes_run_in_parallel_within_the_clients_connection_pool():
    """Checkpoints not known good within the shortest retention (e.g. a daily batch) are each
    checked with a probe from TRIM_HORIZON: in parallel, as the batch's own probes, not one
    shard after the other."""
    from airflow_kinesis_spark.core.lag import find_trim_gaps
    from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition

    client = ProbedKinesis(shards=12, waiting={1, 7}, pool=3)
    client.describe_stream_summary = lambda **kwargs: {"StreamDescriptionSummary": {"RetentionPeriodHours": 24}}
    old = Checkpoint(position=ExtendedSequenceNumber("400"))  # never known empty after it: doubtful
    ranges = [ShardRange(s.shard_id, StartPosition("AFTER_SEQUENCE_NUMBER", "400"), old, NOW) for s in client.shards]
    gaps = find_trim_gaps(client, "s", ranges, NOW, min_call_interval=0)
    assert sorted(gaps) == ["shardId-000000000001", "shardId-000000000007"]  # their oldest record (500) is past 400
    assert client.get_records_calls == 12
    assert 2 <= client.most_active <= 3  # parallel, never more threads than pooled connections


def test_measure_lag_uses_given_checkpoints_and_reports_its_plan_before_probing():
    from airflow_kinesis_spark.core.lag import measure_lag

    client, store = ProbedKinesis(shards=3, waiting={0}), Store()
    seen = []
    done = Checkpoint(Sentinel.SHARD_END)
    summary = measure_lag(client, store, now=NOW, checkpoints={"shardId-000000000002": done},
                          on_plan=lambda plan, shards: seen.append((len(plan.ranges), len(shards), client.get_records_calls)))  # fmt: skip
    assert store.reads == 0  # the given checkpoints, not a second read
    assert seen == [(2, 3, 0)]  # 2 readable of 3 listed, before any probe
    assert sorted(summary["shards"]) == ["shardId-000000000000", "shardId-000000000001"]
    measure_lag(client, store, now=NOW)
    assert store.reads == 1


def test_sync_and_async_measurements_agree():
    import asyncio

    from airflow_kinesis_spark.core import aio
    from airflow_kinesis_spark.core.lag import measure_lag
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    client = ProbedKinesis(shards=4, waiting={0, 3})

    class AsyncKinesis:
        meta = client.meta

        def __getattr__(self, name):
            async def call(**kwargs):
                return getattr(client, name)(**kwargs)

            return call

    class NoTable:
        async def get_item(self, **kwargs):
            return {}  # no head: no committed batch

    store = DynamoDBCheckpointStore(None, "lag_table", "s", "c")
    sync = measure_lag(client, store, now=NOW, checkpoints={})
    asynchronous = asyncio.run(aio.measure_lag(AsyncKinesis(), NoTable(), store))
    drop = {"measured_at", "max_age_ms"}
    assert {k: v for k, v in sync.items() if k not in drop and k != "shards"} == {
        k: v for k, v in asynchronous.items() if k not in drop and k != "shards"
    }
    strip = lambda s: {k: {f: v for f, v in lag.items() if f != "age_ms"} for k, lag in s["shards"].items()}  # noqa: E731
    assert strip(sync) == strip(asynchronous) and sync["shards_with_unconsumed"] == ["shardId-000000000000", "shardId-000000000003"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_position": "AT_TIMESTAMP"}, "initial_position must be TRIM_HORIZON or LATEST"),
        ({"min_age_seconds": -1}, "min_age_seconds must be >= 0"),
        ({"min_records": 0}, "min_records must be an integer 1..10000"),
        ({"min_records": 10_001}, "min_records must be an integer 1..10000"),
        ({"min_records": True}, "min_records must be an integer 1..10000"),
    ],
)
def test_validate_lag_arguments(kwargs, message):
    from airflow_kinesis_spark.core.lag import validate_lag_arguments

    with pytest.raises(ValueError, match=message):
        validate_lag_arguments(**kwargs)
    validate_lag_arguments(initial_position="LATEST", min_age_seconds=0, min_records=10_000)
