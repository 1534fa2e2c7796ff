"""Builders shared by the unit and integration tests (no fixtures here)."""

from __future__ import annotations

import os
import shutil
import threading
from datetime import datetime, timedelta, timezone

from airflow_kinesis_spark.core.job import run_handed_batch, run_handed_window
from airflow_kinesis_spark.core.planner import BatchPlan, plan_incremental
from airflow_kinesis_spark.core.positions import Checkpoint
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.shards import Shard
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

#: A real-looking 56-digit sequence number.
BASE_SEQUENCE_NUMBER = 49590338271490256608559692538361571095921575989136588898
MAX_HASH_KEY = str(2**128 - 1)
# Millisecond precision: what survives the batch log's ISO 8601 timestamps unchanged.
PLAN_NOW = datetime(2024, 5, 1, 12, 0, 0, 125000, tzinfo=timezone.utc)


def shard_id(n: int) -> str:
    return f"shardId-{n:012d}"


def sequence_number(i: int) -> str:
    return str(BASE_SEQUENCE_NUMBER + i * 10**20)


def open_shards(count: int) -> list[Shard]:
    return [
        Shard(
            shard_id=shard_id(n),
            parent_shard_id=None,
            adjacent_parent_shard_id=None,
            starting_sequence_number=sequence_number(0),
            ending_sequence_number=None,
            starting_hash_key="0",
            ending_hash_key=MAX_HASH_KEY,
        )
        for n in range(count)
    ]


def make_plan(
    batch_id: int,
    shards: list[Shard],
    checkpoints: dict[str, Checkpoint] | None = None,
    *,
    stream_name: str = "orders",
    consumer_name: str = "lake",
) -> BatchPlan:
    now = PLAN_NOW + timedelta(minutes=batch_id)
    return plan_incremental(
        batch_id=batch_id,
        stream_name=stream_name,
        consumer_name=consumer_name,
        shards=shards,
        checkpoints=checkpoints or {},
        cutoff=now,
        now=now,
        output_location=f"s3://lake/{stream_name}/{consumer_name}/batch_id={batch_id}",
    )


def checkpoints_after(plan: BatchPlan, last_index: int, *, sub: int | None = None) -> dict[str, Checkpoint]:
    """Every planned shard checkpointed at sequence_number(last_index + shard number)."""
    out = dict(plan.checkpoints)
    for n, rng in enumerate(plan.ranges):
        out[rng.shard_id] = Checkpoint.at(sequence_number(last_index + n), sub)
    return out


def reports_for(plan: BatchPlan, checkpoints: dict[str, Checkpoint]) -> list[ShardReport]:
    """One ShardReport per planned range that ends at ``checkpoints`` (one record read)."""
    out = []
    for rng in plan.ranges:
        last = checkpoints[rng.shard_id].position
        out.append(
            ShardReport(
                shard_id=rng.shard_id,
                first=last,
                last=last,
                records=1 if last else 0,
                bytes=10 if last else 0,
                kinesis_records=1 if last else 0,
                kinesis_bytes=10 if last else 0,
                shard_end=False,
                stop_reason="caught_up",
            )
        )
    return out


def read_plan(kinesis, plan: BatchPlan) -> tuple[list[tuple], list[ShardReport]]:
    """Read every planned range with the real reader in this process (what the Spark job does):
    rows ``(shard_id, sequence_number, sub_sequence_number, data)`` and one report per range."""
    from airflow_kinesis_spark.core.reader import ShardReader

    rows: list[tuple] = []
    reports: list[ShardReport] = []
    for rng in plan.ranges:
        records, report = ShardReader(kinesis, plan.stream_name, rng, min_call_interval=0).read_all()
        rows += [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.data) for r in records]
        reports.append(report)
    return rows, reports


def run_batch_without_spark(kinesis, store, *, batch_id: int, owner: str | None = None, **plan_kwargs):
    """One batch of the protocol (plan, persist, read every range, validate, commit) with the
    reader in this process instead of Spark. Returns (plan, reports, user records)."""
    from airflow_kinesis_spark.core.planner import validate_report
    from airflow_kinesis_spark.core.reader import ShardReader
    from airflow_kinesis_spark.core.shards import list_shards

    now = datetime.now(timezone.utc)
    plan = plan_incremental(
        batch_id=batch_id, stream_name=store.stream_name, consumer_name=store.consumer_name,
        shards=list_shards(kinesis, store.stream_name), checkpoints=store.committed_checkpoints(),
        cutoff=now, now=now, output_location=f"memory://batch_id={batch_id}", **plan_kwargs,
    )  # fmt: skip
    owner = owner or f"test-batch-{batch_id}"
    store.begin(plan, owner)
    records, reports = [], []
    for rng in plan.ranges:
        rows, report = ShardReader(kinesis, store.stream_name, rng, min_call_interval=0).read_all()
        records.extend(rows)
        reports.append(report)
    store.commit(plan, validate_report(plan, reports), owner)
    return plan, reports, records


class InProcessJob:
    """A fake :class:`~airflow_kinesis_spark.core.interfaces.BatchJob` whose driver is this
    process, for tests of the protocol without Spark: handed its batch (or window) through the
    checkpoint store like every job, it knows only its ``JobArguments``, builds its checkpoint
    store from them on ``dynamodb`` (as ``job.batch.store_for`` does) and runs
    ``core.job.run_handed_batch`` (a window: ``run_handed_window``), which claims the batch,
    holds its lease, checks the report, publishes and records it: the real code.

    A subclass writes: :meth:`write_reports` writes ``plan``'s rows at ``location`` (a staging
    location) and returns its reports; it may keep the rows in :attr:`output` (by location),
    which ``publish`` then moves and ``discard`` drops, or write a local folder, moved and removed
    on disk.
    """

    def __init__(self, dynamodb) -> None:
        self.dynamodb = dynamodb
        self.runs: list[BatchPlan] = []  # the plans written, in order
        self.output: dict[str, list[tuple]] = {}  # location -> rows, for a write kept in memory
        self.killed = threading.Event()  # the lease was lost while writing (``cancel``), or ``kill``

    def run_handed(self, arguments, *, output_location: str | None = None) -> None:
        store = DynamoDBCheckpointStore(self.dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
        if arguments.window:
            run_handed_window(store, arguments, write=self.write, publish=self.publish, discard=self.discard)
        else:
            run_handed_batch(store, arguments, write=self.write, publish=self.publish, discard=self.discard,
                             cancel=self.killed.set)  # fmt: skip

    def write_reports(self, plan: BatchPlan, location: str) -> list[ShardReport]:
        raise NotImplementedError

    def write(self, plan: BatchPlan, location: str) -> dict:
        self.runs.append(plan)
        reports = self.write_reports(plan, location)
        if not os.path.exists(location):  # nothing on disk: the write is kept in memory (its rows, if the subclass kept any)
            self.output.setdefault(location, [])
        quarantined = any(r.quarantined or r.dead_letters for r in reports)
        return {"records": sum(r.records for r in reports), "quarantine_location": location if quarantined else None,
                "reports": [r.to_dict() for r in reports]}  # fmt: skip

    def publish(self, staging: str | None, target: str) -> None:
        if staging in self.output or (staging is None and target in self.output):  # rows kept in memory
            rows = self.output.pop(staging, None) if staging is not None else None
            self.output.pop(target, None)
            if rows is not None:
                self.output[target] = rows
            return
        if os.path.exists(target):
            shutil.rmtree(target)
        if staging is not None:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(staging, target)

    def discard(self, staging: str) -> None:
        if self.output.pop(staging, None) is None:
            shutil.rmtree(staging, ignore_errors=True)

    def kill(self) -> None:
        self.killed.set()
