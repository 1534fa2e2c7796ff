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
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from airflow_kinesis_spark.core.consumers import CONSUMER_TYPES, ensure_stream_consumer
from airflow_kinesis_spark.core.lag import find_trim_gaps, known_until
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.planner import (
    BatchPlan,
    initial_checkpoint,
    output_settings,
    plan_incremental,
    restart_from_trim_horizon,
    validate_report,
)
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel, format_timestamp, to_utc
from airflow_kinesis_spark.core.ranges import ShardReport, StartPosition
from airflow_kinesis_spark.core.reader import MIN_CALL_INTERVAL_S, log_probes, probe_ranges
from airflow_kinesis_spark.core.shards import describe_stream_summary, list_shards
from airflow_kinesis_spark.core.store import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.window import (
    derive_slices,
    plan_window,
    validate_window,
    validate_window_report,
    window_label,
    window_summary,
)
from airflow_kinesis_spark.core.job import JobArguments, writer_id
from airflow_kinesis_spark.exceptions import (
    CheckpointConflictError,
    DataLossError,
    PendingPlanMismatchError,
    ReportNotRecordedError,
    WindowAheadError,
)

log = logging.getLogger(__name__)

__all__ = [
    "BatchJob",
    "HandedBatchJob",
    "hands_off",
    "PreparedBatch",
    "prepare_incremental",
    "commit_handed",
    "IncrementalSettings",
    "WindowSettings",
    "run_incremental",
    "run_window",
    "batch_output_location",
    "planned_output_location",
    "plan_id",
    "committed_record_location",
    "committed_record_of",
    "COMMITTED_DIR",
    "window_output_location",
    "IDLE_REFRESH",
    "DEFAULT_LEASE_SECONDS",
    "log_outcome",
]

#: How often an idle consumer records that its shards were empty up to the cutoff: otherwise a
#: stream idle for longer than its retention period would look like lost data.
IDLE_REFRESH = timedelta(hours=1)
# DEFAULT_LEASE_SECONDS (60 s, renewed every quarter of the lease) is defined, and its numbers
# justified, with the lease in ``core.store``; re-exported here for the operators.


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


class HandedBatchJob(Protocol):
    """Runs one planned batch that it takes from the checkpoint store (``core.job``): the Spark
    driver claims the batch, reads the plan, holds the lease, publishes its output and records
    its report there itself, so nothing passes between this process and the driver but the
    :class:`~airflow_kinesis_spark.core.job.JobArguments`. The driver may run anywhere.

    ``takes_batch_from_store`` is ``True`` (see :func:`hands_off`).
    """

    takes_batch_from_store: bool

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job with ``arguments`` and return when it ended.

        :param output_location: the batch's output location (for scoping the job's credentials).
        :raises Exception: the job failed; the protocol releases the lease and re-raises.
        """
        ...

    def kill(self) -> None:
        """Stop a running job at once."""
        ...


class Sink(Protocol):
    """Where a batch's rows become visible (``airflow_kinesis_spark.sinks``: Parquet folders,
    Iceberg, Delta). Every method is idempotent: the protocol calls them again when it rolls a
    batch forward.

    - ``output_spec()``: what the job writes (an ``OutputSpec``, stored in each plan).
    - ``commit_batch(plan, reports)``: make a batch with records visible *before* its checkpoints
      advance (a table commit that records stream, consumer and batch id; a batch already in the
      table adds nothing); returns a ``TableCommit`` (or ``None``).
    - ``after_checkpoint_commit(plan, reports)``: after they advanced (Parquet's committed record).
    - ``repair(store, head)``: before planning, finish what a crash after the last checkpoint
      commit left undone.
    - ``commit_window(plan, reports)``: replace a window's rows atomically.
    """

    format: str
    table: str

    def output_spec(self) -> Any: ...

    def planned_output_spec(self) -> Any: ...

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> Any: ...

    def check_written(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None: ...

    def check_schema(self, transform: str | None) -> None: ...

    def after_checkpoint_commit(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None: ...

    def repair(self, store: Any, head: Any) -> None: ...

    def commit_window(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> Any: ...


def hands_off(job: Any) -> bool:
    """Whether ``job`` takes its batch from the store (:class:`HandedBatchJob`)."""
    return bool(getattr(job, "takes_batch_from_store", False))


@dataclass(frozen=True)
class IncrementalSettings:
    """What an incremental run reads and where it writes (already validated by the caller).

    :param output_root: batch ``N`` goes to :func:`batch_output_location` of it.
    :param cutoff: records arriving at or after this are left for the next batch (UTC).
    :param initial_position: where a never-seen shard starts (``TRIM_HORIZON``, ``LATEST``,
        ``AT_TIMESTAMP``).
    :param lease_seconds: the lease on a pending batch (seconds).
    :param min_call_interval: seconds between two GetRecords calls on one shard for the probes.
    :param sink: the output form (:class:`Sink`); ``None``: Parquet folders without committed
        records (protocol tests).
    :param consumer_type: ``polling`` (GetRecords) or ``efo`` (enhanced fan-out: the consumer is
        registered as a stream consumer, or reused, and the job subscribes as it; ``core.consumers``).
    :param transform: the task's ``package.module:function`` applied by the job before the
        write, or ``None``: recorded in the plan (``task_settings``), so that a pending plan is
        re-used only by a task with the same transform (:func:`check_pending_plan`).
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


@dataclass(frozen=True)
class WindowSettings:
    """What a window run reads and where it writes.

    :param start: the window's start, inclusive (UTC).
    :param end: its end, exclusive (UTC); not in the future.
    :param time_slices: slices per shard (1..64), or ``None`` to derive them
        (:func:`~airflow_kinesis_spark.core.window.derive_slices`).
    :param slice_length: the shortest slice worth a task when deriving.
    :param parallelism: Spark tasks to keep busy when deriving.
    :param sink: the output form (:class:`Sink`); a table's window commit replaces the window's
        rows, and each run then writes its own folder under the window's (``run=...``), so a
        re-run never deletes files the table's current snapshot holds.
    :param consumer_type: as :class:`IncrementalSettings`'.
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


def _check_consumer_type(consumer_type: str) -> None:
    if consumer_type not in CONSUMER_TYPES:
        raise ValueError(f"consumer_type must be one of {', '.join(CONSUMER_TYPES)}; got {consumer_type!r}")


def _for_job(kinesis: Any, plan: BatchPlan, settings: IncrementalSettings | WindowSettings) -> BatchPlan:
    """``plan`` with what only a plan that is persisted or run needs, resolved now: the output
    spec (a ``target_file_size`` becomes a rows cap from the table's latest commit: a catalog
    call) and, for ``efo``, the stream consumer (registered or reused, waited for until ACTIVE).
    A run that finds no new records makes neither call."""
    arn = ensure_stream_consumer(kinesis, settings.stream_name, settings.consumer_name) if settings.consumer_type == "efo" else None
    return replace(plan, output=_output_spec(settings.sink, planning=True), consumer_arn=arn)


def _output_spec(sink: Sink | None, *, planning: bool = False) -> dict[str, Any] | None:
    """The sink's ``OutputSpec`` as stored in a plan (``planning``: with the cap a byte target
    derives); else the DAG author's settings, what a pending plan is compared on."""
    if sink is None:
        return None
    return sink.planned_output_spec().to_dict() if planning else sink.output_spec().settings()


def _is_table(sink: Sink | None) -> bool:
    return sink is not None and sink.format != "parquet"


def batch_output_location(output_root: str, batch_id: int, plan_id: str | None = None) -> str:
    """``{output_root}/batch_id={batch_id}`` (Parquet: the folder readers see as the batch), or with
    ``plan_id`` (tables) ``{output_root}/batch_id={batch_id}-{plan_id}``: a folder only that plan
    of the batch writes, so no attempt of another plan (a re-created checkpoint table, another
    consumer) can replace files a table's snapshot or version references."""
    return f"{output_root.rstrip('/')}/batch_id={batch_id}" + (f"-{plan_id}" if plan_id else "")


#: The folder of Parquet output's committed records under the output root (a ``_`` folder:
#: readers of the output root skip it; ``airflow_kinesis_spark.sinks.parquet``).
COMMITTED_DIR = "_committed"


def committed_record_location(output_root: str, batch_id: int) -> str:
    """``{output_root}/_committed/batch_id={batch_id}/manifest``: Parquet batch ``batch_id``'s
    committed record (its data files, one URI per line)."""
    return f"{output_root.rstrip('/')}/{COMMITTED_DIR}/batch_id={batch_id}/manifest"


def committed_record_of(output_location: str) -> str | None:
    """The committed record a Parquet batch folder ``{root}/batch_id=N`` would have
    (:func:`committed_record_location`); ``None`` for any other location (a table's plan folder,
    a window's)."""
    root, _, name = output_location.rstrip("/").rpartition("/")
    number = name.removeprefix("batch_id=")
    return committed_record_location(root, int(number)) if name.startswith("batch_id=") and number.isdigit() else None


def plan_id(plan: BatchPlan) -> str:
    """12 hex digits that identify one plan of a batch: a digest of its stream, consumer,
    checkpoint table, batch id and creation time (ms). A re-run of the batch re-uses the plan
    and so the id; a batch of the same id planned by another checkpoint history gets another."""
    import hashlib

    text = "\n".join([stream_name_of(plan.stream_name), plan.consumer_name, plan.checkpoint_table or "", str(plan.batch_id),
                      format_timestamp(plan.created_at)])  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def planned_output_location(output_root: str, plan: BatchPlan, sink: Sink | None) -> str:
    """Where batch ``plan`` writes: :func:`batch_output_location` of the task's root, with the
    plan's :func:`plan_id` for a table output. Derived from the task's settings and the plan's
    identity, never read from a stored plan."""
    return batch_output_location(output_root, plan.batch_id, plan_id(plan) if _is_table(sink) else None)


def window_output_location(output_root: str, start: datetime, end: datetime) -> str:
    """``{output_root}/window={label}`` (:func:`~airflow_kinesis_spark.core.window.window_label`)."""
    return f"{output_root.rstrip('/')}/window={window_label(start, end)}"


# -- incremental -------------------------------------------------------------------------------


def run_incremental(
    kinesis: Any, store: Any, job: BatchJob | HandedBatchJob, settings: IncrementalSettings, owner: str,
    *, now: datetime | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One incremental batch of one (stream, consumer), exactly once.

    1. :func:`prepare_incremental`: re-use the pending batch, or plan, probe and persist a new
       one (or finish without a job: no new records, or a report recorded already).
    2. Run the job. A :class:`HandedBatchJob` takes the batch from the store under this run's
       ``owner`` (this run renews the lease until the job's driver claimed the batch) and
       records its report there itself (``core.job``); the batch is then claimed
       back and committed (:func:`commit_handed`). A :class:`BatchJob` runs in this process
       under this run's lease and returns its reports, which are validated, recorded and committed.

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
    :raises ReportNotRecordedError: a handed job ended without recording its report.
    """
    prepared = prepare_incremental(kinesis, store, settings, owner, now=now)
    if prepared.summary is not None:
        return prepared.summary
    plan = prepared.plan
    assert plan is not None
    with _released_on_error(store, plan.batch_id, owner):
        if hands_off(job):
            arguments = prepared.job_arguments(store, owner, settings.lease_seconds)
            # This run holds the batch until its job's driver claims it (the driver's start may
            # outlast the lease); the driver holds it from then on.
            with store.hold_hand_off(plan.batch_id, owner, settings.lease_seconds):
                job.run_handed(arguments, output_location=plan.output_location)  # type: ignore[union-attr]
            return commit_handed(store, plan.batch_id, owner, settings.lease_seconds, reused=prepared.reused, sink=settings.sink,
                                 plan_digest=plan.digest())  # fmt: skip
        return _run_job_and_commit(
            store, job, plan, owner, settings.lease_seconds, records_expected=prepared.records_expected,  # type: ignore[arg-type]
            reused=prepared.reused, sink=settings.sink,
        )  # fmt: skip


@contextmanager
def _released_on_error(store: Any, batch_id: int, owner: str) -> Iterator[None]:
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

    def job_arguments(self, store: Any, owner: str, lease_seconds: float) -> JobArguments:
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
    kinesis: Any, store: Any, settings: IncrementalSettings, owner: str, *, now: datetime | None = None
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
    # Up to the first user record: the job then reads every range, and the other probes would tell nothing more.
    probes = probe_ranges(kinesis, plan.stream_name, plan.ranges, min_call_interval=settings.min_call_interval, until_record=True)
    log_probes(probes, len(plan.ranges))
    if not any(r.records or r.quarantined for r in probes):  # no record: every range was probed
        return PreparedBatch(summary=_commit_without_records(kinesis, store, plan, probes, owner, settings))
    plan = _for_job(kinesis, plan, settings)
    if settings.sink is not None:
        settings.sink.claim(settings.stream_name, settings.consumer_name, record=True)  # the first batch with records records the owner
    store.begin(plan, owner)
    return PreparedBatch(plan=plan, records_expected=any(r.records for r in probes), reused=False, output_root=settings.output_root)


def commit_handed(
    store: Any, batch_id: int, lease_owner: str, lease_seconds: float, *, reused: bool = False, sink: Sink | None = None,
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
    :returns: the batch summary (:func:`incremental_summary`).
    :raises ReportNotRecordedError: no report recorded yet (the job runs, or ended without one);
        nothing committed. Retryable.
    :raises BatchLeaseHeldError: a driver of the batch still holds its lease (it is finishing).
    :raises CheckpointConflictError: the batch is not pending (discarded, or a later batch is
        committed), or another run took it over.
    :raises ReportValidationError: the recorded report does not match the plan; nothing committed.
    """
    head = store.head()
    if head.committed_batch_id == batch_id and head.pending_batch_id != batch_id:
        plan = store.committed_plan(head)
        reports = store.committed_report(head) or []
        summary = incremental_summary(plan, reports, store.committed_checkpoints(head), "committed", reused=True, sink=sink)
        log_outcome(plan, reports, summary, committed_by=head.committed_owner)
        return summary
    if head.pending_batch_id != batch_id:
        raise CheckpointConflictError(
            f"Batch {batch_id} of stream {store.stream_name!r}, consumer {store.consumer_name!r} is not pending in checkpoint "
            f"table {store.table_name!r} (committed batch {head.committed_batch_id}, pending batch {head.pending_batch_id}): "
            "it was discarded or another run moved on. Nothing was committed.",
            batch_id=batch_id, committed_batch_id=head.committed_batch_id, pending_batch_id=head.pending_batch_id,
        )  # fmt: skip
    if head.pending_report_owner is None:
        age = None if not head.pending_heartbeat else (time.time() * 1000 - head.pending_heartbeat) / 1000
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
    _check_consumer_type(settings.consumer_type)
    plan = replace(plan, checkpoint_table=store.table_name, task_settings=_task_settings(settings))
    plan = replace(plan, output_location=planned_output_location(settings.output_root, plan, settings.sink))
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
        # DEBUG: each range's INFO line comes with its outcome (log_outcome)
        log.debug("Plan batch %d: shard %s from %s to cutoff %s", batch_id, rng.shard_id, rng.start, format_timestamp(rng.cutoff))
    return plan


#: The task's arguments that set each compared item of a pending plan: what to put back when it
#: differs. Items not listed (batch id, mode, stream, consumer, checkpoint table, checkpoints and
#: start positions) follow from the checkpoint table itself: no argument of the task explains a
#: difference there, someone else wrote the table.
_SET_BY = {
    "output location": "output_path",
    "output format": "output_format",
    "partitioning": "partition_by",
    "max records per file": "max_records_per_file",
    "target file size": "target_file_size",
    "derived columns": "output_format, partition_by",
    "consumer type": "consumer_type",
    "transform": "transform",
    "max records per shard": "max_records_per_shard",
    "max bytes per shard": "max_bytes_per_shard",
    "initial position": "initial_position, initial_timestamp",
}
#: Keys of a stored output spec (``OutputSpec.to_dict``) and how differences in them are named.
_OUTPUT_ITEMS = {"format": "output format", "partition": "partitioning", "max_records_per_file": "max records per file",
                 "target_file_size": "target file size", "derived": "derived columns"}  # fmt: skip


def _task_settings(settings: IncrementalSettings) -> dict[str, Any]:
    """What a plan records of the task's settings that its ranges do not show (``BatchPlan.task_settings``)."""
    return {"transform": settings.transform or None}


def _initial_position(settings: IncrementalSettings) -> str:
    """The task's initial position as compared with a plan's: ``AT_TIMESTAMP`` with its time."""
    if settings.initial_position == "AT_TIMESTAMP" and settings.initial_timestamp is not None:
        return f"AT_TIMESTAMP {format_timestamp(settings.initial_timestamp)}"
    return settings.initial_position


def _planned_initial_position(plan: BatchPlan) -> str | None:
    """The initial position a first batch (no checkpoint yet) was planned with, read from its
    ranges' starts: ``TRIM_HORIZON``, ``LATEST`` (``AT_TIMESTAMP`` of the planning time, see
    ``planner.initial_checkpoint``) or ``AT_TIMESTAMP <time>``; ``None`` when the plan does not
    show one (a later batch: its never-seen shards may be children, which start at ``TRIM_HORIZON``)."""
    starts = {r.start_checkpoint for r in plan.ranges if r.shard_id not in plan.trim_gaps}
    if plan.checkpoints or len(starts) != 1:
        return None
    (start,) = starts
    if start.sentinel is Sentinel.TRIM_HORIZON:
        return "TRIM_HORIZON"
    if start.sentinel is Sentinel.AT_TIMESTAMP and start.timestamp is not None:
        return "LATEST" if start.timestamp == plan.created_at else f"AT_TIMESTAMP {format_timestamp(start.timestamp)}"
    return None


def _caps(plan: BatchPlan, name: str) -> Any:
    """A cap of the plan's ranges (``max_records`` or ``max_bytes``): one value, or the sorted
    values when the ranges disagree (no task plans that)."""
    values = {getattr(r, name) for r in plan.ranges}
    return next(iter(values)) if len(values) == 1 else sorted(values, key=str)


def _differences(plan: BatchPlan, head: Any, store: Any, settings: IncrementalSettings) -> list[tuple[str, str]]:
    """``(item, line)`` per difference of :func:`pending_plan_differences`."""
    pending_batch_id = head.pending_batch_id
    expected: dict[str, Any] = {
        "batch id": pending_batch_id,
        "mode": "incremental",
        "stream": stream_name_of(settings.stream_name),  # a stream's name and its ARN share checkpoints
        "consumer": settings.consumer_name,
        "checkpoint table": store.table_name,
        "output location": planned_output_location(settings.output_root, replace(plan, batch_id=pending_batch_id or 0),
                                                   settings.sink),
        "consumer type": settings.consumer_type,
    }
    if _is_table(settings.sink) and plan.output_location == batch_output_location(settings.output_root, plan.batch_id):
        expected["output location"] = plan.output_location  # a table's plan made before plan ids named folders
    stored: dict[str, Any] = {
        "batch id": plan.batch_id,
        "mode": plan.mode,
        "stream": stream_name_of(plan.stream_name),
        "consumer": plan.consumer_name,
        "checkpoint table": plan.checkpoint_table or store.table_name,  # plans of earlier versions do not name it
        "output location": plan.output_location,
        "consumer type": "efo" if plan.consumer_arn else "polling",
    }
    want_output, have_output = _output_spec(settings.sink), (output_settings(plan.output) if plan.output else None)
    if want_output is None or have_output is None:  # protocol tests, and plans of earlier versions: Parquet
        expected["output format"] = (want_output or {}).get("format", "parquet")
        stored["output format"] = (have_output or {}).get("format", "parquet")
    else:
        for key in [*_OUTPUT_ITEMS, *sorted(set(want_output) | set(have_output) - set(_OUTPUT_ITEMS))]:
            item = _OUTPUT_ITEMS.get(key, f"output {key}")
            expected[item], stored[item] = want_output.get(key), have_output.get(key)
    if plan.task_settings is not None:  # plans of earlier versions did not record them
        expected["transform"], stored["transform"] = _task_settings(settings)["transform"], plan.task_settings.get("transform")
    if plan.ranges:
        expected["max records per shard"], stored["max records per shard"] = settings.max_records_per_shard, _caps(plan, "max_records")
        expected["max bytes per shard"], stored["max bytes per shard"] = settings.max_bytes_per_shard, _caps(plan, "max_bytes")
    if (initial := _planned_initial_position(plan)) is not None:
        expected["initial position"], stored["initial position"] = _initial_position(settings), initial
    found = [
        (k, f"{k}: the plan has {stored[k]!r}, this task has {v!r}" + (f" (set by {_SET_BY[k]})" if k in _SET_BY else ""))
        for k, v in expected.items() if stored[k] != v
    ]  # fmt: skip
    if any(k not in _SET_BY for k, _ in found):
        return found  # not this consumer's plan: its start positions say nothing more
    if pending_batch_id is not None and pending_batch_id != head.committed_batch_id + 1:
        found.append(("pending batch id", f"batch id: pending batch {pending_batch_id} does not follow committed batch "
                      f"{head.committed_batch_id}"))  # fmt: skip
    committed = {k: v.to_dict() for k, v in store.committed_checkpoints(head).items()}
    if {k: v.to_dict() for k, v in plan.checkpoints.items()} != committed:
        found.append(("checkpoints", "checkpoints: the plan starts from checkpoints other than the committed ones"))
    initial = initial_checkpoint(settings.initial_position, now=plan.created_at, initial_timestamp=settings.initial_timestamp)
    initial_changed = any(k == "initial position" for k, _ in found)
    for rng in plan.ranges:
        known = plan.checkpoints.get(rng.shard_id)
        start = rng.start_checkpoint
        if rng.shard_id in plan.trim_gaps:
            # a recorded trim gap: only with allow_data_loss, from the oldest record kept (the gap's
            # reality is checked against the stream by check_pending_against_stream)
            allowed = settings.allow_data_loss and start.sentinel is Sentinel.TRIM_HORIZON
            why = "over a recorded trim gap, which this task does not allow (allow_data_loss=False)" if not settings.allow_data_loss \
                else "over a recorded trim gap, but not from TRIM_HORIZON"  # fmt: skip
        elif known is None:
            # a never-seen shard: the oldest record kept (a child of read parents), or the task's
            # initial position (a changed initial_position is reported as such above)
            allowed = start.sentinel is Sentinel.TRIM_HORIZON or start == initial or initial_changed
            why = f"for a shard without a checkpoint, neither TRIM_HORIZON nor the task's initial position ({initial})"
        else:
            allowed, why = start == known, f"not after its committed checkpoint {known}"
        if not allowed or rng.start != StartPosition.after(start):
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: the range starts at {rng.start}, {why}"))
    return found


def check_pending_against_stream(kinesis: Any, plan: BatchPlan, head: Any, store: Any, settings: IncrementalSettings, now: datetime) -> None:
    """What a pending plan's check needs the stream for (after :func:`check_pending_plan`): every
    range's shard is a shard of the stream whose parents are at ``SHARD_END`` in the committed
    checkpoints (ORDER); a recorded trim gap is real (the shard's committed checkpoint is behind
    the trim horizon now); an enhanced fan-out consumer ARN is the one ``DescribeStreamConsumer``
    gives for this stream and consumer name. One ``ListShards`` (and the probes and the
    ``DescribeStreamConsumer`` call where the plan needs them); only for a re-used plan.

    :raises PendingPlanMismatchError: naming each difference (someone else wrote the table).
    """
    from airflow_kinesis_spark.core.consumers import stream_consumer_arn
    from airflow_kinesis_spark.core.shards import ShardLineage

    found: list[tuple[str, str]] = []
    committed = store.committed_checkpoints(head)
    lineage = ShardLineage(list_shards(kinesis, settings.stream_name))
    for rng in plan.ranges:
        shard = lineage.shards.get(rng.shard_id)
        if shard is None:
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: not a shard of stream {stream_name_of(settings.stream_name)!r}"))
        elif not lineage.parents_finished(shard, committed):
            found.append((f"shard {rng.shard_id}", f"shard {rng.shard_id}: planned before its parents {', '.join(shard.parents)} "
                          "reached SHARD_END"))  # fmt: skip
    gapped = [replace(r, start_checkpoint=committed[r.shard_id], start=StartPosition.after(committed[r.shard_id]))
              for r in plan.ranges if r.shard_id in plan.trim_gaps and r.shard_id in committed]  # fmt: skip
    if gapped:
        real = find_trim_gaps(kinesis, plan.stream_name, gapped, now, min_call_interval=settings.min_call_interval)
        found += [(f"shard {r.shard_id}", f"shard {r.shard_id}: the plan records a trim gap, but its committed checkpoint "
                   f"{r.start_checkpoint} is not behind the stream's trim horizon") for r in gapped if r.shard_id not in real]  # fmt: skip
    if plan.consumer_arn:
        arn = stream_consumer_arn(kinesis, settings.stream_name, settings.consumer_name)
        if plan.consumer_arn != arn:
            found.append(("consumer ARN", f"consumer ARN: the plan has {plan.consumer_arn!r}, stream consumer "
                          f"{settings.consumer_name!r} of this stream is {arn!r}"))  # fmt: skip
    if found:
        _raise_mismatch(found, head, store, settings)


def pending_plan_differences(plan: BatchPlan, head: Any, store: Any, settings: IncrementalSettings) -> list[str]:
    """How a pending plan read from the checkpoint table differs from what this task would plan:
    one line per difference, ``"<item>: the plan has <a>, this task has <b> (set by <argument>)"``
    (``(set by ...)`` only where an argument of the task sets the item); ``[]`` when it is this
    task's plan. See :func:`check_pending_plan`."""
    return [line for _, line in _differences(plan, head, store, settings)]


def discard_pending_command(stream: str, consumer: str, table: str) -> str:
    """The ``kinesis-spark discard-pending`` command line (its dry run) for one consumer."""
    return f"kinesis-spark discard-pending {stream} -c {consumer} -t {table} --dry-run"


def check_pending_plan(plan: BatchPlan, head: Any, store: Any, settings: IncrementalSettings) -> None:
    """Check a pending plan read from the checkpoint table against what this task would plan.

    The table is state anyone with write access to it can change, and a DAG's settings change, so
    a stored plan is re-used only when it is this task's (:func:`pending_plan_differences`): the
    pending batch id, mode ``incremental``, the stream, the consumer, the checkpoint table, the
    output location (derived from the task's output root and the batch id, never taken from the
    plan), the output spec (format, partitioning, file sizes), the consumer type, the transform,
    the caps per shard, a first batch's initial position, and start positions that follow from
    the committed checkpoints (each range starts after the shard's committed checkpoint, or, for
    a shard without one or with a recorded trim gap, at a sentinel).

    :param head: the store's head item the plan was read through.
    :raises PendingPlanMismatchError: naming each difference, the task's argument that sets it,
        and the fix: put the argument back (the pending batch then finishes as planned), or drop
        the pending batch (``kinesis-spark discard-pending`` with this consumer's stream, consumer
        and table, or ``KinesisDiscardPendingBatchOperator``; the committed checkpoints stay);
        nothing read or written. Fields: ``batch_id``, ``differences`` (the lines), ``arguments``
        (the task's arguments that set them), ``discard_command``.
    """
    found = _differences(plan, head, store, settings)
    if not found:
        return
    _raise_mismatch(found, head, store, settings)


def _raise_mismatch(found: list[tuple[str, str]], head: Any, store: Any, settings: IncrementalSettings) -> None:
    """Raise :class:`PendingPlanMismatchError` for ``found`` (see :func:`check_pending_plan`)."""
    arguments = sorted({a.strip() for k, _ in found if k in _SET_BY for a in _SET_BY[k].split(",")})
    foreign = any(k not in _SET_BY for k, _ in found)
    stream = stream_name_of(settings.stream_name)
    command = discard_pending_command(settings.stream_name, settings.consumer_name, store.table_name)
    what = (
        f"The pending plan of batch {head.pending_batch_id} of stream {stream!r}, consumer {settings.consumer_name!r} in "
        f"checkpoint table {store.table_name!r} is not what this task would plan: {'; '.join(line for _, line in found)}. "
        "Nothing was read or written."
    )  # fmt: skip
    drop = (
        "drop the pending batch; the committed checkpoints stay and the next run plans the batch anew from them: run "
        f"`{command}` to see it, then again with --yes instead of --dry-run (add --output-path with the output root "
        "the plan was made with to delete what the batch wrote there), or run KinesisDiscardPendingBatchOperator"
    )
    if foreign:
        fix = (
            " No argument of this task sets some of these: someone else wrote the checkpoint table. Check who can write "
            f"it (docs/security.md), then {drop}."
        )
    else:
        named = ", ".join(arguments)
        fix = (
            f" To keep the new {named}, {drop}. To finish the pending batch as planned instead, put {named} back. If "
            f"nobody changed {named}, someone else wrote the checkpoint table: check who can write it (docs/security.md)."
        )
    raise PendingPlanMismatchError(
        what + fix, batch_id=head.pending_batch_id, differences=[line for _, line in found], arguments=arguments,
        discard_command=command,
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
    store: Any, job: BatchJob, plan: BatchPlan, owner: str, lease_seconds: float, *, records_expected: bool, reused: bool,
    sink: Sink | None = None,
) -> dict[str, Any]:
    """Run the job of the pending ``plan`` under its lease, then record its report and commit."""
    with store.hold_lease(plan.batch_id, owner, lease_seconds, on_lost=lambda err: job.kill()):
        reports = job.run(plan, records_expected=records_expected)
    checkpoints = validate_report(plan, reports)  # before anything is recorded: a bad report commits nothing
    store.record_report(plan.batch_id, owner, reports)
    return _commit(store, plan, reports, checkpoints, owner, reused=reused, sink=sink)


def _commit(
    store: Any, plan: BatchPlan, reports: list[ShardReport], checkpoints: Mapping[str, Checkpoint], owner: str, *, reused: bool,
    sink: Sink | None = None,
) -> dict[str, Any]:
    """Make the batch visible in the sink's table (idempotent per batch id), then advance every
    checkpoint of ``plan`` (one conditional write), then the sink's after-commit step; summarise.

    A crash between the table commit and the checkpoint commit rolls forward: the next attempt
    finds the recorded report, and the table commit finds the batch in the table and adds nothing.
    """
    table = None
    check_dead_letters(plan, reports)
    if sink is not None and sum(r.records for r in reports):
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
        f"(max_dead_letter_fraction={limit}): that many is a wrong record_format or schema, not bad records. Nothing was "
        f"committed{'; the batch stays pending' if plan.mode == 'incremental' else ''}. The dead letters, with each "
        f"record's error, are under {plan.output_location}/_quarantine: read a few, fix record_format / record_schema / "
        "schema_registry (then discard the pending batch: its plan holds the old settings), or raise "
        "max_dead_letter_fraction if these records really are bad.",
        batch_id=plan.batch_id, records=records, dead_letters=dead, limit=limit,
    )  # fmt: skip


def _commit_without_records(
    kinesis: Any, store: Any, plan: BatchPlan, probes: list[ShardReport], owner: str, settings: IncrementalSettings
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


def incremental_summary(
    plan: BatchPlan, reports: Sequence[ShardReport], checkpoints: Mapping[str, Checkpoint], status: str, *, reused: bool,
    sink: Sink | None = None, table: Any = None,
) -> dict[str, Any]:
    """The run's summary (the operator's XCom), JSON-safe.

    :param status: ``committed``, ``committed_without_records`` or ``no_new_records``.
    :returns: ``batch_id``, ``status``, ``stream_name``, ``consumer_name``, ``records``, ``bytes``,
        ``output_path``, ``quarantined``, ``quarantine_path``, ``out_of_range``, ``cutoff``,
        ``reused_plan``, ``shards`` (per shard: ``records``, ``bytes``, ``first``, ``last``,
        ``checkpoint``, ``stop_reason``, ``shard_end``, ``quarantined``, ``out_of_range``),
        ``waiting_shards``, ``lost_shards``, ``trim_gaps``, ``output_format``, ``table`` (the
        sink's ``TableCommit`` as a dict: ``format``, ``table``, ``snapshot_id``, ``version``,
        ``files``, ``already_committed``; ``None`` when nothing was committed to a table).
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
            "dead_letters": r.dead_letters,
            "out_of_range": r.out_of_range,
        }
        for r in reports
    }
    records = sum(r.records for r in reports) if committed else 0
    quarantined = sum(r.quarantined for r in reports) if committed else 0
    dead_letters = sum(r.dead_letters for r in reports) if committed else 0
    return {
        "batch_id": plan.batch_id if status != "no_new_records" else None,
        "status": status,
        "stream_name": plan.stream_name,
        "consumer_name": plan.consumer_name,
        "records": records,
        "bytes": sum(r.bytes for r in reports) if committed else 0,
        "output_path": plan.output_location if records else None,
        "quarantined": quarantined,
        "dead_letters": dead_letters,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined or dead_letters else None,
        "out_of_range": sum(r.out_of_range for r in reports) if committed else 0,
        "cutoff": format_timestamp(plan.cutoff),
        "reused_plan": reused,
        "shards": shards,
        "waiting_shards": dict(plan.waiting),
        "lost_shards": list(plan.lost_shards),
        "trim_gaps": dict(plan.trim_gaps),
        "output_format": sink.format if sink is not None else "parquet",
        "table": table.to_dict() if table is not None else None,
    }


# -- what the task log says of a batch or a window --------------------------------------------


def _counts(counts: Mapping[str, int]) -> str:
    """``shardId-…1: 2, shardId-…2: 1`` (shards with a count above 0; at most five, then how many more)."""
    items = [f"{shard}: {n}" for shard, n in counts.items() if n]
    more = len(items) - 5
    return ", ".join(items[:5]) + (f" and {more} more shards" if more > 0 else "")


def _read_seconds(reports: Sequence[ShardReport]) -> float | None:
    """Seconds from the first range's read start to the last one's end, or ``None`` if the reports do not say."""
    spans = [(r.read_started, r.read_ended) for r in reports if r.read_started is not None and r.read_ended is not None]
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)  # type: ignore[type-var,operator]


def log_outcome(plan: BatchPlan, reports: Sequence[ShardReport], summary: Mapping[str, Any], *, committed_by: str | None = None) -> None:
    """The task log's account of a committed batch or a written window, from its summary
    (:func:`incremental_summary`, :func:`run_window`'s) and the job's reports:

    * one INFO line per shard range: shard (and time slice), start position, the last extended
      sequence number read and the stop rule that ended the read, records, bytes, seconds;
    * one INFO line for the batch: batch id (or window), shards, records, bytes, seconds reading
      and since planning, checkpoints committed, output;
    * a WARNING with the count per shard when records were quarantined (corrupt KPL aggregates),
      did not decode (``dead_letters``) or were read outside their shard's hash key range
      (``out_of_range``).

    :param committed_by: the writer that committed the batch earlier (a repeated commit).
    """
    window = summary.get("mode") == "window"
    label = (f"Window [{summary['window_start']}, {summary['window_end']})" if window else f"Batch {plan.batch_id}")
    starts = {(r.shard_id, r.slice_index): r.start for r in plan.ranges}
    for r in reports:
        slice_label = f" slice {r.slice_index}" if window else ""
        seconds = f", {r.read_ended - r.read_started:.2f} s" if r.read_started is not None and r.read_ended is not None else ""
        log.info("%s, shard %s%s: %s -> %s (%s), %d records, %d bytes%s", label, r.shard_id, slice_label,
                 starts.get((r.shard_id, r.slice_index), "?"), r.last or "nothing read", r.stop_reason, r.records, r.bytes,
                 seconds)  # fmt: skip
    read = _read_seconds(reports)
    timing = f"read in {read:.1f} s" if read is not None else "read time not reported"
    shards = len({r.shard_id for r in reports})
    if window:
        log.info("%s written: %d records, %d bytes from %d shards x %d time slices, %s; output %s", label,
                 summary["records"], summary["bytes"], shards, summary["time_slices"], timing, summary["output_path"])  # fmt: skip
    else:
        since = time.time() - plan.created_at.timestamp()
        checkpoints = sum(1 for s in summary["shards"].values() if s.get("checkpoint"))
        how = f"was committed already (by {committed_by})" if committed_by else "committed"
        log.info("%s %s: %d records, %d bytes from %d shards, %s, %.1f s since planned; %d checkpoints committed; output %s",
                 label, how, summary["records"], summary["bytes"], shards, timing, since, checkpoints,
                 summary["output_path"])  # fmt: skip
    quarantined: dict[str, int] = {}
    out_of_range: dict[str, int] = {}
    for r in reports:
        quarantined[r.shard_id] = quarantined.get(r.shard_id, 0) + r.quarantined
        out_of_range[r.shard_id] = out_of_range.get(r.shard_id, 0) + r.out_of_range
    if summary["quarantined"]:
        log.warning("%s: %d corrupt Kinesis records quarantined (%s), kept raw under %s and not in the output%s",
                    label, summary["quarantined"], _counts(quarantined), summary["quarantine_path"],
                    "" if window else "; the checkpoints moved past them")  # fmt: skip
    if summary.get("dead_letters"):
        dead: dict[str, int] = {}
        for r in reports:
            dead[r.shard_id] = dead.get(r.shard_id, 0) + r.dead_letters
        log.warning("%s: %d records did not decode (%s): dead letters kept raw with their error under %s, not in the "
                    "output's rows%s", label, summary["dead_letters"], _counts(dead), summary["quarantine_path"],
                    "" if window else "; the checkpoints moved past them because they are kept")  # fmt: skip
    if summary["out_of_range"]:
        log.warning("%s: %d user records outside their shard's hash key range (%s), kept in the output; a producer "
                    "aggregates user records of several shards into one Kinesis record",
                    label, summary["out_of_range"], _counts(out_of_range))  # fmt: skip


# -- window ------------------------------------------------------------------------------------


def run_window(
    kinesis: Any, job: BatchJob | HandedBatchJob, settings: WindowSettings, *, now: datetime | None = None,
    store: Any = None, owner: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Read the window ``[start, end)`` of a stream by arrival time (backfill); checkpoints untouched.

    Every shard that may have been open during the window is planned (closed ones included),
    cut into time slices; the (shard, slice) ranges are probed up to the first one with a user
    record, and the job runs only when a probe found a record (it then reads every range). The
    same window gives the same rows: its output location is derived from the window and
    overwritten on re-run.

    With a ``store`` and a :class:`HandedBatchJob`, the plan goes to the job through the store
    (``store.write_window`` under ``owner``) and its report comes back the same way, so the
    driver may run anywhere; otherwise the job gets the plan directly (:class:`BatchJob`).

    :param kinesis: boto3 Kinesis client.
    :param store: a checkpoint store of the window's (stream, consumer): only its window items are used.
    :param owner: this run's writer id (with ``store``).
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
    if found and store is not None and hands_off(job):
        reports = _run_handed_window(store, job, plan, owner or "window", any(r.records for r in probes),  # type: ignore[arg-type]
                                     settings.output_root)
    elif found:
        reports = job.run(plan, records_expected=any(r.records for r in probes))  # type: ignore[union-attr]
    else:
        log.info("No records in the window: no Spark job, no files")
        reports = probes
    validate_window_report(plan, reports)
    check_dead_letters(plan, reports)
    records = sum(r.records for r in reports)
    table = settings.sink.commit_window(plan, reports) if settings.sink is not None and records else None
    quarantined = sum(r.quarantined for r in reports)
    dead_letters = sum(r.dead_letters for r in reports)
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
        "dead_letters": dead_letters,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined or dead_letters else None,
        "out_of_range": sum(r.out_of_range for r in reports),
        "time_slices": int(slices),
        "shards": window_summary(reports),
        "trim_gap": gap,
        "output_format": settings.sink.format if settings.sink is not None else "parquet",
        "table": table.to_dict() if table is not None else None,
    }
    if found:
        log_outcome(plan, reports, result)
    return result


def check_window_position(plan: BatchPlan, settings: WindowSettings, store: Any) -> None:
    """A window into its consumer's own output (a root or table that holds the consumer's
    incremental batches, or a consumer with committed batches in ``store``) may cover only what
    the consumer has committed: every shard the window reads must be checkpointed at
    ``SHARD_END`` or known read up to the window's end (``core.lag.known_until``). Otherwise a
    later incremental batch would add the window's newer rows a second time.

    Windows into an output no incremental batch of the consumer writes are not limited.

    :raises WindowAheadError: naming the shards, how far each is committed, the latest end the
        window may have, and the ways out; nothing read or written.
    """
    assert settings.sink is not None
    head = store.head() if store is not None else None
    # The store answers at the cost of one read; the output only when the store has committed nothing.
    incremental = (head is not None and head.committed_batch_id > 0) or (
        settings.sink.latest_batch(settings.stream_name, settings.consumer_name, 0) is not None)  # fmt: skip
    if not incremental:
        return
    where = settings.sink.table or settings.sink.output_path or settings.output_root
    end = plan.cutoff
    if store is None:
        raise WindowAheadError(
            f"Output {where} holds incremental batches of stream {stream_name_of(settings.stream_name)!r}, consumer "
            f"{settings.consumer_name!r}, and this window task names no checkpoint_table to check the window against the "
            "consumer's committed position. Nothing was read or written. Give it the consumer's checkpoint_table, or write "
            "the window to another output_path or table.",
            window_end=format_timestamp(end), committed_until=None, shards={},
        )  # fmt: skip
    committed = store.committed_checkpoints(head)
    behind: dict[str, str] = {}
    until: list[datetime] = []
    for shard_id in sorted({r.shard_id for r in plan.ranges}):
        checkpoint = committed.get(shard_id)
        if checkpoint is not None and checkpoint.is_shard_end:
            continue
        known = known_until(checkpoint) if checkpoint is not None else None
        if known is not None and known >= end:
            continue
        behind[shard_id] = f"committed up to {format_timestamp(known)}" if known else (
            "never read by the consumer" if checkpoint is None else f"at {checkpoint}, time unknown")  # fmt: skip
        if known is not None:
            until.append(known)
    if not behind:
        return
    latest = min(until) if len(until) == len(behind) else None
    shards = "; ".join(f"{k}: {v}" for k, v in list(behind.items())[:5]) + (f"; and {len(behind) - 5} more" if len(behind) > 5 else "")
    bound = f"End the window at {format_timestamp(latest)} or earlier" if latest else "Run the window after the consumer's next batches"
    raise WindowAheadError(
        f"Window [{format_timestamp(plan.window_start)}, {format_timestamp(end)}) into output {where} reaches past what "
        f"consumer {settings.consumer_name!r} has committed ({shards}): the consumer's next incremental batches would add "
        f"those rows again. Nothing was read or written. {bound}, or write the window to another output_path or table "
        "(docs/backfill.md, windows and incremental batches).",
        window_end=format_timestamp(end), committed_until=format_timestamp(latest) if latest else None, shards=behind,
    )  # fmt: skip


def _run_handed_window(
    store: Any, job: HandedBatchJob, plan: BatchPlan, owner: str, records_expected: bool, output_root: str
) -> list[ShardReport]:
    """Hand a window's plan to its job through the store and read its report back from there."""
    label = window_label(plan.window_start, plan.cutoff)  # type: ignore[arg-type]
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
