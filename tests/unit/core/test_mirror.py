"""The KCL-style lease mirror's retry of ``BatchWriteItem``'s unprocessed items.

A unit test of ``core.mirror`` with a fake DynamoDB client (the service returns
``UnprocessedItems`` when a partition's throughput is exceeded; moto never does, so no emulator
can produce them): it hands back the items it is told to leave unprocessed and records each call."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

import pytest

from airflow_kinesis_spark.core import mirror
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel
from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition

STORE_LOG = "airflow_kinesis_spark.core.store"


class _Client:
    """``batch_write_item`` that leaves the last item of each call unprocessed, ``refusals`` times."""

    def __init__(self, refusals: int, error: Exception | None = None) -> None:
        self.refusals, self.error, self.calls = refusals, error, []

    def batch_write_item(self, RequestItems):  # noqa: N803 - boto3's parameter name
        (table, requests), = RequestItems.items()
        self.calls.append([r["PutRequest"]["Item"]["leaseKey"]["S"] for r in requests])
        if self.error is not None:
            raise self.error
        if len(self.calls) <= self.refusals:
            return {"UnprocessedItems": {table: requests[-1:]}}
        return {"UnprocessedItems": {}}


def plan_of(shards: int) -> tuple[BatchPlan, dict[str, Checkpoint]]:
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    at = datetime(2026, 11, 20, tzinfo=timezone.utc)
    plan = BatchPlan(batch_id=3, stream_name="s", consumer_name="c", cutoff=at, created_at=at,
                     ranges=tuple(ShardRange(s, StartPosition("TRIM_HORIZON"), Checkpoint(Sentinel.TRIM_HORIZON), at) for s in ids), checkpoints={},
                     output_location="/tmp/out/batch_id=3")  # fmt: skip
    return plan, {s: Checkpoint.at(str(100 + i), 0) for i, s in enumerate(ids)}


@pytest.fixture
def sleeps(monkeypatch):
    """The pauses between attempts, recorded, not taken: those of this test's threads only. A
    thread an earlier test in the same worker left running (one that calls ``time.sleep(1)`` in a
    loop was seen in CI) keeps its real sleep and is not recorded."""
    taken: list[float] = []
    earlier = {t.ident for t in threading.enumerate()} - {threading.main_thread().ident}
    real = time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() in earlier:
            real(seconds)
        else:
            taken.append(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return taken


def test_unprocessed_items_are_written_again_after_growing_pauses(sleeps, caplog):
    client = _Client(refusals=3)
    plan, checkpoints = plan_of(3)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        mirror.mirror_leases(client, "t", "s|c", "c", plan, checkpoints)
    assert client.calls == [["shardId-000000000000", "shardId-000000000001", "shardId-000000000002"]] + [["shardId-000000000002"]] * 3
    assert sleeps == pytest.approx([0.05, 0.1, 0.2])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_items_still_unprocessed_after_the_last_attempt_are_a_warning(sleeps, caplog):
    client = _Client(refusals=100)
    plan, checkpoints = plan_of(2)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        mirror.mirror_leases(client, "t", "s|c", "c", plan, checkpoints)  # never raises
    assert len(client.calls) == mirror.BATCH_WRITE_ATTEMPTS == 5
    assert sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "could not update the KCL-style lease mirror of 1 shards (unprocessed after 5 attempts)"]


def test_a_failed_call_is_not_retried_and_is_a_warning(sleeps, caplog):
    client = _Client(refusals=0, error=RuntimeError("AccessDeniedException"))
    plan, checkpoints = plan_of(2)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        mirror.mirror_leases(client, "t", "s|c", "c", plan, checkpoints)
    assert len(client.calls) == 1 and sleeps == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "could not update the KCL-style lease mirror of 2 shards (shardId-000000000000 ... shardId-000000000001): "
        "AccessDeniedException"]
