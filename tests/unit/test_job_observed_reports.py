"""The job's report rows come back as an observed metric of the write (``airflow_kinesis_spark.job.reports``);
when none comes back the job fails saying so, not with a bare ``KeyError``. No JVM."""

from __future__ import annotations

import pytest

from airflow_kinesis_spark.job.reports import _observed_reports


class Observed:
    """What ``pyspark.sql.Observation`` gives after an action: ``get``, the metrics by name."""

    def __init__(self, metrics: dict) -> None:
        self.get = metrics


def test_report_rows_are_read_from_the_observed_metric():
    rows = _observed_reports(Observed({"reports": '[{"shard_id": "shardId-000000000000"}]'}), object(), "kinesis_batch_1")
    assert rows == [{"shard_id": "shardId-000000000000"}]


def test_a_write_whose_metrics_did_not_come_back_fails_saying_so():
    with pytest.raises(RuntimeError, match=r"observed metric kinesis_batch_1: the report rows of the batch's ranges did not "
                                           r"reach the driver \(metrics received: none\); nothing is committed"):
        _observed_reports(Observed({}), object(), "kinesis_batch_1")
