"""Hook for Amazon Kinesis Data Streams, as the batch protocol reads it."""

from __future__ import annotations

import re
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_kinesis_spark.core.shards import Shard, list_shards

__all__ = ["KinesisStreamHook", "validate_stream_name"]

# Kinesis stream names: 1-128 characters of a-z, A-Z, 0-9, '_', '-', '.' (Kinesis API reference, CreateStream).
_STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")


def validate_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid Kinesis stream name.

    :raises ValueError: naming the rule (1-128 characters of ``a-z A-Z 0-9 _ - .``).
    """
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise ValueError(
            f"stream name {name!r} is not a valid Kinesis stream name: use 1-128 characters of "
            "a-z, A-Z, 0-9, '_', '-' and '.'"
        )
    return name


class KinesisStreamHook(AwsBaseHook):
    """Interact with Amazon Kinesis Data Streams through boto3.

    Credentials, region, ``endpoint_url`` (connection extra ``endpoint_url``, or per service in
    ``service_config``) and botocore config come from the ``aws`` connection, as for every hook
    of the amazon provider. Additional arguments (such as ``aws_conn_id``) are passed down to
    :class:`~airflow.providers.amazon.aws.hooks.base_aws.AwsBaseHook`.

    .. seealso:: docs/operators.md
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "kinesis"
        super().__init__(*args, **kwargs)

    def list_shards(self, stream_name: str, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        """Every shard of the stream, open and closed (paginated ``ListShards``).

        :param shard_filter: optional ``ShardFilter`` (the emulators ignore it).
        :raises StreamNotFoundError: the stream does not exist; names stream, region, endpoint.
        """
        return list_shards(self.conn, validate_stream_name(stream_name), shard_filter)

    def describe_stream_summary(self, stream_name: str) -> dict[str, Any]:
        """``DescribeStreamSummary``: status, retention period (hours), open shard count."""
        return self.conn.describe_stream_summary(StreamName=validate_stream_name(stream_name))["StreamDescriptionSummary"]

    def spark_environment(self, include_credentials: bool = True) -> dict[str, str]:
        """Environment variables that give the Spark job this connection's access to Kinesis.

        Shape: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` (temporary
        credentials only), ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL_KINESIS`` (when the
        connection sets an endpoint). These are passed to spark-submit's environment, never its
        command line.

        :param include_credentials: leave the credentials out (the cluster uses its own role).
        """
        env: dict[str, str] = {}
        if include_credentials:
            credentials = self.get_credentials()
            if credentials.access_key:
                env["AWS_ACCESS_KEY_ID"] = credentials.access_key
                env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_key
            if credentials.token:
                env["AWS_SESSION_TOKEN"] = credentials.token
        region = self.conn_region_name or self.conn.meta.region_name
        if region:
            env["AWS_DEFAULT_REGION"] = region
        endpoint = self.conn_config.get_service_endpoint_url("kinesis")
        if endpoint:
            env["AWS_ENDPOINT_URL_KINESIS"] = endpoint
        return env
