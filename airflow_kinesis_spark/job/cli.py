"""The job's command line: what ``spark_scripts/kinesis_batch.py`` runs (:func:`main`).

Run by spark-submit (``KinesisToSparkOperator``) or by any operator that runs a PySpark script
(a split task group's job task: EMR, Glue, Databricks, Kubernetes, ...) with::

    kinesis_batch.py --checkpoint-table T --stream S --consumer C --batch-id N --lease-owner O
                     [--lease-seconds 60] [--records-expected] [--region R] [--transform module:function]

The batch is handed over in the checkpoint store (``airflow_kinesis_spark.core.job``): the driver
claims it, reads its plan from the store, holds its lease while it runs (losing it cancels the
Spark jobs), writes to a staging directory under ``{output root}/_staging``, and, only while it
still holds the lease, moves the output to the plan's location and records its per-shard report
in the store (:func:`run_handed`). No file passes between the process that planned the batch and
this driver. A window (``--window LABEL``) is handed over the same way, through the window's items.

AWS credentials come from the driver's own chain (boto3's: the environment the runner set, or
the cluster's instance profile, IRSA or EMR execution role), region and endpoints from
``--region`` or the environment (``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_KINESIS``,
``AWS_ENDPOINT_URL_DYNAMODB``); never a credential on the command line.

No Airflow import.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from airflow_kinesis_spark.core.job import JobArguments, check_planned_transform, run_handed_batch, run_handed_window
from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.core.transform import check_transform_spec, resolve_transform
from airflow_kinesis_spark.job.batch import discard, publish, run, store_for

log = logging.getLogger("airflow_kinesis_spark.spark_job")

__all__ = ["AWS_ENV_VARS", "parse_args", "reader_options", "build_session", "run_handed", "configure_logging", "main"]


#: Environment variables handed to the executors' Kinesis clients.
AWS_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_KINESIS",
    "AWS_CA_BUNDLE",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Read one planned Kinesis batch into Parquet.")
    store = parser.add_argument_group("the batch, handed over in the checkpoint store (airflow_kinesis_spark.core.job)")
    JobArguments.add_arguments(store)
    parser.add_argument("--transform", default=None, help="optional module:function, DataFrame -> DataFrame")
    parser.add_argument("--transform-allowed-modules", default=None,
                        help="comma-separated module prefixes a transform may come from (the worker's "
                             "[kinesis_spark] transform_allowed_modules)")  # fmt: skip
    defaults = ReadOptions()  # the readers' settings and their defaults live there
    parser.add_argument("--limit", type=int, default=defaults.limit, help="GetRecords Limit (1..10,000)")
    parser.add_argument("--min-call-interval", type=float, default=defaults.min_call_interval,
                        help="seconds between GetRecords calls per shard")
    parser.add_argument("--read-bytes-per-second", type=float, default=defaults.read_bytes_per_second,
                        help="per-shard read budget the readers pace themselves to (0: no pacing)")
    parser.add_argument("--read-tasks", type=int, default=0, help="Spark tasks reading the ranges (0: default parallelism)")
    # Managed platforms add arguments of their own (Glue: --JOB_NAME, --JOB_RUN_ID, ...): ignored, logged.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        log.warning("ignoring arguments this job does not take (added by the platform?): %s", unknown)
    return args


def reader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The readers' settings from the command line (``ReadOptions.job_args`` wrote them; the
    Spark Connect path passes ``ReadOptions.job_options`` directly)."""
    options = ReadOptions(limit=args.limit, min_call_interval=args.min_call_interval,
                          read_bytes_per_second=args.read_bytes_per_second or None, read_tasks=args.read_tasks or None)  # fmt: skip
    return options.job_options(args.records_expected)


def build_session(app_name: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )


def run_handed(args: argparse.Namespace) -> int:
    """The batch handed over in the checkpoint store (``airflow_kinesis_spark.core.job``): claim,
    read the plan, write under the lease to staging, publish, record the report."""
    job_args = JobArguments.from_namespace(args)
    options = reader_options(args)
    aws_env = {k: os.environ[k] for k in AWS_ENV_VARS if os.environ.get(k)}
    if job_args.region_name:
        aws_env.setdefault("AWS_DEFAULT_REGION", job_args.region_name)  # the executors' Kinesis clients
    store = store_for(job_args)
    spark: Any = None

    def write(plan: Any, location: str) -> dict[str, Any]:
        nonlocal spark
        check_planned_transform(plan, args.transform)  # the plan's transform is the DAG's (BOUND)
        transform = resolve_transform(args.transform, args.transform_allowed_modules)
        spark = build_session(f"kinesis-batch-{plan.stream_name}-{plan.consumer_name}-{plan.batch_id}")
        return run(spark, plan.to_dict(), transform, aws_env, options, location)

    def cancel() -> None:
        if spark is not None:
            log.error("lost the lease on batch %d: cancelling the Spark jobs; nothing is published", job_args.batch_id)
            spark.sparkContext.cancelAllJobs()

    def publish_staged(staging: str | None, target: str) -> None:
        publish(spark, staging, target)

    def discard_staged(staging: str) -> None:
        if spark is not None:
            discard(spark, staging)

    try:
        if job_args.window:
            outcome = run_handed_window(store, job_args, write=write, publish=publish_staged, discard=discard_staged)
        else:
            outcome = run_handed_batch(store, job_args, cancel=cancel, write=write, publish=publish_staged,
                                       discard=discard_staged)  # fmt: skip
    finally:
        if spark is not None:
            spark.stop()
    log.info("%s: %s (writer %s)", f"window {job_args.window}" if job_args.window else f"batch {job_args.batch_id}",
             outcome["status"], outcome["writer"])  # fmt: skip
    return 0


def configure_logging() -> None:
    """The driver's Python logging: the job's own lines (``airflow_kinesis_spark.*``) at INFO,
    every other library's (botocore, py4j, ...) at WARNING, on stderr. Spark's own (JVM) logging
    is configured by the log4j 2 file the runner passes (``kinesis-batch-log4j2.properties``)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_kinesis_spark").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = parse_args(argv)
    if args.transform:
        check_transform_spec(args.transform, args.transform_allowed_modules)  # a malformed spec fails at once; imported once the plan is checked
    return run_handed(args)
