"""The batch job's contract: its arguments and the checkpoint store, nothing else.

A planned batch is handed to its job through the checkpoint store, never through a file:

1. The run that planned the batch (the operator, or a split task group's plan task) persisted
   the plan (``begin``) under its writer id, the *lease owner*, and passes the job
   :class:`JobArguments`: checkpoint table, stream, consumer, batch id, lease owner, lease.
2. The job (:func:`run_handed_batch`, in the Spark driver, wherever it runs) claims the batch under
   its own writer id (:func:`writer_id`: ``{lease_owner}/driver-{random}``), reads the plan from
   the store, holds the lease while it runs, writes its output to a staging directory
   (:func:`staging_location`), and then, only if it still holds the lease, moves the output to
   the plan's location and records its per-shard report, fenced on its writer id. A driver that
   lost its lease (it stalled and a retry took the batch over: a *zombie*) cancels its Spark jobs
   and publishes nothing.
3. The commit (:func:`airflow_kinesis_spark.core.protocol.commit_handed`) claims the batch back,
   validates the recorded report against the plan and advances every checkpoint.

AWS credentials are the job's own (boto3's default chain: the cluster's instance profile, IRSA, an
EMR execution role, or the environment the runner set); they are never job arguments.

No Airflow import, no Spark import: the Spark parts are the callables the job passes in.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.names import validate_consumer_name, validate_stream_name, validate_table_name
from airflow_kinesis_spark.core.planner import BatchPlan, validate_report
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.exceptions import CheckpointConflictError


if TYPE_CHECKING:
    from airflow_kinesis_spark.core.head import Head

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # type checking only: the store imports this module's neighbours
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

__all__ = [
    "JobArguments",
    "writer_id",
    "staging_location",
    "run_handed_batch",
    "run_handed_window",
    "handed_batch_state",
    "job_arguments_from",
    "check_bound_plan",
    "check_planned_transform",
    "bound_output_location",
    "STAGING_DIR",
]

#: Where a job writes before it publishes: ``{output_root}/_staging/`` (a ``_`` folder: Spark's
#: and most engines' Parquet readers skip it).
STAGING_DIR = "_staging"


@dataclass(frozen=True)
class JobArguments:
    """What a batch's job is told (as command-line arguments, :meth:`to_args`).

    :param checkpoint_table: the DynamoDB checkpoint table.
    :param stream_name: the stream.
    :param consumer_name: the consumer.
    :param batch_id: the pending batch to run.
    :param lease_owner: the writer id the batch was handed over by (see module doc).
    :param lease_seconds: the batch's lease (seconds); the job renews it every quarter of it.
    :param records_expected: the planning run's probes saw a user record (the job may read and
        write in one pass).
    :param region_name: the store's region (``None``: the job's environment, ``AWS_DEFAULT_REGION``
        or the cluster's).
    :param window: a window run's label (``core.window.window_label``; ``batch_id`` 0): the plan
        and the report are the window's items in the store (``write_window``), not a batch's.
    :param plan_digest: :meth:`BatchPlan.digest` of the plan the worker checked; the job refuses
        a stored plan with another digest (:func:`check_bound_plan`).
    :param output_root: the task's output root: the job derives the batch's output location
        from it and the plan, and refuses a stored plan that names another.
    """

    checkpoint_table: str
    stream_name: str
    consumer_name: str
    batch_id: int
    lease_owner: str
    lease_seconds: float
    records_expected: bool = False
    region_name: str | None = None
    window: str | None = None
    plan_digest: str | None = None
    output_root: str | None = None

    def __post_init__(self) -> None:
        validate_table_name(self.checkpoint_table)
        validate_stream_name(self.stream_name)
        validate_consumer_name(self.consumer_name)
        if isinstance(self.batch_id, bool) or not isinstance(self.batch_id, int) or self.batch_id < (0 if self.window else 1):
            raise ValueError(f"batch_id must be a positive integer (0 for a window); got {self.batch_id!r}")
        if self.window is not None and (not self.window or "#" in self.window):
            raise ValueError(f"window must be a window label without '#' (core.window.window_label); got {self.window!r}")
        if not self.lease_owner or "#" in self.lease_owner:
            raise ValueError(f"lease_owner must be a non-empty writer id without '#'; got {self.lease_owner!r}")
        if not self.lease_seconds or not math.isfinite(self.lease_seconds) or self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be a finite number > 0 of seconds; got {self.lease_seconds!r}")

    def to_args(self) -> list[str]:
        """The job's command-line arguments (parsed back by :meth:`add_arguments` /
        :meth:`from_namespace`). No credential is ever among them."""
        lease = repr(float(self.lease_seconds)).removesuffix(".0")  # the shortest text that parses back to it exactly
        args = [
            "--checkpoint-table", self.checkpoint_table, "--stream", self.stream_name, "--consumer", self.consumer_name,
            "--batch-id", str(self.batch_id), "--lease-owner", self.lease_owner, "--lease-seconds", lease,
        ]  # fmt: skip
        if self.records_expected:
            args.append("--records-expected")
        if self.region_name:
            args += ["--region", self.region_name]
        if self.window:
            args += ["--window", self.window]
        if self.plan_digest:
            args += ["--plan-digest", self.plan_digest]
        if self.output_root:
            args += ["--output-root", self.output_root]
        return args

    @staticmethod
    def add_arguments(parser: Any) -> None:
        """Add the arguments :meth:`to_args` writes to ``parser`` (an ``argparse.ArgumentParser``
        or one of its argument groups)."""
        parser.add_argument("--checkpoint-table", required=True, help="the DynamoDB checkpoint table")
        parser.add_argument("--stream", required=True, help="the Kinesis stream")
        parser.add_argument("--consumer", required=True, help="the consumer (application) name")
        parser.add_argument("--batch-id", type=int, required=True, help="the pending batch to run")
        parser.add_argument("--lease-owner", required=True, help="the writer id that handed the batch over")
        parser.add_argument("--lease-seconds", type=float, default=DEFAULT_LEASE_SECONDS, help="the batch's lease (seconds)")
        parser.add_argument("--records-expected", nargs="?", const=True, default=False, type=_flag, metavar="true|false",
                            help="the planning run saw a user record: read and write in one pass (a bare flag, or a value "
                                 "for platforms that pass arguments as name/value pairs)")  # fmt: skip
        parser.add_argument("--region", default=None, help="the checkpoint table's AWS region (default: the environment's)")
        parser.add_argument("--window", default=None, help="a window run's label: its plan and report are the window's")
        parser.add_argument("--plan-digest", default=None, help="SHA-256 of the plan the worker checked (the job refuses another)")
        parser.add_argument("--output-root", default=None, help="the task's output root (the job derives the output location)")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> JobArguments:
        """The arguments from a namespace :meth:`add_arguments` parsed.

        :raises ValueError: an argument is invalid (naming it).
        """
        return cls(
            checkpoint_table=ns.checkpoint_table, stream_name=ns.stream, consumer_name=ns.consumer, batch_id=ns.batch_id,
            lease_owner=ns.lease_owner, lease_seconds=ns.lease_seconds, records_expected=ns.records_expected,
            region_name=ns.region, window=ns.window, plan_digest=getattr(ns, "plan_digest", None),
            output_root=getattr(ns, "output_root", None),
        )  # fmt: skip


def _flag(value: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``) as a bool, for ``--records-expected``."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def writer_id(lease_owner: str, role: str) -> str:
    """``{lease_owner}/{role}-{12 random hex digits}``: a writer acting for ``lease_owner``, unique
    per process (two attempts of one job never share one)."""
    return f"{lease_owner}/{role}-{uuid.uuid4().hex[:12]}"


def staging_location(output_location: str, writer: str) -> str:
    """Where ``writer`` writes the batch of ``output_location`` before publishing it:
    ``{parent}/_staging/{name}-{digest of writer}`` next to the output (same file system, so the
    publish is a rename)."""
    parent, _, name = output_location.rstrip("/").rpartition("/")
    digest = hashlib.sha256(writer.encode()).hexdigest()[:16]
    return f"{parent}/{STAGING_DIR}/{name}-{digest}"


def check_bound_plan(plan: BatchPlan, args: JobArguments, expected_location: str | None) -> None:
    """Refuse a stored plan that is not the one the worker checked (BOUND): its digest, stream,
    consumer and batch id must be the job arguments', and its output location the one derived
    from the task's output root (``expected_location``; ``None``: not derivable here, the digest
    covers it).

    :raises PlanBindingError: naming what differs; nothing is read or written.
    """
    from airflow_kinesis_spark.core.names import stream_name_of
    from airflow_kinesis_spark.exceptions import PlanBindingError

    problems = []
    if not args.plan_digest:
        problems.append("the job's arguments carry no plan digest (--plan-digest): they were not made by this "
                        "version's plan task or operator")  # fmt: skip
    elif plan.digest() != args.plan_digest:
        problems.append(f"the stored plan's digest is {plan.digest()[:16]}…, the worker checked {args.plan_digest[:16]}…")
    if stream_name_of(plan.stream_name) != stream_name_of(args.stream_name) or plan.consumer_name != args.consumer_name:
        problems.append(f"the stored plan is of stream {plan.stream_name!r}, consumer {plan.consumer_name!r}")
    if not args.window and plan.batch_id != args.batch_id:
        problems.append(f"the stored plan is of batch {plan.batch_id}")
    if expected_location is not None and plan.output_location != expected_location:
        problems.append(f"the stored plan writes to {plan.output_location!r}, not {expected_location!r} under the task's "
                        "output root")  # fmt: skip
    if problems:
        what = f"window {args.window}" if args.window else f"batch {args.batch_id}"
        raise PlanBindingError(
            f"The plan of {what} of stream {args.stream_name!r}, consumer {args.consumer_name!r} stored in checkpoint table "
            f"{args.checkpoint_table!r} is not the plan the worker checked: {'; '.join(problems)}. Nothing was read or "
            "written. Someone changed the checkpoint table after the check, or these job arguments belong to another run: "
            "check who can write the table (docs/security.md), then re-run the plan task (or the operator).",
            batch_id=args.batch_id, problems=problems,
        )  # fmt: skip


def check_planned_transform(plan: BatchPlan, transform: str | None) -> None:
    """Refuse to run ``plan`` with another transform than the one it was planned with (BOUND): the
    plan is the one the worker checked (:func:`check_bound_plan`), so its ``task_settings`` hold the
    DAG's transform; a job told another (arguments edited on the way, an XCom between the plan
    task and the job) reads and writes nothing. A plan without ``task_settings`` (planned before
    they were recorded) takes the job's.

    :raises ValueError: naming both transforms; nothing read or written.
    """
    if plan.task_settings is None:
        return
    planned = plan.task_settings.get("transform")
    if (transform or None) != (planned or None):
        raise ValueError(f"the job's transform {transform!r} is not the transform batch {plan.batch_id} was planned with "
                         f"({planned!r}): the job was started with other settings than the plan task's (its arguments "
                         "changed after the plan task). Nothing was read or written.")  # fmt: skip


def bound_output_location(plan: BatchPlan, args: JobArguments) -> str | None:
    """The output location the job derives for ``plan`` from the task's output root (the
    protocol's rule, ``core.locations.planned_output_location``); ``None`` without a root."""
    if not args.output_root:
        return None
    from airflow_kinesis_spark.core.locations import batch_output_location, plan_id, window_output_location

    if args.window:
        base = window_output_location(args.output_root, *plan.window)
        return plan.output_location if plan.output_location.startswith(base + "/run=") else base
    table = (plan.output or {}).get("format", "parquet") != "parquet"
    return batch_output_location(args.output_root, plan.batch_id, plan_id(plan) if table else None)


def run_handed_batch(
    store: DynamoDBCheckpointStore,
    args: JobArguments,
    *,
    write: Callable[[BatchPlan, str], dict[str, Any]],
    publish: Callable[[str | None, str], None] | None,
    discard: Callable[[str], None],
    cancel: Callable[[], None],
    writer: str | None = None,
) -> dict[str, Any]:
    """Run the job of pending batch ``args.batch_id`` as handed over in the store (the driver's side).

    :param store: the consumer's :class:`~airflow_kinesis_spark.core.store.DynamoDBCheckpointStore`.
    :param write: ``write(plan, location)`` reads the plan's ranges, writes the output under
        ``location`` and returns the job's result document (``records``, ``reports``: one per
        planned range, as :meth:`ShardReport.to_dict`, ...).
    :param publish: ``publish(staging, target)`` replaces ``target`` with ``staging`` (``None``:
        nothing was written; remove ``target``). ``publish=None``: the job cannot move files (a
        Spark Connect client has no file system API of the server's), so ``write`` writes the
        plan's output location itself and the fence comes after the write: a driver that lost its
        lease while writing is interrupted (``cancel``) and records nothing, but a write that
        ends after the loss is not undone (a retry of the batch writes the same rows there).
    :param discard: removes a staging directory that is not published (best effort).
    :param cancel: cancels the running Spark jobs; called from the lease thread when the lease is lost.
    :param writer: this process's writer id (default: :func:`writer_id` with role ``driver``).
    :returns: ``status`` (``reported``; or ``already_committed`` / ``already_reported``: an earlier
        attempt finished the work, nothing done), ``batch_id``, ``writer``, and the job's result.
    :raises CheckpointConflictError: the batch is not pending or was taken over (this process's
        arguments are stale, or it stalled past its lease): nothing published or recorded.
    :raises BatchLeaseHeldError: another driver of this batch holds a live lease.
    :raises ReportValidationError: the job's reports do not match the plan: nothing published.
    """
    writer = writer or writer_id(args.lease_owner, "driver")
    head = store.head()
    if head.pending_batch_id != args.batch_id:
        if head.committed_batch_id >= args.batch_id:
            log.info("batch %d is committed already (committed batch %d): nothing to do", args.batch_id, head.committed_batch_id)
            return {"status": "already_committed", "batch_id": args.batch_id, "writer": writer}
        raise CheckpointConflictError(
            f"batch {args.batch_id} of stream {args.stream_name!r}, consumer {args.consumer_name!r} is not pending in "
            f"checkpoint table {args.checkpoint_table!r} (committed batch {head.committed_batch_id}, pending batch "
            f"{head.pending_batch_id}): it was discarded, or these job arguments belong to another run. Nothing was "
            "read or written. Re-run the plan task (or the operator) to plan the next batch.",
            batch_id=args.batch_id, committed_batch_id=head.committed_batch_id, pending_batch_id=head.pending_batch_id,
        )  # fmt: skip
    if head.pending_report_owner:
        log.info("batch %d: its output was written and its report recorded by %s already: nothing to do",
                 args.batch_id, head.pending_report_owner)  # fmt: skip
        return {"status": "already_reported", "batch_id": args.batch_id, "writer": writer}
    # Conditional on no report: a driver that stalled after the check above must not run the batch
    # again over another driver's recorded report (its publish replaces that driver's output).
    head = store.claim(args.batch_id, args.lease_owner, writer, args.lease_seconds, before_report=True)
    plan = store.pending_plan(head)
    if plan is None:
        raise CheckpointConflictError(f"pending batch {args.batch_id} has no stored plan", batch_id=args.batch_id)
    try:
        check_bound_plan(plan, args, bound_output_location(plan, args))
    except Exception:
        store.release(args.batch_id, writer)
        raise
    log.info("batch %d claimed by %s: %d shard ranges, output %s", plan.batch_id, writer, len(plan.ranges), plan.output_location)
    with store.hold_lease(plan.batch_id, writer, args.lease_seconds, on_lost=lambda err: cancel()):
        result, reports = _write_and_publish(
            plan, writer, write, publish, discard,
            check=lambda reports: validate_report(plan, reports),  # a report that does not match its plan is never recorded
            fence=lambda: store.heartbeat(plan.batch_id, writer),  # a writer that lost the batch (a zombie) stops here
        )  # fmt: skip
        store.record_report(plan.batch_id, writer, reports)
    store.release(plan.batch_id, writer)  # the commit may claim the batch at once
    log.info("batch %d: %d records written to %s; report recorded by %s",
             plan.batch_id, result["records"], plan.output_location, writer)  # fmt: skip
    return {"status": "reported", "batch_id": plan.batch_id, "writer": writer, **result}


def _write_and_publish(
    plan: BatchPlan, writer: str, write: Callable[[BatchPlan, str], dict[str, Any]],
    publish: Callable[[str | None, str], None] | None, discard: Callable[[str], None], *,
    check: Callable[[list[ShardReport]], Any], fence: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], list[ShardReport]]:  # fmt: skip
    """Write ``plan`` to ``writer``'s staging location, ``check`` the reports, ``fence``, then
    publish to the plan's output location (nothing written: the location is removed); an
    unpublished staging directory is discarded. ``publish`` ``None``: write the plan's output
    location itself, then ``check`` and ``fence``. Returns the job's result and its reports."""
    in_place = publish is None  # nothing to publish, and nothing to discard: the output location is written
    location = plan.output_location if in_place else staging_location(plan.output_location, writer)
    published = in_place
    try:
        result = write(plan, location)
        reports = [ShardReport.from_dict(r) for r in result["reports"]]
        check(reports)
        fence()
        if publish is not None:
            publish(location if result.get("records") or result.get("quarantine_location") else None, plan.output_location)
            published = True
    finally:
        if not published:
            discard(location)
    return result, reports


def run_handed_window(
    store: DynamoDBCheckpointStore,
    args: JobArguments,
    *,
    write: Callable[[BatchPlan, str], dict[str, Any]],
    publish: Callable[[str | None, str], None] | None,
    discard: Callable[[str], None],
    writer: str | None = None,
) -> dict[str, Any]:
    """Run a window job whose plan the planning run stored (``store.write_window``; the driver's side).

    A window has no lease and moves no checkpoint: the job reads the plan stored under
    ``args.lease_owner``, writes to staging, checks its reports cover every (shard, slice) once,
    publishes, and stores its report under the same owner, where the planning run reads it. The
    same window gives the same rows, so a late driver of an earlier attempt publishes the same rows.

    :param write: / :param publish: / :param discard: as :func:`run_handed_batch`.
    :returns: ``status`` ``reported``, ``window``, ``writer`` and the job's result.
    :raises ReportNotRecordedError: no plan stored for the window under ``args.lease_owner``.
    :raises ReportValidationError: the reports do not cover the plan: nothing published.
    """
    from airflow_kinesis_spark.core.window import validate_window_report
    from airflow_kinesis_spark.exceptions import ReportNotRecordedError

    assert args.window, "not a window's arguments"
    writer = writer or writer_id(args.lease_owner, "driver")
    plan = store.window_plan(args.window, args.lease_owner)
    if plan is None:
        raise ReportNotRecordedError(
            f"no plan of window {args.window} stored by {args.lease_owner} in checkpoint table {args.checkpoint_table!r}: "
            "these job arguments belong to another run, or its items expired. Nothing was read or written."
        )
    check_bound_plan(plan, args, bound_output_location(plan, args))
    result, reports = _write_and_publish(plan, writer, write, publish, discard, check=lambda r: validate_window_report(plan, r))
    store.write_window(args.window, "REPORT", args.lease_owner, [r.to_dict() for r in reports])
    log.info("window %s: %d records written to %s; report stored", args.window, result["records"], plan.output_location)
    return {"status": "reported", "window": args.window, "writer": writer, **result}


def job_arguments_from(argv: Sequence[str]) -> JobArguments:
    """Parse :meth:`JobArguments.to_args` output (ignoring other arguments)."""
    parser = argparse.ArgumentParser(add_help=False)
    JobArguments.add_arguments(parser)
    ns, _ = parser.parse_known_args(list(argv))
    return JobArguments.from_namespace(ns)


def handed_batch_state(
    head: Head, batch_id: int, lease_owner: str, lease_seconds: float, *, now_ms: int, handed_at_ms: int,
    job_start_timeout: float,
) -> dict[str, Any] | None:  # fmt: skip
    """Where a handed batch stands, from the store's head item (what a deferred task waits on).

    :param head: the head (:class:`~airflow_kinesis_spark.core.head.Head`).
    :param handed_at_ms: when the batch was handed to its job (epoch milliseconds).
    :param job_start_timeout: seconds a job has to claim the batch after it was handed over
        (a cluster may queue it) before the wait gives up.
    :returns: ``None`` while the job may still record its report; else ``{"status": ...,
        "message": ...}`` with status ``reported`` (commit now), ``committed`` (by an earlier
        attempt), ``not_pending`` (discarded, or another run moved on), ``taken_over`` (another
        run holds the batch), or ``no_report`` (the job's lease expired, or it never claimed the
        batch within ``job_start_timeout``, without a report).
    """
    if head.pending_batch_id != batch_id:
        if head.committed_batch_id == batch_id:
            return {"status": "committed", "message": f"batch {batch_id} is committed already"}
        return {"status": "not_pending", "message": f"batch {batch_id} is not pending (committed batch "
                f"{head.committed_batch_id}, pending batch {head.pending_batch_id})"}  # fmt: skip
    if head.pending_report_owner:
        return {"status": "reported", "message": f"batch {batch_id}: report recorded by {head.pending_report_owner}"}
    holder = head.pending_owner or ""
    if holder != lease_owner and not holder.startswith(lease_owner + "/"):
        return {"status": "taken_over", "message": f"batch {batch_id} was taken over by {holder}"}
    if holder == lease_owner:  # handed over, not claimed by a driver yet
        waited = (now_ms - handed_at_ms) / 1000
        if waited > job_start_timeout:
            return {"status": "no_report", "message": f"batch {batch_id}: no job claimed it within {job_start_timeout:g} s "
                    "of the hand-over (the job did not start, or failed before it claimed the batch)"}  # fmt: skip
        return None
    if not head.pending_heartbeat:  # 0 (or none): the lease was released (``release``, ``release_handed``), no age to give
        return {"status": "no_report", "message": f"batch {batch_id}: the job's driver {holder} released its lease "
                "without recording a report (it failed, or its run gave the job up)"}  # fmt: skip
    age = (now_ms - head.pending_heartbeat) / 1000
    if age > lease_seconds:
        return {"status": "no_report", "message": f"batch {batch_id}: the job's driver {holder} stopped renewing its lease "
                f"{age:.0f} s ago without recording a report (it failed or was killed)"}  # fmt: skip
    return None
