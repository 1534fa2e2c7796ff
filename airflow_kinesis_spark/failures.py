"""One error policy for every task and trigger: a domain error a retry cannot help fails the task at once.

Each :class:`~airflow_kinesis_spark.exceptions.KinesisSparkError` says whether a retry can help
(``retryable``); :func:`task_errors` turns the ones that cannot into ``AirflowFailException``
(Airflow then skips the task's remaining retries) and lets every other error through unchanged,
for Airflow's retries. Used by every operator and by the commit of deferred tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark.exceptions import KinesisSparkError

__all__ = ["task_errors", "error_event", "raise_event_error"]


@contextmanager
def task_errors() -> Iterator[None]:
    """Run the block; a :class:`KinesisSparkError` with ``retryable`` false becomes
    ``AirflowFailException`` with its message (the original chained as its cause).

    :raises AirflowFailException: for a domain error a retry cannot help.
    """
    try:
        yield
    except KinesisSparkError as err:
        if err.retryable:
            raise
        raise AirflowFailException(str(err)) from err


def error_event(err: BaseException) -> dict[str, object]:
    """A trigger's event payload for ``err``: ``status`` ``error``, ``message`` and ``retryable``
    (a domain error's own; any other error may pass)."""
    return {"status": "error", "message": f"{type(err).__name__}: {err}", "retryable": getattr(err, "retryable", True)}


def raise_event_error(message: str, event: dict[str, object] | None) -> NoReturn:
    """Fail the task that resumed on an error event of :func:`error_event`.

    :raises AirflowFailException: the event says a retry cannot help.
    :raises RuntimeError: otherwise (Airflow's retries apply).
    """
    if event is not None and event.get("retryable") is False:
        raise AirflowFailException(message)
    raise RuntimeError(message)
