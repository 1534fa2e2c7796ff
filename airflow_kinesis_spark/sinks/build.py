"""Building the sink of an output's settings (:func:`build_sink`): the checks of the settings
(naming the setting, the problem and the fix) and the sink object of each output form. Used by
the operators, the commit task and ``kinesis-spark leftovers``; not by the Spark job, which
imports only the package's base module and :mod:`~airflow_kinesis_spark.sinks.spark_write`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_kinesis_spark.sinks import OUTPUT_FORMATS, Sink

if TYPE_CHECKING:
    from mypy_boto3_glue import GlueClient
    from airflow_kinesis_spark.core.records import RecordSettings

__all__ = ["SCHEMA_EVOLUTION", "build_sink"]


def build_sink(
    output_format: str,
    output_path: str,
    *,
    table: str | None = None,
    catalog_properties: Mapping[str, str] | None = None,
    partition_by: Sequence[str] | None = None,
    max_records_per_file: int = 0,
    storage_options: Mapping[str, str] | None = None,
    target_file_size: int = 0,
    shared_output: bool = False,
    stream_name: str | None = None,
    consumer_name: str | None = None,
    schema_evolution: str | None = None,
    record_settings: RecordSettings | None = None,
    glue_client: Callable[[], GlueClient] | None = None,
) -> Sink:
    """The sink of an operator's output settings.

    :param output_format: ``parquet``, ``iceberg`` or ``delta``.
    :param output_path: Parquet: the output root; Iceberg: where Spark writes the files (and the
        table's location when it is created); Delta: the table's location.
    :param table: Iceberg only: ``namespace.table``.
    :param catalog_properties: Iceberg only: pyiceberg catalog properties (``type``, ``uri``, ...).
    :param partition_by: Iceberg: fields (default ``day(approximate_arrival_timestamp)``); Delta:
        columns (default ``arrival_date``); not for Parquet.
    :param target_file_size: tables only: target bytes per data file (0: none), turned into a
        rows cap per batch at planning (:meth:`Sink.planned_output_spec`).
    :param shared_output: ``output_path`` is shared by several (stream, consumer) pairs: this
        one's batches go to :func:`~airflow_kinesis_spark.sinks.ownership.consumer_root` (needs
        ``stream_name`` and ``consumer_name``). Otherwise the root belongs to the first (stream,
        consumer) that writes it (:mod:`~airflow_kinesis_spark.sinks.ownership`).
    :param schema_evolution: tables only: ``"none"`` (a batch whose columns the table does not
        hold, or of other types, fails with ``TableCommitError``) or ``"add_columns"`` (new
        columns are added to the table as nullable columns in the batch's own commit; a changed
        type still fails). Default (``None``): ``"add_columns"`` for typed records (a schema
        version that adds fields adds columns), else ``"none"``; Parquet: ``"none"``.
    :param record_settings: how the job decodes records (``core.records.RecordSettings``;
        ``None``: raw).
    :param glue_client: a function returning a boto3 Glue client, for ``record_settings.registry``
        and an Iceberg Glue catalog that names no client settings of its own (``IcebergSink.catalog``).
    :raises ValueError: naming the setting, the problem and the fix.
    """
    typed = record_settings is not None and record_settings.typed
    if schema_evolution is None:
        schema_evolution = "add_columns" if typed and output_format != "parquet" else "none"

    sink = _build_sink(output_format, output_path, table=table, catalog_properties=catalog_properties, partition_by=partition_by,
                       max_records_per_file=max_records_per_file, storage_options=storage_options,
                       target_file_size=target_file_size)  # fmt: skip
    if schema_evolution not in SCHEMA_EVOLUTION:
        raise ValueError(f"schema_evolution must be one of {', '.join(SCHEMA_EVOLUTION)}; got {schema_evolution!r}")
    if schema_evolution != "none" and output_format == "parquet":
        raise ValueError("schema evolution applies to 'iceberg' and 'delta' outputs: Parquet folders have no table schema")
    if shared_output and not (stream_name and consumer_name):
        raise ValueError("shared_output=True needs the task's stream_name and consumer_name")
    from airflow_kinesis_spark.sinks.ownership import consumer_root

    sink.output_path = output_path.rstrip("/")
    sink.shared_output = bool(shared_output)
    sink.batch_root = consumer_root(output_path, stream_name or "", consumer_name or "", bool(shared_output))
    sink.schema_evolution = schema_evolution
    sink.record_settings = record_settings if typed else None
    sink.glue_client = glue_client
    from airflow_kinesis_spark.sinks.parquet import ParquetSink

    if isinstance(sink, ParquetSink):
        sink.output_root = sink.batch_root  # committed records live with the batches
    return sink


#: ``schema_evolution`` values (see :func:`build_sink`).
SCHEMA_EVOLUTION = ("none", "add_columns")


def _build_sink(
    output_format: str, output_path: str, *, table: str | None, catalog_properties: Mapping[str, str] | None,
    partition_by: Sequence[str] | None, max_records_per_file: int, storage_options: Mapping[str, str] | None,
    target_file_size: int,
) -> Sink:  # fmt: skip
    if isinstance(target_file_size, bool) or not isinstance(target_file_size, int) or target_file_size < 0:
        raise ValueError(f"target_file_size must be a number of bytes >= 0 (0: none); got {target_file_size!r}")
    if target_file_size and max_records_per_file:
        raise ValueError("set target_file_size or max_records_per_file, not both")
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"the output format must be one of {', '.join(OUTPUT_FORMATS)}; got {output_format!r}")
    if isinstance(max_records_per_file, bool) or not isinstance(max_records_per_file, int) or max_records_per_file < 0:
        raise ValueError(f"max_records_per_file must be an integer >= 0 (0: no cap); got {max_records_per_file!r}")
    if isinstance(partition_by, str):
        raise ValueError(f"partition_by must be a list of fields, e.g. [{partition_by!r}]; got a string")
    if output_format == "parquet":
        if table or catalog_properties or partition_by or max_records_per_file or target_file_size:
            raise ValueError("table, catalog, partition_by, max_records_per_file and target_file_size apply to 'iceberg' and "
                             "'delta' outputs; a 'parquet' output writes {output_path}/batch_id=N folders")  # fmt: skip
        from airflow_kinesis_spark.sinks.parquet import ParquetSink

        return ParquetSink(output_path, storage_options)
    if output_format == "iceberg":
        if not table:
            raise ValueError("an 'iceberg' output needs a table: the Iceberg identifier 'namespace.table'")
        if not catalog_properties or not catalog_properties.get("type") and not catalog_properties.get("uri"):
            raise ValueError("an 'iceberg' output needs a catalog: catalog_conn_id or catalog_properties with pyiceberg's "
                             "catalog properties, e.g. {'type': 'sql', 'uri': 'sqlite:////path/catalog.db'} or "
                             "{'type': 'glue'}")  # fmt: skip
        from airflow_kinesis_spark.sinks.iceberg import DEFAULT_PARTITION, IcebergSink

        return IcebergSink(table, catalog_properties, output_path, partition_by=DEFAULT_PARTITION if partition_by is None else partition_by,
                           storage_options=storage_options, max_records_per_file=max_records_per_file,
                           target_file_size=target_file_size)  # fmt: skip
    if table or catalog_properties:
        raise ValueError("a 'delta' output takes no table or catalog: the Delta table is at output_path")
    from airflow_kinesis_spark.sinks.delta import DEFAULT_PARTITION as DELTA_PARTITION
    from airflow_kinesis_spark.sinks.delta import DeltaSink

    return DeltaSink(output_path, partition_by=DELTA_PARTITION if partition_by is None else partition_by,
                     storage_options=storage_options, max_records_per_file=max_records_per_file,
                     target_file_size=target_file_size)  # fmt: skip
