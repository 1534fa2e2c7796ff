"""One batch's Spark work: read, transform, write and report (:func:`run`), and the moves of a
handed batch's output (:func:`publish`, :func:`discard`, :func:`refuse_committed`).

* One pass when the operator's probes found a user record (``--records-expected``): the records
  are read, transformed and written by one Spark job, and the per-shard report rows (one per
  range, filtered out of the output) come back as an observed metric of that job
  (``DataFrame.observe``; :mod:`~airflow_kinesis_spark.job.reports`). Corrupt aggregates are
  counted in the reports; when there are any, only the ranges holding them are read a second
  time, keeping only those records, and that read must report what the first did. A transform
  must consume all of its input (filters, projections, joins and aggregations do; ``limit`` and
  ``sample`` do not): a range without a report fails the job.
* Otherwise (a batch that may hold no user record: run by hand, resumed, or only corrupt
  records seen) the read is cached on disk, so Kinesis is read once: the reports are collected
  from the cache, then the records are written from it. No records, no files.
* Output: the write side, :mod:`~airflow_kinesis_spark.sinks.spark_write` (Spark's Parquet
  writer at the plan's ``output_location``, or a handed batch's staging location, which
  :func:`publish` moves to the plan's location afterwards).

pyspark is imported inside the functions that use it. No Airflow import.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.job.read import read_batch
from airflow_kinesis_spark.job.reports import (
    _is_spark_connect,
    _observed,
    ObservedMetricsLostError,
    _observed_reports,
    _range_key,
    _same_read,
    collect_reports,
    observation_supported,
)
from airflow_kinesis_spark.sinks.spark_write import QUARANTINE_DIR, _write_quarantine, output_rows, write_output

log = logging.getLogger("airflow_kinesis_spark.spark_job")

__all__ = ["run", "run_one_pass", "refuse_committed", "publish", "discard", "store_for"]


def run_one_pass(
    spark: Any, plan: dict[str, Any], transform: Callable | None, aws_env: dict[str, str], options: dict[str, Any],
    location: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Read, transform and write in one Spark job (see the module doc); the batch must hold a user record.

    :raises RuntimeError: the read found no user record (the output location then holds a
        Parquet file with no rows; nothing is committed), a range has no report, or the second
        read of ranges with corrupt records reported something else than the first.
    """
    from pyspark.sql import functions as F

    started = time.monotonic()
    location = location or plan["output_location"]
    name = f"kinesis_batch_{plan['batch_id']}_{os.getpid()}_{time.time_ns()}"
    raw, observation = _observed(read_batch(spark, plan, aws_env, options), name)
    data = output_rows(raw, plan)
    if transform is not None:
        data = transform(data)
    write_output(data, plan, location)
    read_seconds = time.monotonic() - started
    reports = collect_reports(plan, _observed_reports(observation, data, name))
    records = sum(r["records"] for r in reports)
    quarantined = sum(r.get("quarantined", 0) + r.get("dead_letters", 0) for r in reports)
    if records == 0:
        raise RuntimeError(f"batch {plan['batch_id']}: the read found no user record although the operator's probes saw one; "
                           f"{location} holds no rows and nothing is committed")  # fmt: skip
    if quarantined > 0:
        keys = {_range_key(r) for r in reports if r.get("quarantined") or r.get("dead_letters")}
        again = {**plan, "ranges": [r for r in plan["ranges"] if _range_key(r) in keys]}
        name2 = name + "_quarantine"
        raw2, observation2 = _observed(read_batch(spark, again, aws_env, {**options, "quarantine_only": True}), name2)
        rows2 = raw2.where(F.col("_report").isNull())
        _write_quarantine(rows2, location)
        first = {_range_key(r): r for r in reports}
        for report in collect_reports(again, _observed_reports(observation2, rows2, name2)):
            before = first[_range_key(report)]
            if not _same_read(before, report):
                raise RuntimeError(f"shard {report['shard_id']}: the second read of its corrupt records read something else "
                                   f"than the first ({before.get('last')} vs {report.get('last')}); nothing is committed")  # fmt: skip
        # the task log's warning comes from the protocol's summary (core.summaries.log_outcome)
        log.info("batch %s: %d corrupt Kinesis records and dead letters written to %s/%s", plan["batch_id"], quarantined, location,
                 QUARANTINE_DIR)  # fmt: skip
    return {
        "batch_id": plan["batch_id"],
        "output_location": plan["output_location"],
        "quarantine_location": f"{plan['output_location']}/{QUARANTINE_DIR}" if quarantined > 0 else None,
        "records": records,
        "read_seconds": round(read_seconds, 3),
        "total_seconds": round(time.monotonic() - started, 3),
        "reports": reports,
    }


def run(
    spark: Any, plan: dict[str, Any], transform: Callable | None, aws_env: dict[str, str], options: dict[str, Any],
    location: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Read, write and report one batch; returns the report document (``output_location``: the plan's).

    :param location: where to write (default: the plan's ``output_location``); a handed batch
        writes to its staging location and publishes it afterwards (``core.job``).
    :param options: the readers' settings, as :func:`~airflow_kinesis_spark.job.cli.reader_options` builds them; with
        ``records_expected`` the batch is read and written in one pass (:func:`run_one_pass`),
        except over a Spark Connect client older than 4.0 (see :func:`observation_supported`),
        where it is read through the cache and must still hold a user record. Over Spark Connect,
        a one-pass write whose observed metrics the server dropped (SPARK-54279) is read again
        through the cache, in the same call.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if location is None and not _is_spark_connect(spark):  # writing the batch's folder itself, not a staging one
        refuse_committed(spark, plan["output_location"])
    # Also over Spark Connect, where the session is the server's: UTC and standard Parquet timestamps.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # No _SUCCESS in a batch folder that is not committed (SQL conf entries reach the write's Hadoop conf).
    spark.conf.set("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
    one_pass = bool(options.get("records_expected"))
    if one_pass and observation_supported(spark):
        try:
            return run_one_pass(spark, plan, transform, aws_env, options, location)
        except ObservedMetricsLostError as err:
            if not _is_spark_connect(spark):
                raise
            # The output is written but unreported; the cached read below collects the report rows
            # itself and overwrites the output with the same ranges' rows.
            log.warning("batch %s: %s. Reading the batch again through a cache (its output is overwritten)",
                        plan["batch_id"], err)  # fmt: skip
    elif one_pass:
        log.info("batch %s: this Spark Connect client (pyspark < 4) cannot read observed metrics: "
                 "reading through a cache instead of in one pass", plan["batch_id"])  # fmt: skip
    started = time.monotonic()
    raw = read_batch(spark, plan, aws_env, options).persist(StorageLevel.DISK_ONLY)
    try:
        rows = [r[0] for r in raw.where(F.col("_report").isNotNull()).select("_report").collect()]
        reports = collect_reports(plan, rows)
        read_seconds = time.monotonic() - started
        records = sum(r["records"] for r in reports)
        quarantined = sum(r.get("quarantined", 0) + r.get("dead_letters", 0) for r in reports)
        if one_pass and records == 0:
            raise RuntimeError(f"batch {plan['batch_id']}: the read found no user record although the operator's probes "
                               "saw one; nothing is written or committed")  # fmt: skip
        location = location or plan["output_location"]
        rows = raw.where(F.col("_report").isNull())
        if records > 0:
            data = output_rows(raw, plan)
            if transform is not None:
                data = transform(data)
            write_output(data, plan, location)
        else:
            log.info("batch %s: no records in the planned ranges; nothing written", plan["batch_id"])
        if quarantined > 0:
            _write_quarantine(rows, location)
            log.info("batch %s: %d corrupt Kinesis records and dead letters written to %s/%s", plan["batch_id"], quarantined,
                     location, QUARANTINE_DIR)  # fmt: skip
    finally:
        raw.unpersist()
    return {
        "batch_id": plan["batch_id"],
        "output_location": plan["output_location"] if records > 0 else None,
        "quarantine_location": f"{plan['output_location']}/{QUARANTINE_DIR}" if quarantined > 0 else None,
        "records": records,
        "read_seconds": round(read_seconds, 3),
        "total_seconds": round(time.monotonic() - started, 3),
        "reports": reports,
    }


def _hadoop_path(spark: Any, path: str) -> tuple[Any, Any]:
    """A Hadoop ``Path`` and its ``FileSystem`` (any scheme Spark writes: file, hdfs, s3a, EMRFS s3, ...)."""
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path, hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration())


def refuse_committed(spark: Any, target: str) -> None:
    """Refuse to write ``target`` when it is a Parquet batch folder that has a committed record
    (``core.locations.committed_record_of``): committed output, which a batch pending in this
    checkpoint store must never replace (the output is ahead of the store: a re-created
    checkpoint table, or another checkpoint history writing the same root).

    :raises RuntimeError: naming the folder and its record; nothing written or deleted.
    """
    from airflow_kinesis_spark.core.locations import committed_record_of

    record = committed_record_of(target)
    if record is None:
        return
    path, fs = _hadoop_path(spark, record)
    if fs.exists(path):
        raise RuntimeError(f"{target} holds a committed batch ({record} exists) that this checkpoint store has not "
                           "committed: the output is ahead of the store. Nothing was written, published or deleted.")  # fmt: skip


def publish(spark: Any, staging: str | None, target: str) -> None:
    """Replace ``target`` with ``staging`` (a rename on the same file system); ``None``: remove ``target``.

    :raises RuntimeError: ``target`` is a Parquet batch folder with a committed record
        (``core.locations.committed_record_of``): committed output, which the pending batch of
        this store must not replace (the output is ahead of the checkpoint store). Nothing published.
    """
    refuse_committed(spark, target)
    dst, fs = _hadoop_path(spark, target)
    if fs.exists(dst):
        fs.delete(dst, True)
    if staging is None:
        return
    src, _ = _hadoop_path(spark, staging)
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise RuntimeError(f"could not move the batch's output from {staging} to {target}; nothing is recorded")
    log.info("published %s", target)
    try:  # the _staging folder, once empty (another writer's staging directory keeps it)
        parent = src.getParent()
        if fs.exists(parent) and len(fs.listStatus(parent)) == 0:
            fs.delete(parent, False)
    except Exception:  # noqa: BLE001 - an empty folder readers skip anyway
        pass


def discard(spark: Any, staging: str) -> None:
    """Remove an unpublished staging directory (best effort: it is under ``_staging``, which readers skip)."""
    try:
        path, fs = _hadoop_path(spark, staging)
        if fs.exists(path):
            fs.delete(path, True)
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to report
        log.warning("could not remove staging directory %s: %s", staging, err)


def store_for(args: JobArguments) -> Any:
    """The checkpoint store, through the driver's own AWS credentials (boto3's default chain:
    environment, instance profile, IRSA, EMR execution role); ``AWS_ENDPOINT_URL_DYNAMODB`` for an
    emulator."""
    import boto3
    from botocore.config import Config

    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    client = boto3.session.Session(region_name=args.region_name).client(
        "dynamodb", config=Config(retries={"mode": "standard", "max_attempts": 10}, connect_timeout=10, read_timeout=30)
    )
    return DynamoDBCheckpointStore(client, args.checkpoint_table, args.stream_name, args.consumer_name)
