"""What every Spark runner shares: its settings (:class:`SparkJobSettings`, with the job's AWS
environment and credentials) and how a run reads in messages.

The spark-submit runner (``hooks.spark``) and the Spark Connect runner (``hooks.spark_connect``)
use these; this module imports neither. Log lines keep the logger of ``hooks.spark``
(``airflow_kinesis_spark.hooks.spark``), where they were written before this module held them.
No Airflow import.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.read_options import ReadOptions

if TYPE_CHECKING:
    from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

# The logger of ``hooks.spark``, where these lines were written before this module held them:
# logging configurations and readers of the task log filter on it.
log = logging.getLogger("airflow_kinesis_spark.hooks.spark")

__all__ = ["JOB_CREDENTIALS", "validate_job_credentials", "SparkJobSettings", "describe", "after_failure"]

#: What the job's AWS credentials may be: temporary and scoped to the stream (default), the
#: connection's own, or none (the cluster's own role: instance profile, IRSA, EMR execution role).
JOB_CREDENTIALS = ("scoped", "connection", "none")


def validate_job_credentials(value: str) -> str:
    """Return ``value`` if it is one of :data:`JOB_CREDENTIALS`.

    :raises ValueError: naming the allowed values.
    """
    if value not in JOB_CREDENTIALS:
        raise ValueError(f"job_credentials must be one of {', '.join(JOB_CREDENTIALS)}; got {value!r}")
    return value


@dataclass
class SparkJobSettings:
    """What every runner needs besides the plan.

    :param kinesis_hook: gives the job's AWS environment (region, endpoint, credentials).
    :param transform: optional ``package.module:function`` applied before the write.
    :param read_options: the readers' settings.
    :param spark_conf: extra Spark conf (spark-submit ``--conf``).
    :param py_files: extra ``--py-files`` / Connect artifacts (comma-separated).
    :param transform_allowed_modules: the module prefixes ``transform`` may come from (the
        provider's ``[kinesis_spark] transform_allowed_modules``; ``()``: any module outside the
        standard library). The job checks the module that defines the function against them too.
    :param reuse_connect_session: over Spark Connect, keep one server session per consumer across
        batches (its id keyed by this worker's secret, see :func:`connect_session_id`) instead of
        a session of the batch's own, released when it ends. Off by default: a kept session can
        be joined between batches by any client that can reach the server (see
        :class:`SparkConnectJob`).
    :param job_credentials: what AWS credentials the job gets (:data:`JOB_CREDENTIALS`):
        ``scoped`` (default: temporary, limited to reading the stream), ``connection`` (the
        connection's own) or ``none`` (the cluster's own role).
    :param checkpoint_hook: the checkpoint store's hook (``DynamoDBCheckpointHook``): its
        DynamoDB endpoint goes to a job that takes its batch from the store.
    """

    spark_conn_id: str
    kinesis_hook: KinesisStreamHook
    read_options: ReadOptions = field(default_factory=ReadOptions)
    transform: str | None = None
    spark_conf: dict[str, Any] = field(default_factory=dict)
    py_files: str | None = None
    transform_allowed_modules: tuple[str, ...] = ()
    reuse_connect_session: bool = False
    job_credentials: str = "scoped"
    checkpoint_hook: Any = None

    def __post_init__(self) -> None:
        validate_job_credentials(self.job_credentials)

    def aws_environment(
        self, stream_name: str, *, output_location: str | None = None, checkpoint_table: str | None = None,
        store_key: str | None = None, cluster_role: bool = False,
    ) -> dict[str, str]:  # fmt: skip
        """The job's AWS environment: region, endpoints (Kinesis; DynamoDB from ``checkpoint_hook``)
        and, unless the job uses its cluster's own role (``job_credentials='none'``, or
        ``cluster_role``), credentials: scoped to reading ``stream_name``, writing
        ``output_location`` and, with ``checkpoint_table``, the consumer's items (``store_key``) of
        the checkpoint table (``'scoped'``, :meth:`KinesisStreamHook.job_credentials`), or the
        connection's own (``'connection'``)."""
        hook = self.kinesis_hook
        if cluster_role or self.job_credentials == "none":
            env = hook.spark_environment(None)
        elif self.job_credentials == "connection":
            env = hook.spark_environment(hook.connection_credentials())
        else:
            env = hook.spark_environment(hook.job_credentials(
                stream_name, output_location=output_location, checkpoint_table=checkpoint_table, store_key=store_key,
            ))  # fmt: skip
        if checkpoint_table and self.checkpoint_hook is not None:
            endpoint = self.checkpoint_hook.conn_config.get_service_endpoint_url("dynamodb")
            if endpoint:
                env["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
        return env


def describe(arguments: JobArguments) -> str:
    """``batch N`` or ``window LABEL`` (``core.window.window_label``), for messages."""
    return f"window {arguments.window}" if arguments.window else f"batch {arguments.batch_id}"


def after_failure(arguments: JobArguments) -> str:
    """What a failed job leaves behind, for messages."""
    if arguments.window:
        return "A re-run reads the same window and overwrites its output."
    return "No checkpoint moved; the plan stays pending and the next attempt re-uses it."
