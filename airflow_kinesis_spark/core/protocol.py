"""The batch protocol's incremental entry points: plan -> begin/lease -> probe -> job -> validate -> commit.

This module is the protocol's policy and nothing else. It drives

* a boto3 **Kinesis client** (shard listing, probes, trim-horizon checks),
* a **checkpoint store** (:class:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore`:
  plan log, head, lease, commit), and
* a **job** (:class:`~airflow_kinesis_spark.core.interfaces.BatchJob`): anything that runs a
  planned batch handed over in the checkpoint store (``core.job``) — reads its ranges, writes its
  output, records one :class:`~airflow_kinesis_spark.core.ranges.ShardReport` per planned range
  there. spark-submit and Spark Connect are two implementations
  (``airflow_kinesis_spark.hooks.spark``, ``airflow_kinesis_spark.hooks.spark_connect``); tests use
  fake ones. Adding another touches nothing here.

Operators validate their arguments, build the client, store and job, call :func:`run_incremental`
(or, for a window, ``core.window_run.run_window``), and publish the returned summary. Where each rule lives: stop rules in
``core.reader``, parents-before-children in ``core.shards``, planning in ``core.planner`` /
``core.window``, the window's entry point in ``core.window_run``, lag and trim-horizon rules in ``core.lag``, the conditional commit in
``core.store`` and the lease in ``core.lease``; the job's and the sink's interfaces in ``core.interfaces``, output locations
and plan ids in ``core.locations``, the pending plan's checks in ``core.pending``, a window's
check against the committed position in ``core.window_position``, the run's summary and the
task log's account in ``core.summaries``.

No Airflow import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.consumers import CONSUMER_TYPES, ensure_stream_consumer
from airflow_kinesis_spark.core.lag import find_trim_gaps, known_until
from airflow_kinesis_spark.core.planner import BatchPlan, plan_incremental, restart_from_trim_horizon, validate_report
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp, to_utc
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.probes import log_probes, probe_ranges
from airflow_kinesis_spark.core.read_options import MIN_CALL_INTERVAL_S
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.job import JobArguments, writer_id
from airflow_kinesis_spark.core.interfaces import BatchJob
from airflow_kinesis_spark.exceptions import CheckpointConflictError, DataLossError, ReportNotRecordedError

from airflow_kinesis_spark.core.locations import _is_table, batch_output_location, planned_output_location
from airflow_kinesis_spark.core.pending import _output_spec, _task_settings, check_pending_against_stream, check_pending_plan
from airflow_kinesis_spark.core.stream_summary import SummaryBudget
from airflow_kinesis_spark.core.summaries import incremental_summary, log_outcome

if TYPE_CHECKING:  # the boto3 stubs (mypy-boto3-kinesis) and Sink (defined once, in sinks): annotations only
    from mypy_boto3_kinesis import KinesisClient
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from airflow_kinesis_spark.core.window_run import WindowSettings
    from airflow_kinesis_spark.sinks import Sink

log = logging.getLogger(__name__)

__all__ = [
    "PreparedBatch",
    "prepare_incremental",
    "commit_handed",
    "IncrementalSettings",
    "run_incremental",
    "plan_batch",
    "check_dead_letters",
    "IDLE_REFRESH",
]

#: How often an idle consumer records that its shards were empty up to the cutoff: otherwise a
#: stream idle for longer than its retention period would look like lost data.
IDLE_REFRESH = timedelta(hours=1)


@dataclass(frozen=True)
class IncrementalSettings:
    """What an incremental run reads and where it writes (already validated by the caller).

    :param output_root: batch ``N`` goes to :func:`batch_output_location` of it.
    :param cutoff: records arriving at or after this are left for the next batch (UTC).
    :param initial_position: where a never-seen shard starts (``TRIM_HORIZON``, ``LATEST``,
        ``AT_TIMESTAMP``).
    :param lease_seconds: the lease on a pending batch (seconds).
    :param min_call_interval: seconds between two GetRecords calls on one shard for the probes.
    :param sink: the output form (:class:`~airflow_kinesis_spark.sinks.Sink`);
        ``None``: Parquet folders without committed records (protocol tests).
    :param consumer_type: ``polling`` (GetRecords) or ``efo`` (enhanced fan-out: the consumer is
        registered as a stream consumer, or reused, and the job subscribes as it; ``core.consumers``).
    :param transform: the task's ``package.module:function`` applied by the job before the
        write, or ``None``: recorded in the plan (``task_settings``), so that a pending plan is
        re-used only by a task with the same transform
        (:func:`~airflow_kinesis_spark.core.pending.check_pending_plan`).
    :param summary_budget: the host's ``DescribeStreamSummary`` budget
        (:class:`~airflow_kinesis_spark.core.stream_summary.SummaryBudget`; the operators pass
        ``KinesisStreamHook.summary_budget``): the batch's own call (the trim-gap check's
        retention period) waits for its slot of the host's pacer; ``None``: unpaced.
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
    sink: Sink | None = None
    consumer_type: str = "polling"
    transform: str | None = None
    summary_budget: SummaryBudget | None = None


def _check_consumer_type(consumer_type: str) -> None:
    if consumer_type not in CONSUMER_TYPES:
        raise ValueError(f"consumer_type must be one of {', '.join(CONSUMER_TYPES)}; got {consumer_type!r}")


def _for_job(kinesis: KinesisClient, plan: BatchPlan, settings: IncrementalSettings | WindowSettings) -> BatchPlan:
    """``plan`` with what only a plan that is persisted or run needs, resolved now: the output
    spec (a ``target_file_size`` becomes a rows cap from the table's latest commit: a catalog
    call) and, for ``efo``, the stream consumer (registered or reused, waited for until ACTIVE;
    the stream's ARN through the settings' ``summary_budget``); without the stored shard iterators
    the probes used (``BatchPlan.without_resume_iterators``). A run that finds no new records makes
    neither call. Used by both entry points (this module's and ``core.window_run``'s)."""
    arn = (ensure_stream_consumer(kinesis, settings.stream_name, settings.consumer_name, budget=settings.summary_budget)
           if settings.consumer_type == "efo" else None)  # fmt: skip
    return replace(plan.without_resume_iterators(), output=_output_spec(settings.sink, planning=True), consumer_arn=arn)


# -- incremental -------------------------------------------------------------------------------


def run_incremental(
    kinesis: KinesisClient, store: DynamoDBCheckpointStore, job: BatchJob, settings: IncrementalSettings, owner: str,
    *, now: datetime | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One incremental batch of one (stream, consumer), exactly once.

    1. :func:`prepare_incremental`: re-use the pending batch, or plan, probe and persist a new
       one (or finish without a job: no new records, or a report recorded already).
    2. Run the job. It takes the batch from the store under this run's ``owner`` (this run
       renews the lease until the job's driver claimed the batch) and records its report there
       itself (``core.job``); the batch is then claimed back and committed (:func:`commit_handed`).

    :param kinesis: boto3 Kinesis client.
    :param store: the consumer's checkpoint store (table created by the caller).
    :param owner: this run's writer id (unique per attempt), for the store's fencing.
    :returns: the batch summary (:func:`~airflow_kinesis_spark.core.summaries.incremental_summary`).
    :raises DataLossError: records would be lost (trim gap or vanished shard) without
        ``allow_data_loss``; nothing read or written.
    :raises CheckpointConflictError: another writer moved the store or took the batch over.
    :raises BatchLeaseHeldError: another run holds the pending batch's lease.
    :raises PendingPlanMismatchError: the pending plan is not this task's
        (:func:`~airflow_kinesis_spark.core.pending.check_pending_plan`).
    :raises ReportValidationError: the job's report does not match the plan; nothing committed.
    :raises ReportNotRecordedError: a handed job ended without recording its report.
    """
    prepared = prepare_incremental(kinesis, store, settings, owner, now=now)
    if prepared.summary is not None:
        return prepared.summary
    plan = prepared.plan
    assert plan is not None
    with _released_on_error(store, plan.batch_id, owner):
        arguments = prepared.job_arguments(store, owner, settings.lease_seconds)
        # This run holds the batch until its job's driver claims it (the driver's start may
        # outlast the lease); the driver holds it from then on.
        with store.hold_hand_off(plan.batch_id, owner, settings.lease_seconds):
            job.run_handed(arguments, output_location=plan.output_location)
        return commit_handed(store, plan.batch_id, owner, settings.lease_seconds, reused=prepared.reused, sink=settings.sink,
                             plan_digest=plan.digest())  # fmt: skip


@contextmanager
def _released_on_error(store: DynamoDBCheckpointStore, batch_id: int, owner: str) -> Iterator[None]:
    """Give up this run's lease on ``batch_id`` (its own and its writers': the job's driver, the
    commit) when the run fails, so a retry need not wait for the lease to expire: this run's
    processes ended (a job that failed, a table commit that refused the batch)."""
    try:
        yield
    except Exception:
        try:
            store.release_handed(batch_id, owner)
        except Exception as err:  # noqa: BLE001 - the run's own error is the one to report
            log.warning("could not release the lease on batch %d: %s", batch_id, err)
        raise


@dataclass(frozen=True)
class PreparedBatch:
    """What :func:`prepare_incremental` leaves: a pending batch for a job, or a finished run.

    :param summary: the run's summary when no job is needed (``no_new_records``,
        ``committed_without_records``, or ``committed``: a pending batch's report was recorded
        already); else ``None``.
    :param plan: the pending batch's plan, held by the preparing run's owner.
    :param records_expected: the probes saw a user record (the job may read and write in one pass).
    :param reused: the pending plan of an earlier run is re-used.
    """

    summary: dict[str, Any] | None = None
    plan: BatchPlan | None = None
    records_expected: bool = False
    reused: bool = False
    output_root: str | None = None

    def job_arguments(self, store: DynamoDBCheckpointStore, owner: str, lease_seconds: float) -> JobArguments:
        """The job's arguments for the pending batch (``core.job``): what this run decided, with
        the checked plan's digest and the task's output root, so the job acts on that plan only."""
        assert self.plan is not None, "no pending batch: the run finished without a job"
        return JobArguments(
            checkpoint_table=store.table_name, stream_name=self.plan.stream_name, consumer_name=self.plan.consumer_name,
            batch_id=self.plan.batch_id, lease_owner=owner, lease_seconds=lease_seconds,
            records_expected=self.records_expected, region_name=getattr(getattr(store.client, "meta", None), "region_name", None),
            plan_digest=self.plan.digest(), output_root=self.output_root,
        )  # fmt: skip


def prepare_incremental(
    kinesis: KinesisClient, store: DynamoDBCheckpointStore, settings: IncrementalSettings, owner: str, *, now: datetime | None = None
) -> PreparedBatch:
    """Everything of an incremental run before its job: the plan task of a split task group.

    1. A pending batch (planned, not committed) is re-used, never replaced: after its start
       positions are checked against the trim horizon, ``owner`` takes it over (once its
       holder's lease expired) and, if its report is recorded already, commits it without a job.
    2. Otherwise plan from the committed checkpoints and the shard lineage, check the trim
       horizon, and probe the ranges (``Limit`` 1) up to the first one with a user record
       (the job reads every range then). No record in any range (every range probed): no job;
       commit only when a checkpoint must be recorded (see :func:`_commit_without_records`).
    3. Persist the plan (``begin``): the batch is pending, held by ``owner``.

    :returns: a :class:`PreparedBatch`; its ``summary`` is set when no job is needed.
    :raises DataLossError, BatchLeaseHeldError, PendingPlanMismatchError, CheckpointConflictError:
        as :func:`run_incremental`.
    """
    now = to_utc(now or datetime.now(timezone.utc))
    head = store.head()
    plan = store.pending_plan(head)
    if settings.sink is not None:
        # Before anything is read or repaired: the output is this consumer's, and not ahead of the store.
        settings.sink.check_output(settings.stream_name, settings.consumer_name, store, head, plan)
        settings.sink.check_schema(settings.transform)
        settings.sink.repair(store, head)
    if plan is not None:
        check_pending_plan(plan, head, store, settings)
        check_pending_against_stream(kinesis, plan, head, store, settings, now)
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
            with _released_on_error(store, plan.batch_id, owner):
                checkpoints = validate_report(plan, reports)
                return PreparedBatch(summary=_commit(store, plan, reports, checkpoints, owner, reused=True, sink=settings.sink))
        return PreparedBatch(plan=plan, records_expected=False, reused=True, output_root=settings.output_root)

    plan = plan_batch(kinesis, store, settings, head.committed_batch_id + 1, now, head=head)
    if not plan.ranges:
        log.info("No shard to read: every shard is at SHARD_END or waiting for its parents (%s)", dict(plan.waiting))
        return PreparedBatch(summary=incremental_summary(plan, [], plan.checkpoints, "no_new_records", reused=False, sink=settings.sink))
    probes = _probe_batch(kinesis, plan, settings)
    if not any(r.records or r.quarantined for r in probes):  # no record: every range was probed
        return PreparedBatch(summary=_commit_without_records(kinesis, store, plan, probes, owner, settings))
    plan = _for_job(kinesis, plan, settings)
    if settings.sink is not None:
        settings.sink.claim(settings.stream_name, settings.consumer_name, record=True)  # the first batch with records records the owner
    store.begin(plan, owner)
    return PreparedBatch(plan=plan, records_expected=any(r.records for r in probes), reused=False, output_root=settings.output_root)


def commit_handed(
    store: DynamoDBCheckpointStore, batch_id: int, lease_owner: str, lease_seconds: float, *, reused: bool = False, sink: Sink | None = None,
    plan_digest: str | None = None,
) -> dict[str, Any]:
    """Commit pending batch ``batch_id`` from the report its job recorded: the commit task.

    Claims the batch back for ``lease_owner`` (under a ``commit`` writer id), validates the
    recorded report against the stored plan, and advances every checkpoint in one conditional
    write. Idempotent: when ``batch_id`` is the committed batch already, its summary is returned.

    :param lease_owner: the writer id the batch was handed to its job by (the plan task's, or the operator's).
    :param sink: the output form: its table commit comes before the checkpoint commit.
    :param plan_digest: the digest of the plan the planning run checked (``BatchPlan.digest``):
        a stored plan with another is refused (``PlanBindingError``), nothing committed.
    :returns: the batch summary (:func:`~airflow_kinesis_spark.core.summaries.incremental_summary`).
    :raises ReportNotRecordedError: no report recorded yet (the job runs, or ended without one);
        nothing committed. Retryable.
    :raises BatchLeaseHeldError: a driver of the batch still holds its lease (it is finishing).
    :raises CheckpointConflictError: the batch is not pending (discarded, or a later batch is
        committed), or another run took it over.
    :raises ReportValidationError: the recorded report does not match the plan; nothing committed.
    :raises CheckpointStoreCorruptError: ``batch_id`` is committed and its plan is not in the table
        (:meth:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore.missing_plan_error`).
    """
    head = store.head()
    if head.committed_batch_id == batch_id and head.pending_batch_id != batch_id:
        committed = store.committed_plan(head)
        if committed is None:
            raise store.missing_plan_error(head)
        committed_reports = store.committed_report(head) or []
        summary = incremental_summary(committed, committed_reports, store.committed_checkpoints(head), "committed", reused=True,
                                      sink=sink)  # fmt: skip
        log_outcome(committed, committed_reports, summary, committed_by=head.committed_owner)
        return summary
    if head.pending_batch_id != batch_id:
        raise CheckpointConflictError(
            f"Batch {batch_id} of stream {store.stream_name!r}, consumer {store.consumer_name!r} is not pending in checkpoint "
            f"table {store.table_name!r} (committed batch {head.committed_batch_id}, pending batch {head.pending_batch_id}): "
            "it was discarded or another run moved on. Nothing was committed.",
            batch_id=batch_id, committed_batch_id=head.committed_batch_id, pending_batch_id=head.pending_batch_id,
        )  # fmt: skip
    if head.pending_report_owner is None:
        age = None if not head.pending_heartbeat else (store.now_ms() - head.pending_heartbeat) / 1000
        running = age is not None and age < lease_seconds and head.pending_owner != lease_owner
        state = (
            f"its job is running (writer {head.pending_owner}, last heartbeat {age:.1f} s ago)" if running
            else f"no job holds it (holder {head.pending_owner}): the job has not started, or ended without recording one"
        )  # fmt: skip
        raise ReportNotRecordedError(
            f"Batch {batch_id} of stream {store.stream_name!r}, consumer {store.consumer_name!r} has no recorded report: "
            f"{state}. Nothing was committed. Retry the commit once the job finished; if the job failed, re-run it "
            "(its plan stays pending).",
            batch_id=batch_id, holder=head.pending_owner, heartbeat_age_seconds=age, job_running=running,
        )  # fmt: skip
    writer = writer_id(lease_owner, "commit")
    head = store.claim(batch_id, lease_owner, writer, lease_seconds)
    plan = store.pending_plan(head)
    reports = store.pending_report(head)
    if plan is None or reports is None:
        raise ReportNotRecordedError(f"Batch {batch_id}: its plan or report went missing while it was claimed", batch_id=batch_id)
    if plan_digest is not None and plan.digest() != plan_digest:
        from airflow_kinesis_spark.exceptions import PlanBindingError

        raise PlanBindingError(
            f"The stored plan of batch {batch_id} of stream {store.stream_name!r}, consumer {store.consumer_name!r} in "
            f"checkpoint table {store.table_name!r} is not the plan the planning run checked (digest {plan.digest()[:16]}…, "
            f"expected {plan_digest[:16]}…): someone changed the checkpoint table. Nothing was committed. Check who can "
            "write the table (docs/security.md), then discard the pending batch (kinesis-spark discard-pending).",
            batch_id=batch_id, problems=["digest"],
        )  # fmt: skip
    return _commit(store, plan, reports, validate_report(plan, reports), writer, reused=reused, sink=sink)


def plan_batch(
    kinesis: KinesisClient, store: DynamoDBCheckpointStore, settings: IncrementalSettings, batch_id: int, now: datetime, *, head: Any = None
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
    _check_consumer_type(settings.consumer_type)
    plan = replace(plan, checkpoint_table=store.table_name, task_settings=_task_settings(settings))
    plan = replace(plan, output_location=planned_output_location(settings.output_root, plan, settings.sink))
    gaps = find_trim_gaps(kinesis, plan.stream_name, plan.ranges, now, min_call_interval=settings.min_call_interval,
                          budget=settings.summary_budget)  # fmt: skip
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
        # DEBUG: each range's INFO line comes with its outcome (log_outcome)
        log.debug("Plan batch %d: shard %s from %s to cutoff %s", batch_id, rng.shard_id, rng.start, format_timestamp(rng.cutoff))
    return plan


def _gap_detail(gaps: Mapping[str, str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in sorted(gaps.items()))


def _pending_plan_gaps(kinesis: KinesisClient, store: DynamoDBCheckpointStore, plan: BatchPlan, settings: IncrementalSettings, owner: str, now: datetime) -> bool:
    """Check a pending plan's start positions against the trim horizon before it is re-used.

    A batch left pending for longer than the stream's retention period starts after checkpoints
    whose next records may have aged out (LOUD, as for committed checkpoints). A persisted plan is
    never rewritten, so with ``allow_data_loss`` the pending batch is discarded (its output was
    never committed) and the caller plans the batch anew.

    :returns: whether the pending batch was discarded.
    :raises DataLossError: a gap without ``allow_data_loss``; nothing read or written.
    """
    gaps = find_trim_gaps(kinesis, plan.stream_name, plan.ranges, now, min_call_interval=settings.min_call_interval,
                          budget=settings.summary_budget)  # fmt: skip
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


def _commit(
    store: DynamoDBCheckpointStore, plan: BatchPlan, reports: list[ShardReport], checkpoints: Mapping[str, Checkpoint], owner: str, *, reused: bool,
    sink: Sink | None = None,
) -> dict[str, Any]:
    """Make the batch visible in the sink's table (idempotent per batch id), then advance every
    checkpoint of ``plan`` (one conditional write), then the sink's after-commit step; summarise.

    A crash between the table commit and the checkpoint commit rolls forward: the next attempt
    finds the recorded report, and the table commit finds the batch in the table and adds nothing.
    """
    table = None
    check_dead_letters(plan, reports)
    if sink is not None and any(r.records for r in reports):
        sink.check_written(plan, reports)  # the report against the published files: a forged one commits nothing
        if _is_table(sink):
            store.heartbeat(plan.batch_id, owner)  # still this run's batch: a zombie makes no table commit
        started = time.monotonic()
        table = sink.commit_batch(plan, reports)
        if table is not None:
            table = replace(table, seconds=round(time.monotonic() - started, 3))
            if _is_table(sink):  # a Parquet batch's commit is the checkpoint commit: no table commit to log
                log.info("Batch %d: table commit to %s (%s) in %.3f s", plan.batch_id, table.table, table.format, table.seconds)
    store.commit(plan, checkpoints, owner)
    if sink is not None:
        sink.after_checkpoint_commit(plan, reports)
        sink.sweep_staging(plan)
    summary = incremental_summary(plan, reports, checkpoints, "committed", reused=reused, sink=sink, table=table)
    log_outcome(plan, reports, summary)
    return summary


def check_dead_letters(plan: BatchPlan, reports: Sequence[ShardReport]) -> None:
    """Before any commit of a batch or window: its dead letters (records that did not decode,
    ``core.records``) are at most the plan's ``max_dead_letter_fraction`` of its records.

    :raises DeadLetterLimitError: more than that; naming the counts, the limit and what to check.
        Nothing committed.
    """
    from airflow_kinesis_spark.core.records import RecordSettings
    from airflow_kinesis_spark.exceptions import DeadLetterLimitError

    spec = (plan.output or {}).get("records")
    records, dead = sum(r.records for r in reports), sum(r.dead_letters for r in reports)
    if not spec or not dead:
        return
    limit = RecordSettings.from_dict(spec).max_dead_letter_fraction
    if dead <= limit * records:
        return
    what = f"batch {plan.batch_id}" if plan.mode == "incremental" else "the window"
    raise DeadLetterLimitError(
        f"{dead} of {what}'s {records} records ({dead / records:.1%}) did not decode as {spec.get('format')} records "
        f"(max_dead_letter_fraction={limit}): that many is a wrong record format or schema, not bad records. Nothing was "
        f"committed{'; the batch stays pending' if plan.mode == 'incremental' else ''}. The dead letters, with each "
        f"record's error, are under {plan.output_location}/_quarantine: read a few, then fix the task's record_settings "
        "(RecordSettings: format, schema or registry), or raise its max_dead_letter_fraction if these records really are bad; either "
        "way discard the pending batch (kinesis-spark discard-pending): its plan holds the settings it was planned with.",
        batch_id=plan.batch_id, records=records, dead_letters=dead, limit=limit,
    )  # fmt: skip


def _probe_batch(kinesis: KinesisClient, plan: BatchPlan, settings: IncrementalSettings) -> list[ShardReport]:
    """Probe the batch's ranges up to the first user record (the job then reads every range, and
    the other probes would tell nothing more).

    The checkpoints' stored shard iterators (``Checkpoint.resume_iterator``: one ``GetRecords``
    per idle shard instead of two) are used only when no checkpoint can be committed from empty
    probes alone, as the checkpoint store holds them and a wrong one must cost at most a delay:
    not for a plan with a new shard or with an idle shard's ``clear_until`` due for a refresh
    (:func:`_commit_without_records`), and a shard's end seen on one is probed again from
    ``GetShardIterator`` before anything is committed. A probe that finds a record only starts the
    job, which reads from the checkpoints.
    """
    planned = [r.shard_id for r in plan.ranges]
    reuse = set(planned) <= set(plan.checkpoints) and not any(
        _needs_idle_refresh(r.start_checkpoint, plan.cutoff) for r in plan.ranges)  # fmt: skip
    probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval,
                          until_record=True, reuse_iterators=reuse)  # fmt: skip
    if reuse and not any(r.records or r.quarantined for r in probes) and any(r.shard_end for r in probes):
        log.info("A probe on a stored shard iterator reached a shard's end: probing every range again from "
                 "GetShardIterator before that end is committed")  # fmt: skip
        probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval, until_record=True)
    log_probes(probes, len(plan.ranges))
    return probes


def _commit_without_records(
    kinesis: KinesisClient, store: DynamoDBCheckpointStore, plan: BatchPlan, probes: list[ShardReport], owner: str, settings: IncrementalSettings
) -> dict[str, Any]:
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
        return incremental_summary(plan, probes, plan.checkpoints, "no_new_records", reused=False, sink=settings.sink)
    log.info(
        "No new records; recording checkpoints without a Spark job (new shards: %s; shards ended: %s; "
        "idle shards seen empty up to the cutoff: %s)",
        new_shards, newly_ended, stale,
    )  # fmt: skip
    plan = _for_job(kinesis, plan, settings)  # persisted: a crash before the commit leaves it pending, to be compared
    store.begin(plan, owner)
    store.commit(plan, checkpoints, owner)
    return incremental_summary(plan, probes, checkpoints, "committed_without_records", reused=False, sink=settings.sink)


def _needs_idle_refresh(checkpoint: Checkpoint, cutoff: datetime) -> bool:
    """Whether an idle shard's checkpoint should record that it was read empty up to ``cutoff``."""
    if checkpoint.position is not None and checkpoint.clear_until is None:
        return True
    return (known_until(checkpoint) or cutoff) < cutoff - IDLE_REFRESH
