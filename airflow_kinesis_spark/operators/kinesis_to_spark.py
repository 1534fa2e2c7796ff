"""KinesisToSparkOperator: one exactly-once micro-batch, plan -> read -> write -> commit."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.core.protocol import prepare_incremental, run_incremental
from airflow_kinesis_spark.hooks.spark_package import spark_script_path
from airflow_kinesis_spark.operators.base import KinesisIncrementalBaseOperator, refuse_arguments
from airflow_kinesis_spark.operators.handoff import commit_event
from airflow_kinesis_spark.operators.settings import SparkSettings
from airflow_kinesis_spark.operators.spark_settings import SparkSettingsMixin
from airflow_kinesis_spark.settings import deferral_requested
from airflow_kinesis_spark.triggers.kinesis import KinesisBatchReportTrigger

__all__ = ["KinesisToSparkOperator", "refuse_arguments", "spark_script_path"]


class KinesisToSparkOperator(SparkSettingsMixin, KinesisIncrementalBaseOperator):
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

    The stream, consumer, checkpoint table, output (``output_settings``, ``record_settings``), reading (``read_options``),
    ``transform``, ``consumer_type``, the batch's bounds (``cutoff``, ``initial_position``, the
    caps), ``lease_seconds``, ``keep_batches``, ``allow_data_loss`` and the checkpoint table's
    creation settings: see :class:`~airflow_kinesis_spark.operators.base.KinesisIncrementalBaseOperator`
    and :class:`~airflow_kinesis_spark.operators.base.KinesisBatchBaseOperator`. A table commit
    adds the batch's files (one Iceberg snapshot or Delta version per batch, recording stream,
    consumer and batch id) before the checkpoints advance; a re-run of a batch already in the
    table adds nothing.

    :param spark_settings: where the job runs and with which credentials
        (:class:`~airflow_kinesis_spark.operators.settings.SparkSettings`; default connection
        ``spark_default``, scoped credentials); its ``conf`` is templated.
    :param aws_conn_id: and ``region_name``, ``verify``, ``botocore_config``: the AWS arguments
        (templated but ``botocore_config``; :class:`~airflow_kinesis_spark.hooks.consumer.KinesisAwsBaseOperator`).
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

    settings_arguments: Sequence[str] = (*KinesisIncrementalBaseOperator.settings_arguments, "spark_settings")
    template_fields: Sequence[str] = (*KinesisIncrementalBaseOperator.template_fields, "spark_settings")

    def __init__(
        self,
        *,
        spark_settings: SparkSettings | None = None,
        deferrable: bool | None = None,
        poke_interval: float = 10.0,
        job_start_timeout: float = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._init_spark(spark_settings)
        self.deferrable = deferrable
        self.poke_interval = poke_interval
        self.job_start_timeout = job_start_timeout

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


def __getattr__(name: str) -> Any:
    """``KinesisWindowToSparkOperator`` and ``INCREMENTAL_ONLY`` by their former path (DAG files
    written before they moved to :mod:`airflow_kinesis_spark.operators.window`)."""
    if name in ("KinesisWindowToSparkOperator", "INCREMENTAL_ONLY"):
        from airflow_kinesis_spark.operators import window

        return getattr(window, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
