from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="module")
def spark():
    """A local SparkSession (Java 17+; executors use this interpreter), per module: a classic
    session left running in a pytest-xdist worker would make the Spark Connect tests that worker
    runs later fail (pyspark refuses a remote session beside a regular one: SESSION_ALREADY_EXIST)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("airflow-kinesis-spark-tests")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
