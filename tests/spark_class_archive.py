"""A small Spark application that `make test` runs once, under spark-submit, to dump a class-data
sharing (CDS) archive of the classes a test's Spark driver loads; see the Makefile's ``TEST_JVM_OPTS``.

It touches what the batch job touches (a DataFrame built in Python, ``mapInArrow`` in a Python
worker, an ``Observation``, Parquet written and read back) so that most of those classes come from
the archive instead of being parsed from Spark's jars again in every test's JVM. Classes it does not
load are loaded as usual; a stale or missing archive only turns sharing off (``-Xshare:auto``).

Usage: ``spark-submit --master local[2] tests/spark_class_archive.py`` with
``-XX:ArchiveClassesAtExit=FILE`` in ``SPARK_SUBMIT_OPTS``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F


def _double(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays([batch.column(0), pa.compute.multiply(batch.column(1), 2)], names=["k", "v"])


def main() -> int:
    spark = SparkSession.builder.appName("spark-class-archive").getOrCreate()
    try:
        rows = spark.createDataFrame([(f"shard-{i % 4}", i) for i in range(200)], "k string, v long")
        observation = Observation("rows")
        doubled = rows.mapInArrow(_double, "k string, v long").observe(observation, F.count(F.lit(1)).alias("n"))
        with tempfile.TemporaryDirectory() as out:
            doubled.write.mode("overwrite").partitionBy("k").parquet(out)
            total = spark.read.parquet(out).agg(F.sum("v")).collect()[0][0]
        if total != 2 * sum(range(200)) or observation.get["n"] != 200:
            print(f"spark_class_archive: unexpected result {total}, {observation.get}", file=sys.stderr)
            return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
