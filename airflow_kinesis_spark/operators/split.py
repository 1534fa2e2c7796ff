"""Split tasks: plan, the user's own Spark job task, commit; for Spark that runs anywhere.

:func:`kinesis_batch_task_group` builds the three as a task group::

    plan  >>  job (any operator that runs a PySpark script with arguments)  >>  commit

* :class:`KinesisPlanBatchOperator` plans the batch (or re-uses the pending one), persists it in
  the checkpoint store and pushes the job's arguments (XCom key ``job_arguments``: a list of
  strings, ``core.job.JobArguments`` plus the reader options, the transform from the DAG file and
  the provider's ``transform_allowed_modules``). Nothing to
  read: the job task is skipped and the commit task returns the plan task's summary.
* The job task runs ``kinesis_batch.py`` (``kinesis-spark package`` writes it and the package
  zip to upload) with those arguments: ``SparkSubmitOperator``, ``EmrServerlessStartJobOperator``,
  ``EmrAddStepsOperator``, ``GlueJobOperator``, ``DatabricksSubmitRunOperator``,
  ``SparkKubernetesOperator``, ... The driver claims the batch, holds its lease, publishes its
  output and records its report in the store (``core.job``), with the cluster's own AWS
  credentials.
* :class:`KinesisCommitBatchOperator` validates the recorded report against the plan and commits;
  with ``deferrable=True`` it waits in the triggerer until the report is recorded (not at all when
  it is recorded already).

Retries converge: a retried plan task re-uses the pending plan; a retried job claims the batch
again (a live driver of it makes the retry fail and retry later; a zombie publishes nothing); a
retried commit is idempotent; a commit with no report yet fails clearly and retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseOperator, BaseXCom, Context, TaskGroup
from airflow.sdk.bases.skipmixin import SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.protocol import prepare_incremental
from airflow_kinesis_spark.core.records import RecordSettings
from airflow_kinesis_spark.failures import task_errors
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator
from airflow_kinesis_spark.lineage import asset_for_output, emit_asset_events, output_uri
from airflow_kinesis_spark.operators.base import KinesisIncrementalBaseOperator, refuse_arguments
from airflow_kinesis_spark.operators.handoff import commit_event, commit_or_raise, handed_event
from airflow_kinesis_spark.operators.output import OutputSettingsMixin
from airflow_kinesis_spark.operators.settings import OutputSettings, refuse_moved_arguments
from airflow_kinesis_spark.settings import deferral_requested, transform_allowed_modules
from airflow_kinesis_spark.triggers.kinesis import KinesisBatchReportTrigger

__all__ = ["KinesisPlanBatchOperator", "KinesisCommitBatchOperator", "kinesis_batch_task_group", "JOB_ARGUMENTS_KEY", "DEFAULT_ARG"]

#: XCom key of the plan task's job arguments (a list of strings).
JOB_ARGUMENTS_KEY = "job_arguments"
#: Arguments of ``KinesisToSparkOperator`` that belong to the job task (and, for the wait, the
#: commit task), not the plan task: refused by it, saying why.
JOB_TASK_ONLY = ("spark_settings", "deferrable", "poke_interval", "job_start_timeout")


class KinesisPlanBatchOperator(KinesisIncrementalBaseOperator, SkipMixin):
    """The plan task of a split task group: plan and persist one incremental batch, hand it over.

    Re-uses a pending batch (never replaces it), or plans, probes and persists a new one, exactly
    as :class:`KinesisToSparkOperator` does before its Spark job; then hands the batch to the job
    task through the checkpoint store (``core.job``).

    :param job_task_ids: the job tasks to skip when there is nothing to read (default: every
        direct downstream task that is not a :class:`KinesisCommitBatchOperator`).
    :param output_asset: default ``False`` here: the commit task makes the batch visible.
    :param kwargs: the planning and reading arguments of
        :class:`~airflow_kinesis_spark.operators.base.KinesisIncrementalBaseOperator` (stream,
        consumer, checkpoint table, output path, ``output_settings``, ``record_settings``, cutoff, initial
        position, caps, ``allow_data_loss``, ``lease_seconds``; ``transform`` and ``read_options`` go
        into the job's arguments). ``KinesisToSparkOperator``'s ``spark_settings`` and deferral arguments
        (:data:`JOB_TASK_ONLY`) belong to the job and commit tasks and are refused.
    :returns: (XCom) ``status`` (``pending``: a job must run; else the summary's status:
        ``no_new_records``, ``committed_without_records``, ``committed``), ``batch_id``,
        ``lease_owner``, ``lease_seconds``, ``output_location``, ``reused_plan``,
        ``job_arguments`` (also under XCom key :data:`JOB_ARGUMENTS_KEY`; ``[]`` without a job)
        and ``summary`` (the batch summary when no job is needed, else ``None``).
    :raises TypeError: a Spark argument was given.
    :raises AirflowFailException: as :class:`KinesisToSparkOperator` (conflict, data loss, a
        pending plan that is not this task's, a corrupt item of the checkpoint table).
    """

    ui_color = "#fbd7a8"

    def __init__(self, *, job_task_ids: Sequence[str] | None = None, output_asset: bool = False, **kwargs: Any) -> None:
        refuse_arguments(type(self).__name__, kwargs, JOB_TASK_ONLY,
                         "Spark runs in the job task (the operator that runs kinesis_batch.py), and the commit task "
                         "waits for it (deferrable, poke_interval, job_start_timeout)")  # fmt: skip
        super().__init__(output_asset=output_asset, **kwargs)
        self.job_task_ids = list(job_task_ids) if job_task_ids is not None else None

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate()
        store = self._store()
        owner = self._owner(context)
        with task_errors():
            prepared = prepare_incremental(self.kinesis_hook.conn, store, self._settings(context), owner)
        ti = context.get("ti")
        if prepared.summary is not None:
            summary = prepared.summary
            self.log.info("Batch %s: %s; no job to run", summary["batch_id"], summary["status"])
            handover = {"status": summary["status"], "batch_id": summary["batch_id"], "lease_owner": owner,
                        "lease_seconds": self.lease_seconds, "output_location": summary["output_path"],
                        "reused_plan": summary["reused_plan"], JOB_ARGUMENTS_KEY: [], "summary": summary}  # fmt: skip
            if ti is not None:
                ti.xcom_push(key=JOB_ARGUMENTS_KEY, value=[])
                # Skipping ends execute() with DownstreamTasksSkipped, after which Airflow pushes no
                # return value: the commit task's hand-over is pushed here, before the skip.
                ti.xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=handover)
                self._skip_job_tasks(context)
            return handover
        plan = prepared.plan
        assert plan is not None
        arguments = [*prepared.job_arguments(store, owner, self.lease_seconds).to_args(), *self.read_options.job_args(False)]
        if self.transform:
            arguments += ["--transform", self.transform]
            if allowed := transform_allowed_modules():  # the job checks the module defining the function too
                arguments += ["--transform-allowed-modules", ",".join(allowed)]
        self.log.info("Batch %d handed over to the job task (lease owner %s): %s", plan.batch_id, owner, " ".join(arguments))
        if ti is not None:
            ti.xcom_push(key=JOB_ARGUMENTS_KEY, value=arguments)
        return {"status": "pending", "batch_id": plan.batch_id, "lease_owner": owner, "lease_seconds": self.lease_seconds,
                "output_location": plan.output_location, "reused_plan": prepared.reused, JOB_ARGUMENTS_KEY: arguments,
                "plan_digest": plan.digest(), "summary": None}  # fmt: skip

    def _skip_job_tasks(self, context: Context) -> None:
        task = context.get("task") or self
        downstream = task.get_direct_relatives(upstream=False)
        if self.job_task_ids is not None:
            skip = [t for t in downstream if t.task_id in self.job_task_ids]
        else:
            skip = [t for t in downstream if not isinstance(t, KinesisCommitBatchOperator)]
        if skip:
            self.log.info("Nothing for a job to read: skipping %s", [t.task_id for t in skip])
            self.skip(ti=context["ti"], tasks=skip)


class KinesisCommitBatchOperator(OutputSettingsMixin, KinesisAwsBaseOperator):
    """The commit task of a split task group: commit the batch its plan task handed over.

    Reads the plan task's XCom; when a job ran, claims the batch back, validates the report the
    job recorded in the store against the stored plan, and advances every checkpoint in one
    conditional write (``core.protocol.commit_handed``). Idempotent. Without a recorded report
    it fails (retryable) with what it found, or, with ``deferrable=True``, waits in the triggerer
    (:class:`~airflow_kinesis_spark.triggers.kinesis.KinesisBatchReportTrigger`) until the report
    is recorded or the job's lease expired without one. A deferrable commit task reads the store
    first and defers only while the job may still record its report (a report recorded already
    is committed at once).

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer (templated).
    :param checkpoint_table: the checkpoint table (templated).
    :param plan_task_id: the plan task (its XCom return value).
    :param output_path: the output root (templated): the committed records of Parquet batches, the
        Delta table, the Iceberg table's files; the asset event. ``None``: no asset and, for
        Parquet, no committed record.
    :param output_settings: the output settings
        (:class:`~airflow_kinesis_spark.operators.settings.OutputSettings`), the plan task's: for
        the table commit this task makes before the checkpoint commit; templated as there.
    :param record_settings: the plan task's record settings
        (:class:`~airflow_kinesis_spark.core.records.RecordSettings`): a typed batch's table
        columns and dead-letter limit.
    :param output_asset: declare the output root as an Asset outlet (as :class:`KinesisToSparkOperator`).
    :param deferrable: wait in the triggerer while the job runs. ``None`` (default): Airflow's
        ``[operators] default_deferrable``, read when the task runs.
    :param poke_interval: seconds between two reads of the store while deferred.
    :param job_start_timeout: seconds the job has to claim the batch after the plan task handed
        it over (a queued cluster job) before a deferred wait gives up.
    :param aws_conn_id: and ``region_name``, ``verify``, ``botocore_config``: the AWS arguments
        (templated but ``botocore_config``; :class:`~airflow_kinesis_spark.hooks.consumer.KinesisAwsBaseOperator`).
    :returns: (XCom) the batch summary, as :class:`KinesisToSparkOperator`'s.
    :raises ReportNotRecordedError: (retryable) no report recorded yet; the plan stays pending.
    :raises BatchLeaseHeldError: (retryable) the job's driver still holds the lease.
    :raises AirflowFailException: another run took the batch over or moved on, or the report does
        not match the plan.
    """

    template_fields: Sequence[str] = (
        "output_settings", "stream_name", "consumer_name", "checkpoint_table", "output_path", *AWS_TEMPLATE_FIELDS,
    )  # fmt: skip
    ui_color = "#f4a460"

    def __init__(
        self, *, stream_name: str, consumer_name: str, checkpoint_table: str, plan_task_id: str,
        output_path: str | None = None, output_asset: bool = True,
        deferrable: bool | None = None, poke_interval: float = 10.0,
        job_start_timeout: float = 600.0, output_settings: OutputSettings | None = None, record_settings: RecordSettings | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        refuse_moved_arguments(type(self).__name__, kwargs, ("output_settings", "record_settings"))
        super().__init__(**kwargs)
        self._init_output(output_settings, record_settings)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.plan_task_id = plan_task_id
        self.output_path = output_path
        self.deferrable = deferrable
        self.poke_interval = poke_interval
        self.job_start_timeout = job_start_timeout
        if output_asset and output_path and (uri := output_uri(output_path)) and not any(getattr(o, "uri", None) == uri for o in self.outlets):
            self.outlets = [*self.outlets, asset_for_output(output_path)]

    def _handoff(self, context: Context) -> dict[str, Any]:
        handoff = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not isinstance(handoff, dict) or "status" not in handoff:
            raise AirflowFailException(f"plan task {self.plan_task_id!r} left no hand-over in XCom (got {handoff!r}): "
                                       "run the plan task first")  # fmt: skip
        return handoff

    def _store(self) -> Any:
        return self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)

    def execute(self, context: Context) -> dict[str, Any]:
        handoff = self._handoff(context)
        if handoff["status"] != "pending":
            summary = handoff["summary"]
            self.log.info("Batch %s: %s at planning; nothing to commit", summary["batch_id"], summary["status"])
            return self._done(context, summary)
        store = self._store()
        batch_id, owner, lease = int(handoff["batch_id"]), handoff["lease_owner"], float(handoff["lease_seconds"])
        reused = bool(handoff.get("reused_plan"))
        if deferral_requested(self.deferrable):
            handed_at = time.time()
            # Read the head first: a job task that ran before this one has recorded its report
            # already (commit now, in this worker); defer only while the job may still record it.
            with task_errors():  # a malformed head: a retry reads the same
                event = handed_event(store, batch_id, owner, lease, handed_at=handed_at, job_start_timeout=self.job_start_timeout)
            if event is None:
                self.defer(
                    trigger=KinesisBatchReportTrigger(
                        stream_name=self.stream_name, consumer_name=self.consumer_name, checkpoint_table=self.checkpoint_table,
                        batch_id=batch_id, lease_owner=owner, lease_seconds=lease, handed_at=handed_at,
                        job_start_timeout=self.job_start_timeout, poke_interval=self.poke_interval,
                        **self.aws_trigger_kwargs,
                    ),
                    method_name="execute_complete",
                )  # fmt: skip
            self.log.info("Not deferring: %s", event["message"])
            return self._done(context, commit_event(store, event, lease, reused=reused, sink=self._sink(),
                                                    plan_digest=handoff.get("plan_digest")))  # fmt: skip
        summary = commit_or_raise(store, batch_id, owner, lease, reused=reused, sink=self._sink(), plan_digest=handoff.get("plan_digest"))
        return self._done(context, summary)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        handoff = self._handoff(context)
        summary = commit_event(self._store(), event, float(handoff["lease_seconds"]), reused=bool(handoff.get("reused_plan")),
                               sink=self._sink(), plan_digest=handoff.get("plan_digest"))  # fmt: skip
        return self._done(context, summary)

    def _sink(self) -> Any:
        """The output form (``None`` without an output path: plain Parquet, no committed record)."""
        if not self.output_path:
            if self.output_settings.format != "parquet":
                raise AirflowFailException(f"output format {self.output_settings.format!r} needs output_path on the commit task")
            return None
        self.validate_output()
        return self.sink

    def _done(self, context: Context, summary: dict[str, Any]) -> dict[str, Any]:
        if self.output_path:
            emit_asset_events(self.outlets, self.output_path, context, summary, self.log)
        return summary


class _DefaultArg:
    """The type of :data:`DEFAULT_ARG`."""

    def __repr__(self) -> str:
        return "DEFAULT_ARG"


#: An argument of :func:`kinesis_batch_task_group` that was not given: its tasks take it from the
#: DAG's ``default_args``, else from their own default (passing the default explicitly would
#: hide ``default_args``).
DEFAULT_ARG: Any = _DefaultArg()


def kinesis_batch_task_group(
    group_id: str,
    *,
    job: Callable[[Any], BaseOperator],
    stream_name: str,
    consumer_name: str,
    checkpoint_table: str,
    output_path: str,
    deferrable: bool | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    aws_conn_id: Any = DEFAULT_ARG,
    region_name: Any = DEFAULT_ARG,
    verify: Any = DEFAULT_ARG,
    botocore_config: Any = DEFAULT_ARG,
    commit_kwargs: dict[str, Any] | None = None,
    output_settings: OutputSettings | None = None,
    record_settings: RecordSettings | None = None,
    **plan_kwargs: Any,
) -> TaskGroup:
    """Plan, job and commit tasks of one incremental batch, as a task group ``group_id``.

    :param job: builds the job task from the job's arguments (an XComArg of the plan task's
        :data:`JOB_ARGUMENTS_KEY`, resolved to a list of strings at run time); called inside the
        group, so its ``task_id`` is prefixed with ``group_id``. Example::

            job=lambda arguments: SparkSubmitOperator(task_id="job", application=script,
                                                      py_files=core_zip, application_args=arguments)

    :param deferrable: the commit task waits in the triggerer while the job runs. ``None``
        (default): Airflow's ``[operators] default_deferrable``, read when the task runs.
    :param lease_seconds: the batch's lease, renewed by the job's driver; keep it below the job
        task's ``retry_delay`` so a retry finds an expired lease.
    :param aws_conn_id: and ``region_name``, ``verify``, ``botocore_config``: the AWS arguments of
        the plan and the commit task
        (:class:`~airflow_kinesis_spark.hooks.consumer.KinesisAwsBaseOperator`); not given
        (:data:`DEFAULT_ARG`): the DAG's ``default_args``, else the operators' defaults.
    :param commit_kwargs: extra arguments of :class:`KinesisCommitBatchOperator` (``poke_interval``,
        ``job_start_timeout``, ``retries``, ...).
    :param output_settings: the output settings
        (:class:`~airflow_kinesis_spark.operators.settings.OutputSettings`), given to the plan
        task (stored in the plan: what the job writes) and the commit task (the table commit) alike.
    :param record_settings: the record settings (:class:`~airflow_kinesis_spark.core.records.RecordSettings`),
        given to both tasks alike.
    :param plan_kwargs: arguments of :class:`KinesisPlanBatchOperator` (cutoff, initial position,
        caps, transform, reader options, ...).
    :returns: the task group (plan >> job >> commit; the commit runs when the job was skipped).
    """
    refuse_moved_arguments("kinesis_batch_task_group", plan_kwargs, ("output_settings", "record_settings", "read_options"))
    # Only the AWS arguments given here: the others come from the DAG's default_args, as for any operator.
    aws = {name: value for name, value in (("aws_conn_id", aws_conn_id), ("region_name", region_name), ("verify", verify),
                                           ("botocore_config", botocore_config)) if value is not DEFAULT_ARG}  # fmt: skip
    with TaskGroup(group_id) as group:
        plan = KinesisPlanBatchOperator(
            task_id="plan", stream_name=stream_name, consumer_name=consumer_name, checkpoint_table=checkpoint_table,
            output_path=output_path, lease_seconds=lease_seconds, output_settings=output_settings, record_settings=record_settings, **aws,
            **plan_kwargs,
        )  # fmt: skip
        job_task = job(plan.output[JOB_ARGUMENTS_KEY])
        plan.job_task_ids = [job_task.task_id]
        commit = KinesisCommitBatchOperator(
            task_id="commit", stream_name=stream_name, consumer_name=consumer_name, checkpoint_table=checkpoint_table,
            plan_task_id=plan.task_id, output_path=output_path, deferrable=deferrable, trigger_rule="none_failed", **aws,
            output_settings=output_settings, record_settings=record_settings, **(commit_kwargs or {}),
        )  # fmt: skip
        plan >> job_task >> commit
    return group
