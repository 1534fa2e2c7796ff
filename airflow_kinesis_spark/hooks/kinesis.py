"""Hook for Amazon Kinesis Data Streams, as the batch protocol reads it."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook, SessionFactory

from airflow_kinesis_spark.core.admin import check_endpoint
from airflow_kinesis_spark.core.names import validate_stream_name
from airflow_kinesis_spark.core.shards import Shard, describe_stream_summary, list_shards

__all__ = ["FailFastAwsHook", "KinesisStreamHook", "validate_stream_name"]


class FailFastAwsHook(AwsBaseHook):
    """:class:`AwsBaseHook` whose client checks, on first use and within seconds, that its endpoint answers.

    Without the check, a connection that points nowhere (a closed port, an unresolvable host, an
    address that drops packets) fails only after botocore's connect timeout (60 s) times its
    retries: minutes. The first access of ``conn`` sends one unsigned request to the service's
    endpoint, and, with ``role_arn``, to the STS endpoint of the assume-role call, on a budget of
    a few seconds (:func:`~airflow_kinesis_spark.core.admin.check_endpoint`). The request needs no
    IAM permission. The client itself keeps the connection's timeouts and retries (``config_kwargs``)
    for every real call, so throttling and transient errors on AWS are retried as before.

    :raises EndpointUnreachableError: (from ``conn``) naming the connection, the service, its
        endpoint and region, and what to check.
    """

    @property
    def connection_description(self) -> str:
        """``aws connection 'aws_default'``, or what is used instead of one (for messages)."""
        if not self.aws_conn_id:
            return "boto3's default chain (aws_conn_id=None)"
        if self.conn_config.conn_id is None:
            return f"aws connection {self.aws_conn_id!r} (not found: boto3's default chain)"
        return f"aws connection {self.aws_conn_id!r}"

    @cached_property
    def conn(self) -> Any:
        """The boto3 client (cached), once its endpoint answered.

        :raises EndpointUnreachableError: the service's or, with ``role_arn``, STS's endpoint does not answer.
        """
        source = self.connection_description
        if self.conn_config.role_arn:
            sts = SessionFactory(conn=self.conn_config, region_name=self.region_name, config=self.config).basic_session.client(
                "sts", endpoint_url=self.conn_config.get_service_endpoint_url("sts", sts_connection_assume=True),
                config=self.config, verify=self.verify,
            )  # fmt: skip
            check_endpoint(sts, f"{source}, assume-role call for role_arn {self.conn_config.role_arn!r}",
                           hint=self._endpoint_hint("sts"), verify=self.verify)  # fmt: skip
        client = self.get_client_type(region_name=self.region_name)
        check_endpoint(client, source, hint=self._endpoint_hint(self.service_name), verify=self.verify)
        return client

    def _endpoint_hint(self, service: str) -> str:
        where = f"extra 'service_config': {{'{service}': {{'endpoint_url': ...}}}}"
        if service == "sts":
            where += " (the assume-role call does not use the extra 'endpoint_url')"
        else:
            where += " or extra 'endpoint_url'"
        return (
            f"Check the endpoint of the connection ({where}), its 'region_name', and the network path "
            "from this machine (DNS, proxy, VPC endpoint, security groups)."
        )


class KinesisStreamHook(FailFastAwsHook):
    """Interact with Amazon Kinesis Data Streams through boto3.

    Credentials, region, ``endpoint_url`` (connection extra ``endpoint_url``, or per service in
    ``service_config``) and botocore config come from the ``aws`` connection, as for every hook
    of the amazon provider. Additional arguments (such as ``aws_conn_id``) are passed down to
    :class:`~airflow.providers.amazon.aws.hooks.base_aws.AwsBaseHook`. A connection whose endpoint
    does not answer fails within seconds on first use (see :class:`FailFastAwsHook`).

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
        """``DescribeStreamSummary``: status, retention period (hours), open shard count.

        :raises StreamNotFoundError: the stream does not exist; names stream, region, endpoint.
        """
        return describe_stream_summary(self.conn, validate_stream_name(stream_name))

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
