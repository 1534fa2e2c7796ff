"""The output of a task: its settings objects (``output_settings``, ``record_settings``) turned into
the output form (``sink``), with the catalog's and the storage's settings resolved from Airflow
connections.

Used by every batch operator (``operators.base``), by
:class:`~airflow_kinesis_spark.operators.split.KinesisCommitBatchOperator`, which makes the table
commit of a split task group, and by
:class:`~airflow_kinesis_spark.operators.tables.KinesisTableCompactionOperator`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow_kinesis_spark.core.records import RecordSettings
from airflow_kinesis_spark.operators.settings import OutputSettings, task_copy
from airflow_kinesis_spark.sinks import OUTPUT_FORMATS, Sink
from airflow_kinesis_spark.sinks.build import build_sink

if TYPE_CHECKING:  # the boto3 stubs (mypy-boto3-glue): annotations only
    from mypy_boto3_glue import GlueClient

__all__ = ["OutputSettingsMixin", "check_local_output"]


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
    """The output settings of a task (:class:`~airflow_kinesis_spark.operators.settings.OutputSettings`
    as ``output_settings``, :class:`~airflow_kinesis_spark.core.records.RecordSettings` as ``record_settings``);
    ``sink`` builds the output form (``airflow_kinesis_spark.sinks``) from them.
    """

    output_settings: OutputSettings
    record_settings: RecordSettings
    output_path: str
    aws_conn_id: str | None
    region_name: str | None
    aws_hook_kwargs: dict[str, Any]

    def _init_output(self, output_settings: OutputSettings | None, record_settings: RecordSettings | None) -> None:
        """Keep copies of the settings objects (their defaults when ``None``): copies, so rendering
        this task never writes into an object other tasks (or a mapped task's ``partial``) share.

        :raises TypeError: ``output_settings`` or ``record_settings`` is not the settings object.
        """
        self.output_settings = task_copy("output_settings", output_settings, OutputSettings)
        self.record_settings = task_copy("record_settings", record_settings, RecordSettings)

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render a copy of the settings objects (their ``template_fields``), so a rendered value
        never reaches another task or run that shares the object the DAG file built."""
        self.output_settings = replace(self.output_settings)
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]

    def validate_output(self) -> None:
        """Check the output settings without I/O (after rendering).

        :raises ValueError: naming the setting, the problem and the fix.
        """
        o = self.output_settings
        if o.format not in OUTPUT_FORMATS:
            raise ValueError(f"OutputSettings.format must be one of {', '.join(OUTPUT_FORMATS)}; got {o.format!r}")
        props = dict(o.catalog_properties or {}) or ({"type": "from connection"} if o.catalog_conn_id else None)
        self._build_sink(self.output_path or "unset", props, None, placeholder="unset")

    def _build_sink(self, path: str, catalog_properties: dict[str, str] | None, storage_options: dict[str, str] | None,
                    placeholder: str | None = None, glue_client: Callable[[], GlueClient] | None = None) -> Sink:  # fmt: skip
        o = self.output_settings
        return build_sink(
            o.format, path, table=o.table, catalog_properties=catalog_properties, partition_by=o.partition_by,
            max_records_per_file=o.max_records_per_file, storage_options=storage_options,
            target_file_size=o.target_file_size, shared_output=o.shared_output,
            stream_name=getattr(self, "stream_name", None) or placeholder,
            consumer_name=getattr(self, "consumer_name", None) or placeholder,
            schema_evolution=o.schema_evolution, record_settings=self.record_settings, glue_client=glue_client,
        )  # fmt: skip

    def _glue_client(self) -> GlueClient:
        """A Glue client of ``aws_conn_id``, with ``verify`` and ``botocore_config`` (AWS Glue Schema
        Registry, and an Iceberg Glue catalog without credentials of its own)."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(client_type="glue", **self.aws_hook_kwargs).get_conn()

    @cached_property
    def sink(self) -> Sink:
        """The output form, with the catalog's and the storage's settings resolved."""
        return self._build_sink(self.output_path, self._catalog_properties(), self._storage_options(),
                                glue_client=self._glue_client)  # fmt: skip

    @property
    def output_root(self) -> str:
        """Where this (stream, consumer)'s batches go: ``output_path``, or its consumer folder
        with ``shared_output`` (``sinks.ownership.consumer_root``)."""
        from airflow_kinesis_spark.sinks.ownership import consumer_root

        return consumer_root(self.output_path, getattr(self, "stream_name", ""), getattr(self, "consumer_name", ""),
                             self.output_settings.shared_output)  # fmt: skip

    def _catalog_properties(self) -> dict[str, str] | None:
        if self.output_settings.format != "iceberg":
            return None
        props: dict[str, str] = {}
        if conn_id := self.output_settings.catalog_conn_id:
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection(conn_id)
            props.update({k: str(v) for k, v in (conn.extra_dejson or {}).items()})
            if conn.host and "uri" not in props:
                props["uri"] = conn.host
            if conn.password and props.get("type") == "rest" and "credential" not in props:
                props["credential"] = f"{conn.login}:{conn.password}" if conn.login else conn.password
            props.setdefault("name", conn_id)
        props.update(self.output_settings.catalog_properties or {})
        return props

    def _storage_options(self) -> dict[str, str] | None:
        if urlparse(self.output_path).scheme not in ("s3", "s3a", "s3n"):
            return dict(self.output_settings.storage_options or {}) or None
        return {**self._aws_storage_options(), **(self.output_settings.storage_options or {})}

    def _aws_storage_options(self) -> dict[str, str]:
        """Credentials, region, endpoint and CA bundle (``verify``'s path) of ``aws_conn_id`` in
        delta-rs's key names (``sinks.files.aws_storage_options``)."""
        from airflow_kinesis_spark.sinks.files import aws_storage_options

        hook: Any = self.kinesis_hook  # type: ignore[attr-defined]
        return aws_storage_options(hook.get_credentials(), self.region_name or hook.conn_region_name,
                                   getattr(hook.conn_config, "endpoint_url", None), hook.verify)  # fmt: skip
