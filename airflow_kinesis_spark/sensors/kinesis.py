"""Sensors that watch a stream for one consumer: shard lag, resharding, retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_kinesis_spark.failures import raise_event_error
from airflow_kinesis_spark.core.lag import (
    backlog_ready,
    measure_lag,
    retention_risks,
    topology_change,
    validate_lag_arguments,
)
from airflow_kinesis_spark.core.names import validate_stream_name
from airflow_kinesis_spark.core.stream_summary import RETENTION_MAX_AGE_S, STATUS_MAX_AGE_S
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.settings import deferral_requested
from airflow_kinesis_spark.hooks.consumer import AWS_TEMPLATE_FIELDS, KinesisAwsBaseOperator
from airflow_kinesis_spark.triggers.kinesis import (
    KinesisReshardingTrigger,
    KinesisRetentionTrigger,
    KinesisShardLagTrigger,
)

__all__ = ["KinesisShardLagSensor", "KinesisReshardingSensor", "KinesisRetentionGuardSensor"]


class _ConsumerSensor(BaseSensorOperator, KinesisAwsBaseOperator):
    """Common part: one consumer of one stream, its checkpoint table, the AWS connection.

    In deferrable mode the sensor checks once (unless ``poke_before_deferring`` is false), then
    defers to its trigger, which polls every ``poke_interval`` seconds with the async AWS client
    until done or ``timeout``. A failed trigger fails the task (skips it with ``soft_fail``).
    """

    template_fields: Sequence[str] = ("stream_name", "consumer_name", "checkpoint_table", *AWS_TEMPLATE_FIELDS)

    def __init__(
        self,
        *,
        stream_name: str,
        consumer_name: str,
        checkpoint_table: str,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream_name = stream_name
        self.consumer_name = consumer_name
        self.checkpoint_table = checkpoint_table
        self.deferrable = deferrable

    def store(self) -> DynamoDBCheckpointStore:
        validate_stream_name(self.stream_name)
        return self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name)

    def trigger_kwargs(self) -> dict[str, Any]:
        """The common arguments of the sensors' triggers (``_ConsumerTrigger``), by name."""
        return {
            "stream_name": self.stream_name,
            "consumer_name": self.consumer_name,
            "checkpoint_table": self.checkpoint_table,
            "poke_interval": float(self.poke_interval),
            **self.aws_trigger_kwargs,
        }

    def trigger(self) -> Any:
        raise NotImplementedError

    #: In deferrable mode, poke once in the worker before deferring (a sensor whose condition
    #: often holds already saves a trip through the triggerer).
    poke_before_deferring = True

    def execute(self, context: Context) -> Any:
        if not deferral_requested(self.deferrable):
            return super().execute(context)
        if self.poke_before_deferring:
            result = self.poke(context)
            if result.is_done:
                return result.xcom_value
        self.log.info("Deferring: %s polls every %ss", type(self.trigger()).__name__, self.poke_interval)
        self.defer(trigger=self.trigger(), method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not event or event.get("status") != "success":
            message = f"{type(self).__name__} trigger failed: {(event or {}).get('message', event)}"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise_event_error(message, event)
        return self.complete(event)

    def complete(self, event: dict[str, Any]) -> Any:
        raise NotImplementedError


class KinesisShardLagSensor(_ConsumerSensor):
    """Wait until a consumer's backlog is worth a batch; push the per-shard lag to XCom.

    Lag is measured after the consumer's committed checkpoints (the same store
    ``KinesisToSparkOperator`` commits to): per shard, whether a record is waiting, the age of the
    oldest waiting record (ms; CloudWatch's iterator age, per consumer) and ``MillisBehindLatest``
    where the service gives it. One ``GetShardIterator`` and ``GetRecords`` (``Limit`` 1) per
    shard per poke; the service allows 5 of each per second per shard, so keep
    ``poke_interval`` >= 1 s per concurrent sensor.

    .. seealso:: docs/sensors.md

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer whose checkpoints count (templated).
    :param checkpoint_table: its DynamoDB checkpoint table (templated).
    :param min_age_seconds: succeed when the oldest unconsumed record is at least this old
        (seconds); ``None`` (default): succeed when any shard has an unconsumed record.
    :param initial_position: where never-seen shards start, as the operator's argument.
    :param deferrable: poll in the triggerer (async AWS client) instead of a worker slot. ``None``
        (default): Airflow's ``[operators] default_deferrable``, read when the sensor runs.
    :returns: (XCom) ``stream_name``, ``consumer_name``, ``measured_at``, ``shards`` (shard id ->
        ``checkpoint``, ``has_unconsumed``, ``oldest_unconsumed_arrival``, ``age_ms``,
        ``millis_behind_latest``), ``shards_with_unconsumed``, ``max_age_ms``, ``waiting_shards``.
    """

    def __init__(self, *, min_age_seconds: float | None = None, initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_age_seconds = min_age_seconds
        self.initial_position = initial_position

    def poke(self, context: Context) -> PokeReturnValue:
        validate_lag_arguments(initial_position=self.initial_position, min_age_seconds=self.min_age_seconds)
        summary = measure_lag(self.kinesis_hook.conn, self.store(), initial_position=self.initial_position)
        done = backlog_ready(summary, self.min_age_seconds)
        self._log_lag(summary, "ready" if done else "waiting")
        return PokeReturnValue(is_done=done, xcom_value=summary)

    def _log_lag(self, summary: dict[str, Any], state: str) -> None:
        self.log.info(
            "Lag of %s/%s: %d shards with records waiting, oldest %.1fs; %s",
            self.stream_name, self.consumer_name, len(summary["shards_with_unconsumed"]),
            summary["max_age_ms"] / 1000, state,
        )  # fmt: skip
        for shard_id, lag in summary["shards"].items():
            self.log.info("  %s: checkpoint %s, age %s ms, MillisBehindLatest %s", shard_id, lag["checkpoint"],
                          lag["age_ms"], lag["millis_behind_latest"])  # fmt: skip

    def trigger(self) -> KinesisShardLagTrigger:
        return KinesisShardLagTrigger(min_age_seconds=self.min_age_seconds, initial_position=self.initial_position, **self.trigger_kwargs())

    def complete(self, event: dict[str, Any]) -> Any:
        self._log_lag(event["lag"], "ready (from the trigger)")
        return event["lag"]


class KinesisReshardingSensor(_ConsumerSensor):
    """Wait for a resharding: succeed when the open shards differ from the last committed batch's.

    While the stream is ``UPDATING`` (a split, merge or UpdateShardCount in progress) it keeps
    waiting. The status comes from ``DescribeStreamSummary`` (20 calls per second per account,
    Kinesis API reference), shared by the host's sensors and triggers: a summary at most
    ``STATUS_MAX_AGE_S`` (5 s) old, else a call paced by the host's budget (docs/sensors.md).
    The change goes to XCom so a DAG can branch, alert, or just proceed; the operator
    handles resharding by itself (parents are read to ``SHARD_END`` before their children).

    .. seealso:: docs/sensors.md

    :param stream_name: the stream (templated).
    :param consumer_name: the consumer whose last committed batch is the baseline (templated).
    :param checkpoint_table: its DynamoDB checkpoint table (templated).
    :returns: (XCom) ``open_shards``, ``previous_open_shards``, ``new_shards``, ``closed_shards``,
        ``children`` (parent -> child shard ids), ``changed``, ``committed_batch_id``.
    """

    def poke(self, context: Context) -> PokeReturnValue:
        status = self.kinesis_hook.describe_stream_summary(self.stream_name, max_age=STATUS_MAX_AGE_S)["StreamStatus"]
        if status == "UPDATING":
            self.log.info("Stream %s is UPDATING (resharding in progress)", self.stream_name)
            return PokeReturnValue(is_done=False)
        plan = self.store().committed_plan()
        if plan is None:
            self.log.info("Consumer %s has no committed batch to compare the shards with", self.consumer_name)
            return PokeReturnValue(is_done=False)
        change = {**topology_change(self.kinesis_hook.list_shards(self.stream_name), plan.open_shards),
                  "committed_batch_id": plan.batch_id}  # fmt: skip
        self.log.info("Open shards now %s; at batch %d %s; new %s, closed %s", change["open_shards"], plan.batch_id,
                      change["previous_open_shards"], change["new_shards"], change["closed_shards"])  # fmt: skip
        return PokeReturnValue(is_done=change["changed"], xcom_value=change)

    def trigger(self) -> KinesisReshardingTrigger:
        return KinesisReshardingTrigger(**self.trigger_kwargs())

    def complete(self, event: dict[str, Any]) -> Any:
        change = event["change"]
        self.log.info("Resharding since batch %s: new %s, closed %s, children %s", change["committed_batch_id"],
                      change["new_shards"], change["closed_shards"], change["children"])  # fmt: skip
        return change


class KinesisRetentionGuardSensor(_ConsumerSensor):
    """Fail before data is lost: when a consumer's oldest unconsumed record nears the retention period.

    Succeeds at once when every shard's oldest unconsumed record is younger than the stream's
    retention period (``RetentionPeriodHours``) minus ``margin``; otherwise fails without retry
    (or is skipped with ``soft_fail=True``), naming the shards and the time left. It evaluates
    once, in the worker, also with ``deferrable=True``: deferring one evaluation would only add a
    trip through the triggerer, and a task whose trigger fires at once can meet a scheduler race
    (Airflow 3.3: the executor reports the deferring task finished while it is already queued
    again, and the task fails). ``KinesisRetentionTrigger`` evaluates the same rule for DAGs that
    want it in the triggerer. The retention period comes from ``DescribeStreamSummary``, shared by
    the host's sensors and triggers (a summary at most ``RETENTION_MAX_AGE_S``, 300 s, old).

    .. seealso:: docs/sensors.md

    :param margin: how close to the retention period is too close (default 1 hour).
    :returns: (XCom) ``retention_period_hours``, ``at_risk`` (shard id -> ms left), ``lag``.
    :raises AirflowFailException: a shard is at risk (``AirflowSkipException`` with ``soft_fail``).
    """

    poke_before_deferring = True  # one evaluation, always done: it never defers

    def __init__(self, *, margin: timedelta = timedelta(hours=1), initial_position: str = "TRIM_HORIZON", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.margin = margin
        self.initial_position = initial_position

    def poke(self, context: Context) -> PokeReturnValue:
        validate_lag_arguments(initial_position=self.initial_position)
        retention = float(self.kinesis_hook.describe_stream_summary(self.stream_name, max_age=RETENTION_MAX_AGE_S)["RetentionPeriodHours"])
        lag = measure_lag(self.kinesis_hook.conn, self.store(), initial_position=self.initial_position)
        return PokeReturnValue(is_done=True, xcom_value=self.complete(
            {"retention_period_hours": retention, "at_risk": retention_risks(lag, retention, self.margin), "lag": lag}
        ))  # fmt: skip

    def trigger(self) -> KinesisRetentionTrigger:
        return KinesisRetentionTrigger(margin_seconds=self.margin.total_seconds(), initial_position=self.initial_position,
                                       **self.trigger_kwargs())  # fmt: skip

    def complete(self, event: dict[str, Any]) -> Any:
        at_risk = event["at_risk"]
        if at_risk:
            detail = ", ".join(f"{k} ({v / 3_600_000:.2f} h left)" for k, v in sorted(at_risk.items()))
            message = (
                f"Consumer {self.consumer_name!r} of stream {self.stream_name!r}: unconsumed records are within "
                f"{self.margin} of the {event['retention_period_hours']} h retention period on {detail}. Run the "
                "ingestion (or raise the retention period) before they age out."
            )
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowFailException(message)
        self.log.info("Retention guard: every shard's oldest unconsumed record is more than %s from aging out", self.margin)
        return {k: v for k, v in event.items() if k != "status"}
