"""What every batch operator shares: a stream and a consumer, the output (``output_settings``,
``record_settings``), how the job reads (``read_options``) and the transform it applies; the validation, the run
and its asset event and lineage.

:class:`KinesisBatchBaseOperator` is the base of the window operator;
:class:`KinesisIncrementalBaseOperator` adds where an incremental batch starts and stops, its
lease and its batch log, and is the base of ``KinesisToSparkOperator`` and the split task
group's plan task. Each operator adds only the arguments it uses.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.core.consumers import CONSUMER_TYPES
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.names import validate_consumer_name, validate_stream_name, validate_table_name
from airflow_kinesis_spark.core.planner import INITIAL_POSITIONS
from airflow_kinesis_spark.core.positions import parse_timestamp
from airflow_kinesis_spark.core.protocol import IncrementalSettings
from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.core.records import RecordSettings
from airflow_kinesis_spark.core.retention import DEFAULT_KEEP_BATCHES
from airflow_kinesis_spark.core.transform import check_transform_spec, resolve_transform
from airflow_kinesis_spark.failures import task_errors
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator
from airflow_kinesis_spark.lineage import asset_for_output, emit_asset_events, operator_lineage, output_uri
from airflow_kinesis_spark.operators.output import OutputSettingsMixin, check_local_output
from airflow_kinesis_spark.operators.settings import OutputSettings, refuse_moved_arguments, task_copy
from airflow_kinesis_spark.settings import transform_allowed_modules

__all__ = ["KinesisBatchBaseOperator", "KinesisIncrementalBaseOperator", "declared_transforms", "refuse_arguments"]


def declared_transforms(task: Any) -> list[Any] | None:
    """The transforms the DAG file gives ``task``, read from the DAG's own task object (which
    rendering never touches): its ``transform`` argument; for a mapped task, its ``partial``
    value and the literal values of ``expand`` / ``expand_kwargs`` (values of an XComArg are
    run-time input, so they are not among them). ``None`` when ``task`` is not in a DAG or is the
    DAG's object itself (an operator executed directly).
    """
    if not task.has_dag():
        return None
    declared = task.dag.task_dict.get(task.task_id)
    if declared is None or declared is task:
        return None
    expand_input = getattr(declared, "expand_input", None)
    if expand_input is None:  # a plain task: the DAG's copy holds the value its constructor got
        return [getattr(declared, "transform", None)]
    partial = getattr(declared, "partial_kwargs", {})
    literal = [partial["transform"]] if "transform" in partial else []
    value = getattr(expand_input, "value", None)
    if isinstance(value, dict) and isinstance(value.get("transform"), (list, tuple)):  # expand(transform=[...])
        literal += list(value["transform"])
    elif isinstance(value, (list, tuple)):  # expand_kwargs([{...}, ...])
        literal += [item["transform"] for item in value if isinstance(item, dict) and "transform" in item]
    return literal


def refuse_arguments(task: str, kwargs: Mapping[str, Any], refused: Sequence[str], why: str) -> None:
    """For an operator that does not take some arguments its relatives take: refuse them when
    the task is built, saying why (a DAG's ``default_args`` fill only the arguments a task is
    given, so they never reach ``kwargs``).

    :raises TypeError: ``kwargs`` names one of ``refused``: ``"<task> does not take <names>: <why>"``.
    """
    given = sorted(set(kwargs) & set(refused))
    if given:
        raise TypeError(f"{task} does not take {', '.join(given)}: {why}")


class KinesisBatchBaseOperator(OutputSettingsMixin, KinesisAwsBaseOperator):
    """The arguments and the run every batch operator shares (not a task of its own).

    :param stream_name: the Kinesis stream (templated).
    :param consumer_name: the consumer (application) name: the namespace of the checkpoints (templated).
    :param checkpoint_table: DynamoDB table of the checkpoints; created on first use (templated).
    :param output_path: the output root (templated): any path Spark's writers take (local,
        ``s3a://``, ...). Parquet batch ``N`` goes to ``{output_path}/batch_id=N``; for Delta the
        table's location; for Iceberg where Spark writes the table's files.
    :param output_settings: the output's form and table
        (:class:`~airflow_kinesis_spark.operators.settings.OutputSettings`; default Parquet);
        its ``format``, ``table``, ``catalog_conn_id`` and ``schema_evolution`` are templated.
    :param record_settings: how the records' bytes are decoded
        (:class:`~airflow_kinesis_spark.core.records.RecordSettings`, docs/typed-records.md;
        default ``raw``: the ``data`` column); checked when built.
    :param read_options: how the job's readers read
        (:class:`~airflow_kinesis_spark.core.read_options.ReadOptions`: ``limit``,
        ``min_call_interval``, ``read_bytes_per_second``, ``read_tasks``); checked when built.
    :param transform: optional ``package.module:function`` taking and returning a pyspark
        DataFrame, applied before the write. **Not templated**: it is code the job runs, so it is
        written in the DAG file, never taken from run-time input (``dag_run.conf``, ``params``, an
        XCom). A value the task did not get from its DAG file (a template, an XComArg, a mapped
        task expanded over run-time values) is refused with ``ValueError``. Its module may not be
        in Python's standard library and, when the provider's ``[kinesis_spark]
        transform_allowed_modules`` option lists module prefixes, must be under one of them
        (checked before anything is imported).
    :param consumer_type: ``polling`` (default: ``GetRecords``, sharing each shard's 2 MiB/s and
        5 calls per second with every other polling reader) or ``efo`` (enhanced fan-out: the
        consumer is registered as a stream consumer of the stream, or reused, and the job reads
        with ``SubscribeToShard``: 2 MiB/s per shard of its own, pushed; billed per
        consumer-shard-hour while registered) (templated).
    :param allow_data_loss: go on when records may be lost (a vanished shard, a checkpoint or a
        window before the trim horizon); the gap is logged and reported. Without it the run
        fails without retry and nothing is read (LOUD).
    :param output_asset: declare the output root as an Airflow Asset outlet and emit an event with
        the run's summary (``lineage``).
    :param point_in_time_recovery: create the checkpoint table with point-in-time recovery
        (billed per GB-month of table size; see docs/iam.md). Tables that exist are left as they are.
    :param deletion_protection: create the checkpoint table with deletion protection (free).
    :raises TypeError: an argument that moved into a settings object (``output_format``,
        ``spark_conn_id``, ...: :func:`~airflow_kinesis_spark.operators.settings.refuse_moved_arguments`),
        or a settings argument of another type.
    """

    template_fields: Sequence[str] = (
        "output_settings", "consumer_type", "stream_name", "consumer_name", "checkpoint_table", "output_path",
        # not "transform": code the job runs comes from the DAG file, never from run-time input
        *AWS_TEMPLATE_FIELDS,
    )  # fmt: skip
    ui_color = "#f4a460"
    #: The settings objects this operator takes (``operators.settings``).
    settings_arguments: Sequence[str] = ("output_settings", "record_settings", "read_options")

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        output_path: str,
        output_settings: OutputSettings | None = None,
        record_settings: RecordSettings | None = None,
        read_options: ReadOptions | None = None,
        transform: str | None = None,
        consumer_type: str = "polling",
        allow_data_loss: bool = False,
        output_asset: bool = True,
        point_in_time_recovery: bool = True,
        deletion_protection: bool = True,
        **kwargs: Any,
    ) -> None:
        refuse_moved_arguments(type(self).__name__, kwargs, self.settings_arguments)
        super().__init__(**kwargs)
        self._init_output(output_settings, record_settings)
        self.read_options = task_copy("read_options", read_options, ReadOptions)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.output_path = output_path
        self.transform = transform
        self.consumer_type = consumer_type
        self.allow_data_loss = allow_data_loss
        self.point_in_time_recovery = point_in_time_recovery
        self.deletion_protection = deletion_protection
        self.output_asset = output_asset
        if output_asset and (uri := output_uri(output_path)) and not any(getattr(o, "uri", None) == uri for o in self.outlets):
            self.outlets = [*self.outlets, asset_for_output(output_path)]
        self._outcome: dict[str, Any] | None = None  # the last run's summary, for lineage

    # -- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every argument; called first in :meth:`execute`, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        validate_stream_name(self.stream_name)
        validate_table_name(self.checkpoint_table)
        validate_consumer_name(self.consumer_name)
        if not self.output_path or not isinstance(self.output_path, str):
            raise ValueError("output_path is required: a directory Spark can write Parquet to")
        check_local_output(self.output_path)
        self.validate_output()
        if self.consumer_type not in CONSUMER_TYPES:
            raise ValueError(f"consumer_type must be one of {', '.join(CONSUMER_TYPES)}; got {self.consumer_type!r}")
        if self.transform:
            self._check_transform()

    def _check_transform(self) -> None:
        """The transform is the one the DAG file gives this task, and it may be imported: its
        module is allowed (:func:`transform_allowed_modules`). It is imported here too (after that
        check) unless the task's Spark job ships the module (``SparkSettings.py_files``: the job
        checks it before reading anything).

        :raises ValueError: a template or a run-time value (naming why it is refused), or a spec
            that is malformed, refused, or (imported here) does not import.
        """
        spec = self.transform
        if not isinstance(spec, str):
            raise ValueError(f"transform must be a 'package.module:function' string written in the DAG file; got a "
                             f"{type(spec).__name__}: the code a job runs is never taken from run-time input (an XCom)")  # fmt: skip
        if "{{" in spec or "{%" in spec:
            raise ValueError(f"transform {spec!r} is a template, but transform is not templated: the code a job runs "
                             "comes from the DAG file, never from run-time input (dag_run.conf, params). Write the "
                             "'package.module:function' itself in the DAG file")  # fmt: skip
        declared = declared_transforms(self)
        if declared is not None and spec not in declared:
            raise ValueError(f"transform {spec!r} of task {self.task_id!r} is not one its DAG file gives it "
                             f"({', '.join(map(repr, declared)) or 'none'}): it was set at run time (a subclass that "
                             "templates transform, or a mapped task expanded over an XCom). The code a job runs comes "
                             "from the DAG file only")  # fmt: skip
        allowed = transform_allowed_modules()
        check_transform_spec(spec, allowed)
        if self._transform_imports_here():
            resolve_transform(spec, allowed)

    def _transform_imports_here(self) -> bool:
        """Whether the transform's module must import in this worker (a task that runs no job of its own: yes)."""
        return True

    # -- the run -------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        self.validate()
        with task_errors():  # a retry cannot help (KinesisSparkError.retryable): fail without retries
            summary = self._run_batch(context)
        self._publish(context, summary)
        return summary

    def _run_batch(self, context: Context) -> dict[str, Any]:
        raise NotImplementedError

    def _publish(self, context: Context, summary: dict[str, Any]) -> None:
        """Put the run's summary on the output asset's event (see ``output_asset``); keep it for lineage."""
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
                                table=self.output_settings.table or self.output_path, output_format=self.output_settings.format)  # fmt: skip

    def _owner(self, context: Context) -> str:
        """A readable, unique writer id for the checkpoint store's fencing."""
        ti = context.get("ti") or context.get("task_instance")
        if ti is not None:
            base = f"{ti.dag_id}.{ti.task_id}.{ti.run_id}.try{ti.try_number}"
        else:
            base = f"{self.dag_id}.{self.task_id}" if self.has_dag() else self.task_id
        return re.sub(r"[#\s]", "_", f"{base}.{uuid.uuid4().hex[:8]}")


class KinesisIncrementalBaseOperator(KinesisBatchBaseOperator):
    """An incremental batch's arguments: where it starts and stops, its lease and its batch log
    (the base of ``KinesisToSparkOperator`` and ``KinesisPlanBatchOperator``).

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
    :param lease_seconds: the lease on a pending batch (seconds, default 60): its holder renews
        it every quarter of this; another run may take the batch over (re-using its plan) only
        after it expired, so a retry after a run that died without a word waits up to this long.
        Keep it below the task's ``retry_delay``; over Spark Connect keep it above the longest
        batch's job (docs/guarantees.md).
    :param keep_batches: batches of the checkpoint table's batch log to keep (plans, reports and
        checkpoints of older batches get a DynamoDB TTL and are deleted by DynamoDB, typically
        within a few days); the committed and the pending batch never expire.
    """

    template_fields: Sequence[str] = (*KinesisBatchBaseOperator.template_fields, "cutoff", "initial_position", "initial_timestamp")

    def __init__(
        self,
        *,
        cutoff: str | datetime | None = None,
        initial_position: str = "TRIM_HORIZON",
        initial_timestamp: str | datetime | None = None,
        max_records_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cutoff = cutoff
        self.initial_position = initial_position
        self.initial_timestamp = initial_timestamp
        self.max_records_per_shard = max_records_per_shard
        self.max_bytes_per_shard = max_bytes_per_shard
        self.lease_seconds = lease_seconds
        self.keep_batches = keep_batches

    def validate(self) -> None:
        """Check every argument; called first in :meth:`execute`, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        super().validate()
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
        for name in ("cutoff", "initial_timestamp"):
            value = getattr(self, name)
            if value:
                try:
                    parse_timestamp(value)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{name}: {err}") from err

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
            min_call_interval=self.read_options.min_call_interval,
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
