"""The exception a failed spark-submit job names, found in its output (BatchSparkSubmitHook)."""

from __future__ import annotations

import pytest

from airflow_kinesis_spark.hooks.spark_submit import exception_line, failure_cause
from tests.unit.hooks.provider_probe import OUTPUT  # a failed PySpark job's spark-submit output (the probe's fake prints it)


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("RuntimeError: injected failure in the user transform", "RuntimeError: injected failure in the user transform"),
        ('Exception in thread "main" java.lang.IllegalArgumentException: bad master', "java.lang.IllegalArgumentException: bad master"),
        ("Caused by: java.io.IOException: Mkdirs failed to create /x", "java.io.IOException: Mkdirs failed to create /x"),
        ("26/11/24 00:16:27 INFO CodecPool: Got brand-new compressor [.snappy]", None),
        ('  File "/opt/job/kinesis_batch.py", line 600, in main', None),
        ("\tat org.apache.spark.scheduler.DAGScheduler.run(DAGScheduler.scala:1)", None),
        ("Traceback (most recent call last):", None),
    ],
)
def test_exception_lines(line, cause):
    assert exception_line(line) == cause


def test_the_cause_is_the_last_exception_that_is_not_a_wrapper():
    """(The hook reads the lines from its wrapper's copy of spark-submit's output: test_spark_submit_provider.py.)"""
    assert failure_cause(OUTPUT.splitlines()) == "java.io.IOException: Mkdirs failed to create file:/readonly/lake/_staging/batch_id=1-ab12"
    assert failure_cause(["26/11/24 INFO all good"]) is None
    assert failure_cause(["py4j.protocol.Py4JJavaError: An error occurred while calling o45.parquet."]) == (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o45.parquet.")  # only a wrapper: it
