"""Triggers behind the deferrable sensors: they poll with the async AWS client (aiobotocore).

Each trigger evaluates exactly what its sensor's ``poke`` evaluates (the rules live in
``airflow_kinesis_spark.core.lag``), and yields one event: ``{"status": "success", ...}`` when
the condition holds, ``{"status": "error", "message": ...}`` when it cannot be evaluated or
must fail. Arguments are JSON-serialisable only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_kinesis_spark.core import aio
from airflow_kinesis_spark.core.lag import (
    backlog_ready,
    retention_risks,
    topology_change,
)
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.hooks.dynamodb import DynamoDBCheckpointHook
from airflow_kinesis_spark.hooks.kinesis import KinesisStreamHook

__all__ = ["KinesisShardLagTrigger", "KinesisReshardingTrigger", "KinesisRetentionTrigger"]


class _ConsumerTrigger(BaseTrigger):
    """Common arguments: which consumer of which stream, where its checkpoints are, how often."""

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        poke_interval: float = 60.0,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__()
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.poke_interval = poke_interval
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.extra = extra

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream_name": self.stream_name,
                "consumer_name": self.consumer_name,
                "checkpoint_table": self.checkpoint_table,
                "poke_interval": self.poke_interval,
                "aws_conn_id": self.aws_conn_id,
                "region_name": self.region_name,
                **self.extra,
            },
        )

    def _store(self) -> DynamoDBCheckpointStore:
        return DynamoDBCheckpointStore(None, self.checkpoint_table, self.stream_name, self.consumer_name)

    async def evaluate(self, kinesis: Any, dynamodb: Any) -> dict[str, Any] | None:
        """One poll: an event payload when done, else ``None``."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        kinesis_hook = KinesisStreamHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)
        dynamodb_hook = DynamoDBCheckpointHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)
        try:
            async with await kinesis_hook.get_async_conn() as kinesis, await dynamodb_hook.get_async_conn() as dynamodb:
                while True:
                    payload = await self.evaluate(kinesis, dynamodb)
                    if payload is not None:
                        yield TriggerEvent(payload)
                        return
                    await asyncio.sleep(self.poke_interval)
        except Exception as err:  # noqa: BLE001 - reported to the task, which fails with it
            yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}"})


class KinesisShardLagTrigger(_ConsumerTrigger):
    """Fires when a consumer's backlog is worth a batch (see ``KinesisShardLagSensor``).

    :param min_age_seconds: oldest unconsumed record at least this old; ``None``: any record.
    :param initial_position: where never-seen shards start (``TRIM_HORIZON`` or ``LATEST``).
    """

    def __init__(self, *, min_age_seconds: float | None = None, initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        super().__init__(min_age_seconds=min_age_seconds, initial_position=initial_position, **kwargs)

    async def evaluate(self, kinesis: Any, dynamodb: Any) -> dict[str, Any] | None:
        summary = await aio.measure_lag(kinesis, dynamodb, self._store(), initial_position=self.extra["initial_position"])
        self.log.info("lag of %s/%s: max age %s ms, shards with records %s", self.stream_name, self.consumer_name,
                      summary["max_age_ms"], summary["shards_with_unconsumed"])  # fmt: skip
        if backlog_ready(summary, self.extra["min_age_seconds"]):
            return {"status": "success", "lag": summary}
        return None


class KinesisReshardingTrigger(_ConsumerTrigger):
    """Fires when the open shards differ from the last committed batch's (see ``KinesisReshardingSensor``)."""

    async def evaluate(self, kinesis: Any, dynamodb: Any) -> dict[str, Any] | None:
        summary = await aio.describe_stream_summary(kinesis, self.stream_name)
        if summary["StreamStatus"] == "UPDATING":
            self.log.info("stream %s is UPDATING (resharding in progress)", self.stream_name)
            return None
        _, _, plan = await aio.committed_state(dynamodb, self._store())
        if plan is None:
            self.log.info("consumer %s has no committed batch to compare with", self.consumer_name)
            return None
        change = topology_change(await aio.list_shards(kinesis, self.stream_name), plan.open_shards)
        if change["changed"]:
            return {"status": "success", "change": {**change, "committed_batch_id": plan.batch_id}}
        return None


class KinesisRetentionTrigger(_ConsumerTrigger):
    """Evaluates the retention guard once (see ``KinesisRetentionGuardSensor``).

    :param margin_seconds: how close to the retention period counts as at risk.
    """

    def __init__(self, *, margin_seconds: float, initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        super().__init__(margin_seconds=margin_seconds, initial_position=initial_position, **kwargs)

    async def evaluate(self, kinesis: Any, dynamodb: Any) -> dict[str, Any] | None:
        retention = float((await aio.describe_stream_summary(kinesis, self.stream_name))["RetentionPeriodHours"])
        lag = await aio.measure_lag(kinesis, dynamodb, self._store(), initial_position=self.extra["initial_position"])
        risks = retention_risks(lag, retention, timedelta(seconds=self.extra["margin_seconds"]))
        return {"status": "success", "retention_period_hours": retention, "at_risk": risks, "lag": lag}
