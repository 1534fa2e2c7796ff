"""One error policy (airflow_kinesis_spark.failures): every domain error says whether a retry can
help, and one function maps it for every operator, task and trigger."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_kinesis_spark import exceptions
from airflow_kinesis_spark.failures import error_event, raise_event_error, task_errors

#: The errors a retry finds again: another writer won, a plan or report that does not fit, records
#: that would be lost, a table or output that refuses the batch, a corrupt item of the store, an
#: output endpoint the table library does not trust.
NOT_RETRYABLE = {
    "CheckpointConflictError", "DataLossError", "PendingPlanMismatchError", "ReportValidationError", "DeadLetterLimitError",
    "TableCommitError", "OutputOwnedError", "OutputAheadError", "WindowAheadError", "PlanBindingError",
    "CheckpointStoreCorruptError", "OutputTrustError",
}  # fmt: skip


def domain_errors() -> list[type[exceptions.KinesisSparkError]]:
    return [getattr(exceptions, name) for name in exceptions.__all__ if name != "KinesisSparkError"]


def test_every_domain_error_says_whether_a_retry_can_help():
    assert {e.__name__ for e in domain_errors() if not e.retryable} == NOT_RETRYABLE
    assert {e.__name__ for e in domain_errors()} >= NOT_RETRYABLE | {"BatchLeaseHeldError", "ReportNotRecordedError"}


@pytest.mark.parametrize("error", domain_errors(), ids=lambda e: e.__name__)
def test_task_errors_fails_at_once_exactly_when_a_retry_cannot_help(error):
    raised = error("what happened", batch_id=3)
    if error.retryable:
        with pytest.raises(error), task_errors():
            raise raised
    else:
        with pytest.raises(AirflowFailException, match="what happened") as info, task_errors():
            raise raised
        assert info.value.__cause__ is raised


def test_other_errors_pass_through_for_airflows_retries():
    with pytest.raises(OSError), task_errors():
        raise OSError("network")


def test_a_trigger_error_event_carries_the_policy_to_the_resumed_task():
    corrupt = error_event(exceptions.CheckpointStoreCorruptError("bad item"))
    assert corrupt == {"status": "error", "message": "CheckpointStoreCorruptError: bad item", "retryable": False}
    with pytest.raises(AirflowFailException, match="trigger failed"):
        raise_event_error("trigger failed", corrupt)
    with pytest.raises(RuntimeError, match="trigger failed"):
        raise_event_error("trigger failed", error_event(TimeoutError("slow")))
    with pytest.raises(RuntimeError):
        raise_event_error("an event of an earlier version", {"status": "error", "message": "x"})
