"""KinesisTableCompactionOperator: the optional small-file compaction of a table output."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.core.positions import parse_timestamp
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator
from airflow_kinesis_spark.operators.output import OutputSettingsMixin
from airflow_kinesis_spark.operators.settings import OutputSettings, refuse_moved_arguments

__all__ = ["KinesisTableCompactionOperator"]


class KinesisTableCompactionOperator(OutputSettingsMixin, KinesisAwsBaseOperator):
    """Compact the small files the micro-batches wrote for rows that arrived in ``[start, end)``.

    - ``iceberg``: one overwrite snapshot rewrites those rows (pyiceberg, copy-on-write) into files
      of the table's ``write.target-file-size-bytes``. The rows are read into this worker's memory:
      compact a day or less at a time.
    - ``delta``: delta-rs ``optimize.compact`` on the partitions of those days (the default
      ``arrival_date`` partitioning; otherwise the whole table), files of ``target_file_size``.

    Schedule it after the day is complete (e.g. daily, for the previous day). It commits with the
    table's optimistic concurrency beside the ingestion: a batch commit that conflicts with it is
    retried by the batch. Replaced files stay until snapshots expire (Iceberg) or ``vacuum``
    (Delta). Costs: docs/output.md.

    :param output_path: the output root, as the ingestion task's (templated).
    :param output_settings: the ingestion task's output settings
        (:class:`~airflow_kinesis_spark.operators.settings.OutputSettings`): ``format``
        ``iceberg`` or ``delta``, ``table``, ``catalog_conn_id``, ``catalog_properties``,
        ``storage_options``; for Delta, ``target_file_size`` is the compacted files' target size
        in bytes (0: the table's ``delta.targetFileSize``, delta-rs default 100 MiB). Templated
        as there.
    :param start: / :param end: the arrival-time range (ISO 8601 or datetime, UTC; templated).
        Default: the run's data interval.
    :returns: (XCom) ``table``, ``files_before``, ``files_after`` and ``snapshot_id`` (Iceberg) or
        ``version`` (Delta).
    :raises ValueError: format ``parquet``, or no range.
    :raises TableCommitError: the table does not exist.
    """

    template_fields: Sequence[str] = ("output_settings", "output_path", "start", "end", *AWS_TEMPLATE_FIELDS)
    ui_color = "#f4a460"

    def __init__(
        self, *, output_path: str, output_settings: OutputSettings, start: str | datetime | None = None,
        end: str | datetime | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        refuse_moved_arguments(type(self).__name__, kwargs, ("output_settings",))
        if output_settings is None:
            raise TypeError("KinesisTableCompactionOperator needs output_settings: the ingestion task's OutputSettings "
                            "(format 'iceberg' or 'delta', table, catalog)")  # fmt: skip
        super().__init__(**kwargs)
        self._init_output(output_settings, None)
        self.output_path = output_path
        self.start = start
        self.end = end

    def execute(self, context: Context) -> dict[str, Any]:
        if self.output_settings.format == "parquet":
            raise ValueError("OutputSettings.format 'parquet' has no table to compact: compaction is for 'iceberg' and 'delta'")
        self.validate_output()
        start = self.start or context.get("data_interval_start")
        end = self.end or context.get("data_interval_end")
        if not start or not end:
            raise ValueError("start and end are needed (ISO 8601, UTC) when the run has no data interval")
        start, end = parse_timestamp(start), parse_timestamp(end)
        if start >= end:
            raise ValueError(f"start must be before end; got [{start.isoformat()}, {end.isoformat()})")
        result = self.sink.compact(start, end, target_size=(self.output_settings.target_file_size or None) if self.output_settings.format == "delta" else None)
        self.log.info("Compacted %s: %s", self.sink.table, result)
        return result
