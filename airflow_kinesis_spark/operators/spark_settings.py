"""The Spark settings every task that runs the batch's job shares: where the job runs (the
Spark connection and its submit options), how it reads (``ReadOptions``), which credentials it
gets and the transform it applies.

Used by :class:`~airflow_kinesis_spark.operators.kinesis_to_spark.KinesisToSparkOperator` (and
the window operator, which inherits it); the split task group gives the same arguments to its
job task (docs/split-tasks.md).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.core.transform import check_transform_spec, resolve_transform
from airflow_kinesis_spark.hooks.spark import SparkJob
from airflow_kinesis_spark.hooks.spark_settings import SparkJobSettings, validate_job_credentials
from airflow_kinesis_spark.settings import transform_allowed_modules

__all__ = ["SparkSettingsMixin", "declared_transforms"]


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


class SparkSettingsMixin:
    """The batch job's Spark connection, reader settings, credentials and transform; ``spark_job``
    builds its runner (``hooks.spark.SparkJob``) when a job is needed.

    :param spark_conn_id: the Spark connection: type ``spark`` (spark-submit through the
        apache-spark provider; ``local[*]`` if the connection does not exist) or ``spark_connect``
        (the job runs over Spark Connect against a running server: no JVM start per batch).
    :param spark_conf: extra ``--conf`` of spark-submit (templated, JSON).
    :param spark_py_files: extra ``--py-files`` (comma-separated), e.g. for the transform's module.
    :param get_records_limit: ``Limit`` of each GetRecords call, 1..10,000 (Kinesis API reference).
    :param min_call_interval: seconds between two GetRecords calls on one shard; 0.2 matches the
        service's 5 calls per second per shard.
    :param read_bytes_per_second: the per-shard read budget (bytes per second) the readers pace
        themselves to: after a GetRecords response of B bytes a shard's next call waits
        B / budget seconds. The default, 2 MiB/s, is the service's per-shard read limit
        (Kinesis API reference, GetRecords); lower it when other consumers share the shards'
        budget, or ``None`` for no byte pacing (an emulator without limits).
    :param read_tasks: Spark tasks that read the shard ranges; each task reads its ranges at the
        same time, one thread per range. ``None``: Spark's default parallelism (at most one task
        per range).
    :param spark_connect_reuse_session: over Spark Connect, keep one server session per
        consumer across batches (default ``False``: each batch runs in a session of its own,
        released when the batch ends; it starts its Python workers and uploads the package's
        code, a zip of about 120 KB, again). Kept, its id is an HMAC of stream and consumer names
        keyed by a secret of this worker or the connection's ``session_secret`` extra, so no other
        client can create it first; but the server lists its sessions (event log, UI), and any client of
        the server can join a kept session between batches and run code in the Python workers
        that read the next batches with their credentials. Opt in only on a server whose every
        client you trust (docs/security.md). The server drops a kept session after its idle
        timeout (``spark.connect.session.manager.defaultSessionTimeout``); a session it no longer
        accepts is replaced by a new one.
    :param job_credentials: the AWS credentials the Spark job gets: ``scoped`` (default:
        temporary credentials from STS limited by a session policy to reading this stream; the
        connection's long-lived keys never leave the worker; see
        ``KinesisStreamHook.job_credentials``), ``connection`` (the connection's own credentials)
        or ``none`` (the cluster's own role: instance profile, IRSA, EMR execution role). On YARN
        and Kubernetes masters none are shipped whatever this says.
    :param transform: optional ``package.module:function`` taking and returning a pyspark
        DataFrame, applied before the write. **Not templated**: it is code the job runs, so it is
        written in the DAG file, never taken from run-time input (``dag_run.conf``, ``params``, an
        XCom). A value the task did not get from its DAG file (a template, an XComArg, a mapped
        task expanded over run-time values) is refused with ``ValueError``. Its module may not be
        in Python's standard library and, when the provider's ``[kinesis_spark]
        transform_allowed_modules`` option lists module prefixes, must be under one of them
        (checked before anything is imported).
    """

    spark_conn_id: str
    spark_conf: dict[str, Any] | None
    spark_py_files: str | None
    get_records_limit: int
    min_call_interval: float
    read_bytes_per_second: float | None
    read_tasks: int | None
    spark_connect_reuse_session: bool
    job_credentials: str
    transform: str | None
    checkpoint_table: str
    task_id: str
    kinesis_hook: Any
    checkpoint_hook: Any

    def _init_spark(
        self, *, spark_conn_id: str, spark_conf: dict[str, Any] | None, spark_py_files: str | None, get_records_limit: int,
        min_call_interval: float, read_bytes_per_second: float | None, read_tasks: int | None,
        spark_connect_reuse_session: bool, job_credentials: str, transform: str | None,
    ) -> None:  # fmt: skip
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.spark_py_files = spark_py_files
        self.get_records_limit = get_records_limit
        self.min_call_interval = min_call_interval
        self.read_bytes_per_second = read_bytes_per_second
        self.read_tasks = read_tasks
        self.spark_connect_reuse_session = spark_connect_reuse_session
        self.job_credentials = job_credentials
        self.transform = transform

    def validate_spark(self) -> None:
        """Check the reader settings, the credentials mode and the transform, before any I/O.

        :raises ValueError: naming the argument, the problem and the fix.
        """
        self.read_options  # noqa: B018 - builds and checks the reader settings
        validate_job_credentials(self.job_credentials)
        if self.transform:
            self._check_transform()

    def _check_transform(self) -> None:
        """The transform is the one the DAG file gives this task, and it may be imported: its
        module is allowed (:func:`transform_allowed_modules`). Without ``spark_py_files`` it is
        imported here too (after that check); with them the module need not import here, and the
        job checks it before reading anything.

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
        if not self.spark_py_files:
            resolve_transform(spec, allowed)

    @cached_property
    def read_options(self) -> ReadOptions:
        """The job's reader settings (validated: :class:`ValueError` names the argument)."""
        return ReadOptions(
            limit=self.get_records_limit,
            min_call_interval=self.min_call_interval,
            read_bytes_per_second=self.read_bytes_per_second,
            read_tasks=self.read_tasks,
        )

    @cached_property
    def spark_job(self) -> SparkJob:
        """Where the batch's Spark job runs (the runner for the
        ``spark_conn_id`` connection, chosen when a job is needed)."""
        settings = SparkJobSettings(
            spark_conn_id=self.spark_conn_id, kinesis_hook=self.kinesis_hook, read_options=self.read_options,
            transform=self.transform, transform_allowed_modules=transform_allowed_modules(),
            spark_conf=dict(self.spark_conf or {}), py_files=self.spark_py_files,
            reuse_connect_session=self.spark_connect_reuse_session, job_credentials=self.job_credentials,
            checkpoint_hook=self.checkpoint_hook if self.checkpoint_table else None,
        )  # fmt: skip
        return SparkJob(settings, session_scope=type(self).__name__)

    def on_kill(self) -> None:
        """Kill the batch's Spark job, if this task started one."""
        if "spark_job" in self.__dict__:
            self.spark_job.kill()
