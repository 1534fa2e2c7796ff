"""The batch protocol's entry points: one per mode, plan -> begin/lease -> probe -> job -> validate -> commit.

This module is the protocol's policy and nothing else. It drives

* a boto3 **Kinesis client** (shard listing, probes, trim-horizon checks),
* a **checkpoint store** (:class:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore`:
  plan log, head, lease, commit), and
* a **job** (:class:`BatchJob`): anything that runs a planned batch — reads its ranges, writes
  its output — and returns one :class:`~airflow_kinesis_spark.core.ranges.ShardReport` per
  planned range. spark-submit and Spark Connect are two implementations
  (``airflow_kinesis_spark.hooks.spark``); tests use a fake one. Adding another touches nothing here.

Operators validate their arguments, build the client, store and job, call :func:`run_incremental`
or :func:`run_window`, and publish the returned summary. Where each rule lives: stop rules in
``core.reader``, parents-before-children in ``core.shards``, planning in ``core.planner`` /
``core.window``, lag and trim-horizon rules in ``core.lag``, the commit and the lease in
``core.store``.

No Airflow import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from airflow_kinesis_spark.core.lag import find_trim_gaps, known_until
from airflow_kinesis_spark.core.planner import BatchPlan, plan_incremental, restart_from_trim_horizon, validate_report
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp, to_utc
from airflow_kinesis_spark.core.ranges import ShardReport, StartPosition
from airflow_kinesis_spark.core.reader import MIN_CALL_INTERVAL_S, probe_ranges
from airflow_kinesis_spark.core.shards import describe_stream_summary, list_shards
from airflow_kinesis_spark.core.window import (
    derive_slices,
    plan_window,
    validate_window,
    validate_window_report,
    window_label,
    window_summary,
)
from airflow_kinesis_spark.exceptions import DataLossError, PendingPlanMismatchError

log = logging.getLogger(__name__)

__all__ = [
    "BatchJob",
    "IncrementalSettings",
    "WindowSettings",
    "run_incremental",
    "run_window",
    "batch_output_location",
    "window_output_location",
    "IDLE_REFRESH",
    "DEFAULT_LEASE_SECONDS",
]

#: How often an idle consumer records that its shards were empty up to the cutoff: otherwise a
#: stream idle for longer than its retention period would look like lost data.
IDLE_REFRESH = timedelta(hours=1)
#: A run holding a pending batch renews its lease every third of this (seconds).
DEFAULT_LEASE_SECONDS = 120.0


class BatchJob(Protocol):
    """Runs one planned batch: reads every planned range, writes the output at
    ``plan.output_location`` (overwriting), and returns one report per planned range.

    Implementations own everything about where and how the job runs (packaging, environment,
    credentials, processes, cleanup); the protocol only calls these two methods.
    """

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """Run the job of ``plan``.

        :param records_expected: the probes saw a user record, so the job may read and write
            in one pass.
        :raises Exception: any failure; the protocol leaves the plan pending (incremental) and
            re-raises.
        """
        ...

    def kill(self) -> None:
        """Stop a running job at once (called from another thread when the lease is lost)."""
        ...


@dataclass(frozen=True)
class IncrementalSettings:
    """What an incremental run reads and where it writes (already validated by the caller).

    :param output_root: batch ``N`` goes to :func:`batch_output_location` of it.
    :param cutoff: records arriving at or after this are left for the next batch (UTC).
    :param initial_position: where a never-seen shard starts (``TRIM_HORIZON``, ``LATEST``,
        ``AT_TIMESTAMP``).
    :param lease_seconds: the lease on a pending batch (seconds).
    :param min_call_interval: seconds between two GetRecords calls on one shard for the probes.
    """

    stream_name: str
    consumer_name: str
    output_root: str
    cutoff: datetime
    initial_position: str = "TRIM_HORIZON"
    initial_timestamp: datetime | None = None
    max_records_per_shard: int | None = None
    max_bytes_per_shard: int | None = None
    allow_data_loss: bool = False
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    min_call_interval: float = MIN_CALL_INTERVAL_S


@dataclass(frozen=True)
class WindowSettings:
    """What a window run reads and where it writes.

    :param start: the window's start, inclusive (UTC).
    :param end: its end, exclusive (UTC); not in the future.
    :param time_slices: slices per shard (1..64), or ``None`` to derive them
        (:func:`~airflow_kinesis_spark.core.window.derive_slices`).
    :param slice_length: the shortest slice worth a task when deriving.
    :param parallelism: Spark tasks to keep busy when deriving.
    """

    stream_name: str
    consumer_name: str
    output_root: str
    start: datetime
    end: datetime
    time_slices: int | None = None
    slice_length: timedelta = timedelta(minutes=15)
    parallelism: int = 2
    allow_data_loss: bool = False
    min_call_interval: float = MIN_CALL_INTERVAL_S


def batch_output_location(output_root: str, batch_id: int) -> str:
    """``{output_root}/batch_id={batch_id}``: the one directory a batch writes (and a re-run overwrites)."""
    return f"{output_root.rstrip('/')}/batch_id={batch_id}"


def window_output_location(output_root: str, start: datetime, end: datetime) -> str:
    """``{output_root}/window={label}`` (:func:`~airflow_kinesis_spark.core.window.window_label`)."""
    return f"{output_root.rstrip('/')}/window={window_label(start, end)}"


# -- incremental -------------------------------------------------------------------------------


def run_incremental(
    kinesis: Any, store: Any, job: BatchJob, settings: IncrementalSettings, owner: str, *, now: datetime | None = None
) -> dict[str, Any]:
    """One incremental batch of one (stream, consumer), exactly once.

    1. A pending batch (planned, not committed) is re-used, never replaced: after its start
       positions are checked against the trim horizon, this run takes it over (once its holder's
       lease expired) and, if its report is recorded already, commits without running the job.
    2. Otherwise plan from the committed checkpoints and the shard lineage, check the trim
       horizon, and probe every range (``Limit`` 1). No record in any range: no job; commit
       only when a checkpoint must be recorded (see :func:`_commit_without_records`).
    3. Persist the plan (``begin``), run the job under the lease, validate its report against
       the plan, record the report, and advance every checkpoint in one conditional write.

    :param kinesis: boto3 Kinesis client.
    :param store: the consumer's checkpoint store (table created by the caller).
    :param owner: this run's writer id (unique per attempt), for the store's fencing.
    :returns: the batch summary (:func:`incremental_summary`).
    :raises DataLossError: records would be lost (trim gap or vanished shard) without
        ``allow_data_loss``; nothing read or written.
    :raises CheckpointConflictError: another writer moved the store or took the batch over.
    :raises BatchLeaseHeldError: another run holds the pending batch's lease.
    :raises PendingPlanMismatchError: the pending plan is not this task's (:func:`check_pending_plan`).
    :raises ReportValidationError: the job's report does not match the plan; nothing committed.
    """
    now = to_utc(now or datetime.now(timezone.utc))
    head = store.head()
    plan = store.pending_plan(head)
    if plan is not None:
        check_pending_plan(plan, head, store, settings)
    if plan is not None and _pending_plan_gaps(kinesis, store, plan, settings, owner, now):
        plan = None  # discarded (allow_data_loss): planned anew below, from the oldest records kept
        head = store.head()
    if plan is not None:
        log.info(
            "Re-using the pending plan of batch %d (planned %s, cutoff %s, %d shard ranges)",
            plan.batch_id, format_timestamp(plan.created_at), format_timestamp(plan.cutoff), len(plan.ranges),
        )  # fmt: skip
        head = store.take_over(plan.batch_id, owner, settings.lease_seconds)
        reports = store.pending_report(head)
        if reports is not None:
            log.info("Batch %d's output was already written; committing without re-running Spark", plan.batch_id)
            return _commit(store, plan, reports, validate_report(plan, reports), owner, reused=True)
        return _run_job_and_commit(store, job, plan, owner, settings.lease_seconds, records_expected=False, reused=True)

    plan = plan_batch(kinesis, store, settings, head.committed_batch_id + 1, now, head=head)
    if not plan.ranges:
        log.info("No shard to read: every shard is at SHARD_END or waiting for its parents (%s)", dict(plan.waiting))
        return incremental_summary(plan, [], plan.checkpoints, "no_new_records", reused=False)
    probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval)
    if not any(r.records or r.quarantined for r in probes):
        return _commit_without_records(store, plan, probes, owner)
    store.begin(plan, owner)
    return _run_job_and_commit(
        store, job, plan, owner, settings.lease_seconds, records_expected=any(r.records for r in probes), reused=False
    )


def plan_batch(
    kinesis: Any, store: Any, settings: IncrementalSettings, batch_id: int, now: datetime, *, head: Any = None
) -> BatchPlan:
    """Plan batch ``batch_id`` from the committed checkpoints and the shard lineage; nothing persisted.

    :param head: the store's head item as the caller read it (``None``: read it here), so a run
        reads the head once.

    :raises DataLossError: a checkpoint fell behind the trim horizon, or a checkpointed shard
        vanished before ``SHARD_END``, without ``allow_data_loss``.
    """
    plan = plan_incremental(
        batch_id=batch_id,
        stream_name=settings.stream_name,
        consumer_name=settings.consumer_name,
        shards=list_shards(kinesis, settings.stream_name),
        checkpoints=store.committed_checkpoints(head),
        cutoff=settings.cutoff,
        now=now,
        output_location=batch_output_location(settings.output_root, batch_id),
        initial_position=settings.initial_position,
        initial_timestamp=settings.initial_timestamp,
        max_records_per_shard=settings.max_records_per_shard,
        max_bytes_per_shard=settings.max_bytes_per_shard,
        allow_data_loss=settings.allow_data_loss,
    )
    plan = replace(plan, checkpoint_table=store.table_name)
    gaps = find_trim_gaps(kinesis, plan.stream_name, plan.ranges, now, min_call_interval=settings.min_call_interval)
    if gaps:
        detail = _gap_detail(gaps)
        if not settings.allow_data_loss:
            raise DataLossError(
                f"Checkpoints of consumer {plan.consumer_name!r} fell behind the trim horizon of stream "
                f"{plan.stream_name!r}: {detail}. Records after them may have aged out unread. Nothing was "
                "read. To go on from the oldest records kept (TRIM_HORIZON), re-run with allow_data_loss=True.",
                trim_gaps=gaps,
            )
        log.warning("Going on from the oldest records kept (allow_data_loss=True): %s", detail)
        plan = restart_from_trim_horizon(plan, gaps)
    for rng in plan.ranges:
        log.info("Plan batch %d: shard %s from %s to cutoff %s", batch_id, rng.shard_id, rng.start, format_timestamp(rng.cutoff))
    return plan


def check_pending_plan(plan: BatchPlan, head: Any, store: Any, settings: IncrementalSettings) -> None:
    """Check a pending plan read from the checkpoint table against what this task would plan.

    The table is state anyone with write access to it can change, so a stored plan is re-used
    only when it is this task's: the pending batch id, mode ``incremental``, the stream, the
    consumer, the checkpoint table, the output location (derived from the task's output root and
    the batch id, never taken from the plan), and start positions that follow from the committed
    checkpoints (each range starts after the shard's committed checkpoint, or, for a shard
    without one or with a recorded trim gap, at a sentinel).

    :param head: the store's head item the plan was read through.
    :raises PendingPlanMismatchError: naming each difference and the fix; nothing read or written.
    """
    pending_batch_id = head.pending_batch_id
    expected: dict[str, Any] = {
        "batch id": pending_batch_id,
        "mode": "incremental",
        "stream": settings.stream_name,
        "consumer": settings.consumer_name,
        "checkpoint table": store.table_name,
        "output location": batch_output_location(settings.output_root, pending_batch_id or 0),
    }
    stored: dict[str, Any] = {
        "batch id": plan.batch_id,
        "mode": plan.mode,
        "stream": plan.stream_name,
        "consumer": plan.consumer_name,
        "checkpoint table": plan.checkpoint_table or store.table_name,  # plans of earlier versions do not name it
        "output location": plan.output_location,
    }
    problems = [f"{k}: the plan has {stored[k]!r}, this task has {v!r}" for k, v in expected.items() if stored[k] != v]
    if not problems:
        committed = {k: v.to_dict() for k, v in store.committed_checkpoints(head).items()}
        if {k: v.to_dict() for k, v in plan.checkpoints.items()} != committed:
            problems.append("checkpoints: the plan starts from checkpoints other than the committed ones")
        for rng in plan.ranges:
            known = plan.checkpoints.get(rng.shard_id)
            sentinel_start = rng.start_checkpoint.position is None and (known is None or rng.shard_id in plan.trim_gaps)
            if not (rng.start_checkpoint == known or sentinel_start) or rng.start != StartPosition.after(rng.start_checkpoint):
                problems.append(f"shard {rng.shard_id}: the range starts at {rng.start}, not after its committed checkpoint {known}")
    if problems:
        raise PendingPlanMismatchError(
            f"The pending plan of batch {pending_batch_id} in checkpoint table {store.table_name!r} is not what this task "
            f"would plan: {'; '.join(problems)}. Nothing was read or written. If the task's settings changed, put them "
            "back or drop the pending batch (kinesis-spark discard-pending); if nobody changed them, someone else wrote "
            "the checkpoint table: check who can write it (docs/security.md).",
            batch_id=pending_batch_id, differences=problems,
        )  # fmt: skip


def _gap_detail(gaps: Mapping[str, str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in sorted(gaps.items()))


def _pending_plan_gaps(kinesis: Any, store: Any, plan: BatchPlan, settings: IncrementalSettings, owner: str, now: datetime) -> bool:
    """Check a pending plan's start positions against the trim horizon before it is re-used.

    A batch left pending for longer than the stream's retention period starts after checkpoints
    whose next records may have aged out (LOUD, as for committed checkpoints). A persisted plan is
    never rewritten, so with ``allow_data_loss`` the pending batch is discarded (its output was
    never committed) and the caller plans the batch anew.

    :returns: whether the pending batch was discarded.
    :raises DataLossError: a gap without ``allow_data_loss``; nothing read or written.
    """
    gaps = find_trim_gaps(kinesis, plan.stream_name, plan.ranges, now, min_call_interval=settings.min_call_interval)
    if not gaps:
        return False
    detail = _gap_detail(gaps)
    if not settings.allow_data_loss:
        raise DataLossError(
            f"Pending batch {plan.batch_id} of consumer {plan.consumer_name!r} (planned {format_timestamp(plan.created_at)}) "
            f"starts behind the trim horizon of stream {plan.stream_name!r}: {detail}. Records after its start positions "
            "may have aged out unread. Nothing was read. To go on from the oldest records kept, re-run with "
            "allow_data_loss=True (the pending batch is then discarded and planned anew).",
            trim_gaps=gaps, batch_id=plan.batch_id,
        )  # fmt: skip
    log.warning(
        "Pending batch %d starts behind the trim horizon (%s); discarding it and planning anew (allow_data_loss=True)",
        plan.batch_id, detail,
    )  # fmt: skip
    store.take_over(plan.batch_id, owner, settings.lease_seconds)  # never discard a batch a live run holds
    store.discard_pending(plan.batch_id, owner)
    return True


def _run_job_and_commit(
    store: Any, job: BatchJob, plan: BatchPlan, owner: str, lease_seconds: float, *, records_expected: bool, reused: bool
) -> dict[str, Any]:
    """Run the job of the pending ``plan`` under its lease, then record its report and commit."""
    with store.hold_lease(plan.batch_id, owner, lease_seconds, on_lost=lambda err: job.kill()):
        reports = job.run(plan, records_expected=records_expected)
    checkpoints = validate_report(plan, reports)  # before anything is recorded: a bad report commits nothing
    store.record_report(plan.batch_id, owner, reports)
    return _commit(store, plan, reports, checkpoints, owner, reused=reused)


def _commit(
    store: Any, plan: BatchPlan, reports: list[ShardReport], checkpoints: Mapping[str, Checkpoint], owner: str, *, reused: bool
) -> dict[str, Any]:
    """Advance every checkpoint of ``plan`` (one conditional write) and summarise the batch."""
    store.commit(plan, checkpoints, owner)
    summary = incremental_summary(plan, reports, checkpoints, "committed", reused=reused)
    log.info(
        "Batch %d committed: %d records from %d shards, output %s",
        plan.batch_id, summary["records"], len(plan.ranges), plan.output_location,
    )  # fmt: skip
    return summary


def _commit_without_records(store: Any, plan: BatchPlan, probes: list[ShardReport], owner: str) -> dict[str, Any]:
    """No planned range has a record: no job. Commit only when a checkpoint must be recorded:
    a new shard's starting position, a shard's end, or (at most every :data:`IDLE_REFRESH`) that
    idle shards were seen empty up to the cutoff."""
    checkpoints = validate_report(plan, probes)
    newly_ended = [k for k, v in checkpoints.items() if v.is_shard_end and not (plan.checkpoints.get(k) or v).is_shard_end]
    new_shards = sorted(set(checkpoints) - set(plan.checkpoints))
    stale = [r.shard_id for r in plan.ranges if _needs_idle_refresh(r.start_checkpoint, plan.cutoff)]
    if not newly_ended and not new_shards and not stale:
        log.info("No new records in %d shards before cutoff %s: no Spark job, no files, no batch",
                 len(plan.ranges), format_timestamp(plan.cutoff))  # fmt: skip
        return incremental_summary(plan, probes, plan.checkpoints, "no_new_records", reused=False)
    log.info(
        "No new records; recording checkpoints without a Spark job (new shards: %s; shards ended: %s; "
        "idle shards seen empty up to the cutoff: %s)",
        new_shards, newly_ended, stale,
    )  # fmt: skip
    store.begin(plan, owner)
    store.commit(plan, checkpoints, owner)
    return incremental_summary(plan, probes, checkpoints, "committed_without_records", reused=False)


def _needs_idle_refresh(checkpoint: Checkpoint, cutoff: datetime) -> bool:
    """Whether an idle shard's checkpoint should record that it was read empty up to ``cutoff``."""
    if checkpoint.position is not None and checkpoint.clear_until is None:
        return True
    return (known_until(checkpoint) or cutoff) < cutoff - IDLE_REFRESH


def incremental_summary(
    plan: BatchPlan, reports: Sequence[ShardReport], checkpoints: Mapping[str, Checkpoint], status: str, *, reused: bool
) -> dict[str, Any]:
    """The run's summary (the operator's XCom), JSON-safe.

    :param status: ``committed``, ``committed_without_records`` or ``no_new_records``.
    :returns: ``batch_id``, ``status``, ``stream_name``, ``consumer_name``, ``records``, ``bytes``,
        ``output_path``, ``quarantined``, ``quarantine_path``, ``out_of_range``, ``cutoff``,
        ``reused_plan``, ``shards`` (per shard: ``records``, ``bytes``, ``first``, ``last``,
        ``checkpoint``, ``stop_reason``, ``shard_end``, ``quarantined``, ``out_of_range``),
        ``waiting_shards``, ``lost_shards``, ``trim_gaps``.
    """
    committed = status == "committed"
    shards = {
        r.shard_id: {
            "records": r.records,
            "bytes": r.bytes,
            "first": str(r.first) if r.first else None,
            "last": str(r.last) if r.last else None,
            "checkpoint": str(checkpoints[r.shard_id]) if r.shard_id in checkpoints else None,
            "stop_reason": r.stop_reason,
            "shard_end": r.shard_end,
            "quarantined": r.quarantined,
            "out_of_range": r.out_of_range,
        }
        for r in reports
    }
    records = sum(r.records for r in reports) if committed else 0
    quarantined = sum(r.quarantined for r in reports) if committed else 0
    return {
        "batch_id": plan.batch_id if status != "no_new_records" else None,
        "status": status,
        "stream_name": plan.stream_name,
        "consumer_name": plan.consumer_name,
        "records": records,
        "bytes": sum(r.bytes for r in reports) if committed else 0,
        "output_path": plan.output_location if records else None,
        "quarantined": quarantined,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined else None,
        "out_of_range": sum(r.out_of_range for r in reports) if committed else 0,
        "cutoff": format_timestamp(plan.cutoff),
        "reused_plan": reused,
        "shards": shards,
        "waiting_shards": dict(plan.waiting),
        "lost_shards": list(plan.lost_shards),
        "trim_gaps": dict(plan.trim_gaps),
    }


# -- window ------------------------------------------------------------------------------------


def run_window(kinesis: Any, job: BatchJob, settings: WindowSettings, *, now: datetime | None = None) -> dict[str, Any]:
    """Read the window ``[start, end)`` of a stream by arrival time (backfill); checkpoints untouched.

    Every shard that may have been open during the window is planned (closed ones included),
    cut into time slices; every (shard, slice) range is probed, and the job runs only when a
    probe found a record. The same window gives the same rows: its output location is derived
    from the window and overwritten on re-run.

    :param kinesis: boto3 Kinesis client.
    :returns: ``mode`` ``window``, ``status`` (``written`` or ``no_records``), ``stream_name``,
        ``window_start``, ``window_end``, ``records``, ``bytes``, ``output_path``, ``quarantined``,
        ``quarantine_path``, ``out_of_range``, ``time_slices``, ``shards`` (per shard ``records``,
        ``bytes``, ``slices``, ``quarantined``, ``out_of_range``), ``trim_gap``.
    :raises ValueError: ``start >= end`` or an end in the future.
    :raises DataLossError: the window starts before the trim horizon without ``allow_data_loss``.
    :raises ReportValidationError: the job's reports do not cover every (shard, slice) once.
    """
    now = to_utc(now or datetime.now(timezone.utc))
    start, end = to_utc(settings.start), to_utc(settings.end)
    validate_window(start, end, now=now)  # cheap checks before any call
    summary = describe_stream_summary(kinesis, settings.stream_name)
    horizon = now - timedelta(hours=float(summary["RetentionPeriodHours"]))
    gap = validate_window(start, end, now=now, trim_horizon=horizon, allow_data_loss=settings.allow_data_loss)
    if gap:
        log.warning("Reading what exists of the window (allow_data_loss=True): %s", gap)
    shards = list_shards(kinesis, settings.stream_name, {"Type": "FROM_TIMESTAMP", "Timestamp": start})
    slices = settings.time_slices or derive_slices(
        start, end, len(shards), slice_length=settings.slice_length, parallelism=settings.parallelism
    )
    plan = plan_window(
        stream_name=settings.stream_name, consumer_name=settings.consumer_name, shards=shards, start=start, end=end,
        slices=int(slices), now=now, output_location=window_output_location(settings.output_root, start, end),
    )  # fmt: skip
    log.info("Window [%s, %s): %d shards x %d time slices, output %s",
             format_timestamp(start), format_timestamp(end), len(shards), slices, plan.output_location)  # fmt: skip
    probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval)
    found = any(r.records or r.quarantined for r in probes)
    if found:
        reports = job.run(plan, records_expected=any(r.records for r in probes))
    else:
        log.info("No records in the window: no Spark job, no files")
        reports = probes
    validate_window_report(plan, reports)
    records = sum(r.records for r in reports)
    quarantined = sum(r.quarantined for r in reports)
    result = {
        "mode": "window",
        "status": "written" if found else "no_records",
        "stream_name": settings.stream_name,
        "window_start": format_timestamp(start),
        "window_end": format_timestamp(end),
        "records": records,
        "bytes": sum(r.bytes for r in reports),
        "output_path": plan.output_location if records else None,
        "quarantined": quarantined,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined else None,
        "out_of_range": sum(r.out_of_range for r in reports),
        "time_slices": int(slices),
        "shards": window_summary(reports),
        "trim_gap": gap,
    }
    log.info("Window written: %d records from %d shards to %s", records, len(result["shards"]), result["output_path"])
    return result
