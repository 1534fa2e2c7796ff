"""Hook for the DynamoDB checkpoint store."""

from __future__ import annotations

from typing import Any

from airflow_kinesis_spark.core.retention import DEFAULT_KEEP_BATCHES
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.hooks.kinesis import FailFastAwsHook

__all__ = ["DynamoDBCheckpointHook"]


class DynamoDBCheckpointHook(FailFastAwsHook):
    """Checkpoints and batch log of Kinesis consumers in DynamoDB.

    Credentials, region and ``endpoint_url`` come from the ``aws`` connection. Additional
    arguments (such as ``aws_conn_id``) are passed down to
    :class:`~airflow.providers.amazon.aws.hooks.base_aws.AwsBaseHook`. A connection whose endpoint
    does not answer fails within seconds on first use (see
    :class:`~airflow_kinesis_spark.hooks.kinesis.FailFastAwsHook`).

    .. seealso:: docs/concepts.md (the checkpoint store's layout)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "dynamodb"
        super().__init__(*args, **kwargs)

    def get_store(
        self,
        table_name: str,
        stream_name: str,
        consumer_name: str,
        *,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        point_in_time_recovery: bool = True,
        deletion_protection: bool = True,
    ) -> DynamoDBCheckpointStore:
        """The checkpoint store of one (stream, consumer) in ``table_name``.

        :param keep_batches: batches of the batch log kept; older ones expire (DynamoDB TTL).
        :param point_in_time_recovery: turn on point-in-time recovery when the store creates the
            table (needs ``dynamodb:UpdateContinuousBackups``; without it, a warning). Default ``True``.
        :param deletion_protection: create the table with deletion protection. Default ``True``.
            Neither setting changes a table that exists (see docs/iam.md, "Protecting the checkpoint table").
        :raises ValueError: when ``table_name`` breaks DynamoDB's naming rules, or ``keep_batches`` < 1.
        :raises TypeError: when ``point_in_time_recovery`` or ``deletion_protection`` is not a ``bool``.
        """
        return DynamoDBCheckpointStore(
            self.conn,
            table_name,
            stream_name,
            consumer_name,
            keep_batches=keep_batches,
            point_in_time_recovery=point_in_time_recovery,
            deletion_protection=deletion_protection,
        )
