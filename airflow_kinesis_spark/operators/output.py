"""The output settings every batch task shares: the format and, for a table, where it lives.

Used by :class:`~airflow_kinesis_spark.operators.kinesis_to_spark.KinesisToSparkOperator` (and
the window and split plan operators, which inherit it) and by
:class:`~airflow_kinesis_spark.operators.split.KinesisCommitBatchOperator`, which makes the table
commit of a split task group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow_kinesis_spark.core.records import DEFAULT_MAX_DEAD_LETTER_FRACTION, RecordSettings
from airflow_kinesis_spark.sinks import OUTPUT_FORMATS, Sink, build_sink

__all__ = ["OutputSettingsMixin", "OUTPUT_TEMPLATE_FIELDS", "RECORD_ARGUMENTS", "check_local_output"]

#: Output settings rendered by Jinja.
OUTPUT_TEMPLATE_FIELDS = ("output_format", "table", "catalog_conn_id", "schema_evolution")
#: The record settings every batch task takes (``core.records.RecordSettings``), by argument name.
RECORD_ARGUMENTS = ("record_format", "record_schema", "record_message", "schema_registry", "keep_raw_data",
                    "max_dead_letter_fraction")  # fmt: skip


def check_local_output(path: str) -> None:
    """Fail early when a local output path cannot be written (remote paths are Spark's to check).

    :raises ValueError: a part of the path is a file, or the nearest existing directory is not writable.
    """
    parsed = urlparse(path)
    if parsed.scheme not in ("", "file"):
        return
    local = Path(parsed.path if parsed.scheme else path)
    probe = local
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"output_path {path!r} cannot be written: {str(probe)!r} is a file, not a directory")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"output_path {path!r} cannot be written: no write permission on {str(probe)!r}")


class OutputSettingsMixin:
    """``output_format`` (``parquet``, ``iceberg``, ``delta``) and the table settings; ``sink``
    builds the output form (``airflow_kinesis_spark.sinks``).

    :param output_format: ``parquet`` (``{output_path}/batch_id=N`` folders with committed
        records), ``iceberg`` (a table in a catalog; Spark writes its files under
        ``output_path``) or ``delta`` (the table at ``output_path``). Default ``parquet``.
    :param table: Iceberg: ``namespace.table``.
    :param catalog_conn_id: Iceberg: an Airflow connection whose extra holds pyiceberg's catalog
        properties (``{"type": "glue"}``, ``{"type": "sql", "uri": "postgresql+psycopg2://..."}``,
        ``{"type": "rest", "uri": "https://..."}``); its login/password/host fill ``credential``
        and ``uri`` of a REST catalog when set.
    :param catalog_properties: Iceberg: the properties themselves (over the connection's).
    :param partition_by: Iceberg: partition fields, ``transform(column)`` with ``year``,
        ``month``, ``day``, ``hour``, or a column name (default
        ``["day(approximate_arrival_timestamp)"]``). Delta: partition columns (default
        ``["arrival_date"]``, the UTC arrival date the job adds). ``[]``: unpartitioned.
    :param max_records_per_file: cap on rows per data file (Spark's ``maxRecordsPerFile``;
        0: none). Otherwise each Spark task writes one file per partition value it holds.
    :param target_file_size: tables: target bytes per data file (0: none); each plan turns it
        into a rows cap from the stored bytes per row of the table's latest commit (the first
        batch of a new table has none). Not with ``max_records_per_file``.
    :param storage_options: delta-rs storage options for an ``s3://`` table (locking provider,
        ...); credentials, region and endpoint come from ``aws_conn_id`` when not set.
    :param shared_output: ``output_path`` (and an Iceberg ``table``) is shared by several
        (stream, consumer) pairs: each writes its batches under
        ``{output_path}/stream={stream}/consumer={consumer}``, so none collide. Default
        ``False``: the first (stream, consumer) that writes the root owns it (recorded in
        ``{output_path}/_kinesis_spark_output.json``), and any other fails before reading
        (``OutputOwnedError``). Every task writing a shared root must set it.
    :param schema_evolution: tables: ``"none"`` (a batch with columns the table does not hold,
        or of other types, fails with ``TableCommitError``, nothing committed) or
        ``"add_columns"`` (new columns are added to the table as nullable columns with the
        batch's commit; a changed type still fails). Default: ``"add_columns"`` with a typed
        ``record_format``, else ``"none"``.
    :param record_format: what a record's bytes hold (docs/typed-records.md): ``"raw"``
        (default: the ``data`` column), ``"json"``, ``"avro"`` or ``"protobuf"``: decoded into
        typed columns beside the metadata columns (``core.records``).
    :param record_schema: the schema inline: Avro schema JSON; JSON Schema or a Spark DDL
        string; base64 of a serialized Protobuf ``FileDescriptorSet``. Or ``schema_registry``.
    :param record_message: ``protobuf``: the message's full name.
    :param schema_registry: AWS Glue Schema Registry's schema, ``{"registry_name": ...,
        "schema_name": ...}`` or ``{"schema_arn": ...}``; records in its wire format, each decoded
        with the version it names; read with ``aws_conn_id``'s credentials (its role for a schema
        of another account).
    :param keep_raw_data: typed records: keep the ``data`` column too (default ``False``).
    :param max_dead_letter_fraction: typed records: a batch (or window) with more dead letters
        than this fraction of its records fails, nothing committed (default 0.01).
    """

    output_format: str
    output_path: str
    aws_conn_id: str | None
    region_name: str | None
    aws_hook_kwargs: dict[str, Any]

    def _init_output(
        self, *, output_format: str = "parquet", table: str | None = None, catalog_conn_id: str | None = None,
        catalog_properties: dict[str, str] | None = None, partition_by: Sequence[str] | None = None,
        max_records_per_file: int = 0, storage_options: dict[str, str] | None = None, target_file_size: int = 0,
        shared_output: bool = False, schema_evolution: str | None = None, record_format: str = "raw",
        record_schema: str | None = None, record_message: str | None = None, schema_registry: dict[str, str] | None = None,
        keep_raw_data: bool = False, max_dead_letter_fraction: float = DEFAULT_MAX_DEAD_LETTER_FRACTION,
    ) -> None:  # fmt: skip
        self.record_format = record_format
        self.record_schema = record_schema
        self.record_message = record_message
        self.schema_registry = schema_registry
        self.keep_raw_data = keep_raw_data
        self.max_dead_letter_fraction = max_dead_letter_fraction
        self.output_format = output_format
        self.shared_output = shared_output
        self.schema_evolution = schema_evolution
        self.target_file_size = target_file_size
        self.table = table
        self.catalog_conn_id = catalog_conn_id
        self.catalog_properties = catalog_properties
        self.partition_by = list(partition_by) if partition_by is not None and not isinstance(partition_by, str) else partition_by
        self.max_records_per_file = max_records_per_file
        self.storage_options = storage_options

    def validate_output(self) -> None:
        """Check the output settings without I/O.

        :raises ValueError: naming the setting, the problem and the fix.
        """
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}; got {self.output_format!r}")
        props = dict(self.catalog_properties or {}) or ({"type": "from connection"} if self.catalog_conn_id else None)
        build_sink(self.output_format, self.output_path or "unset", table=self.table, catalog_properties=props,
                   partition_by=self.partition_by, max_records_per_file=self.max_records_per_file,
                   target_file_size=self.target_file_size, shared_output=self.shared_output,
                   stream_name=getattr(self, "stream_name", None) or "unset", consumer_name=getattr(self, "consumer_name", None) or "unset",
                   schema_evolution=self.schema_evolution, record_settings=self.record_settings)  # fmt: skip

    @property
    def record_settings(self) -> RecordSettings:
        """How the job decodes records (``core.records.RecordSettings``).

        :raises ValueError: naming the setting, the problem and the fix (an inline schema that
            does not convert included).
        """
        return RecordSettings(self.record_format, schema=self.record_schema, message=self.record_message,
                              registry=self.schema_registry, keep_raw_data=self.keep_raw_data,
                              max_dead_letter_fraction=self.max_dead_letter_fraction)  # fmt: skip

    def _glue_client(self) -> Any:
        """A Glue client of ``aws_conn_id`` (AWS Glue Schema Registry)."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(client_type="glue", **self.aws_hook_kwargs).get_conn()

    @cached_property
    def sink(self) -> Sink:
        """The output form, with the catalog's and the storage's settings resolved."""
        return build_sink(
            self.output_format, self.output_path, table=self.table, catalog_properties=self._catalog_properties(),
            partition_by=self.partition_by, max_records_per_file=self.max_records_per_file,
            storage_options=self._storage_options(), target_file_size=self.target_file_size, shared_output=self.shared_output,
            stream_name=getattr(self, "stream_name", None), consumer_name=getattr(self, "consumer_name", None),
            schema_evolution=self.schema_evolution, record_settings=self.record_settings, glue_client=self._glue_client,
        )  # fmt: skip

    @property
    def output_root(self) -> str:
        """Where this (stream, consumer)'s batches go: ``output_path``, or its consumer folder
        with ``shared_output`` (``sinks.ownership.consumer_root``)."""
        from airflow_kinesis_spark.sinks.ownership import consumer_root

        return consumer_root(self.output_path, getattr(self, "stream_name", ""), getattr(self, "consumer_name", ""), self.shared_output)

    def _catalog_properties(self) -> dict[str, str] | None:
        if self.output_format != "iceberg":
            return None
        props: dict[str, str] = {}
        if self.catalog_conn_id:
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection(self.catalog_conn_id)
            props.update({k: str(v) for k, v in (conn.extra_dejson or {}).items()})
            if conn.host and "uri" not in props:
                props["uri"] = conn.host
            if conn.password and props.get("type") == "rest" and "credential" not in props:
                props["credential"] = f"{conn.login}:{conn.password}" if conn.login else conn.password
            props.setdefault("name", self.catalog_conn_id)
        props.update(self.catalog_properties or {})
        if props.get("type") == "glue" and not any(k.startswith(("glue.access-key-id", "client.access-key-id")) for k in props):
            props.update(self._aws_client_properties())
        return props

    def _aws_client_properties(self) -> dict[str, str]:
        """pyiceberg ``client.*`` properties (Glue and S3) from ``aws_conn_id``."""
        opts = self._aws_storage_options()
        names = {"AWS_ACCESS_KEY_ID": "client.access-key-id", "AWS_SECRET_ACCESS_KEY": "client.secret-access-key",
                 "AWS_SESSION_TOKEN": "client.session-token", "AWS_REGION": "client.region"}  # fmt: skip
        props = {names[k]: v for k, v in opts.items() if k in names}
        if opts.get("AWS_ENDPOINT_URL"):
            props["glue.endpoint"] = opts["AWS_ENDPOINT_URL"]
        return props

    def _storage_options(self) -> dict[str, str] | None:
        if urlparse(self.output_path).scheme not in ("s3", "s3a", "s3n"):
            return dict(self.storage_options or {}) or None
        return {**self._aws_storage_options(), **(self.storage_options or {})}

    def _aws_storage_options(self) -> dict[str, str]:
        """Credentials, region and endpoint of ``aws_conn_id`` in delta-rs's key names."""
        from airflow_kinesis_spark.sinks.files import aws_storage_options

        hook: Any = self.kinesis_hook  # type: ignore[attr-defined]
        return aws_storage_options(hook.get_credentials(), self.region_name or hook.conn_region_name,
                                   getattr(hook.conn_config, "endpoint_url", None))  # fmt: skip
