"""Checkpoint administration: rewind a consumer to a point in time (like Kafka's reset-offsets), or
drop its pending batch."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.failures import task_errors
from airflow_kinesis_spark.core.admin import discard_pending, rewind
from airflow_kinesis_spark.core.consumers import deregister_stream_consumer
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator

__all__ = ["KinesisCheckpointRewindOperator", "KinesisDiscardPendingBatchOperator", "KinesisDeregisterStreamConsumerOperator"]


class KinesisCheckpointRewindOperator(KinesisAwsBaseOperator):
    """Reset a consumer's checkpoints to a timestamp, ``TRIM_HORIZON`` or ``LATEST``.

    The next ``KinesisToSparkOperator`` run of that consumer reads from there (parents before
    children, as always). The rewind is itself a committed batch that reads nothing, fenced like
    any other: it fails if another run of the consumer is active.

    .. seealso:: docs/rewind.md

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer (templated).
    :param checkpoint_table: its DynamoDB checkpoint table (templated).
    :param to: ``TRIM_HORIZON``, ``LATEST`` or an ISO 8601 timestamp (UTC) (templated).
    :param dry_run: only log and return the per-shard positions it would set, and what it would
        discard.
    :param discard_pending: drop a pending batch first (never one a live run holds); the rewind
        takes its batch id, so the batch's directory under ``output_path`` is deleted if local.
    :param output_path: the consumer's output root, the ``output_path`` of its
        ``KinesisToSparkOperator`` (templated). Only ``{output_path}/batch_id=N`` of the discarded
        batch ``N`` is ever deleted, and only when the stored plan names exactly it; without
        ``output_path`` nothing is deleted. See :func:`airflow_kinesis_spark.core.admin.discard_pending`.
    :param lease_seconds: the consumer's lease (seconds), its ``KinesisToSparkOperator``'s
        ``lease_seconds``: a pending batch with a more recent heartbeat is left alone.
    :returns: (XCom) see :func:`airflow_kinesis_spark.core.admin.rewind`.
    :raises AirflowFailException: a batch is pending, another writer moved first, or an item of the
        checkpoint table is corrupt (``CheckpointStoreCorruptError``); no retry.
    :raises BatchLeaseHeldError: a live run holds the pending batch (retryable).
    """

    template_fields: Sequence[str] = (
        "stream_name", "consumer_name", "checkpoint_table", "to", "output_path", *AWS_TEMPLATE_FIELDS,
    )  # fmt: skip

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        to: str,
        dry_run: bool = False,
        discard_pending: bool = False,
        output_path: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.to = to
        self.dry_run = dry_run
        self.discard_pending = discard_pending
        self.output_path = output_path
        self.lease_seconds = lease_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        store = self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)
        owner = f"rewind.{self.task_id}.{uuid.uuid4().hex[:8]}"
        with task_errors():
            result = rewind(self.kinesis_hook.conn, store, self.to, dry_run=self.dry_run, discard_pending=self.discard_pending,
                            output_path=self.output_path or None, owner=owner, lease_seconds=self.lease_seconds)  # fmt: skip
        verb = "would set" if self.dry_run else "set"
        for shard_id, change in result["shards"].items():
            self.log.info("%s: %s -> %s (%s)", shard_id, change["from"], change["to"], verb)
        if result["discarded_batch_id"] is not None:
            self.log.warning("Pending batch %s %s: %s", result["discarded_batch_id"],
                             "would be discarded" if self.dry_run else "discarded", result["discarded_output"])  # fmt: skip
        if not self.dry_run:
            self.log.info("Consumer %s rewound to %s as batch %s", self.consumer_name, self.to, result["batch_id"])
        return result


class KinesisDiscardPendingBatchOperator(KinesisAwsBaseOperator):
    """Drop a consumer's pending (planned, uncommitted) batch; its committed checkpoints stay.

    For a pending batch that no longer fits its task (for example after the task's
    ``output_path`` changed, which makes ``KinesisToSparkOperator`` refuse the stored plan): the
    next run plans the same batch id anew from the committed checkpoints. Refused while a live
    run holds the batch (``BatchLeaseHeldError``, retryable). The batch's own directory,
    ``{output_path}/batch_id=N``, is deleted when local, and only when the stored plan names
    exactly it: never a path read from the checkpoint table.

    .. seealso:: docs/rewind.md

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer (templated).
    :param checkpoint_table: its DynamoDB checkpoint table (templated).
    :param output_path: the consumer's output root, the ``output_path`` of its
        ``KinesisToSparkOperator`` (templated); ``None``: nothing is deleted.
    :param dry_run: only log and return what it would do.
    :param lease_seconds: the consumer's lease (seconds), its ``KinesisToSparkOperator``'s
        ``lease_seconds``: a pending batch with a more recent heartbeat belongs to a live run.
    :returns: (XCom) see :func:`airflow_kinesis_spark.core.admin.discard_pending`.
    :raises AirflowFailException: another writer moved first, or an item of the checkpoint table
        is corrupt (``CheckpointStoreCorruptError``; a corrupt plan of the pending batch is not:
        the batch is discarded without it); no retry.
    :raises BatchLeaseHeldError: a live run holds the pending batch (retryable).
    """

    template_fields: Sequence[str] = (
        "stream_name", "consumer_name", "checkpoint_table", "output_path", *AWS_TEMPLATE_FIELDS,
    )  # fmt: skip

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        output_path: str | None = None,
        dry_run: bool = False,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.output_path = output_path
        self.dry_run = dry_run
        self.lease_seconds = lease_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        store = self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)
        owner = f"discard.{self.task_id}.{uuid.uuid4().hex[:8]}"
        with task_errors():
            result = discard_pending(store, output_path=self.output_path or None, dry_run=self.dry_run, owner=owner,
                                     lease_seconds=self.lease_seconds)  # fmt: skip
        if result["discarded_batch_id"] is None:
            self.log.info("Consumer %s has no pending batch (committed batch %s): nothing to discard",
                          self.consumer_name, result["committed_batch_id"])  # fmt: skip
        else:
            self.log.warning("Pending batch %s of consumer %s (held by %s) %s: %s", result["discarded_batch_id"],
                             self.consumer_name, result["holder"], "would be discarded" if self.dry_run else "discarded",
                             result["discarded_output"])  # fmt: skip
        return result


class KinesisDeregisterStreamConsumerOperator(KinesisAwsBaseOperator):
    """Deregister the stream consumer ``consumer_type="efo"`` registered for a consumer.

    A registered stream consumer is billed per shard-hour while it exists (and per GB pushed);
    deregister it when the consumer goes back to polling or is retired. The checkpoints are
    untouched: the next enhanced fan-out run registers it again.

    :param stream_name: the stream, by name or ARN (templated).
    :param consumer_name: the consumer (templated).
    :param aws_conn_id: and ``region_name``, ``verify``, ``botocore_config``: the AWS arguments
        (templated but ``botocore_config``; :class:`~airflow_kinesis_spark.hooks.consumer.KinesisAwsBaseOperator`).
    :returns: (XCom) ``stream``, ``consumer_name``, ``deregistered`` (``False``: it was not registered).
    """

    template_fields: Sequence[str] = ("stream_name", "consumer_name", *AWS_TEMPLATE_FIELDS)

    def __init__(
        self, *, stream_name: str, consumer_name: str,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.stream_name = stream_name
        self.consumer_name = consumer_name

    def execute(self, context: Context) -> dict[str, Any]:
        existed = deregister_stream_consumer(self.kinesis_hook.conn, self.stream_name, self.consumer_name,
                                             budget=self.kinesis_hook.summary_budget)  # fmt: skip
        self.log.info("Stream consumer %s of %s: %s", self.consumer_name, self.stream_name,
                      "deregistered" if existed else "was not registered")  # fmt: skip
        return {"stream": self.stream_name, "consumer_name": self.consumer_name, "deregistered": existed}
