"""Triggers behind the deferrable sensors: they poll with the async AWS client (aiobotocore).

Each trigger evaluates exactly what its sensor's ``poke`` evaluates (the rules live in
``airflow_kinesis_spark.core.lag``), and yields one event: ``{"status": "success", ...}`` when
the condition holds, ``{"status": "error", "message": ...}`` when it cannot be evaluated or
must fail. Arguments are JSON-serialisable only.

``KinesisBacklogTrigger`` is different: an event trigger for an ``AssetWatcher`` (event-driven
scheduling), which runs as long as the watching asset exists and fires once per backlog.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_kinesis_spark.failures import error_event
from airflow_kinesis_spark.core import aio
from airflow_kinesis_spark.core.job import handed_batch_state
from airflow_kinesis_spark.core.lag import (
    backlog_due,
    backlog_ready,
    retention_risks,
    topology_change,
    validate_lag_arguments,
)
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.core.stream_summary import RETENTION_MAX_AGE_S, STATUS_MAX_AGE_S, SummaryBudget
from airflow_kinesis_spark.hooks.consumer import ConsumerHooksMixin

__all__ = [
    "KinesisShardLagTrigger",
    "KinesisReshardingTrigger",
    "KinesisRetentionTrigger",
    "KinesisBacklogTrigger",
    "KinesisBatchReportTrigger",
]

#: The shortest ``poke_interval`` of :class:`KinesisBacklogTrigger` (seconds). Each poll calls
#: ``GetShardIterator`` once and ``GetRecords`` up to 3 times per shard; both are limited to 5
#: calls per second per shard, a budget shared with every reader of the shard (Kinesis API
#: reference). At this floor a poll uses at most 0.2 and 0.6 of them, leaving the batches' readers the rest.
MIN_BACKLOG_POLL_INTERVAL_S = 5.0
#: While :class:`KinesisBacklogTrigger` holds after an event, it reads the consumer's head (one
#: strongly consistent ``GetItem``, no Kinesis call) this often (seconds), and polls the backlog
#: as soon as a run committed, instead of up to ``poke_interval`` later.
BACKLOG_HOLD_HEAD_INTERVAL_S = 1.0


class _ConsumerTrigger(ConsumerHooksMixin, BaseTrigger):
    """Common arguments: which consumer of which stream, where its checkpoints are, how often.

    Every argument is an attribute of the same name and goes into :meth:`serialize` by that name
    (JSON values only); a subclass lists its own in :meth:`own_arguments`.

    :param stream_name: the Kinesis stream.
    :param consumer_name: the consumer (application) name whose checkpoints are read.
    :param checkpoint_table: the DynamoDB checkpoint table.
    :param poke_interval: seconds between polls.
    :param aws_conn_id: the ``aws`` connection.
    :param region_name: overrides the connection's region.
    :param verify: TLS certificate verification of the trigger's AWS clients (boto3's ``verify``).
    :param botocore_config: a ``botocore.config.Config`` as a dict, for the trigger's AWS clients.
    """

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        poke_interval: float = 60.0,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        verify: bool | str | None = None,
        botocore_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.poke_interval = poke_interval
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.verify = verify
        self.botocore_config = botocore_config

    def own_arguments(self) -> dict[str, Any]:
        """The subclass's own keyword arguments by name, as :meth:`serialize` writes them."""
        return {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "stream_name": self.stream_name,
                "consumer_name": self.consumer_name,
                "checkpoint_table": self.checkpoint_table,
                "poke_interval": self.poke_interval,
                **self.aws_trigger_kwargs,
                **self.own_arguments(),
            },
        )

    def _store(self) -> DynamoDBCheckpointStore:
        return DynamoDBCheckpointStore(None, self.checkpoint_table, self.stream_name, self.consumer_name)

    #: Whether :meth:`evaluate` reads the stream (``False``: only the checkpoint store).
    reads_kinesis = True

    @asynccontextmanager
    async def _clients(self) -> AsyncIterator[tuple[aio.AsyncKinesisClient | None, aio.AsyncDynamoDBClient]]:
        """Async (aiobotocore) Kinesis and DynamoDB clients of the trigger's connection, for its whole
        run; no Kinesis client (``None``) for a trigger that only reads the store (:attr:`reads_kinesis`)."""
        dynamodb_hook = self.checkpoint_hook
        if not self.reads_kinesis:
            async with await dynamodb_hook.get_async_conn() as dynamodb:
                yield None, dynamodb
            return
        kinesis_hook = self.kinesis_hook
        async with await kinesis_hook.get_async_conn() as kinesis, await dynamodb_hook.get_async_conn() as dynamodb:
            # After get_async_conn: the connection is read (in a thread) and cached on the hook by then.
            self._summary_budget = kinesis_hook.summary_budget
            yield kinesis, dynamodb

    #: The host's ``DescribeStreamSummary`` budget and cache (``KinesisStreamHook.summary_budget``),
    #: set by :meth:`_clients`; every trigger of the triggerer, and every sensor of the host, share it.
    _summary_budget: SummaryBudget | None = None

    async def _describe_stream_summary(self, kinesis: aio.AsyncKinesisClient, max_age: float) -> dict[str, Any]:
        """``DescribeStreamSummary`` of the trigger's stream, from the host's cache or paced (``aio.describe_stream_summary``)."""
        return await aio.describe_stream_summary(kinesis, self.stream_name, budget=self._summary_budget, max_age=max_age)

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        """One poll: an event payload when done, else ``None``."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async with self._clients() as (kinesis, dynamodb):
                while True:
                    payload = await self.evaluate(kinesis, dynamodb)
                    if payload is not None:
                        yield TriggerEvent(payload)
                        return
                    await asyncio.sleep(self.poke_interval)
        except Exception as err:  # noqa: BLE001 - reported to the task, which fails with it (retried if it may pass)
            yield TriggerEvent(error_event(err))


class KinesisShardLagTrigger(_ConsumerTrigger):
    """Fires when a consumer's backlog is worth a batch (see ``KinesisShardLagSensor``).

    :param min_age_seconds: oldest unconsumed record at least this old (seconds); ``None``: any record.
    :param initial_position: where never-seen shards start (``TRIM_HORIZON`` or ``LATEST``).
    :param kwargs: the common arguments (see ``_ConsumerTrigger``).
    :raises ValueError: an argument out of range (``lag.validate_lag_arguments``).
    """

    def __init__(self, *, min_age_seconds: float | None = None, initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        validate_lag_arguments(initial_position=initial_position, min_age_seconds=min_age_seconds)
        super().__init__(**kwargs)
        self.min_age_seconds = min_age_seconds
        self.initial_position = initial_position

    def own_arguments(self) -> dict[str, Any]:
        return {"min_age_seconds": self.min_age_seconds, "initial_position": self.initial_position}

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        summary = await aio.measure_lag(kinesis, dynamodb, self._store(), initial_position=self.initial_position)
        self.log.info("lag of %s/%s: max age %s ms, shards with records %s", self.stream_name, self.consumer_name,
                      summary["max_age_ms"], summary["shards_with_unconsumed"])  # fmt: skip
        if backlog_ready(summary, self.min_age_seconds):
            return {"status": "success", "lag": summary}
        return None


class KinesisReshardingTrigger(_ConsumerTrigger):
    """Fires when the open shards differ from the last committed batch's (see ``KinesisReshardingSensor``)."""

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        summary = await self._describe_stream_summary(kinesis, STATUS_MAX_AGE_S)
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

    :param margin_seconds: how close to the retention period counts as at risk (seconds).
    :param initial_position: where never-seen shards start (``TRIM_HORIZON`` or ``LATEST``).
    :param kwargs: the common arguments (see ``_ConsumerTrigger``).
    :raises ValueError: an ``initial_position`` other than those two.
    """

    def __init__(self, *, margin_seconds: float, initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        validate_lag_arguments(initial_position=initial_position)
        super().__init__(**kwargs)
        self.margin_seconds = margin_seconds
        self.initial_position = initial_position

    def own_arguments(self) -> dict[str, Any]:
        return {"margin_seconds": self.margin_seconds, "initial_position": self.initial_position}

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        retention = float((await self._describe_stream_summary(kinesis, RETENTION_MAX_AGE_S))["RetentionPeriodHours"])
        lag = await aio.measure_lag(kinesis, dynamodb, self._store(), initial_position=self.initial_position)
        risks = retention_risks(lag, retention, timedelta(seconds=self.margin_seconds))
        return {"status": "success", "retention_period_hours": retention, "at_risk": risks, "lag": lag}


class KinesisBacklogTrigger(_ConsumerTrigger, BaseEventTrigger):
    """Fires when a consumer's backlog is worth a batch: for an ``AssetWatcher`` (event-driven runs).

    Every ``poke_interval`` seconds it reads the consumer's committed checkpoints (the same store
    as ``KinesisToSparkOperator``) and counts, per readable shard, the user records after the
    checkpoint, up to ``min_records``. It fires when either threshold is passed, whichever comes
    first: at least ``min_records`` records wait (all shards together), or the oldest unconsumed
    record is at least ``min_age_seconds`` old. With neither, any waiting record fires it.

    **Calls per poll.** One ``ListShards`` (paginated), one ``GetItem`` and one ``Query`` on the
    checkpoint table, and per readable shard one ``GetShardIterator`` and one to three
    ``GetRecords`` (``Limit`` ``min_records``, else 1; 0.2 s apart). ``GetRecords`` and
    ``GetShardIterator`` allow 5 calls per second per shard, shared with the batches' readers,
    and a shard serves 2 MiB/s (Kinesis API reference): hence the floor of
    ``MIN_BACKLOG_POLL_INTERVAL_S`` (5 s) on ``poke_interval``, and a bound of 10,000 on
    ``min_records`` (one ``GetRecords``). Every poll reads up to ``min_records`` records per
    shard; for large thresholds prefer ``min_age_seconds`` (``Limit`` 1).

    **The event** (the asset event's ``extra["payload"]``): ``status`` ``success``, ``reason``
    (``min_records``, ``min_age_seconds`` or ``any_record``), ``stream_name``,
    ``consumer_name``, ``committed_batch_id`` (the consumer's head when counted),
    ``records_waiting`` (counted up to ``min_records`` per shard) and ``records_waiting_exact``,
    ``max_age_ms``, ``shards_with_unconsumed``, ``shards`` (per shard with records:
    ``records_waiting``, ``age_ms``), ``measured_at``, ``min_records``, ``min_age_seconds``.

    **Re-firing.** The trigger keeps running after an event (Airflow keeps it while the asset is
    watched). It fires at most once per committed batch: after an event it holds while the
    consumer's committed batch id is unchanged, and fires again only once a run committed and
    the backlog after that commit passes a threshold again. As it reads committed checkpoints,
    it never fires for records a run already committed. While it holds, it reads only the
    consumer's head (one ``GetItem``) every ``BACKLOG_HOLD_HEAD_INTERVAL_S`` (1 s), and polls the
    backlog as soon as the committed batch id moved: a run's records that arrived meanwhile start
    the next run within about a second of the commit, not up to ``poke_interval`` later (at most
    one backlog poll per commit beyond the interval's). When Airflow re-creates it (triggerer
    restart, changed arguments), the hold starts afresh, so one more event may come for a
    backlog a run is ingesting: the next run then finds little or nothing, and a run without
    new records starts no Spark job. Schedule the DAG with ``max_active_runs=1``: events during
    a run then queue a single next run. A poll that fails (throttling beyond retries, a missing
    stream) is logged and the next poll tries again; it never fires.

    .. seealso:: docs/sensors.md

    :param stream_name: the Kinesis stream.
    :param consumer_name: the consumer (application) name whose checkpoints are read.
    :param checkpoint_table: the DynamoDB checkpoint table (a missing table reads as no checkpoint).
    :param min_records: fire when at least this many user records wait, 1..10,000; ``None``: no count threshold.
    :param min_age_seconds: fire when the oldest unconsumed record is at least this old (seconds);
        ``None``: no age threshold.
    :param poke_interval: seconds between polls, at least 5 (``MIN_BACKLOG_POLL_INTERVAL_S``).
    :param initial_position: where never-seen shards start: ``TRIM_HORIZON`` or ``LATEST``, as the operator's.
    :param aws_conn_id: the ``aws`` connection.
    :param region_name: overrides the connection's region.
    :raises ValueError: an argument out of range (at DAG parse time).
    """

    def __init__(
        self,
        *,
        min_records: int | None = None,
        min_age_seconds: float | None = None,
        poke_interval: float = 60.0,
        initial_position: str = "TRIM_HORIZON",
        **kwargs: Any,
    ) -> None:
        validate_lag_arguments(initial_position=initial_position, min_age_seconds=min_age_seconds, min_records=min_records)
        if not poke_interval >= MIN_BACKLOG_POLL_INTERVAL_S:
            raise ValueError(
                f"poke_interval must be at least {MIN_BACKLOG_POLL_INTERVAL_S:g} seconds (Kinesis allows 5 GetRecords and "
                f"5 GetShardIterator calls per second per shard, shared with the batches' readers); got {poke_interval!r}"
            )
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.min_records = min_records
        self.min_age_seconds = min_age_seconds
        self.initial_position = initial_position
        # The committed batch id the last event was sent for (in memory: see "Re-firing").
        self._fired_for: int | None = None
        # The committed batch id the last poll counted after.
        self._counted_after: int | None = None

    def own_arguments(self) -> dict[str, Any]:
        return {"min_records": self.min_records, "min_age_seconds": self.min_age_seconds, "initial_position": self.initial_position}

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        min_records, min_age = self.min_records, self.min_age_seconds
        summary = await aio.measure_backlog(
            kinesis, dynamodb, self._store(), bound=min_records or 1, initial_position=self.initial_position
        )
        reason = backlog_due(summary, min_records, min_age)
        committed = summary["committed_batch_id"]
        self._counted_after = committed
        self.log.info(
            "backlog of %s/%s after batch %s: %s%d records waiting in %d shards, oldest %d ms; %s",
            self.stream_name, self.consumer_name, committed, "" if summary["records_waiting_exact"] else "at least ",
            summary["records_waiting"], len(summary["shards_with_unconsumed"]), summary["max_age_ms"],
            f"due ({reason})" if reason else "not due",
        )  # fmt: skip
        if reason is None:
            return None
        if self._fired_for == committed:
            self.log.info("holding: an event was already sent for the backlog after batch %s", committed)
            return None
        self._fired_for = committed
        return {
            "status": "success",
            "reason": reason,
            "stream_name": self.stream_name,
            "consumer_name": self.consumer_name,
            "committed_batch_id": committed,
            "records_waiting": summary["records_waiting"],
            "records_waiting_exact": summary["records_waiting_exact"],
            "max_age_ms": summary["max_age_ms"],
            "shards_with_unconsumed": summary["shards_with_unconsumed"],
            "shards": {
                shard_id: {"records_waiting": lag["records_waiting"], "age_ms": lag["age_ms"]}
                for shard_id, lag in summary["shards"].items()
                if lag["has_unconsumed"]
            },
            "measured_at": summary["measured_at"],
            "min_records": min_records,
            "min_age_seconds": min_age,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async with self._clients() as (kinesis, dynamodb):
            while True:
                try:
                    payload = await self.evaluate(kinesis, dynamodb)
                except Exception as err:  # noqa: BLE001 - an event trigger has no task to fail: log, poll again
                    self.log.error("backlog poll of %s/%s failed: %s: %s", self.stream_name, self.consumer_name,
                                   type(err).__name__, err)  # fmt: skip
                    payload = None
                if payload is not None:
                    yield TriggerEvent(payload)
                await self._wait_for_next_poll(dynamodb)

    async def _wait_for_next_poll(self, dynamodb: aio.AsyncDynamoDBClient) -> None:
        """Sleep ``poke_interval`` seconds; while holding after an event (the last poll counted
        after the batch the event was sent for), end early once the consumer's committed batch id
        moved (read every ``BACKLOG_HOLD_HEAD_INTERVAL_S``)."""
        deadline = time.monotonic() + self.poke_interval
        holding = self._fired_for is not None and self._fired_for == self._counted_after
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not holding:
                await asyncio.sleep(left)
                return
            await asyncio.sleep(min(left, BACKLOG_HOLD_HEAD_INTERVAL_S))
            try:
                committed = (await aio.read_head(dynamodb, self._store())).committed_batch_id
            except Exception as err:  # noqa: BLE001 - the next backlog poll reads the head again
                self.log.info("reading the head of %s/%s failed (%s); polling at the interval", self.stream_name,
                              self.consumer_name, err)  # fmt: skip
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                return
            if committed != self._counted_after:
                self.log.info("batch %s committed: polling the backlog now", committed)
                return


class KinesisBatchReportTrigger(_ConsumerTrigger):
    """Waits on the checkpoint store while a handed batch's job runs elsewhere (a deferred
    ``KinesisToSparkOperator`` or ``KinesisCommitBatchOperator``): one ``GetItem`` of the head per
    poll, no worker slot.

    Fires once (``core.job.handed_batch_state``): ``reported`` (the job recorded its report:
    commit now), ``committed`` (an earlier attempt committed it), ``not_pending``, ``taken_over``,
    or ``no_report`` (the job's lease expired, or no job claimed the batch within
    ``job_start_timeout`` seconds of ``handed_at``, without a report); ``error`` when the store
    cannot be read.

    :param batch_id: the handed batch.
    :param lease_owner: the writer id it was handed over by.
    :param lease_seconds: the batch's lease (seconds).
    :param handed_at: when it was handed over (epoch seconds).
    :param job_start_timeout: seconds the job has to claim the batch.
    :param kwargs: the common arguments (see ``_ConsumerTrigger``).
    """

    def __init__(
        self, *, batch_id: int, lease_owner: str, lease_seconds: float, handed_at: float, job_start_timeout: float,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.batch_id = int(batch_id)
        self.lease_owner = lease_owner
        self.lease_seconds = float(lease_seconds)
        self.handed_at = float(handed_at)
        self.job_start_timeout = float(job_start_timeout)

    reads_kinesis = False  # one GetItem of the head per poll

    def own_arguments(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "lease_owner": self.lease_owner, "lease_seconds": self.lease_seconds,
                "handed_at": self.handed_at, "job_start_timeout": self.job_start_timeout}  # fmt: skip

    async def evaluate(self, kinesis: Any, dynamodb: aio.AsyncDynamoDBClient) -> dict[str, Any] | None:
        head = await aio.read_head(dynamodb, self._store())
        state = handed_batch_state(
            head, self.batch_id, self.lease_owner, self.lease_seconds, now_ms=int(time.time() * 1000),
            handed_at_ms=int(self.handed_at * 1000), job_start_timeout=self.job_start_timeout,
        )  # fmt: skip
        if state is None:
            self.log.info("batch %d of %s/%s: job running (holder %s)", self.batch_id, self.stream_name, self.consumer_name,
                          head.pending_owner)  # fmt: skip
            return None
        self.log.info("%s", state["message"])
        return {**state, "batch_id": self.batch_id, "lease_owner": self.lease_owner}
