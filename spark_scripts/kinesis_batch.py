"""PySpark job: read a planned batch of Kinesis shard ranges, write Parquet, report per shard.

Run by spark-submit (``KinesisToSparkOperator``) or by any operator that runs a PySpark script
(a split task group's job task: EMR, Glue, Databricks, Kubernetes, ...) with::

    kinesis_batch.py --checkpoint-table T --stream S --consumer C --batch-id N --lease-owner O
                     [--lease-seconds 60] [--records-expected] [--region R] [--transform module:function]

The batch is handed over in the checkpoint store (``airflow_kinesis_spark.core.job``): the driver
claims it, reads its plan from the store, holds its lease while it runs (losing it cancels the
Spark jobs), writes to a staging directory under ``{output root}/_staging``, and, only while it
still holds the lease, moves the output to the plan's location and records its per-shard report
in the store. No file passes between the process that planned the batch and this driver.
``--plan-file PLAN.json --report-file REPORT.json`` instead (window mode, and tests) reads the
plan from a file and writes the report to one.

* A DataFrame of shard ranges read with ``mapInArrow`` (works classic and over Spark Connect),
  in as many tasks as Spark runs at once (``--read-tasks``, default: the default parallelism,
  at most one per range). Each task reads all of its ranges at the same time, one thread per
  range (``airflow_kinesis_spark.core.reader.read_concurrently``): reading Kinesis is waiting on
  each shard's read budget, so every shard is kept busy even with fewer cores than shards. The
  task hands Spark its rows in joined Arrow record batches (:data:`HANDOVER_ROWS`,
  :data:`HANDOVER_BYTES`), not one per ``GetRecords`` page.
* One pass when the operator's probes found a user record (``--records-expected``): the records
  are read, transformed and written by one Spark job, and the per-shard report rows (one per
  range, filtered out of the output) come back as an observed metric of that job
  (``DataFrame.observe``). Corrupt aggregates are counted in the reports; when there are any,
  only the ranges holding them are read a second time, keeping only those records, and that
  read must report what the first did. A transform must consume all of its input (filters,
  projections, joins and aggregations do; ``limit`` and ``sample`` do not): a range without a
  report fails the job.
* Otherwise (a batch that may hold no user record: run by hand, resumed, or only corrupt
  records seen) the read is cached on disk, so Kinesis is read once: the reports are collected
  from the cache, then the records are written from it. No records, no files.
* Output: Spark's Parquet writer, mode ``overwrite``, at the plan's ``output_location`` (derived
  from the batch id), so a re-run of the batch replaces its output; no ``_SUCCESS`` marker (the
  batch is not committed yet; ``airflow_kinesis_spark.sinks.parquet``). For a table output
  (the plan's ``output``: ``airflow_kinesis_spark.sinks.OutputSpec``) the rows are written one
  table partition per file (hidden ``_p{i}`` folder columns, source columns kept in the file)
  for the worker's table commit; no table format jar is needed.
* AWS credentials come from the driver's own chain (boto3's: the environment the runner set, or
  the cluster's instance profile, IRSA or EMR execution role), region and endpoints from
  ``--region`` or the environment (``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_KINESIS``,
  ``AWS_ENDPOINT_URL_DYNAMODB``); never a credential on the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from airflow_kinesis_spark.core.job import JobArguments, run_handed_batch, run_handed_window
from airflow_kinesis_spark.core.read_options import ReadOptions
from airflow_kinesis_spark.core.schema import arrow_schema, spark_ddl
from airflow_kinesis_spark.core.transform import check_transform_spec, resolve_transform

log = logging.getLogger("airflow_kinesis_spark.spark_job")

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

#: Columns ``mapInArrow`` yields after the output columns (``core.schema``) and the decoded ones
#: (``core.records``), all filtered out of the output: why a record is quarantined (a corrupt
#: Kinesis record, or a dead letter: a user record that does not decode), its kind
#: (``core.records.DEAD_LETTER_KINDS``), and the per-range report row.
JOB_COLUMNS = (("_quarantine_reason", "string"), ("_error_kind", "string"), ("_report", "string"))
#: What ``mapInArrow`` yields for raw records.
RAW_SCHEMA = spark_ddl(*JOB_COLUMNS)
#: A task hands Spark its rows in Arrow record batches of up to about this many rows, or bytes:
#: consecutive smaller ones (a small batch's pages of a few KiB, the one-row reports) are joined.
#: Each record batch costs the JVM's Arrow reader some work: at 256 shard ranges of 20 records,
#: 512 record batches took about 0.2 s more of its CPU than a few joined ones (an isolated local[2] run).
#: The rows are Spark's own default batch (``spark.sql.execution.arrow.maxRecordsPerBatch``).
HANDOVER_ROWS = 10_000
HANDOVER_BYTES = 8 * 1024 * 1024
#: Quarantine output, under ``{output_location}/_quarantine`` (a ``_`` folder: Spark's readers skip it).
QUARANTINE_DIR = "_quarantine"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Read one planned Kinesis batch into Parquet.")
    store = parser.add_argument_group("the batch, handed over in the checkpoint store (airflow_kinesis_spark.core.job)")
    JobArguments.add_arguments(store)
    for action in store._group_actions:  # only required without --plan-file; checked in main()
        action.required = False
    files = parser.add_argument_group("window mode (the operator's local runner) and tests: the plan in a file")
    files.add_argument("--plan-file", default=None, help="the batch plan (JSON)")
    files.add_argument("--report-file", default=None, help="where to write the per-shard report (JSON)")
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
    if args.plan_file is None and args.checkpoint_table is None:
        parser.error("give the handed batch (--checkpoint-table, --stream, --consumer, --batch-id, --lease-owner) "
                     "or --plan-file and --report-file")  # fmt: skip
    if args.plan_file is not None and args.report_file is None:
        parser.error("--plan-file needs --report-file")
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


def job_schema(records: dict[str, Any] | None) -> tuple[Any, str]:
    """What ``mapInArrow`` yields for a plan's record spec (``OutputSpec.records``; ``None``:
    raw): ``(pyarrow.Schema, Spark DDL)``: the output columns, the decoded columns
    (``core.records.RecordDecoder.schema``), then :data:`JOB_COLUMNS`."""
    import pyarrow as pa

    from airflow_kinesis_spark.core.record_schemas import spark_type
    from airflow_kinesis_spark.core.records import RecordDecoder

    schema = arrow_schema()
    decoded = RecordDecoder(records).schema if records else []
    for f in decoded:
        schema = schema.append(f)
    for name, _ in JOB_COLUMNS:
        schema = schema.append(pa.field(name, pa.string()))
    ddl = spark_ddl(*[(f"`{f.name}`", spark_type(f.type)) for f in decoded], *JOB_COLUMNS)
    return schema, ddl


def make_reader_function(stream_name: str, aws_env: dict[str, str], options: dict[str, Any], consumer_arn: str | None = None,
                         records: dict[str, Any] | None = None) -> Callable:  # fmt: skip
    """The ``mapInArrow`` function: each input row is one shard range (JSON); all ranges of a
    task are read at the same time. ``stream_name`` may be an ARN (the calls address it so); the
    rows' ``stream_name`` column is the stream's name either way. With ``consumer_arn`` the ranges
    are read with enhanced fan-out (SubscribeToShard) as that stream consumer. With ``records``
    (a typed record spec, ``core.records``) each page's records are decoded as they are read;
    the ones that do not decode are marked dead letters, and counted in their range's report
    (``dead_letters``)."""
    from airflow_kinesis_spark.core.names import stream_name_of

    row_stream_name = stream_name_of(stream_name)

    def read_ranges(batches: Iterator[Any]) -> Iterator[Any]:
        import boto3
        from botocore.config import Config

        from airflow_kinesis_spark.core.pool import share_data_loader
        from airflow_kinesis_spark.core.ranges import ShardRange
        from airflow_kinesis_spark.core.read_options import own_throttling
        from airflow_kinesis_spark.core.reader import ShardReader

        ranges = [ShardRange.from_dict(json.loads(r)) for batch in batches for r in batch.column(0).to_pylist()]
        session = share_data_loader(boto3.session.Session(  # a reused Python worker parses botocore's data once
            aws_access_key_id=aws_env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=aws_env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=aws_env.get("AWS_SESSION_TOKEN"),
            region_name=aws_env.get("AWS_DEFAULT_REGION") or aws_env.get("AWS_REGION"),
        ))
        client = own_throttling(session.client(  # throttling is the readers' to retry, in step with each shard's budget
            "kinesis",
            endpoint_url=aws_env.get("AWS_ENDPOINT_URL_KINESIS") or aws_env.get("AWS_ENDPOINT_URL"),
            verify=aws_env.get("AWS_CA_BUNDLE") or None,
            config=Config(
                retries={"mode": "standard", "max_attempts": 10}, connect_timeout=10, read_timeout=60,
                max_pool_connections=max(10, 2 * len(ranges)),
            ),
        ))
        schema, _ = job_schema(records)
        readers = [
            ShardReader(
                client, stream_name, rng, limit=options["limit"], min_call_interval=options["min_call_interval"],
                read_bytes_per_second=options.get("read_bytes_per_second"), consumer_arn=consumer_arn,
            )
            for rng in ranges
        ]  # fmt: skip
        quarantine_only = bool(options.get("quarantine_only"))
        yield from joined_batches(_read_batches(readers, schema, quarantine_only), HANDOVER_ROWS, HANDOVER_BYTES)

    def _read_batches(readers: list[Any], schema: Any, quarantine_only: bool) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_kinesis_spark.core.reader import read_concurrently
        from airflow_kinesis_spark.core.records import RecordDecoder

        decoder = RecordDecoder(records) if records else None
        dead_letters: dict[int, int] = {}
        for reader, page in read_concurrently(readers):
            if page is None:
                assert reader.report is not None
                report = {**reader.report.to_dict(), "dead_letters": dead_letters.get(id(reader), 0)}
                row = [pa.nulls(1, f.type) for f in schema][:-1] + [pa.array([json.dumps(report)], pa.string())]
                yield pa.RecordBatch.from_arrays(row, schema=schema)
                continue
            # What a Kinesis record's user records share is converted once and repeated by Arrow.
            n = len(page)
            index = pa.array(page.kinesis_record_index(), pa.int32())
            reasons = pa.array(page.quarantine_reasons, pa.string()).take(index)
            kinds = pc.if_else(pc.is_valid(reasons), pa.scalar("corrupt_aggregate"), pa.scalar(None, pa.string()))
            decoded: list[Any] = []
            if decoder is not None:
                # a corrupt Kinesis record is not decoded: its reason stays the reader's
                datas = [b"" if r is not None else d for d, r in zip(page.datas, reasons.to_pylist())]
                result = decoder.decode(datas)
                decoded = result.columns
                if result.dead_letters:
                    corrupt = reasons.to_pylist()
                    kinds = pa.array(["corrupt_aggregate" if c is not None else k for c, k in zip(corrupt, result.kinds)], pa.string())
                    reasons = pa.array([c if c is not None else m for c, m in zip(corrupt, result.messages)], pa.string())
                    dead = sum(1 for c, k in zip(corrupt, result.kinds) if c is None and k is not None)
                    dead_letters[id(reader)] = dead_letters.get(id(reader), 0) + dead
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(row_stream_name, pa.string()), n),
                    pa.repeat(pa.scalar(page.shard_id, pa.string()), n),
                    pa.array(page.sequence_numbers, pa.string()).take(index),
                    pa.array(page.sub_sequence_numbers, pa.int64()),
                    pa.array(page.partition_keys, pa.string()),
                    pa.array(page.explicit_hash_keys, pa.string()),
                    pa.array(page.arrivals, pa.timestamp("us", tz="UTC")).take(index),
                    pa.array(page.datas, pa.binary()),
                    *decoded,
                    reasons,
                    kinds,
                    pa.nulls(n, pa.string()),
                ],
                schema=schema,
            )
            if quarantine_only:
                batch = batch.filter(pc.is_valid(batch.column("_quarantine_reason")))
                if batch.num_rows == 0:
                    continue
            yield batch

    return read_ranges


def joined_batches(batches: Iterator[Any], max_rows: int, max_bytes: int) -> Iterator[Any]:
    """``batches`` (pyarrow record batches of one schema) in order, consecutive ones joined while
    the result stays within ``max_rows`` rows and ``max_bytes`` bytes (``RecordBatch.nbytes``);
    a batch that reaches either bound on its own passes at once, as it is. Holds back less than
    one joined batch."""
    pending: list[Any] = []
    rows = size = 0
    for batch in batches:
        if pending and (rows + batch.num_rows > max_rows or size + batch.nbytes > max_bytes):
            yield _join(pending)
            pending, rows, size = [], 0, 0
        pending.append(batch)
        rows, size = rows + batch.num_rows, size + batch.nbytes
        if rows >= max_rows or size >= max_bytes:
            yield _join(pending)
            pending, rows, size = [], 0, 0
    if pending:
        yield _join(pending)


def _join(batches: list[Any]) -> Any:
    """One record batch of ``batches`` (pyarrow 15 has no ``concat_batches``)."""
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def default_parallelism(spark: Any) -> int | None:
    """How many tasks the cluster runs at once: the SparkContext's default parallelism (classic
    sessions); over Spark Connect, ``spark.default.parallelism`` or the ``local[N]`` master, else
    the number of partitions Spark gives a range without a partition count (one small job:
    a ``local[*]`` or cluster master does not say in its conf)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext
        pass
    try:
        value = spark.conf.get("spark.default.parallelism", None)
        if value:
            return int(value)
        # A Spark Connect server with a local master says how many cores it runs tasks on.
        master = spark.conf.get("spark.master", None) or ""
        if master.startswith("local[") and master[6:-1].isdigit():
            return int(master[6:-1])
        from pyspark.sql import functions as F

        partitions = spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p")).agg(F.max("p"))
        return int(partitions.first()[0]) + 1
    except Exception:  # noqa: BLE001
        pass
    return None


def read_batch(spark: Any, plan: dict[str, Any], aws_env: dict[str, str], options: dict[str, Any]) -> Any:
    """A DataFrame of the batch's user records plus one ``_report`` row per shard range."""
    from pyspark.sql import functions as F

    ranges = [json.dumps(r, sort_keys=True) for r in plan["ranges"]]
    n = len(ranges)
    tasks = options.get("read_tasks") or default_parallelism(spark) or n
    tasks = max(1, min(n, tasks))
    log.info("batch %s: %d shard ranges read by %d Spark tasks", plan["batch_id"], n, tasks)
    range_df = spark.range(0, n, 1, tasks).select(
        F.element_at(F.array(*[F.lit(r) for r in ranges]), (F.col("id") + 1).cast("int")).alias("range")
    )
    records = (plan.get("output") or {}).get("records")
    reader = make_reader_function(plan["stream_name"], aws_env, options, plan.get("consumer_arn"), records)
    return range_df.mapInArrow(reader, job_schema(records)[1] if records else RAW_SCHEMA)


def _range_key(item: dict[str, Any]) -> tuple[str, int]:
    return item["shard_id"], int(item.get("slice_index") or 0)


#: What two reads of one range must agree on (timings and call counts may differ).
READ_FIELDS = ("first", "last", "records", "quarantined", "dead_letters", "stop_reason")


def _same_read(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in READ_FIELDS)


def collect_reports(plan: dict[str, Any], rows: list[str]) -> list[dict[str, Any]]:
    """One report per planned range, from the job's report rows (JSON), in the plan's order.

    Spark may run a read more than once (a retried task, a transform whose sort samples its
    input); a range's reports must then agree on what was read.

    :raises RuntimeError: a range without a report (the transform did not consume all of its
        input, e.g. ``limit``), or two reports of one range that disagree.
    """
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        report = json.loads(row)
        key = _range_key(report)
        seen = found.setdefault(key, report)
        if not _same_read(seen, report):
            raise RuntimeError(f"shard {key[0]} (slice {key[1]}) was read twice with different results: "
                               f"{[seen.get(k) for k in READ_FIELDS]} and {[report.get(k) for k in READ_FIELDS]}; "
                               "nothing is committed")  # fmt: skip
    missing = [key for key in map(_range_key, plan["ranges"]) if key not in found]
    if missing:
        raise RuntimeError(
            f"no read report for {len(missing)} of {len(plan['ranges'])} shard ranges ({missing[:3]}...): the job did not "
            "read them to the end. A transform must consume all of its input (no limit or sample); nothing is committed"
        )
    return [found[key] for key in map(_range_key, plan["ranges"])]


#: Spark's expressions for the partition transforms of ``airflow_kinesis_spark.sinks.PARTITION_TRANSFORMS``
#: (UTC session time zone): values that group rows by partition (the table reads the partition
#: value from each file's statistics, or, for Delta, the column itself).
_TRANSFORM_FORMATS = {"year": "yyyy", "month": "yyyy-MM", "day": "yyyy-MM-dd", "hour": "yyyy-MM-dd-HH"}


def _partition_column(transform: str, source: str) -> Any:
    from pyspark.sql import functions as F

    column = F.col(f"`{source}`")
    if transform == "identity":
        return column.cast("string")
    if transform == "date":
        return F.to_date(column)
    if transform in _TRANSFORM_FORMATS:
        return F.date_format(column, _TRANSFORM_FORMATS[transform])
    raise ValueError(f"unknown partition transform {transform!r}")


def write_output(data: Any, plan: dict[str, Any], location: str) -> None:
    """Write the batch's rows as the plan's output form asks (see the module doc).

    :raises ValueError: a partition or derived column's source is not among the transform's
        output columns (naming it and the columns there are).
    """
    output = plan.get("output") or {}
    partition = [tuple(f) for f in output.get("partition", ())]
    for name, transform, source in output.get("derived", ()):
        if name not in data.columns:
            if source not in data.columns:
                raise ValueError(f"the {output.get('format')} output adds column {name} = {transform}({source}), but the "
                                 f"transform's output has no {source} (columns: {data.columns}); keep it, or set partition_by")  # fmt: skip
            data = data.withColumn(name, _partition_column(transform, source))
    missing = [source for _, source, _ in partition if source not in data.columns]
    if missing:
        raise ValueError(f"the {output.get('format')} output is partitioned by {missing}, which the transform's output "
                         f"lacks (columns: {data.columns}); keep them in the transform, or change partition_by")  # fmt: skip
    for transform, source, name in partition:
        data = data.withColumn(name, _partition_column(transform, source))
    # No repartition (a shuffle stage on every batch): Spark's writer sorts each task's rows by the
    # partition columns and writes one file per (task, partition value); compaction merges them.
    writer = data.write
    if output.get("max_records_per_file"):
        writer = writer.option("maxRecordsPerFile", int(output["max_records_per_file"]))
    if partition:
        writer = writer.partitionBy(*[name for _, _, name in partition])
    writer.mode("overwrite").parquet(location)


def output_rows(raw: Any, plan: dict[str, Any]) -> Any:
    """The output's rows of the job's read: user records that decoded (not a report row, a
    corrupt Kinesis record or a dead letter), without the job's columns; without ``data`` when
    the records are decoded and ``keep_raw_data`` is not set."""
    from pyspark.sql import functions as F

    records = (plan.get("output") or {}).get("records")
    drop = [name for name, _ in JOB_COLUMNS] + (["data"] if records and not records.get("keep_raw_data") else [])
    return raw.where(F.col("_report").isNull() & F.col("_quarantine_reason").isNull()).drop(*drop)


def _write_quarantine(rows: Any, location: str) -> None:
    """Corrupt Kinesis records and dead letters (user records that did not decode), raw, under
    ``{location}/_quarantine`` (after the data: overwriting the data location clears this
    folder): ``stream_name``, ``shard_id``, ``sequence_number``, ``sub_sequence_number``,
    ``partition_key``, ``approximate_arrival_timestamp``, ``data``, ``error_kind``
    (``core.records.DEAD_LETTER_KINDS``) and ``reason`` (the message)."""
    from pyspark.sql import functions as F

    rows.where(F.col("_quarantine_reason").isNotNull()).select(
        "stream_name", "shard_id", "sequence_number", "sub_sequence_number", "partition_key", "approximate_arrival_timestamp",
        "data", F.col("_error_kind").alias("error_kind"), F.col("_quarantine_reason").alias("reason"),
    ).write.mode("overwrite").parquet(f"{location}/{QUARANTINE_DIR}")  # fmt: skip


# Spark 3.5 and 4 compatibility of the one-pass job's observed metric (the only Spark API the job
# uses whose behaviour differs between the two lines):
# * classic 3.5 hands an observed metric's value back as py4j sees it, so a list (``collect_list``)
#   arrives as a Java object; 4.x converts it to Python. The metric is therefore one string, the
#   JSON array of the report rows, which every version returns as a Python ``str``.
# * a Spark Connect client before 4.0 sends the metric's plan node but cannot read the value back
#   (its ``Observation.get`` only knows classic sessions): :func:`run` then takes the cached path.


def _is_spark_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (not a classic, JVM-backed one)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def observation_supported(spark: Any) -> bool:
    """Whether an observed metric of a write can be read back on ``spark``: on classic sessions
    always; over Spark Connect from pyspark 4.0 on."""
    if not _is_spark_connect(spark):
        return True
    import pyspark

    return int(pyspark.__version__.split(".")[0]) >= 4


def _observed(df: Any, name: str) -> tuple[Any, Any]:
    """``df`` with its report rows observed as a metric named ``name``: one JSON array (a string)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation(name)
    return df.observe(observation, F.to_json(F.collect_list("_report")).alias("reports")), observation


def _observed_reports(observation: Any, data: Any, name: str) -> list[str]:
    """The report rows an action on ``data`` observed.

    :raises RuntimeError: the metric's plan node was optimized away (classic), or the action's
        metrics did not come back; :raises TypeError: the metric is not one JSON string.
    """
    jdf = getattr(data, "_jdf", None)
    if jdf is not None and f"CollectMetrics {name}" not in jdf.queryExecution().optimizedPlan().toString():
        # Classic Spark waits forever for a metric whose plan node the optimizer removed.
        raise RuntimeError("the transform's result does not depend on the records read; no report was observed")
    metrics = observation.get
    if "reports" not in metrics:
        # Seen over Spark Connect on a loaded machine: a write that succeeded, no metrics back. Spark
        # Connect servers up to 4.1 send a query's observed metrics only if they arrive within 100 ms
        # of its end (Observation.getRowOrEmpty; SPARK-54279 removes that wait).
        raise RuntimeError(f"observed metric {name}: the report rows of the batch's ranges did not reach the driver "
                           f"(metrics received: {', '.join(sorted(metrics)) or 'none'}); nothing is committed. Over Spark "
                           "Connect a busy server can drop a query's observed metrics (SPARK-54279): the task's retry "
                           "runs the same plan again")
    value = metrics["reports"]
    if not isinstance(value, str):
        raise TypeError(f"observed metric {name}: expected the report rows as one JSON string, got {type(value).__name__}")
    return list(json.loads(value))


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
    :param options: the readers' settings, as :func:`reader_options` builds them; with
        ``records_expected`` the batch is read and written in one pass (:func:`run_one_pass`),
        except over a Spark Connect client older than 4.0 (see :func:`observation_supported`),
        where it is read through the cache and must still hold a user record.
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
        return run_one_pass(spark, plan, transform, aws_env, options, location)
    if one_pass:
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
        # The plan is the one the worker checked (core.job.check_bound_plan): its transform is the
        # DAG's. Arguments edited on the way (an XCom between the plan task and this job) are refused.
        planned = (plan.task_settings or {}).get("transform") if plan.task_settings is not None else args.transform
        if (args.transform or None) != (planned or None):
            raise ValueError(f"--transform {args.transform!r} is not the transform batch {plan.batch_id} was planned with "
                             f"({planned!r}): these job arguments were changed after the plan task. Nothing was read or written.")  # fmt: skip
        transform = resolve_transform(args.transform, args.transform_allowed_modules)
        spark = build_session(f"kinesis-batch-{plan.stream_name}-{plan.consumer_name}-{plan.batch_id}")
        return run(spark, plan.to_dict(), transform, aws_env, options, location)

    def cancel() -> None:
        if spark is not None:
            log.error("lost the lease on batch %d: cancelling the Spark jobs; nothing is published", job_args.batch_id)
            spark.sparkContext.cancelAllJobs()

    handlers = {
        "write": write,
        "publish": lambda staging, target: publish(spark, staging, target),
        "discard": lambda staging: spark is not None and discard(spark, staging),
    }
    try:
        if job_args.window:
            outcome = run_handed_window(store, job_args, **handlers)
        else:
            outcome = run_handed_batch(store, job_args, cancel=cancel, **handlers)
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
    if args.plan_file is None:
        if args.transform:
            check_transform_spec(args.transform, args.transform_allowed_modules)  # a malformed spec fails at once; imported once the plan is checked
        return run_handed(args)
    transform = resolve_transform(args.transform, args.transform_allowed_modules)  # fail before reading anything
    with open(args.plan_file, encoding="utf-8") as fh:
        plan = json.load(fh)
    options = reader_options(args)
    aws_env = {k: os.environ[k] for k in AWS_ENV_VARS if os.environ.get(k)}
    spark = build_session(f"kinesis-batch-{plan['stream_name']}-{plan['consumer_name']}-{plan['batch_id']}")
    try:
        result = run(spark, plan, transform, aws_env, options)
    finally:
        spark.stop()
    tmp = args.report_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, args.report_file)
    log.info(
        "batch %s: %d records from %d shard ranges written to %s in %.1fs",
        plan["batch_id"], result["records"], len(result["reports"]), result["output_location"], result["total_seconds"],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
