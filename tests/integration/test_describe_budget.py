"""Thirty sensors and triggers of one deployment at once stay under DescribeStreamSummary's limit
of 20 calls per second per account (Kinesis API reference, DescribeStreamSummary).

kinesalite behind the benchmark's limits proxy (in a process of its own, as the service is
elsewhere), which refuses a 21st call within a second with ``LimitExceededException`` and
counts every arrival. 15 sensors poke in worker processes of their own (forked, as Airflow runs
each task instance in a process), 15 triggers poll in one event loop (one triggerer); every
process shares the host's pacer and summary cache (``core.stream_summary``) through the state
directory.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
import traceback
from datetime import timedelta

import pytest

from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.sensors.kinesis import KinesisReshardingSensor, KinesisRetentionGuardSensor
from airflow_kinesis_spark.triggers.kinesis import KinesisReshardingTrigger, KinesisRetentionTrigger
from benchmarks.kinesis_limits import LimitsProxyProcess
from demo.producer import put_plain
from tests.conftest import create_stream
from tests.integration.test_sensors import consume_everything

pytestmark = pytest.mark.integration

STREAMS = 15  # one sensor (a process) and one trigger (the event loop) per stream
RESHARDED = 12  # streams 0..11: a resharding sensor and trigger; 12..14: a retention guard sensor and trigger
#: Every resharding sensor and trigger polls 5 times a second: 120 polls a second in all (24
#: pollers), far more than the account's 20 DescribeStreamSummary calls a second if each asked
#: the service, also on a loaded machine where the polls come slower.
POKE_INTERVAL = 0.2
#: Seconds of polling before the resharding streams are split (and their sensors and triggers fire).
POLL_SECONDS = 6


def poke_until_done(kind: str, kwargs: dict, start_at: float, results) -> None:
    """A sensor in poke mode, in a process of its own: from ``start_at`` (epoch seconds; every
    sensor at once, as sensors of DAGs scheduled alike), poke every ``poke_interval`` until done."""
    try:
        cls = KinesisReshardingSensor if kind == "resharding" else KinesisRetentionGuardSensor
        sensor = cls(**kwargs)
        sensor.kinesis_hook.conn  # the connection's endpoint check, before the start
        time.sleep(max(0.0, start_at - time.time()))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            result = sensor.poke({})
            if result.is_done:
                results.put((kwargs["stream_name"], "sensor", result.xcom_value))
                return
            time.sleep(sensor.poke_interval)
        results.put((kwargs["stream_name"], "sensor", "timed out"))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((kwargs["stream_name"], "sensor", traceback.format_exc()))


async def first_event(trigger, start_at: float) -> dict:
    await asyncio.sleep(max(0.0, start_at - time.time()))
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


def split_first_shard(client, stream: str) -> str:
    parent = list_shards(client, stream)[0]
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2 + 1
    client.split_shard(StreamName=stream, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 200})
    return parent.shard_id


def test_thirty_sensors_and_triggers_stay_under_the_accounts_describe_stream_summary_limit(
    aws_conn, kinesalite_endpoint, kinesalite, dynamodb, unique_name, monkeypatch, tmp_path
):
    streams = [f"{unique_name}-{i}" for i in range(STREAMS)]
    for stream in streams:
        create_stream(kinesalite, stream, 2)
        put_plain(kinesalite, stream, [(f"k{i}", b"x") for i in range(4)])
    for stream in streams[:RESHARDED]:  # the baseline the resharding sensors compare with
        consume_everything(kinesalite, dynamodb, stream, f"{stream}_t")
    monkeypatch.setenv("AIRFLOW__KINESIS_SPARK__SHARED_STATE_DIR", str(tmp_path / "state"))
    with LimitsProxyProcess(kinesalite_endpoint) as proxy:
        aws_conn(proxy.endpoint)  # Kinesis through the proxy; DynamoDB on moto
        results = multiprocessing.get_context("fork").Queue()

        def args(stream: str) -> dict:
            return {"stream_name": stream, "consumer_name": "c", "checkpoint_table": f"{stream}_t"}

        start_at = time.time() + 8  # the sensors' processes are forked and their hooks built by then
        sensors = []
        for i, stream in enumerate(streams):
            kind = "resharding" if i < RESHARDED else "retention"
            kwargs = {"task_id": f"s{i}", "poke_interval": POKE_INTERVAL, **args(stream)}
            process = multiprocessing.get_context("fork").Process(target=poke_until_done, args=(kind, kwargs, start_at, results))
            sensors.append(process)
        triggers = [
            KinesisReshardingTrigger(poke_interval=POKE_INTERVAL, **args(s)) if i < RESHARDED
            else KinesisRetentionTrigger(margin_seconds=3600.0, poke_interval=POKE_INTERVAL, **args(s))
            for i, s in enumerate(streams)
        ]  # fmt: skip

        async def everything() -> tuple[list[dict], dict[str, str]]:
            for process in sensors:
                process.start()
            polling = [asyncio.ensure_future(first_event(t, start_at)) for t in triggers]
            await asyncio.sleep(max(0.0, start_at - time.time()) + POLL_SECONDS)  # polls before the split
            parents = {s: await asyncio.to_thread(split_first_shard, kinesalite, s) for s in streams[:RESHARDED]}
            return await asyncio.wait_for(asyncio.gather(*polling), timeout=120), parents

        events, parents = asyncio.run(everything())
        answers = {}
        for _ in sensors:
            stream, _, answer = results.get(timeout=120)
            answers[stream] = answer
        for process in sensors:
            process.join(timeout=30)
        stats = proxy.stats

    assert stats["DescribeStreamSummary"] >= STREAMS, stats  # every stream asked at least once
    assert stats["DescribeStreamSummary.max_per_second"] <= 20, stats
    assert stats["DescribeStreamSummary.throttled"] == 0, stats
    for i, (stream, event) in enumerate(zip(streams, events, strict=True)):
        answer = answers[stream]
        assert isinstance(answer, dict), answer
        assert event["status"] == "success", event
        if i < RESHARDED:
            for change in (answer, event["change"]):
                assert change["closed_shards"] == [parents[stream]] and len(change["new_shards"]) == 2, change
        else:
            assert answer["retention_period_hours"] == event["retention_period_hours"] == 24.0
            assert answer["at_risk"] == event["at_risk"] == {}


def test_limit_exceeded_is_retried_by_botocore_sync_and_async(aws_conn, kinesalite_endpoint, kinesalite, unique_name,
                                                              monkeypatch):  # fmt: skip
    """What the budget leaves to botocore: a ``DescribeStreamSummary`` the service refuses with
    ``LimitExceededException`` (other hosts, other applications of the account) is retried by the
    connection's client, sync and async, in botocore's default retry mode (its ``_retry.json``
    has a Kinesis policy for it; standard and adaptive count it as throttling)."""
    from concurrent.futures import ThreadPoolExecutor

    import botocore.retryhandler

    from airflow_kinesis_spark.core import aio
    from airflow_kinesis_spark.core.shards import describe_stream_summary
    from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook
    from benchmarks.kinesis_limits import KinesisLimits, ThrottlingProxy

    create_stream(kinesalite, unique_name, 1)
    # botocore's legacy jitter (aiobotocore's too) draws from botocore.retryhandler's random: the
    # four retries wait r1, 2*r2, 4*r3 and 8*r4 seconds (r uniform in [0, 1)), and all four fall
    # within the one second a limit of 1 call a second refuses with probability 1/(4! * 64), about
    # 1 in 1,536. The draw is not what this test checks: seeded, for this test only.
    monkeypatch.setattr(botocore.retryhandler, "random", random.Random(20261128))
    with ThrottlingProxy(kinesalite_endpoint, KinesisLimits(describe_stream_summary_per_second=1)) as proxy:
        aws_conn(proxy.endpoint)
        hook = KinesisStreamHook()
        with ThreadPoolExecutor(2) as pool:  # unpaced (no budget): the second call within the second is refused
            answers = list(pool.map(lambda _: describe_stream_summary(hook.conn, unique_name), range(2)))
        assert [a["StreamName"] for a in answers] == [unique_name] * 2
        assert proxy.stats["DescribeStreamSummary.throttled"] >= 1, proxy.stats
        proxy.reset_stats()
        # The sync calls' last admission holds the account's one call a second for up to a second;
        # the async calls start after it, on a free second as the sync ones did (without this wait
        # both were refused at first and a CI run exhausted the retries).
        time.sleep(1.0)

        async def both() -> list[dict]:
            async with await KinesisStreamHook().get_async_conn() as client:
                return await asyncio.gather(*(aio.describe_stream_summary(client, unique_name) for _ in range(2)))

        assert [a["StreamName"] for a in asyncio.run(both())] == [unique_name] * 2
        assert proxy.stats["DescribeStreamSummary.throttled"] >= 1, proxy.stats


def test_an_operators_own_describe_stream_summary_goes_through_the_hosts_budget(
    aws_conn, kinesis, unique_name, tmp_path, monkeypatch
):
    """A window's retention check (and an incremental batch's trim-gap check) is paced by the
    host's budget and leaves its answer in the host's cache; it called the service directly."""
    from datetime import datetime, timezone

    from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook
    from airflow_kinesis_spark.operators.settings import ReadOptions
    from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator

    monkeypatch.setenv("AIRFLOW__KINESIS_SPARK__SHARED_STATE_DIR", str(tmp_path / "state"))
    create_stream(kinesis, unique_name, 1)
    end = datetime.now(timezone.utc) - timedelta(seconds=1)
    window = KinesisWindowToSparkOperator(task_id="w", stream_name=unique_name, output_path=str(tmp_path / "out"),
                                          window_start=(end - timedelta(minutes=1)).isoformat(), window_end=end.isoformat(),
                                          read_options=ReadOptions(min_call_interval=0.0))  # fmt: skip
    assert window.execute({})["status"] == "no_records"  # an empty window: the probes, no Spark job
    hook = KinesisStreamHook(aws_conn_id="aws_default")
    cached = hook.summary_budget.cached(hook.conn, unique_name, 60.0)
    assert cached is not None and cached["RetentionPeriodHours"] == 24
