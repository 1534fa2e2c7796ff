"""The AWS arguments of every operator and sensor of a Kinesis consumer, and the hooks built from
them: one base, following the amazon provider's conventions for its operators (``aws_conn_id``,
``region_name``, ``verify``, ``botocore_config``; ``verify`` templated with the other two)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

__all__ = ["AWS_TEMPLATE_FIELDS", "ConsumerHooksMixin", "KinesisAwsBaseOperator"]

#: The templated AWS arguments (as the amazon provider's ``aws_template_fields``).
AWS_TEMPLATE_FIELDS: tuple[str, ...] = ("aws_conn_id", "region_name", "verify")


class ConsumerHooksMixin:
    """``kinesis_hook`` and ``checkpoint_hook`` on the ``aws_conn_id``, ``region_name``,
    ``verify`` and ``botocore_config`` of a task (operators and sensors, through
    :class:`KinesisAwsBaseOperator`) or of a trigger (``triggers.kinesis``).

    Built lazily, in ``execute``/``poke``/``run``. The first call of either hook checks within seconds that
    its endpoint answers, and raises ``EndpointUnreachableError`` naming the connection, the
    service and the endpoint if it does not (see
    :class:`~airflow_kinesis_spark.hooks.kinesis.FailFastAwsHook`).
    """

    aws_conn_id: str | None
    region_name: str | None
    verify: bool | str | None = None
    botocore_config: dict[str, Any] | None = None

    @property
    def aws_hook_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of an ``AwsBaseHook`` of this task's AWS arguments
        (``botocore_config`` is the hook's ``config``)."""
        return {"aws_conn_id": self.aws_conn_id, "region_name": self.region_name, "verify": self.verify,
                "config": self.botocore_config}  # fmt: skip

    @property
    def aws_trigger_kwargs(self) -> dict[str, Any]:
        """The AWS arguments of the task's triggers, by name (JSON values)."""
        return {"aws_conn_id": self.aws_conn_id, "region_name": self.region_name, "verify": self.verify,
                "botocore_config": self.botocore_config}  # fmt: skip

    @cached_property
    def kinesis_hook(self) -> KinesisStreamHook:
        return KinesisStreamHook(**self.aws_hook_kwargs)

    @cached_property
    def checkpoint_hook(self) -> DynamoDBCheckpointHook:
        return DynamoDBCheckpointHook(**self.aws_hook_kwargs)


class KinesisAwsBaseOperator(ConsumerHooksMixin, BaseOperator):
    """Base of the provider's operators and sensors: the AWS arguments, once.

    A ``BaseOperator`` itself, so a DAG's ``default_args`` fill these arguments as they fill the
    amazon provider's operators'.

    :param aws_conn_id: the ``aws`` connection for Kinesis, DynamoDB and Glue (templated).
        ``None``: boto3's default credential chain.
    :param region_name: overrides the connection's region (templated).
    :param verify: TLS certificate verification of this task's AWS clients (templated), as
        boto3's ``verify``: ``None`` (default: verify, with botocore's CA bundle), ``False`` (do
        not verify), or the path of a CA bundle. A path also goes to the Spark job
        (``AWS_CA_BUNDLE``); ``False`` does not (docs/operators.md, Parameters).
    :param botocore_config: a ``botocore.config.Config`` as a dict (``{"retries": {"mode":
        "adaptive"}, "read_timeout": 30}``), for this task's and its triggers' AWS clients; the
        Spark job's readers keep their own settings (docs/operators.md, Parameters).
    """

    template_fields: Sequence[str] = AWS_TEMPLATE_FIELDS

    def __init__(
        self,
        *,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.verify = verify
        self.botocore_config = botocore_config
