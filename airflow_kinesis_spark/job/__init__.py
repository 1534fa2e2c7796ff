"""The PySpark job: read a planned batch of Kinesis shard ranges, write Parquet, report per shard.

``spark_scripts/kinesis_batch.py`` is its entry point (spark-submit's application, a cluster's
job task), which calls :func:`main`; the Spark Connect runner (``hooks.spark_connect``) calls
:func:`run` in the worker's own process. The package is Airflow-free: it goes to the driver and
the executors (or a Spark Connect server) in the package zip (``hooks.spark_package.core_zip``).

* :mod:`~airflow_kinesis_spark.job.cli`: the command line (:func:`main`, :func:`parse_args`),
  the Spark session, and the batch handed over in the checkpoint store (:func:`run_handed`).
* :mod:`~airflow_kinesis_spark.job.batch`: one batch's read, transform, write and report
  (:func:`run`, in one pass or through a cache), and the publication of a handed batch's output.
* :mod:`~airflow_kinesis_spark.job.read`: the ``mapInArrow`` read of the shard ranges.
* :mod:`~airflow_kinesis_spark.job.reports`: the per-range reports and the observed metric that
  brings them back.
* The write side is the sink's: :mod:`airflow_kinesis_spark.sinks.spark_write`.

No Airflow import in any of them; pyspark is imported inside the functions that use it.
"""

from __future__ import annotations

from airflow_kinesis_spark.job.batch import discard, publish, refuse_committed, run, run_one_pass, store_for
from airflow_kinesis_spark.job.cli import (
    AWS_ENV_VARS,
    build_session,
    configure_logging,
    main,
    parse_args,
    reader_options,
    run_handed,
)
from airflow_kinesis_spark.job.read import (
    HANDOVER_BYTES,
    HANDOVER_ROWS,
    JOB_COLUMNS,
    default_parallelism,
    job_schema,
    joined_batches,
    make_reader_function,
    read_batch,
)
from airflow_kinesis_spark.job.reports import READ_FIELDS, collect_reports, observation_supported

__all__ = [
    "main",
    "parse_args",
    "reader_options",
    "build_session",
    "configure_logging",
    "run_handed",
    "AWS_ENV_VARS",
    "run",
    "run_one_pass",
    "refuse_committed",
    "publish",
    "discard",
    "store_for",
    "read_batch",
    "make_reader_function",
    "job_schema",
    "joined_batches",
    "default_parallelism",
    "JOB_COLUMNS",
    "HANDOVER_ROWS",
    "HANDOVER_BYTES",
    "READ_FIELDS",
    "collect_reports",
    "observation_supported",
]
