"""The hooks every operator and sensor of a Kinesis consumer needs, built lazily from its arguments."""

from __future__ import annotations

from functools import cached_property

from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

__all__ = ["ConsumerHooksMixin"]


class ConsumerHooksMixin:
    """``kinesis_hook`` and ``checkpoint_hook`` on the task's ``aws_conn_id`` and ``region_name``.

    Built lazily, in ``execute``/``poke``. The first call of either hook checks within seconds that
    its endpoint answers, and raises ``EndpointUnreachableError`` naming the connection, the
    service and the endpoint if it does not (see
    :class:`~airflow_kinesis_spark.hooks.kinesis.FailFastAwsHook`).
    """

    aws_conn_id: str | None
    region_name: str | None

    @cached_property
    def kinesis_hook(self) -> KinesisStreamHook:
        return KinesisStreamHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)

    @cached_property
    def checkpoint_hook(self) -> DynamoDBCheckpointHook:
        return DynamoDBCheckpointHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)
