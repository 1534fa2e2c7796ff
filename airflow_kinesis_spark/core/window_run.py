"""The window entry point (backfill by time): :func:`run_window` plans ``[start, end)`` by arrival
time on every shard that may have been open, probes, runs the job, validates and commits the
window's output (a table's window commit); it never touches the incremental checkpoints.

Split from ``core.protocol`` (the incremental entry points), whose helpers it shares: the
output spec and stream consumer resolved for the job (``_for_job``), the consumer-type check and
:func:`~airflow_kinesis_spark.core.protocol.check_dead_letters`. Planning lives in
``core.window``, the check against the committed position in ``core.window_position``.

No Airflow import.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.interfaces import BatchJob
from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.locations import _is_table, window_output_location
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp, to_utc
from airflow_kinesis_spark.core.probes import log_probes, probe_ranges
from airflow_kinesis_spark.core.protocol import _check_consumer_type, _for_job, check_dead_letters
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.read_options import MIN_CALL_INTERVAL_S
from airflow_kinesis_spark.core.shards import describe_stream_summary, list_shards
from airflow_kinesis_spark.core.stream_summary import SummaryBudget
from airflow_kinesis_spark.core.summaries import log_outcome, window_run_summary
from airflow_kinesis_spark.core.window import derive_slices, plan_window, validate_window, validate_window_report, window_label
from airflow_kinesis_spark.core.window_position import check_window_position
from airflow_kinesis_spark.exceptions import ReportNotRecordedError

if TYPE_CHECKING:  # the boto3 stubs (mypy-boto3-kinesis) and Sink (defined once, in sinks): annotations only
    from mypy_boto3_kinesis import KinesisClient
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from airflow_kinesis_spark.sinks import Sink

log = logging.getLogger(__name__)

__all__ = ["WindowSettings", "run_window"]


@dataclass(frozen=True)
class WindowSettings:
    """What a window run reads and where it writes.

    :param start: the window's start, inclusive (UTC).
    :param end: its end, exclusive (UTC); not in the future.
    :param time_slices: slices per shard (1..64), or ``None`` to derive them
        (:func:`~airflow_kinesis_spark.core.window.derive_slices`).
    :param slice_length: the shortest slice worth a task when deriving.
    :param parallelism: Spark tasks to keep busy when deriving.
    :param sink: the output form (:class:`~airflow_kinesis_spark.sinks.Sink`); a
        table's window commit replaces the window's rows, and each run then writes its own
        folder under the window's (``run=...``), so a re-run never deletes files the table's
        current snapshot holds.
    :param consumer_type: as :class:`IncrementalSettings`'.
    :param summary_budget: as :class:`IncrementalSettings`' (the window's retention check).
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
    sink: Sink | None = None
    consumer_type: str = "polling"
    summary_budget: SummaryBudget | None = None



def run_window(
    kinesis: KinesisClient, job: BatchJob, settings: WindowSettings, *, store: DynamoDBCheckpointStore, owner: str,
    now: datetime | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Read the window ``[start, end)`` of a stream by arrival time (backfill); checkpoints untouched.

    Every shard that may have been open during the window is planned (closed ones included),
    cut into time slices; the (shard, slice) ranges are probed up to the first one with a user
    record, and the job runs only when a probe found a record (it then reads every range). The
    same window gives the same rows: its output location is derived from the window and
    overwritten on re-run.

    The plan goes to the job through the store (``store.write_window`` under ``owner``) and its
    report comes back the same way (``core.job.run_handed_window``), so the driver may run
    anywhere.

    :param kinesis: boto3 Kinesis client.
    :param store: a checkpoint store of the window's (stream, consumer): its window items carry
        the plan and the report (they expire after 7 days); its checkpoints are read, never moved
        (``core.window_position``).
    :param owner: this run's writer id (unique per attempt).
    :returns: ``mode`` ``window``, ``status`` (``written`` or ``no_records``), ``stream_name``,
        ``window_start``, ``window_end``, ``records``, ``bytes``, ``output_path``, ``quarantined``,
        ``quarantine_path``, ``out_of_range``, ``time_slices``, ``shards`` (per shard ``records``,
        ``bytes``, ``slices``, ``quarantined``, ``out_of_range``), ``trim_gap``.
    :raises ValueError: ``start >= end`` or an end in the future (before any call).
    :raises DataLossError: the window starts before the trim horizon without ``allow_data_loss``.
    :raises ReportValidationError: the job's reports do not cover every (shard, slice) once.
    """
    now = to_utc(now or datetime.now(timezone.utc))
    start, end = to_utc(settings.start), to_utc(settings.end)
    validate_window(start, end, now=now)  # cheap checks before any call
    summary = describe_stream_summary(kinesis, settings.stream_name, budget=settings.summary_budget)
    horizon = now - timedelta(hours=float(summary["RetentionPeriodHours"]))
    gap = validate_window(start, end, now=now, trim_horizon=horizon, allow_data_loss=settings.allow_data_loss)
    if gap:
        log.warning("Reading what exists of the window (allow_data_loss=True): %s", gap)
    shards = list_shards(kinesis, settings.stream_name, {"Type": "FROM_TIMESTAMP", "Timestamp": start})
    slices = settings.time_slices or derive_slices(
        start, end, len(shards), slice_length=settings.slice_length, parallelism=settings.parallelism
    )
    location = window_output_location(settings.output_root, start, end)
    if _is_table(settings.sink):  # the table's current snapshot may hold the last run's files: never overwrite them
        location += f"/run={format_timestamp(now).replace(':', '').replace('-', '')}-{uuid.uuid4().hex[:8]}"
    plan = plan_window(
        stream_name=settings.stream_name, consumer_name=settings.consumer_name, shards=shards, start=start, end=end,
        slices=int(slices), now=now, output_location=location,
    )  # fmt: skip
    _check_consumer_type(settings.consumer_type)
    if settings.sink is not None:
        settings.sink.claim(settings.stream_name, settings.consumer_name, record=False)
        check_window_position(plan, settings, store)
    log.info("Window [%s, %s): %d shards x %d time slices, output %s",
             format_timestamp(start), format_timestamp(end), len(shards), slices, plan.output_location)  # fmt: skip
    probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval, until_record=True)
    log_probes(probes, len(plan.ranges))
    found = any(r.records or r.quarantined for r in probes)  # else every range was probed: the probes are the reports
    plan = _for_job(kinesis, plan, settings) if found else plan
    if found and settings.sink is not None:
        settings.sink.claim(settings.stream_name, settings.consumer_name, record=True)
    if found:
        reports = _run_handed_window(store, job, plan, owner, any(r.records for r in probes), settings.output_root)
    else:
        log.info("No records in the window: no Spark job, no files")
        reports = probes
    validate_window_report(plan, reports)
    check_dead_letters(plan, reports)
    records = sum(r.records for r in reports)
    table = settings.sink.commit_window(plan, reports) if settings.sink is not None and records else None
    result = window_run_summary(plan, reports, "written" if found else "no_records", stream_name=settings.stream_name,
                                start=start, end=end, time_slices=slices, trim_gap=gap, sink=settings.sink, table=table)  # fmt: skip
    if found:
        log_outcome(plan, reports, result)
    return result


def _run_handed_window(
    store: DynamoDBCheckpointStore, job: BatchJob, plan: BatchPlan, owner: str, records_expected: bool, output_root: str
) -> list[ShardReport]:
    """Hand a window's plan to its job through the store and read its report back from there."""
    label = window_label(*plan.window)
    store.write_window(label, "PLAN", owner, plan.to_dict())
    arguments = JobArguments(
        checkpoint_table=store.table_name, stream_name=plan.stream_name, consumer_name=plan.consumer_name, batch_id=0,
        lease_owner=owner, lease_seconds=DEFAULT_LEASE_SECONDS, records_expected=records_expected,
        region_name=getattr(getattr(store.client, "meta", None), "region_name", None), window=label,
        plan_digest=plan.digest(), output_root=output_root,
    )  # fmt: skip
    job.run_handed(arguments, output_location=plan.output_location)
    reports = store.window_report(label, owner)
    if reports is None:
        raise ReportNotRecordedError(f"The Spark job of window {label} ended without storing its report in checkpoint table "
                                     f"{store.table_name!r}. A re-run reads the same window and overwrites its output.")  # fmt: skip
    return reports
