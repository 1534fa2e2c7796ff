"""The host's DescribeStreamSummary budget (core.stream_summary): pacer slots, the shared cache,
its keys and its state file. A stand-in client carries only ``meta`` (endpoint and region: the
keys); no call is made here (the integration test test_describe_budget.py makes them)."""

from __future__ import annotations

import multiprocessing
import time
import os
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from airflow_kinesis_spark.core.stream_summary import SummaryBudget


def client(endpoint: str = "http://127.0.0.1:1", region: str = "eu-west-1"):
    return SimpleNamespace(meta=SimpleNamespace(endpoint_url=endpoint, region_name=region))


SUMMARY = {"StreamName": "clicks", "StreamStatus": "ACTIVE", "RetentionPeriodHours": 24,
           "StreamCreationTimestamp": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}  # fmt: skip


def test_calls_get_slots_one_interval_apart_per_endpoint(tmp_path):
    budget = SummaryBudget(calls_per_second=10, state_dir=str(tmp_path))
    delays = [budget.reserve(client(), f"s{i}", 5.0)[1] for i in range(4)]
    assert delays[0] == 0.0
    # each call's delay counts from its own start, a moment after the previous call's
    assert [b - a for a, b in zip(delays, delays[1:])] == [pytest.approx(0.1, abs=0.02)] * 3
    assert budget.reserve(client(region="us-east-1"), "s0", 5.0) == (None, 0.0)  # another endpoint: its own pacer


def test_a_summary_answers_every_budget_of_the_directory_within_max_age(tmp_path):
    one, other = SummaryBudget(state_dir=str(tmp_path), principal="aws_default|"), SummaryBudget(state_dir=str(tmp_path), principal="aws_default|")
    one.remember(client(), "clicks", SUMMARY)
    summary, delay = other.reserve(client(), "clicks", 5.0)
    assert summary == SUMMARY and delay == 0.0  # the datetime survives the state file
    assert other.reserve(client(), "clicks", 0.0)[0] is None  # max_age 0: never cached
    assert SummaryBudget(state_dir=str(tmp_path), principal="other_account|").cached(client(), "clicks", 5.0) is None
    assert other.cached(client(endpoint="http://127.0.0.1:2"), "clicks", 5.0) is None


def _reserve(state_dir: str, queue) -> None:
    budget = SummaryBudget(calls_per_second=5, state_dir=state_dir)
    before = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host, as the pacer's
    delay = budget.reserve(client(), "clicks", 5.0)[1]
    queue.put((before + delay, time.monotonic() + delay))  # the slot given lies between the two


def test_processes_share_the_pacer(tmp_path):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=_reserve, args=(str(tmp_path), queue)) for _ in range(4)]
    for process in processes:
        process.start()
    slots = sorted(queue.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    # 5 calls/s: the slots the four processes were given are 0.2 s apart (each slot is known
    # within the time its reserve call took; the processes start at different times)
    gaps = [(b_late - a_early) for (a_early, _), (_, b_late) in zip(slots, slots[1:])]
    assert all(gap >= 0.2 for gap in gaps), gaps


def test_a_directory_open_to_others_is_not_used(tmp_path, caplog):
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    budget = SummaryBudget(state_dir=str(shared))
    budget.remember(client(), "clicks", SUMMARY)
    assert not (shared / "describe-stream-summary.json").exists()
    assert "shared in this process only" in caplog.text and "closed to others" in caplog.text
    assert budget.cached(client(), "clicks", 5.0) == SUMMARY  # this process still shares it


def test_calls_per_second_must_be_positive():
    with pytest.raises(ValueError, match="describe_stream_summary_per_second must be > 0"):
        SummaryBudget(calls_per_second=0)
