"""The output settings every batch task shares: the format and, for a table, where it lives.

Used by :class:`~airflow_kinesis_spark.operators.kinesis_to_spark.KinesisToSparkOperator` (and
the window and split plan operators, which inherit it) and by
:class:`~airflow_kinesis_spark.operators.split.KinesisCommitBatchOperator`, which makes the table
commit of a split task group.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any
from urllib.parse import urlparse

from airflow_kinesis_spark.sinks import OUTPUT_FORMATS, Sink, build_sink

__all__ = ["OutputSettingsMixin", "OUTPUT_TEMPLATE_FIELDS"]

#: Output settings rendered by Jinja.
OUTPUT_TEMPLATE_FIELDS = ("output_format", "table", "catalog_conn_id", "schema_evolution")


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
    :param schema_evolution: tables: ``"none"`` (default: a batch with columns the table does
        not hold, or of other types, fails with ``TableCommitError``, nothing committed) or
        ``"add_columns"`` (new columns are added to the table as nullable columns with the
        batch's commit; a changed type still fails).
    """

    output_format: str
    output_path: str
    aws_conn_id: str | None
    region_name: str | None

    def _init_output(
        self, *, output_format: str = "parquet", table: str | None = None, catalog_conn_id: str | None = None,
        catalog_properties: dict[str, str] | None = None, partition_by: Sequence[str] | None = None,
        max_records_per_file: int = 0, storage_options: dict[str, str] | None = None, target_file_size: int = 0,
        shared_output: bool = False, schema_evolution: str = "none",
    ) -> None:  # fmt: skip
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
                   schema_evolution=self.schema_evolution)  # fmt: skip

    @cached_property
    def sink(self) -> Sink:
        """The output form, with the catalog's and the storage's settings resolved."""
        return build_sink(
            self.output_format, self.output_path, table=self.table, catalog_properties=self._catalog_properties(),
            partition_by=self.partition_by, max_records_per_file=self.max_records_per_file,
            storage_options=self._storage_options(), target_file_size=self.target_file_size, shared_output=self.shared_output,
            stream_name=getattr(self, "stream_name", None), consumer_name=getattr(self, "consumer_name", None),
            schema_evolution=self.schema_evolution,
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
        hook: Any = self.kinesis_hook  # type: ignore[attr-defined]
        creds = hook.get_credentials()
        opts = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key}
        if creds.token:
            opts["AWS_SESSION_TOKEN"] = creds.token
        region = self.region_name or hook.conn_region_name
        if region:
            opts["AWS_REGION"] = region
        endpoint = getattr(hook.conn_config, "endpoint_url", None)
        if endpoint:
            opts["AWS_ENDPOINT_URL"] = endpoint
            if endpoint.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        return {k: v for k, v in opts.items() if v}
