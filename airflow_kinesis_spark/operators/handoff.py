"""What the operators do with a handed batch's outcome (deferred operator, split commit task)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.failures import raise_event_error, task_errors
from airflow_kinesis_spark.core.job import handed_batch_state
from airflow_kinesis_spark.core.protocol import commit_handed
from airflow_kinesis_spark.hooks.spark_temp import consumer_key, sweep_leftover_temp_dirs
from airflow_kinesis_spark.exceptions import ReportNotRecordedError

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from airflow_kinesis_spark.sinks import Sink

__all__ = ["commit_event", "commit_or_raise", "handed_event"]

AFTER = "Nothing was committed; the plan stays pending and the next attempt re-uses it."



def commit_or_raise(
    store: DynamoDBCheckpointStore, batch_id: int, lease_owner: str, lease_seconds: float, *, reused: bool = False, sink: Sink | None = None,
    plan_digest: str | None = None,
) -> dict[str, Any]:
    """:func:`~airflow_kinesis_spark.core.protocol.commit_handed`, its errors as Airflow's.

    :param plan_digest: the digest of the plan the planning run checked (refused if the stored
        plan has another: ``PlanBindingError``).
    :raises AirflowFailException: (no retry) another run took the batch over or moved on, the
        recorded report does not match the plan, the stored plan is not the checked one, or an
        item of the checkpoint table is corrupt (``CheckpointStoreCorruptError``).
    :raises ReportNotRecordedError: (retryable) no report recorded yet.
    :raises BatchLeaseHeldError: (retryable) a driver of the batch still holds its lease.
    """
    with task_errors():
        summary = commit_handed(store, batch_id, lease_owner, lease_seconds, reused=reused, sink=sink, plan_digest=plan_digest)
    # The batch is committed: a failed detached job's directory of it (or of an earlier batch), kept
    # on this worker for its log, can no longer be of use.
    sweep_leftover_temp_dirs(committed={consumer_key(store.stream_name, store.consumer_name): batch_id})
    return summary


def handed_event(
    store: DynamoDBCheckpointStore, batch_id: int, lease_owner: str, lease_seconds: float, *, handed_at: float, job_start_timeout: float
) -> dict[str, Any] | None:
    """What :class:`~airflow_kinesis_spark.triggers.kinesis.KinesisBatchReportTrigger` would fire
    with now, from one read of the head (``core.job.handed_batch_state``): a task reads it before
    it defers, and defers only while it is ``None`` (the job may still record its report).

    :param handed_at: when the batch was handed to its job (epoch seconds).
    :returns: ``None``, or the trigger's event (``status``, ``message``, ``batch_id``, ``lease_owner``)
        for :func:`commit_event`.
    """
    state = handed_batch_state(
        store.head(), batch_id, lease_owner, lease_seconds, now_ms=int(time.time() * 1000),
        handed_at_ms=int(handed_at * 1000), job_start_timeout=job_start_timeout,
    )  # fmt: skip
    return None if state is None else {**state, "batch_id": batch_id, "lease_owner": lease_owner}


def commit_event(
    store: DynamoDBCheckpointStore, event: dict[str, Any], lease_seconds: float, *, reused: bool = False, sink: Sink | None = None,
    plan_digest: str | None = None,
) -> dict[str, Any]:
    """Commit after :class:`~airflow_kinesis_spark.triggers.kinesis.KinesisBatchReportTrigger` fired.

    :param event: the trigger's payload (``status``, ``message``, ``batch_id``, ``lease_owner``).
    :returns: the batch summary (``reported`` and ``committed``).
    :raises AirflowFailException: ``taken_over`` or ``not_pending`` (another run moved on; no retry).
    :raises ReportNotRecordedError: ``no_report`` (retryable: the plan stays pending).
    :raises RuntimeError: ``error``: the trigger could not read the store (retryable), or
        ``AirflowFailException`` when the error says a retry cannot help (a corrupt item).
    """
    status = event.get("status")
    if status in ("reported", "committed"):
        return commit_or_raise(store, int(event["batch_id"]), event["lease_owner"], lease_seconds, reused=reused, sink=sink,
                               plan_digest=plan_digest)  # fmt: skip
    message = event.get("message") or status
    if status in ("taken_over", "not_pending"):
        raise AirflowFailException(f"{message}: another run of this consumer moved on. This run's output is not committed.")
    if status == "no_report":
        raise ReportNotRecordedError(f"{message}. {AFTER}", batch_id=event.get("batch_id"))
    raise_event_error(f"Waiting for the batch's report failed: {message}. {AFTER}", event)
