"""KinesisToSparkOperator: one exactly-once micro-batch, plan -> read -> write -> commit."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.failures import task_errors
from airflow_kinesis_spark.core.records import DEFAULT_MAX_DEAD_LETTER_FRACTION
from airflow_kinesis_spark.core.consumers import CONSUMER_TYPES
from airflow_kinesis_spark.core.names import validate_consumer_name, validate_stream_name, validate_table_name
from airflow_kinesis_spark.core.planner import INITIAL_POSITIONS
from airflow_kinesis_spark.core.positions import parse_timestamp
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.protocol import IncrementalSettings, prepare_incremental, run_incremental
from airflow_kinesis_spark.core.read_options import READ_BYTES_PER_SECOND, ReadOptions
from airflow_kinesis_spark.core.retention import DEFAULT_KEEP_BATCHES
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator
from airflow_kinesis_spark.operators.handoff import commit_event
from airflow_kinesis_spark.settings import deferral_requested
from airflow_kinesis_spark.operators.output import OUTPUT_TEMPLATE_FIELDS, OutputSettingsMixin, check_local_output
from airflow_kinesis_spark.operators.spark_settings import SparkSettingsMixin
from airflow_kinesis_spark.triggers.kinesis import KinesisBatchReportTrigger
from airflow_kinesis_spark.hooks.spark_package import spark_script_path
from airflow_kinesis_spark.lineage import asset_for_output, emit_asset_events, operator_lineage, output_uri

__all__ = ["KinesisToSparkOperator", "refuse_arguments", "spark_script_path"]


def refuse_arguments(task: str, kwargs: Mapping[str, Any], refused: Sequence[str], why: str) -> None:
    """For a subclass of :class:`KinesisToSparkOperator` that does not use some of its arguments:
    refuse them when the task is built (a DAG's ``default_args`` fill only the arguments a task
    is given, so they never reach ``kwargs``).

    :raises TypeError: ``kwargs`` names one of ``refused``: ``"<task> does not take <names>: <why>"``.
    """
    given = sorted(set(kwargs) & set(refused))
    if given:
        raise TypeError(f"{task} does not take {', '.join(given)}: {why}")


class KinesisToSparkOperator(SparkSettingsMixin, OutputSettingsMixin, KinesisAwsBaseOperator):
    """Read every shard of a Kinesis stream from its checkpoint to the cutoff into Parquet, exactly once.

    One run is one batch of the batch protocol: **plan** (committed checkpoints + shard lineage,
    persisted in the checkpoint table before any record is read), **read** and **write** (a
    PySpark job submitted with the apache-spark provider's ``SparkSubmitHook``: one task per shard,
    Parquet at ``{output_path}/batch_id={N}``), **commit** (the job's per-shard report is
    validated against the plan, then every checkpoint advances in one conditional write).

    A failed run leaves its plan pending; the next attempt re-uses it (never replaces it), so a
    retry reads the same records and overwrites the same output. A run with no new records starts
    no Spark job and writes no files.

    .. seealso:: docs/operators.md

    :param stream_name: the Kinesis stream (templated).
    :param consumer_name: the consumer (application) name: the namespace of the checkpoints (templated).
    :param checkpoint_table: DynamoDB table of the checkpoints; created on first use (templated).
    :param output_path: root of the output; batch ``N`` goes to ``{output_path}/batch_id=N``. Any
        path Spark's Parquet writer takes (local, ``s3a://``, ...) (templated). For
        ``output_format="delta"`` the Delta table's location; for ``iceberg`` where Spark writes
        the table's files (and the table's location when it is created).
    :param consumer_type: ``polling`` (default: ``GetRecords``, sharing each shard's 2 MiB/s and
        5 calls per second with every other polling reader) or ``efo`` (enhanced fan-out: the
        consumer is registered as a stream consumer of the stream, or reused, and the job reads
        with ``SubscribeToShard``: 2 MiB/s per shard of its own, pushed; billed per
        consumer-shard-hour while registered: deregister with ``kinesis-spark deregister-consumer``
        or ``KinesisDeregisterStreamConsumerOperator``). Same records, reports and checkpoints:
        a consumer may switch between batches (a pending batch keeps the type it was planned with).
    :param output_format: ``parquet`` (default), ``iceberg`` or ``delta``; with ``table``,
        ``catalog_conn_id``, ``catalog_properties``, ``partition_by``, ``max_records_per_file``,
        ``target_file_size``, ``storage_options``, ``shared_output`` (several consumers write one
        root or table, each under its own folder) and ``schema_evolution`` (``"add_columns"``:
        new columns added to the table): see :class:`~airflow_kinesis_spark.operators.output.OutputSettingsMixin`
        and docs/output.md. A table commit adds the batch's files (one Iceberg snapshot or Delta
        version per batch, recording stream, consumer and batch id) before the checkpoints
        advance; a re-run of a batch already in the table adds nothing.
    :param transform: and ``spark_conn_id``, ``spark_conf``, ``spark_py_files``, ``get_records_limit``,
        ``min_call_interval``, ``read_bytes_per_second``, ``read_tasks``,
        ``spark_connect_reuse_session``, ``job_credentials``: where the job runs, how it reads and
        what it applies before the write: see
        :class:`~airflow_kinesis_spark.operators.spark_settings.SparkSettingsMixin`.
    :param cutoff: records arriving at or after this time are left for the next batch (ISO 8601 or
        datetime, UTC). Default: the run's ``data_interval_end``; ``now`` for manual runs. Never
        later than the planning time (templated).
    :param initial_position: where a never-seen shard starts: ``TRIM_HORIZON`` (default),
        ``LATEST`` or ``AT_TIMESTAMP``. Children of checkpointed shards always start at
        ``TRIM_HORIZON`` (templated).
    :param initial_timestamp: with ``AT_TIMESTAMP`` (ISO 8601, UTC) (templated).
    :param max_records_per_shard: cap on user records read per shard per batch, or ``None``.
        An aggregated record is never cut: reading stops before an aggregate that would pass the
        cap, except the first one of the range, which is taken whole (so every batch moves on).
    :param max_bytes_per_shard: cap on Kinesis record bytes read per shard per batch, or ``None``.
    :param aws_conn_id: and ``region_name``, ``verify``, ``botocore_config``: the AWS arguments
        (templated but ``botocore_config``; :class:`~airflow_kinesis_spark.hooks.consumer.KinesisAwsBaseOperator`).
    :param lease_seconds: the lease on a pending batch (seconds, default 60): its holder renews
        it every quarter of this; another run may take the batch over (re-using its plan) only
        after it expired, so a retry after a run that died without a word waits up to this long.
        Keep it below the task's ``retry_delay``; over Spark Connect keep it above the longest
        batch's job (docs/guarantees.md).
    :param point_in_time_recovery: create the checkpoint table with point-in-time recovery
        (billed per GB-month of table size; see docs/iam.md). Tables that exist are left as they are.
    :param deletion_protection: create the checkpoint table with deletion protection (free).
    :param keep_batches: batches of the checkpoint table's batch log to keep (plans, reports and
        checkpoints of older batches get a DynamoDB TTL and are deleted by DynamoDB, typically
        within a few days); the committed and the pending batch never expire.
    :param allow_data_loss: go on when records may be lost: a checkpointed shard vanished before
        ``SHARD_END``, or a checkpoint fell behind the trim horizon (records after it may have
        aged out). The gap is logged and reported in the summary; without this flag the run fails
        without retry and nothing is read (LOUD).
    :param output_asset: declare the output root as an Airflow Asset outlet (URI from
        ``lineage.output_uri``: ``file://`` for a local path, ``s3://`` for ``s3a://``; not for a
        templated or relative path), so DAGs scheduled on it run after each batch. Every
        successful run emits an asset event whose ``extra`` is the batch summary in short
        (``lineage.asset_event_extra``: ``batch_id``, ``records``, ``shards``, ``output_path``, ...),
        also a run without new records (``records`` 0: Airflow emits an event for every declared
        outlet). For events only when records were written, pass ``output_asset=False`` and
        ``outlets=[AssetAlias(...)]``: the operator adds the output asset's event to each alias
        outlet only when ``records`` > 0. OpenLineage: :meth:`get_openlineage_facets_on_complete`.
    :param deferrable: hand the batch to a Spark driver that does not run in this worker, then
        wait in the triggerer (:class:`~airflow_kinesis_spark.triggers.kinesis.KinesisBatchReportTrigger`)
        instead of a worker slot, and commit when the job recorded its report. Needs a spark
        connection in cluster deploy mode on YARN or Kubernetes (submitted with
        ``spark.{yarn,kubernetes}.submission.waitAppCompletion=false``), or a local master
        (development: the driver runs as a detached process on this machine). Not with Spark
        Connect. Same events and XCom as the blocking path. ``None`` (default): Airflow's
        ``[operators] default_deferrable`` setting, applied only when the connection can run the
        driver away from this worker (otherwise the run blocks, and says so in its log); an
        explicit ``True`` with such a connection fails with :class:`ValueError` before anything is planned.
    :param poke_interval: seconds between two reads of the checkpoint store while deferred.
    :param job_start_timeout: seconds the deferred job has to claim its batch (a cluster may
        queue it) before the wait fails and the task retries (the plan stays pending).
    :returns: (XCom) the batch summary: ``batch_id``, ``status`` (``committed``,
        ``committed_without_records`` or ``no_new_records``), ``stream_name``,
        ``consumer_name``, ``records``, ``bytes``, ``output_path``, ``quarantined`` (corrupt
        aggregates, kept raw under ``{output_path}/batch_id=N/_quarantine`` = ``quarantine_path``),
        ``out_of_range`` (aggregated user records outside their shard's hash key range, kept),
        ``cutoff``, ``reused_plan``,
        ``shards`` (per shard: ``records``, ``bytes``, ``first``, ``last``, ``checkpoint``,
        ``stop_reason``, ``shard_end``), ``waiting_shards`` (shard id -> reason) and
        ``lost_shards`` and ``trim_gaps`` (what was passed over with ``allow_data_loss``);
        for a committed batch also ``output_format`` and ``table`` (``format``, ``table``: the
        identifier, ``snapshot_id`` (Iceberg) or ``version`` (Delta), ``files`` added,
        ``already_committed``; ``None`` for a batch without records).
    :raises ValueError: bad arguments (names, caps, transform, output path), before anything is read.
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    :raises AirflowFailException: (no retry) another run of this consumer moved the checkpoints
        (from :class:`CheckpointConflictError`), the job's report does not match the plan (from
        :class:`ReportValidationError`), records would be lost (from :class:`DataLossError`), or an
        item of the checkpoint table is corrupt (from :class:`CheckpointStoreCorruptError`).
        Nothing is committed.
    :raises RuntimeError: the Spark job failed; the plan stays pending for the next attempt.
    """

    template_fields: Sequence[str] = (
        *OUTPUT_TEMPLATE_FIELDS,
        "consumer_type",
        "stream_name",
        "consumer_name",
        "checkpoint_table",
        "output_path",
        # not "transform": code the job runs comes from the DAG file, never from run-time input
        "cutoff",
        "initial_position",
        "initial_timestamp",
        *AWS_TEMPLATE_FIELDS,
        "spark_conf",
    )
    template_fields_renderers = {"spark_conf": "json"}
    ui_color = "#f4a460"
    #: Whether runs read and advance the checkpoint store (window mode does not).
    uses_checkpoints = True

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        output_path: str,
        transform: str | None = None,
        cutoff: str | datetime | None = None,
        initial_position: str = "TRIM_HORIZON",
        initial_timestamp: str | datetime | None = None,
        max_records_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        spark_py_files: str | None = None,
        get_records_limit: int = ReadOptions.limit,
        min_call_interval: float = ReadOptions.min_call_interval,
        read_bytes_per_second: float | None = READ_BYTES_PER_SECOND,
        read_tasks: int | None = None,
        spark_connect_reuse_session: bool = False,
        allow_data_loss: bool = False,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        output_asset: bool = True,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        job_credentials: str = "scoped",
        point_in_time_recovery: bool = True,
        deletion_protection: bool = True,
        deferrable: bool | None = None,
        poke_interval: float = 10.0,
        job_start_timeout: float = 600.0,
        output_format: str = "parquet",
        table: str | None = None,
        catalog_conn_id: str | None = None,
        catalog_properties: dict[str, str] | None = None,
        partition_by: Sequence[str] | None = None,
        max_records_per_file: int = 0,
        storage_options: dict[str, str] | None = None,
        target_file_size: int = 0,
        consumer_type: str = "polling",
        shared_output: bool = False,
        schema_evolution: str | None = None,
        record_format: str = "raw",
        record_schema: str | None = None,
        record_message: str | None = None,
        schema_registry: dict[str, str] | None = None,
        keep_raw_data: bool = False,
        max_dead_letter_fraction: float = DEFAULT_MAX_DEAD_LETTER_FRACTION,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.consumer_type = consumer_type
        self._init_output(
            output_format=output_format, table=table, catalog_conn_id=catalog_conn_id, catalog_properties=catalog_properties,
            partition_by=partition_by, max_records_per_file=max_records_per_file, storage_options=storage_options,
            target_file_size=target_file_size, shared_output=shared_output, schema_evolution=schema_evolution,
            record_format=record_format, record_schema=record_schema, record_message=record_message,
            schema_registry=schema_registry, keep_raw_data=keep_raw_data, max_dead_letter_fraction=max_dead_letter_fraction,
        )  # fmt: skip
        self.deferrable = deferrable
        self.poke_interval = poke_interval
        self.job_start_timeout = job_start_timeout
        self.point_in_time_recovery = point_in_time_recovery
        self.deletion_protection = deletion_protection
        self.keep_batches = keep_batches
        self.lease_seconds = lease_seconds
        self.output_asset = output_asset
        if output_asset and (uri := output_uri(output_path)) and not any(getattr(o, "uri", None) == uri for o in self.outlets):
            self.outlets = [*self.outlets, asset_for_output(output_path)]
        self._outcome: dict[str, Any] | None = None  # the last run's summary, for lineage
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.output_path = output_path
        self.cutoff = cutoff
        self.initial_position = initial_position
        self.initial_timestamp = initial_timestamp
        self.max_records_per_shard = max_records_per_shard
        self.max_bytes_per_shard = max_bytes_per_shard
        self.allow_data_loss = allow_data_loss
        self._init_spark(
            spark_conn_id=spark_conn_id, spark_conf=spark_conf, spark_py_files=spark_py_files,
            get_records_limit=get_records_limit, min_call_interval=min_call_interval,
            read_bytes_per_second=read_bytes_per_second, read_tasks=read_tasks,
            spark_connect_reuse_session=spark_connect_reuse_session, job_credentials=job_credentials, transform=transform,
        )  # fmt: skip

    # -- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every argument; called first in :meth:`execute`, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        validate_stream_name(self.stream_name)
        if self.uses_checkpoints or self.checkpoint_table:
            validate_table_name(self.checkpoint_table)
        validate_consumer_name(self.consumer_name)
        for name in ("max_records_per_shard", "max_bytes_per_shard"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None; got {value!r}")
        if not self.lease_seconds or self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {self.lease_seconds!r}")
        if self.initial_position not in INITIAL_POSITIONS:
            raise ValueError(f"initial_position must be one of {', '.join(INITIAL_POSITIONS)}; got {self.initial_position!r}")
        if self.initial_position == "AT_TIMESTAMP" and not self.initial_timestamp:
            raise ValueError("initial_position='AT_TIMESTAMP' needs initial_timestamp (ISO 8601, UTC)")
        if not self.output_path or not isinstance(self.output_path, str):
            raise ValueError("output_path is required: a directory Spark can write Parquet to")
        check_local_output(self.output_path)
        self.validate_output()
        if self.consumer_type not in CONSUMER_TYPES:
            raise ValueError(f"consumer_type must be one of {', '.join(CONSUMER_TYPES)}; got {self.consumer_type!r}")
        for name in ("cutoff", "initial_timestamp"):
            value = getattr(self, name)
            if value:
                try:
                    parse_timestamp(value)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{name}: {err}") from err
        self.validate_spark()

    # -- the batch -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate()
        with task_errors():  # a retry cannot help (KinesisSparkError.retryable): fail without retries
            summary = self._run_batch(context)
        self._publish(context, summary)
        return summary

    def _publish(self, context: Context, summary: dict[str, Any]) -> None:
        """Put the batch summary on the output asset's event (see ``output_asset``); keep it for lineage."""
        self._outcome = summary
        emit_asset_events(self.outlets, self.output_path, context, summary, self.log)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage datasets (``lineage.operator_lineage``): the stream (namespace
        ``kinesis://{region}``) in, the output root out, with the run's record counts."""
        try:
            region = self.region_name or self.kinesis_hook.conn_region_name
        except Exception:  # noqa: BLE001 - lineage must not fail for want of a region
            region = self.region_name
        return operator_lineage(stream_name=self.stream_name, region=region, output_path=self.output_path, summary=self._outcome,
                                table=self.table or self.output_path, output_format=self.output_format)  # fmt: skip

    def _run_batch(self, context: Context) -> dict[str, Any]:
        store = self._store()
        settings = self._settings(context)
        owner = self._owner(context)
        if not self._defers():
            return run_incremental(self.kinesis_hook.conn, store, self.spark_job, settings, owner)
        prepared = prepare_incremental(self.kinesis_hook.conn, store, settings, owner)
        if prepared.summary is not None:
            return prepared.summary
        plan = prepared.plan
        arguments = prepared.job_arguments(store, owner, self.lease_seconds)
        job = self.spark_job.submit_detached(arguments, output_location=plan.output_location)
        self.log.info("Batch %d handed to its Spark job (%s); deferring until its report is recorded", plan.batch_id, job)
        self.defer(
            trigger=KinesisBatchReportTrigger(
                stream_name=self.stream_name, consumer_name=self.consumer_name, checkpoint_table=self.checkpoint_table,
                batch_id=plan.batch_id, lease_owner=owner, lease_seconds=self.lease_seconds, handed_at=time.time(),
                job_start_timeout=self.job_start_timeout, poke_interval=self.poke_interval, **self.aws_trigger_kwargs,
            ),
            method_name="execute_complete",
            kwargs={"reused": prepared.reused, "plan_digest": plan.digest()},
        )  # fmt: skip
        raise AssertionError("unreachable: defer() raises")  # pragma: no cover

    def _defers(self) -> bool:
        """Whether this run hands its batch to a driver elsewhere and defers (see ``deferrable``);
        checked before anything is planned, so a wrong connection leaves no pending batch.

        :raises ValueError: ``deferrable=True`` with a connection whose driver would run here.
        """
        if not deferral_requested(self.deferrable):
            return False
        try:
            self.spark_job.check_detachable()
        except ValueError as err:
            if self.deferrable:
                raise
            self.log.info("Not deferring ([operators] default_deferrable is on, but %s)", err)
            return False
        return True

    def execute_complete(
        self, context: Context, event: dict[str, Any], reused: bool = False, plan_digest: str | None = None
    ) -> dict[str, Any]:
        """Resume after :class:`KinesisBatchReportTrigger` fired: commit the handed batch (same
        summary, XCom and asset event as the blocking path).

        :raises AirflowFailException: the batch was taken over or is no longer pending, or the
            recorded report does not match the plan (no retry).
        :raises ReportNotRecordedError: the job ended without a report (retryable: the plan stays pending).
        """
        self.validate()
        summary = commit_event(self._store(), event, self.lease_seconds, reused=reused, sink=self.sink, plan_digest=plan_digest)
        self._publish(context, summary)
        return summary

    def _store(self) -> Any:
        """The consumer's checkpoint store, its table created on first use."""
        store = self.checkpoint_hook.get_store(
            self.checkpoint_table, self.stream_name, self.consumer_name, keep_batches=self.keep_batches,
            point_in_time_recovery=self.point_in_time_recovery, deletion_protection=self.deletion_protection,
        )  # fmt: skip
        store.ensure_table()
        return store

    def _settings(self, context: Context) -> IncrementalSettings:
        return IncrementalSettings(
            stream_name=self.stream_name,
            consumer_name=self.consumer_name,
            output_root=self.output_root,
            cutoff=self._cutoff(context, datetime.now(timezone.utc)),
            initial_position=self.initial_position,
            initial_timestamp=parse_timestamp(self.initial_timestamp) if self.initial_timestamp else None,
            max_records_per_shard=self.max_records_per_shard,
            max_bytes_per_shard=self.max_bytes_per_shard,
            allow_data_loss=self.allow_data_loss,
            lease_seconds=self.lease_seconds,
            min_call_interval=self.min_call_interval,
            sink=self.sink,
            consumer_type=self.consumer_type,
            transform=self.transform or None,
            summary_budget=self.kinesis_hook.summary_budget,
        )

    def _cutoff(self, context: Context, now: datetime) -> datetime:
        if self.cutoff:
            return parse_timestamp(self.cutoff)
        dag_run = context.get("dag_run")
        run_type = str(getattr(dag_run, "run_type", "") or "").lower()
        interval_end = context.get("data_interval_end")
        if interval_end is None or "manual" in run_type:
            return now
        return parse_timestamp(interval_end)

    def _owner(self, context: Context) -> str:
        """A readable, unique writer id for the checkpoint store's fencing."""
        ti = context.get("ti") or context.get("task_instance")
        if ti is not None:
            base = f"{ti.dag_id}.{ti.task_id}.{ti.run_id}.try{ti.try_number}"
        else:
            base = f"{self.dag_id}.{self.task_id}" if self.has_dag() else self.task_id
        return re.sub(r"[#\s]", "_", f"{base}.{uuid.uuid4().hex[:8]}")


def __getattr__(name: str) -> Any:
    """``KinesisWindowToSparkOperator`` and ``INCREMENTAL_ONLY`` by their former path (DAG files
    written before they moved to :mod:`airflow_kinesis_spark.operators.window`)."""
    if name in ("KinesisWindowToSparkOperator", "INCREMENTAL_ONLY"):
        from airflow_kinesis_spark.operators import window

        return getattr(window, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
