"""Checkpoint administration: rewind a consumer to a point in time (like Kafka's reset-offsets)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.core.admin import rewind
from airflow_kinesis_spark.exceptions import CheckpointConflictError
from airflow_kinesis_spark.hooks.consumer import ConsumerHooksMixin

__all__ = ["KinesisCheckpointRewindOperator"]


class KinesisCheckpointRewindOperator(ConsumerHooksMixin, BaseOperator):
    """Reset a consumer's checkpoints to a timestamp, ``TRIM_HORIZON`` or ``LATEST``.

    The next ``KinesisToSparkOperator`` run of that consumer reads from there (parents before
    children, as always). The rewind is itself a committed batch that reads nothing, fenced like
    any other: it fails if another run of the consumer is active.

    .. seealso:: docs/rewind.md

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer (templated).
    :param checkpoint_table: its DynamoDB checkpoint table (templated).
    :param to: ``TRIM_HORIZON``, ``LATEST`` or an ISO 8601 timestamp (UTC) (templated).
    :param dry_run: only log and return the per-shard positions it would set.
    :param discard_pending: drop a pending batch first; the rewind takes its batch id, so the
        discarded batch's output is deleted if local, else named in ``discarded_output``.
    :returns: (XCom) see :func:`airflow_kinesis_spark.core.admin.rewind`.
    :raises AirflowFailException: a batch is pending or another writer moved first (no retry).
    """

    template_fields: Sequence[str] = ("stream_name", "consumer_name", "checkpoint_table", "to", "aws_conn_id", "region_name")

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        to: str,
        dry_run: bool = False,
        discard_pending: bool = False,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.to = to
        self.dry_run = dry_run
        self.discard_pending = discard_pending
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name


    def execute(self, context: Context) -> dict[str, Any]:
        store = self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)
        owner = f"rewind.{self.task_id}.{uuid.uuid4().hex[:8]}"
        try:
            result = rewind(self.kinesis_hook.conn, store, self.to, dry_run=self.dry_run,
                            discard_pending=self.discard_pending, owner=owner)  # fmt: skip
        except CheckpointConflictError as err:
            raise AirflowFailException(str(err)) from err
        verb = "would set" if self.dry_run else "set"
        for shard_id, change in result["shards"].items():
            self.log.info("%s: %s -> %s (%s)", shard_id, change["from"], change["to"], verb)
        if not self.dry_run:
            self.log.info("Consumer %s rewound to %s as batch %s", self.consumer_name, self.to, result["batch_id"])
        return result
