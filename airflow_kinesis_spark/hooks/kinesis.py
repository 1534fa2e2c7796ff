"""Hook for Amazon Kinesis Data Streams, as the batch protocol reads it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import urlparse
from functools import cached_property
from typing import Any

import boto3
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook, SessionFactory
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.admin import check_endpoint
from airflow_kinesis_spark.core.job import STAGING_DIR
from airflow_kinesis_spark.core.names import parse_stream_arn, validate_stream_name
from airflow_kinesis_spark.core.pool import share_data_loader
from airflow_kinesis_spark.core.read_options import own_throttling
from airflow_kinesis_spark.core.shards import Shard, describe_stream_summary, list_shards
from airflow_kinesis_spark.settings import summary_budget_settings
from airflow_kinesis_spark.core.stream_summary import SummaryBudget

#: Default lifetime of the Spark job's temporary credentials (seconds). A batch that reads
#: longer fails with expired credentials and its retry re-uses the plan; raise it for long batches.
JOB_CREDENTIALS_SECONDS = 3600
#: The shortest lifetime STS grants (AssumeRole, GetFederationToken: 900 s, STS API reference).
STS_MIN_SECONDS = 900
_UNSCOPED_WARNED: list[bool] = []

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

    def get_session(self, region_name: str | None = None, deferrable: bool = False) -> boto3.session.Session:
        """The amazon provider's session; a synchronous one shares botocore's data loader (:func:`share_data_loader`)."""
        session = super().get_session(region_name=region_name, deferrable=deferrable)
        return session if deferrable else share_data_loader(session)

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

    @cached_property
    def conn(self) -> Any:
        """The boto3 Kinesis client (cached), once its endpoint answered; throttling errors of
        reads reach the readers (:func:`~airflow_kinesis_spark.core.read_options.own_throttling`).

        :raises EndpointUnreachableError: see :class:`FailFastAwsHook`.
        """
        return own_throttling(super().conn)

    def list_shards(self, stream_name: str, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        """Every shard of the stream, open and closed (paginated ``ListShards``).

        :param shard_filter: optional ``ShardFilter`` (the emulators ignore it).
        :raises StreamNotFoundError: the stream does not exist; names stream, region, endpoint.
        """
        return list_shards(self.conn, validate_stream_name(stream_name), shard_filter)

    @cached_property
    def summary_budget(self) -> SummaryBudget:
        """This host's share of the account's ``DescribeStreamSummary`` budget (20 calls per
        second per account, Kinesis API reference) and its summary cache, shared by every
        process of the host (``core.stream_summary``).

        Settings (Airflow configuration, section ``[kinesis_spark]``): ``describe_stream_summary_per_second``
        (calls per second this host makes at most; default 10) and ``shared_state_dir`` (default:
        a directory of the user in the system's temporary directory). The cache is keyed by the
        connection id and its ``role_arn`` too.

        :raises ValueError: ``describe_stream_summary_per_second`` not > 0.
        """
        calls_per_second, state_dir = summary_budget_settings()
        return SummaryBudget(
            calls_per_second=calls_per_second, state_dir=state_dir,
            principal=f"{self.aws_conn_id}|{self.conn_config.role_arn or ''}",
        )  # fmt: skip

    def describe_stream_summary(self, stream_name: str, max_age: float = 0.0) -> dict[str, Any]:
        """``DescribeStreamSummary``: status, retention period (hours), open shard count; from the
        host's cache when another caller asked at most ``max_age`` seconds ago, else paced by
        :attr:`summary_budget` (``shards.describe_stream_summary``).

        :param max_age: seconds; 0: always asks the service (paced all the same).
        :raises StreamNotFoundError: the stream does not exist; names stream, region, endpoint.
        """
        return describe_stream_summary(self.conn, validate_stream_name(stream_name), budget=self.summary_budget, max_age=max_age)

    def spark_environment(self, credentials: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment variables that give the Spark job access to Kinesis.

        Shape: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` (from
        ``credentials``, as :meth:`job_credentials` returns them; none when ``None``: the job
        uses its cluster's own role), ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_KINESIS`` (when
        the connection sets an endpoint) and ``AWS_CA_BUNDLE`` (when ``verify`` is a CA bundle's
        path, which must exist where the driver runs). These are passed to spark-submit's
        environment, never its command line. ``verify=False`` has no environment variable in
        botocore: the job verifies certificates with its own CA bundle (logged as a warning).
        """
        env: dict[str, str] = dict(credentials or {})
        region = self.conn_region_name or self.conn.meta.region_name
        if region:
            env["AWS_DEFAULT_REGION"] = region
        endpoint = self.conn_config.get_service_endpoint_url("kinesis")
        if endpoint:
            env["AWS_ENDPOINT_URL_KINESIS"] = endpoint
        if isinstance(self.verify, str) and self.verify:
            env["AWS_CA_BUNDLE"] = self.verify
        elif self.verify is False:
            self.log.warning("verify=False applies to this task's AWS clients, not to the Spark job's: the job verifies "
                             "TLS certificates with its own CA bundle. To trust a private CA there too, give verify the "
                             "path of a CA bundle that exists where the driver runs (it becomes the job's AWS_CA_BUNDLE)")  # fmt: skip
        return env

    def connection_credentials(self) -> dict[str, str]:
        """The connection's own credentials as environment variables (unscoped)."""
        credentials = self.get_credentials()
        env: dict[str, str] = {}
        if credentials.access_key:
            env["AWS_ACCESS_KEY_ID"] = credentials.access_key
            env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_key
        if credentials.token:
            env["AWS_SESSION_TOKEN"] = credentials.token
        return env

    def job_credentials(
        self, stream_name: str, *, output_location: str | None = None, checkpoint_table: str | None = None,
        store_key: str | None = None, duration_seconds: int = JOB_CREDENTIALS_SECONDS,
    ) -> dict[str, str]:  # fmt: skip
        """Short-lived credentials for a batch's Spark job, limited to reading one stream.

        A session policy (:func:`job_session_policy`) allows only ``GetShardIterator``,
        ``GetRecords``, ``ListShards`` and ``DescribeStreamSummary`` on ``stream_name`` (and
        ``kms:Decrypt`` through Kinesis, for encrypted streams), and, for an ``s3://`` / ``s3a://``
        ``output_location``, writing that one batch directory (Spark's S3 connector reads the same
        credentials), and, with ``checkpoint_table``, the items of one consumer (``store_key``,
        ``{stream}|{consumer}``) in that table (a job that takes its batch from the store). The
        connection's long-lived keys never leave the worker:

        * a connection with ``role_arn``: ``AssumeRole`` of that role, from the connection's base
          credentials, with the session policy;
        * long-lived keys (an IAM user): ``GetFederationToken`` with the session policy;
        * temporary credentials and no role to assume (an instance profile, IRSA, a role the
          worker already runs as): STS cannot scope them further; they are shipped as they are,
          and a warning says so (once per process).

        :param duration_seconds: lifetime, at least 900 (the STS minimum, STS API reference).
        :returns: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``.
        :raises RuntimeError: STS refused (names the IAM action to allow, and the operator's
            ``job_credentials`` to choose otherwise).
        """
        stream_name = validate_stream_name(stream_name)
        region = self.conn_region_name or self.conn.meta.region_name
        policy = json.dumps(job_session_policy(
            stream_name, region, self.conn.meta.partition, output_location=output_location,
            checkpoint_table=checkpoint_table, store_key=store_key,
        ))  # fmt: skip
        duration = max(STS_MIN_SECONDS, int(duration_seconds))
        role_arn = self.conn_config.role_arn
        try:
            if role_arn:
                base = SessionFactory(conn=self.conn_config, region_name=self.region_name, config=self.config).basic_session
                sts = base.client("sts", endpoint_url=self.conn_config.get_service_endpoint_url("sts", sts_connection_assume=True),
                                  config=self.config, verify=self.verify)  # fmt: skip
                answer = sts.assume_role(RoleArn=role_arn, RoleSessionName="airflow-kinesis-spark-job", Policy=policy,
                                         DurationSeconds=duration)["Credentials"]  # fmt: skip
                how = f"AssumeRole of {role_arn}"
            elif not self.get_credentials().token:
                sts = self.get_session(region_name=self.region_name).client(
                    "sts", endpoint_url=self.conn_config.get_service_endpoint_url("sts"), config=self.config, verify=self.verify
                )
                answer = sts.get_federation_token(Name="airflow-kinesis-spark", Policy=policy, DurationSeconds=duration)["Credentials"]
                how = "GetFederationToken"
            else:
                if not _UNSCOPED_WARNED:
                    _UNSCOPED_WARNED.append(True)
                    self.log.warning(
                        "The Spark job gets this worker's temporary credentials unscoped: they are already a role's "
                        "session and %s has no role_arn to assume with a session policy. Set role_arn on the connection "
                        "to give the job credentials limited to reading stream %r.", self.connection_description, stream_name,
                    )  # fmt: skip
                return self.connection_credentials()
        except ClientError as err:
            action = "sts:AssumeRole on " + role_arn if role_arn else "sts:GetFederationToken"
            raise RuntimeError(
                f"Could not get scoped credentials for the Spark job from STS ({err.response.get('Error', {}).get('Code')}): "
                f"allow {action} to {self.connection_description}, or choose job_credentials='connection' (ship the "
                "connection's own credentials) or 'none' (the cluster's own role) on the operator."
            ) from err
        self.log.info("The Spark job gets temporary credentials (%s, %d s) limited to reading stream %s", how, duration, stream_name)
        return {"AWS_ACCESS_KEY_ID": answer["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": answer["SecretAccessKey"],
                "AWS_SESSION_TOKEN": answer["SessionToken"]}  # fmt: skip


def job_session_policy(
    stream_name: str, region: str | None, partition: str = "aws", *, output_location: str | None = None,
    checkpoint_table: str | None = None, store_key: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The session policy of a job's credentials: read ``stream_name`` (a name or an ARN), write the batch's output.

    Shape: an IAM policy document (dict). Actions: ``kinesis:GetShardIterator``,
    ``kinesis:GetRecords``, ``kinesis:ListShards``, ``kinesis:DescribeStreamSummary`` on the
    stream's ARN (any account: the role's own policy names the account; a given ARN as it is),
    ``kinesis:SubscribeToShard`` and ``kinesis:DescribeStreamConsumer`` on its consumers (enhanced
    fan-out), ``kms:Decrypt`` only
    through Kinesis in the region (encrypted streams, Kinesis developer guide); for an S3
    ``output_location`` (``s3://`` or ``s3a://``): ``s3:GetObject``, ``s3:PutObject``,
    ``s3:DeleteObject``, ``s3:AbortMultipartUpload`` under that directory and its staging
    directories (``core.job.staging_location``), ``s3:ListBucket`` on its bucket, and
    ``kms:GenerateDataKey``/``kms:Decrypt`` through S3 (SSE-KMS buckets); with ``checkpoint_table``:
    ``dynamodb:GetItem``, ``dynamodb:PutItem``, ``dynamodb:UpdateItem``, ``dynamodb:Query`` on that
    table, only on items whose partition key is ``store_key`` (condition ``dynamodb:LeadingKeys``).
    """
    region = region or "*"
    # A stream ARN (another account's stream, shared by its resource policy) is the resource itself.
    stream_resource = str(arn) if (arn := parse_stream_arn(stream_name)) else f"arn:{partition}:kinesis:{region}:*:stream/{stream_name}"
    statements: list[dict[str, Any]] = []
    parsed = urlparse(output_location or "")
    if parsed.scheme in ("s3", "s3a", "s3n") and parsed.netloc:
        prefix = parsed.path.strip("/")
        parent, _, name = prefix.rpartition("/")
        staging = f"{parent}/{STAGING_DIR}/{name}-*".lstrip("/")
        statements += [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"arn:{partition}:s3:::{parsed.netloc}/{prefix}", f"arn:{partition}:s3:::{parsed.netloc}/{prefix}/*",
                             f"arn:{partition}:s3:::{parsed.netloc}/{staging}"],
            },
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:{partition}:s3:::{parsed.netloc}"]},
            {
                "Effect": "Allow",
                "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
                "Resource": "*",
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}},
            },
        ]
    if checkpoint_table:
        statement: dict[str, Any] = {
            "Effect": "Allow",
            "Action": ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"],
            "Resource": [f"arn:{partition}:dynamodb:{region}:*:table/{checkpoint_table}"],
        }
        if store_key:
            statement["Condition"] = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [store_key]}}
        statements.append(statement)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["kinesis:GetShardIterator", "kinesis:GetRecords", "kinesis:ListShards", "kinesis:DescribeStreamSummary"],
                "Resource": [stream_resource],
            },
            {  # enhanced fan-out: the stream's registered consumers
                "Effect": "Allow",
                "Action": ["kinesis:SubscribeToShard", "kinesis:DescribeStreamConsumer"],
                "Resource": [f"{stream_resource}/consumer/*"],
            },
            {
                "Effect": "Allow",
                "Action": ["kms:Decrypt"],
                "Resource": "*",
                "Condition": {"StringEquals": {"kms:ViaService": f"kinesis.{region}.amazonaws.com"}},
            },
            *statements,
        ],
    }
