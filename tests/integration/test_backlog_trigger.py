"""KinesisBacklogTrigger (AssetWatcher) against moto over HTTP, run as the triggerer runs it (asyncio)."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from airflow.triggers.base import BaseEventTrigger

from airflow_kinesis_spark.core import aio
from airflow_kinesis_spark.core.lag import backlog_due, backlog_from_counts, backlog_summary, lag_plan, shard_backlog
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.shards import Shard, list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.triggers import kinesis as triggers
from airflow_kinesis_spark.triggers.kinesis import KinesisBacklogTrigger
from demo.producer import put_plain
from tests.conftest import create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration

POLL = 0.3  # seconds; the floor is lowered for these tests by the ``fast_polls`` fixture
#: Time for the trigger to start (its aiobotocore clients take seconds to build on a busy machine).
STARTUP = 6.0


@pytest.fixture
def fast_polls(monkeypatch):
    monkeypatch.setattr(triggers, "MIN_BACKLOG_POLL_INTERVAL_S", 0.1)


def trigger_for(stream: str, **kwargs: Any) -> KinesisBacklogTrigger:
    return KinesisBacklogTrigger(stream_name=stream, consumer_name="c", checkpoint_table=f"{stream}_t",
                                 poke_interval=kwargs.pop("poke_interval", POLL), **kwargs)  # fmt: skip


async def _collect(trigger: KinesisBacklogTrigger, out: list[dict], until: Callable[[list[dict]], bool]) -> None:
    async for event in trigger.run():
        out.append(event.payload)
        if until(out):
            return


def events_within(trigger: KinesisBacklogTrigger, seconds: float, stop_after: int | None = None) -> list[dict]:
    """Run the trigger for ``seconds`` (or until ``stop_after`` events) and return its events."""
    out: list[dict] = []

    async def main() -> None:
        try:
            await asyncio.wait_for(_collect(trigger, out, lambda e: stop_after is not None and len(e) >= stop_after), seconds)
        except asyncio.TimeoutError:
            pass

    asyncio.run(main())
    return out


def records_per_shard(kinesis, stream: str) -> dict[str, int]:
    """How many records each shard holds (read to the tip with boto3)."""
    counts = {}
    for shard in list_shards(kinesis, stream):
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard.shard_id, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        total = 0
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            total += len(page["Records"])
            if not page["Records"]:
                break
            iterator = page.get("NextShardIterator")
        counts[shard.shard_id] = total
    return counts


def commit_everything(kinesis, dynamodb, stream: str, batch_id: int) -> None:
    store = DynamoDBCheckpointStore(dynamodb, f"{stream}_t", stream, "c")
    store.ensure_table()
    run_batch_without_spark(kinesis, store, batch_id=batch_id)


def logged(capfd, caplog) -> list[str]:
    """Log lines of this test (Airflow's structlog writes to stdout)."""
    captured = capfd.readouterr()
    return (captured.out + captured.err).splitlines() + caplog.messages


def test_no_event_without_records(fast_polls, aws_conn, kinesis, unique_name, capfd, caplog):
    caplog.set_level(logging.INFO)
    create_stream(kinesis, unique_name, 2)
    assert events_within(trigger_for(unique_name), STARTUP + 5 * POLL) == []
    polls = [m for m in logged(capfd, caplog) if f"backlog of {unique_name}/c" in m]
    assert len(polls) >= 3 and all("0 records waiting in 0 shards" in m and "not due" in m for m in polls)


def test_fires_once_min_records_wait_with_the_exact_count(fast_polls, aws_conn, kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(30)])
    assert events_within(trigger_for(unique_name, min_records=50), STARTUP + 4 * POLL) == []  # 30 < 50
    put_plain(kinesis, unique_name, [(f"k{i}", b"y") for i in range(30)])
    (event,) = events_within(trigger_for(unique_name, min_records=50), 30, stop_after=1)
    json.dumps(event)  # an asset event's extra: JSON only
    assert event["status"] == "success" and event["reason"] == "min_records"
    assert event["stream_name"] == unique_name and event["consumer_name"] == "c" and event["committed_batch_id"] == 0
    truth = records_per_shard(kinesis, unique_name)
    assert event["records_waiting"] == 60 and event["records_waiting_exact"] is True
    assert {k: v["records_waiting"] for k, v in event["shards"].items()} == {k: v for k, v in truth.items() if v}
    assert sorted(event["shards_with_unconsumed"]) == sorted(k for k, v in truth.items() if v)
    assert event["min_records"] == 50 and event["min_age_seconds"] is None and event["max_age_ms"] >= 0


def test_counts_stop_at_the_bound_and_say_so(fast_polls, aws_conn, kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(25)])
    (event,) = events_within(trigger_for(unique_name, min_records=10), 30, stop_after=1)
    assert event["records_waiting"] == 10 and event["records_waiting_exact"] is False


def test_age_threshold_fires_when_count_threshold_is_not_reached(fast_polls, aws_conn, kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"x")] * 3)
    assert events_within(trigger_for(unique_name, min_records=1000, min_age_seconds=3600), STARTUP + 4 * POLL) == []
    (event,) = events_within(trigger_for(unique_name, min_records=1000, min_age_seconds=0), 30, stop_after=1)
    assert event["reason"] == "min_age_seconds" and event["records_waiting"] == 3


def test_no_event_once_the_consumer_committed_past_the_records(fast_polls, aws_conn, kinesis, dynamodb, unique_name):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(20)])
    assert len(events_within(trigger_for(unique_name), 30, stop_after=1)) == 1
    commit_everything(kinesis, dynamodb, unique_name, batch_id=1)
    # A re-created trigger (as after a triggerer restart) reads the committed checkpoints: nothing waits.
    assert events_within(trigger_for(unique_name), STARTUP + 5 * POLL) == []
    put_plain(kinesis, unique_name, [("new", b"z")] * 4)
    (event,) = events_within(trigger_for(unique_name), 30, stop_after=1)
    # Without min_records a poll reads one record per shard (Limit 1): "at least 1" waits.
    assert event["committed_batch_id"] == 1 and event["reason"] == "any_record"
    assert event["records_waiting"] >= 1 and event["records_waiting_exact"] is False
    (counted,) = events_within(trigger_for(unique_name, min_records=4), 30, stop_after=1)
    assert counted["committed_batch_id"] == 1 and counted["records_waiting"] == 4


def test_one_event_per_committed_batch_while_the_trigger_keeps_running(fast_polls, aws_conn, kinesis, dynamodb, unique_name):
    """The DAG run ingests while the trigger polls on: no second event until a batch commits."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(5)])
    trigger = trigger_for(unique_name, min_records=5)
    seen: list[dict] = []

    async def main() -> None:
        events: asyncio.Queue = asyncio.Queue()

        async def consume() -> None:
            async for event in trigger.run():
                seen.append(event.payload)
                await events.put(event.payload)

        task = asyncio.create_task(consume())
        try:
            first = await asyncio.wait_for(events.get(), 30)
            assert first["committed_batch_id"] == 0 and first["records_waiting"] == 5
            await asyncio.to_thread(put_plain, kinesis, unique_name, [("more", b"y")] * 3)  # arrives mid-run
            await asyncio.sleep(8 * POLL)
            assert events.empty(), "fired again before any batch committed"
            await asyncio.to_thread(commit_everything, kinesis, dynamodb, unique_name, 1)
            await asyncio.to_thread(put_plain, kinesis, unique_name, [("late", b"z")] * 2)
            assert await asyncio.to_thread(events_within, trigger_for(unique_name, min_records=5), STARTUP) == []  # 2 < 5
            await asyncio.to_thread(put_plain, kinesis, unique_name, [("late", b"w")] * 3)
            second = await asyncio.wait_for(events.get(), 30)
            assert second["committed_batch_id"] == 1 and second["records_waiting"] == 5
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert len(seen) == 2


@asynccontextmanager
async def running(trigger) -> AsyncIterator[asyncio.Queue]:
    """The trigger running in a task; yields the queue its events' payloads arrive on, and
    cancels the task on exit."""
    events: asyncio.Queue = asyncio.Queue()

    async def consume() -> None:
        async for event in trigger.run():
            await events.put(event.payload)

    task = asyncio.create_task(consume())
    try:
        yield events
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_after_an_event_a_commit_starts_the_next_poll_at_once(aws_conn, kinesis, dynamodb, unique_name):
    """While it holds, the trigger watches the head: a commit is followed by a backlog poll within
    about a second, not a ``poke_interval`` (here 600 s) later."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(3)])
    trigger = trigger_for(unique_name, poke_interval=600)

    async def main() -> list[dict]:
        async with running(trigger) as events:
            first = await asyncio.wait_for(events.get(), 30)  # the first poll runs at once
            await asyncio.to_thread(put_plain, kinesis, unique_name, [("more", b"y")] * 2)  # arrives mid-run
            await asyncio.to_thread(commit_everything, kinesis, dynamodb, unique_name, 1)
            await asyncio.to_thread(put_plain, kinesis, unique_name, [("late", b"z")] * 2)
            second = await asyncio.wait_for(events.get(), 60)  # 60 s, a tenth of poke_interval
            return [first, second]

    first, second = asyncio.run(main())
    assert first["committed_batch_id"] == 0 and second["committed_batch_id"] == 1


def test_after_a_commit_with_nothing_waiting_it_polls_at_the_interval_again(aws_conn, kinesis, dynamodb, unique_name):
    """The head watch ends with the poll after the commit: when nothing waits then, the trigger
    is no longer holding and polls Kinesis every ``poke_interval`` (600 s here), not every second."""
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", b"x") for i in range(3)])
    trigger = trigger_for(unique_name, poke_interval=600)
    polls: list[dict | None] = []
    evaluate = trigger.evaluate

    async def counted(kinesis_client: Any, dynamodb_client: Any) -> dict | None:
        result = await evaluate(kinesis_client, dynamodb_client)
        polls.append(result)
        return result

    trigger.evaluate = counted  # type: ignore[method-assign]

    async def main() -> None:
        async with running(trigger) as events:
            await asyncio.wait_for(events.get(), 30)
            await asyncio.to_thread(commit_everything, kinesis, dynamodb, unique_name, 1)
            deadline = time.monotonic() + 60
            while len(polls) < 2 and time.monotonic() < deadline:  # the poll after the commit
                await asyncio.sleep(0.1)
            await asyncio.sleep(5 * triggers.BACKLOG_HOLD_HEAD_INTERVAL_S)

    asyncio.run(main())
    assert len(polls) == 2, polls
    assert polls[0] is not None and polls[1] is None  # the event, then nothing waiting after batch 1


def test_a_failing_poll_is_logged_and_never_fires(fast_polls, aws_conn, unique_name, capfd, caplog):
    caplog.set_level(logging.INFO)
    assert events_within(trigger_for(f"{unique_name}-missing"), STARTUP + 4 * POLL) == []
    failures = [m for m in logged(capfd, caplog) if "backlog poll of" in m and "failed: StreamNotFoundError" in m]
    assert len(failures) >= 2  # it went on polling


def test_poll_interval_floor_and_argument_checks():
    assert triggers.MIN_BACKLOG_POLL_INTERVAL_S == 5.0
    with pytest.raises(ValueError, match=r"poke_interval must be at least 5 seconds .*GetRecords"):
        trigger_for("s", poke_interval=4.9)
    assert trigger_for("s", poke_interval=5).poke_interval == 5
    for bad in (0, 10_001, True, 2.5):
        with pytest.raises(ValueError, match="min_records must be an integer 1..10000"):
            trigger_for("s", poke_interval=60, min_records=bad)
    with pytest.raises(ValueError, match="min_age_seconds"):
        trigger_for("s", poke_interval=60, min_age_seconds=-1)
    with pytest.raises(ValueError, match="initial_position"):
        trigger_for("s", poke_interval=60, initial_position="AT_TIMESTAMP")


def test_serialize_round_trips_and_is_an_event_trigger():
    trigger = KinesisBacklogTrigger(stream_name="s", consumer_name="c", checkpoint_table="t", min_records=500,
                                    min_age_seconds=120.0, poke_interval=30, region_name="eu-west-1")  # fmt: skip
    assert isinstance(trigger, BaseEventTrigger)
    path, kwargs = trigger.serialize()
    json.dumps(kwargs)
    assert path == "airflow_kinesis_spark.triggers.kinesis.KinesisBacklogTrigger"
    assert kwargs["min_records"] == 500 and kwargs["min_age_seconds"] == 120.0 and kwargs["poke_interval"] == 30
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert (rebuilt.min_records, rebuilt.min_age_seconds, rebuilt.initial_position) == (500, 120.0, "TRIM_HORIZON")
    with pytest.raises(TypeError, match="min_record"):
        KinesisBacklogTrigger(**{**kwargs, "min_record": 5})  # a misspelt argument is an error, not an extra
    # What identifies the watcher's trigger in Airflow's database: stable across re-creation.
    assert BaseEventTrigger.hash(path, kwargs) == BaseEventTrigger.hash(*rebuilt.serialize())


class _EndlessShard:
    """A Kinesis client whose shard never shows its tip (empty pages, MillisBehindLatest > 0)."""

    def __init__(self) -> None:
        self.get_records_calls: list[float] = []

    async def get_shard_iterator(self, **kwargs: Any) -> dict:
        return {"ShardIterator": "it"}

    async def get_records(self, **kwargs: Any) -> dict:
        self.get_records_calls.append(time.monotonic())
        return {"Records": [], "NextShardIterator": "it", "MillisBehindLatest": 60_000}


def test_count_makes_at_most_three_get_records_calls_per_shard_paced_for_the_limit():
    from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition
    from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel

    client = _EndlessShard()
    rng = ShardRange("shardId-000000000000", StartPosition("TRIM_HORIZON"), Checkpoint(Sentinel.TRIM_HORIZON),
                     datetime.now(timezone.utc) + timedelta(hours=1))  # fmt: skip
    report, budget_spent = asyncio.run(aio.count_range(client, "s", rng, 100))
    assert budget_spent is True and report.records == 0
    calls = client.get_records_calls
    assert len(calls) == 3  # COUNT_MAX_GET_RECORDS_CALLS
    assert all(b - a >= 0.19 for a, b in zip(calls, calls[1:]))  # 5 GetRecords per second per shard at most


def test_backlog_due_takes_whichever_threshold_comes_first():
    now = datetime.now(timezone.utc)
    shard = Shard("shardId-000000000000", None, None, "1", None, "0", "9")
    plan = lag_plan("s", "c", [shard], {}, now)
    (rng,) = plan.ranges
    waiting = ShardReport(rng.shard_id, None, None, 7, 7, 7, 7, False, "caught_up", first_arrival=now - timedelta(seconds=30))
    summary = backlog_summary([shard_backlog(rng, waiting, now, budget_spent=False)], plan, now, 10)
    assert summary["records_waiting"] == 7 and summary["records_waiting_exact"] is True
    assert backlog_from_counts(plan, [(waiting, False)], now, 10) == summary
    assert backlog_from_counts(plan, [(waiting, True)], now, 10)["records_waiting_exact"] is False  # budget spent: a lower bound
    assert backlog_due(summary, None, None) == "any_record"
    assert backlog_due(summary, 7, None) == "min_records"
    assert backlog_due(summary, 8, None) is None
    assert backlog_due(summary, 8, 30) == "min_age_seconds"
    assert backlog_due(summary, 8, 31) is None
    empty = ShardReport(rng.shard_id, None, None, 0, 0, 0, 0, False, "caught_up")
    idle = backlog_summary([shard_backlog(rng, empty, now, budget_spent=False)], plan, now, 10)
    assert backlog_due(idle, None, None) is None and backlog_due(idle, None, 0) is None
