"""Transforms that change the output's columns, for the schema tests of the table outputs
(tests/integration/test_output_safety.py). DataFrame API only: over Spark Connect the transform
runs in the client, so the server needs no copy of this module."""

from __future__ import annotations

from typing import Any


def add_country(df: Any) -> Any:
    """Adds a string column ``country``."""
    from pyspark.sql import functions as F

    return df.withColumn("country", F.lit("nl"))


def partition_key_as_long(df: Any) -> Any:
    """``partition_key`` as a long (another type than the table's string)."""
    from pyspark.sql import functions as F

    return df.withColumn("partition_key", F.length("partition_key").cast("long"))
