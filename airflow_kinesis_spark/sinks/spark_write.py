"""The Spark side of the sink: how the job writes a batch's rows (:func:`write_output`) and its
quarantined records (:func:`_write_quarantine`).

* Output: Spark's Parquet writer, mode ``overwrite``, at the plan's ``output_location`` (derived
  from the batch id) or a handed batch's staging location, so a re-run of the batch replaces its
  output; no ``_SUCCESS`` marker (the batch is not committed yet;
  ``airflow_kinesis_spark.sinks.parquet``). For a table output (the plan's ``output``:
  ``airflow_kinesis_spark.sinks.OutputSpec``) the rows are written one table partition per file
  (hidden ``_p{i}`` folder columns, source columns kept in the file) for the worker's table
  commit; no table format jar is needed.
* The output's rows (:func:`output_rows`) are the read's user records that decoded, without the
  job's columns (``core.schema.JOB_COLUMNS``); corrupt Kinesis records and dead letters go to
  ``{location}/_quarantine`` (:data:`QUARANTINE_DIR`).

The job (``airflow_kinesis_spark.job``) calls these in the Spark driver. pyspark is imported
inside the functions; no Airflow, pyiceberg or deltalake import (the table commits of
``sinks.iceberg`` and ``sinks.delta`` run on the Airflow worker).
"""

from __future__ import annotations

from typing import Any

from airflow_kinesis_spark.core.schema import JOB_COLUMNS

__all__ = ["QUARANTINE_DIR", "PARQUET_WRITER_OPTIONS", "write_output", "output_rows"]


#: Quarantine output, under ``{output_location}/_quarantine`` (a ``_`` folder: Spark's readers skip it).
QUARANTINE_DIR = "_quarantine"
#: Options of every Parquet write of the job (Hadoop configuration of parquet-mr's writer).
#: The writer measures its buffered page and row group first after
#: ``parquet.page.size.row.check.min`` rows (default 100; parquet-mr 1.13 and 1.16, Spark 3.5
#: and 4, use it for both checks), then at intervals estimated from the mean row size. Records
#: may be 10 MiB since October 2025 (Kinesis ``MaxRecordSizeInKiB`` up to 10,240): 100 of them
#: are 1,000 MiB in the JVM before the first check flushes a row group meant to be 128 MiB
#: (``parquet.block.size``). Checked from the first row on, the writer holds at most a row
#: group and one row; small rows still get checks spaced out by the estimate.
PARQUET_WRITER_OPTIONS = {"parquet.page.size.row.check.min": "1"}
#: Spark's expressions for the partition transforms of ``airflow_kinesis_spark.sinks.PARTITION_TRANSFORMS``
#: (UTC session time zone): values that group rows by partition (the table reads the partition
#: value from each file's statistics, or, for Delta, the column itself).
_TRANSFORM_FORMATS = {"year": "yyyy", "month": "yyyy-MM", "day": "yyyy-MM-dd", "hour": "yyyy-MM-dd-HH"}


def _partition_column(transform: str, source: str) -> Any:
    from pyspark.sql import functions as F

    column = F.col(f"`{source}`")
    if transform == "identity":
        return column.cast("string")
    if transform == "date":
        return F.to_date(column)
    if transform in _TRANSFORM_FORMATS:
        return F.date_format(column, _TRANSFORM_FORMATS[transform])
    raise ValueError(f"unknown partition transform {transform!r}")


def write_output(data: Any, plan: dict[str, Any], location: str) -> None:
    """Write the batch's rows as the plan's output form asks (see the module doc).

    :raises ValueError: a partition or derived column's source is not among the transform's
        output columns (naming it and the columns there are).
    """
    output = plan.get("output") or {}
    partition = [tuple(f) for f in output.get("partition", ())]
    for name, transform, source in output.get("derived", ()):
        if name not in data.columns:
            if source not in data.columns:
                raise ValueError(f"the {output.get('format')} output adds column {name} = {transform}({source}), but the "
                                 f"transform's output has no {source} (columns: {data.columns}); keep it, or set partition_by")  # fmt: skip
            data = data.withColumn(name, _partition_column(transform, source))
    missing = [source for _, source, _ in partition if source not in data.columns]
    if missing:
        raise ValueError(f"the {output.get('format')} output is partitioned by {missing}, which the transform's output "
                         f"lacks (columns: {data.columns}); keep them in the transform, or change partition_by")  # fmt: skip
    for transform, source, name in partition:
        data = data.withColumn(name, _partition_column(transform, source))
    # No repartition (a shuffle stage on every batch): Spark's writer sorts each task's rows by the
    # partition columns and writes one file per (task, partition value); compaction merges them.
    writer = data.write.options(**PARQUET_WRITER_OPTIONS)
    if output.get("max_records_per_file"):
        writer = writer.option("maxRecordsPerFile", int(output["max_records_per_file"]))
    if partition:
        writer = writer.partitionBy(*[name for _, _, name in partition])
    writer.mode("overwrite").parquet(location)


def output_rows(raw: Any, plan: dict[str, Any]) -> Any:
    """The output's rows of the job's read: user records that decoded (not a report row, a
    corrupt Kinesis record or a dead letter), without the job's columns; without ``data`` when
    the records are decoded and ``keep_raw_data`` is not set."""
    from pyspark.sql import functions as F

    records = (plan.get("output") or {}).get("records")
    drop = [name for name, _ in JOB_COLUMNS] + (["data"] if records and not records.get("keep_raw_data") else [])
    return raw.where(F.col("_report").isNull() & F.col("_quarantine_reason").isNull()).drop(*drop)


def _write_quarantine(rows: Any, location: str) -> None:
    """Corrupt Kinesis records and dead letters (user records that did not decode), raw, under
    ``{location}/_quarantine`` (after the data: overwriting the data location clears this
    folder): ``stream_name``, ``shard_id``, ``sequence_number``, ``sub_sequence_number``,
    ``partition_key``, ``approximate_arrival_timestamp``, ``data``, ``error_kind``
    (``core.records.DEAD_LETTER_KINDS``) and ``reason`` (the message)."""
    from pyspark.sql import functions as F

    rows.where(F.col("_quarantine_reason").isNotNull()).select(
        "stream_name", "shard_id", "sequence_number", "sub_sequence_number", "partition_key", "approximate_arrival_timestamp",
        "data", F.col("_error_kind").alias("error_kind"), F.col("_quarantine_reason").alias("reason"),
    ).write.options(**PARQUET_WRITER_OPTIONS).mode("overwrite").parquet(f"{location}/{QUARANTINE_DIR}")  # fmt: skip
