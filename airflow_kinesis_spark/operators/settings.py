"""The settings objects of the batch operators: where the output goes (:class:`OutputSettings`),
how records are decoded (:class:`RecordSettings`), how the job reads (:class:`ReadOptions`) and
where it runs (:class:`SparkSettings`).

One object per concept, given to every task that needs it::

    output = OutputSettings(format="iceberg", table="lake.orders", catalog_conn_id="iceberg_catalog")
    KinesisToSparkOperator(task_id="ingest", ..., output_settings=output, spark_settings=SparkSettings(conn_id="spark_prod"))
    KinesisTableCompactionOperator(task_id="compact", output_path=..., output_settings=output)

``kinesis_batch_task_group`` gives its ``output_settings`` and ``record_settings`` to both its plan and its commit
task. :class:`OutputSettings` and :class:`SparkSettings` are rendered by Jinja where their
``template_fields`` say (the operator renders the objects it holds); :class:`RecordSettings` and
:class:`ReadOptions` are checked when they are built, in the DAG file.

The arguments these objects replace (``output_format``, ``spark_conn_id``, ``record_format``,
``get_records_limit``, ...) are refused with a :class:`TypeError` that names the new spelling
(:func:`refuse_moved_arguments`).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from airflow_kinesis_spark.core.read_options import ReadOptions as ReadOptions
from airflow_kinesis_spark.core.records import RecordSettings as RecordSettings

# ReadOptions and RecordSettings are documented where they are defined (core.read_options, core.records).
__all__ = ["MOVED_ARGUMENTS", "OutputSettings", "SparkSettings", "refuse_moved_arguments", "task_copy"]

_S = TypeVar("_S")

#: Words in a key of ``catalog_properties``, ``storage_options`` or ``conf`` whose value the
#: settings' ``repr`` hides: Airflow shows a rendered settings object as its ``repr`` (the task's
#: rendered template fields), where its secret masking sees one string, not the keys.
_SECRET_WORDS = ("secret", "password", "token", "credential", "key")


def _masked(mapping: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if mapping is None:
        return None
    return {k: "***" if any(w in str(k).lower() for w in _SECRET_WORDS) else v for k, v in mapping.items()}


def _repr(obj: Any, secret_maps: Sequence[str]) -> str:
    """``Class(field=value, ...)`` with the values of secret-looking keys of ``secret_maps`` hidden."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    values.update({name: _masked(values[name]) for name in secret_maps})
    return f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


@dataclass(repr=False)
class OutputSettings:
    """The output's form and, for a table, where it lives (docs/output.md). The output root itself
    is each operator's ``output_path``.

    :param format: ``parquet`` (``{output_path}/batch_id=N`` folders with committed records),
        ``iceberg`` (a table in a catalog; Spark writes its files under ``output_path``) or
        ``delta`` (the table at ``output_path``). Default ``parquet`` (templated).
    :param table: Iceberg: ``namespace.table`` (templated).
    :param catalog_conn_id: Iceberg: an Airflow connection whose extra holds pyiceberg's catalog
        properties (``{"type": "glue"}``, ``{"type": "sql", "uri": "postgresql+psycopg2://..."}``,
        ``{"type": "rest", "uri": "https://..."}``); its login/password/host fill ``credential``
        and ``uri`` of a REST catalog when set (templated).
    :param catalog_properties: Iceberg: the properties themselves (over the connection's).
    :param partition_by: Iceberg: partition fields, ``transform(column)`` with ``year``,
        ``month``, ``day``, ``hour``, or a column name (default
        ``["day(approximate_arrival_timestamp)"]``). Delta: partition columns (default
        ``["arrival_date"]``, the UTC arrival date the job adds). ``[]``: unpartitioned.
    :param max_records_per_file: cap on rows per data file (Spark's ``maxRecordsPerFile``;
        0: none). Otherwise each Spark task writes one file per partition value it holds.
    :param target_file_size: tables: target bytes per data file (0: none); each plan turns it
        into a rows cap from the stored bytes per row of the table's latest commit (the first
        batch of a new table has none). Not with ``max_records_per_file``. For
        ``KinesisTableCompactionOperator`` on Delta: the compacted files' size.
    :param storage_options: delta-rs storage options for an ``s3://`` table (locking provider,
        ...); credentials, region and endpoint come from the task's ``aws_conn_id`` when not set.
    :param shared_output: ``output_path`` (and an Iceberg ``table``) is shared by several
        (stream, consumer) pairs: each writes its batches under
        ``{output_path}/stream={stream}/consumer={consumer}``, so none collide. Default
        ``False``: the first (stream, consumer) that writes the root owns it (recorded in
        ``{output_path}/_kinesis_spark_output.json``), and any other fails before reading
        (``OutputOwnedError``). Every task writing a shared root must set it.
    :param schema_evolution: tables: ``"none"`` (a batch with columns the table does not hold,
        or of other types, fails with ``TableCommitError``, nothing committed) or
        ``"add_columns"`` (new columns are added to the table as nullable columns with the
        batch's commit; a changed type still fails). Default: ``"add_columns"`` with typed
        records (:class:`RecordSettings` other than ``raw``), else ``"none"`` (templated).

    Checked (``sinks.build.build_sink``) when a task validates its arguments, after rendering:
    :class:`ValueError` names the setting, the problem and the fix. Its ``repr`` (what Airflow
    shows as the rendered template field) hides the values of ``catalog_properties`` and
    ``storage_options`` keys that name a secret, password, token, credential or key.
    """

    #: Rendered by Jinja inside an operator's ``output_settings`` (Airflow renders a nested object's own
    #: ``template_fields``).
    template_fields: ClassVar[Sequence[str]] = ("format", "table", "catalog_conn_id", "schema_evolution")

    format: str = "parquet"
    table: str | None = None
    catalog_conn_id: str | None = None
    catalog_properties: Mapping[str, str] | None = None
    partition_by: Sequence[str] | None = None
    max_records_per_file: int = 0
    target_file_size: int = 0
    storage_options: Mapping[str, str] | None = None
    shared_output: bool = False
    schema_evolution: str | None = None

    def __post_init__(self) -> None:
        if self.partition_by is not None and not isinstance(self.partition_by, str):
            self.partition_by = list(self.partition_by)

    def __repr__(self) -> str:
        return _repr(self, ("catalog_properties", "storage_options"))


@dataclass(repr=False)
class SparkSettings:
    """Where the batch's Spark job runs and with which credentials.

    :param conn_id: the Spark connection: type ``spark`` (spark-submit through the apache-spark
        provider; ``local[*]`` if the connection does not exist) or ``spark_connect`` (the job
        runs over Spark Connect against a running server: no JVM start per batch). Default
        ``spark_default``.
    :param conf: extra ``--conf`` of spark-submit (templated, JSON).
    :param py_files: extra ``--py-files`` (comma-separated), e.g. for the transform's module.
    :param connect_reuse_session: over Spark Connect, keep one server session per consumer
        across batches (default ``False``: each batch runs in a session of its own, released
        when the batch ends; it starts its Python workers and uploads the package's code, a zip
        of about 120 KB, again). Kept, its id is an HMAC of stream and consumer names keyed by a
        secret of this worker or the connection's ``session_secret`` extra, so no other client
        can create it first; but the server lists its sessions (event log, UI), and any client
        of the server can join a kept session between batches and run code in the Python
        workers that read the next batches with their credentials. Opt in only on a server
        whose every client you trust (docs/security.md). The server drops a kept session after
        its idle timeout (``spark.connect.session.manager.defaultSessionTimeout``); a session it
        no longer accepts is replaced by a new one.
    :param job_credentials: the AWS credentials the Spark job gets: ``scoped`` (default:
        temporary credentials from STS limited by a session policy to reading this stream; the
        connection's long-lived keys never leave the worker; see
        ``KinesisStreamHook.job_credentials``), ``connection`` (the connection's own
        credentials) or ``none`` (the cluster's own role: instance profile, IRSA, EMR execution
        role). On YARN and Kubernetes masters none are shipped whatever this says.

    Checked when a task validates its arguments: :class:`ValueError` names the setting. Its
    ``repr`` hides the values of ``conf`` keys that name a secret, password, token, credential or key.
    """

    #: Rendered by Jinja inside an operator's ``spark_settings``.
    template_fields: ClassVar[Sequence[str]] = ("conf",)

    conn_id: str = "spark_default"
    conf: dict[str, Any] | None = field(default=None)
    py_files: str | None = None
    connect_reuse_session: bool = False
    job_credentials: str = "scoped"

    def __repr__(self) -> str:
        return _repr(self, ("conf",))


#: The former flat arguments of the batch operators, by name: the settings object and the field
#: that hold them now.
MOVED_ARGUMENTS: dict[str, str] = {
    **{old: f"output_settings=OutputSettings({new}=...)" for old, new in (
        ("output_format", "format"), ("table", "table"), ("catalog_conn_id", "catalog_conn_id"),
        ("catalog_properties", "catalog_properties"), ("partition_by", "partition_by"),
        ("max_records_per_file", "max_records_per_file"), ("target_file_size", "target_file_size"),
        ("storage_options", "storage_options"), ("shared_output", "shared_output"),
        ("schema_evolution", "schema_evolution"))},
    **{old: f"record_settings=RecordSettings({new}=...)" for old, new in (
        ("record_format", "format"), ("record_schema", "schema"), ("record_message", "message"),
        ("schema_registry", "registry"), ("keep_raw_data", "keep_raw_data"),
        ("max_dead_letter_fraction", "max_dead_letter_fraction"))},
    **{old: f"read_options=ReadOptions({new}=...)" for old, new in (
        ("get_records_limit", "limit"), ("min_call_interval", "min_call_interval"),
        ("read_bytes_per_second", "read_bytes_per_second"), ("read_tasks", "read_tasks"))},
    **{old: f"spark_settings=SparkSettings({new}=...)" for old, new in (
        ("spark_conn_id", "conn_id"), ("spark_conf", "conf"), ("spark_py_files", "py_files"),
        ("spark_connect_reuse_session", "connect_reuse_session"), ("job_credentials", "job_credentials"))},
}  # fmt: skip


def refuse_moved_arguments(task: str, kwargs: Mapping[str, Any], takes: Collection[str]) -> None:
    """Refuse the arguments that moved into a settings object, naming where each went, or that
    it does not apply to ``task`` (whose settings arguments are ``takes``).

    Old names in the task's ``default_args`` (which Airflow would drop without a word) get a
    :class:`UserWarning` naming their new spelling.

    :raises TypeError: ``"<task> takes its settings as objects now (from
        airflow_kinesis_spark.operators.settings): output_format -> output_settings=OutputSettings(format=...);
        spark_conn_id: no Spark settings here (spark_settings is not an argument of <task>)"``.
    """
    stale = sorted(set(kwargs.get("default_args") or {}) & set(MOVED_ARGUMENTS))
    if stale:  # Airflow fills only declared arguments from default_args: these would be dropped without a word
        warnings.warn(f"{task} ignores default_args {', '.join(stale)}: they moved into settings objects "
                      f"({'; '.join(f'{n} -> {MOVED_ARGUMENTS[n]}' for n in stale)}); pass those to the task instead",
                      UserWarning, stacklevel=3)  # fmt: skip
    moved = []
    for name in sorted(set(kwargs) & set(MOVED_ARGUMENTS)):
        target = MOVED_ARGUMENTS[name]
        argument = target.split("=", 1)[0]
        moved.append(f"{name} -> {target}" if argument in takes else f"{name}: {argument} is not an argument of {task}")
    if moved:
        raise TypeError(f"{task} takes its settings as objects now (from airflow_kinesis_spark.operators.settings): "
                        f"{'; '.join(moved)}")  # fmt: skip


def task_copy(name: str, value: _S | None, cls: type[_S]) -> _S:
    """A task's own settings object from the argument ``name``: ``cls()`` when ``value`` is
    ``None``, else a copy of a mutable one (:class:`OutputSettings`, :class:`SparkSettings`), so
    rendering one task never writes into an object other tasks or a mapped task's ``partial``
    share; a frozen one (:class:`RecordSettings`, :class:`ReadOptions`) is kept as it is.

    :raises TypeError: ``"<name> must be an instance of <cls> (airflow_kinesis_spark.operators.settings); got dict"``.
    """
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be an instance of {cls.__name__} (airflow_kinesis_spark.operators.settings); "
                        f"got {type(value).__name__}")  # fmt: skip
    return replace(value) if isinstance(value, (OutputSettings, SparkSettings)) else value
