"""Table commits that conflict with another writer's, tried again: the one retry policy of the
Iceberg and Delta sinks (``sinks.iceberg``, ``sinks.delta``), with tenacity.

A table commit conflicts when another writer committed to the table between this attempt's read
of the table and its own commit (pyiceberg's ``CommitFailedException``, delta-rs'
``CommitFailedError``, or a table created meanwhile). Each attempt reloads the table and looks
for the batch in it first, so an attempt after a conflict never adds the batch twice.

No Airflow import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

__all__ = ["COMMIT_ATTEMPTS", "retry_on_conflict"]

#: Attempts of a table commit that conflicts with another writer's, in all (each on the reloaded table).
COMMIT_ATTEMPTS = 5

T = TypeVar("T")


def retry_on_conflict(attempt: Callable[[], T], conflicts: tuple[type[BaseException], ...], what: str, *,
                      logger: logging.Logger, pause: float = 0.0) -> T:  # fmt: skip
    """``attempt()``, called again while it raises one of ``conflicts``, up to :data:`COMMIT_ATTEMPTS`
    calls in all; each conflict is logged as a warning on the sink's ``logger``, naming ``what``
    (``"table db.events: commit"``). ``pause`` seconds before the second call, one more ``pause`` before each later
    one (0: at once).

    :returns: what ``attempt`` returned.
    :raises BaseException: what the last call raised (one of ``conflicts`` after the last
        attempt), or at once anything else it raised.
    """

    def conflicted(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning("%s conflicted with another writer (%s); retrying on the reloaded table (attempt %d of %d)", what,
                    error, state.attempt_number + 1, COMMIT_ATTEMPTS)  # fmt: skip

    retrying = Retrying(retry=retry_if_exception_type(conflicts), stop=stop_after_attempt(COMMIT_ATTEMPTS),
                        wait=wait_incrementing(pause, pause), before_sleep=conflicted, reraise=True)  # fmt: skip
    return retrying(attempt)
