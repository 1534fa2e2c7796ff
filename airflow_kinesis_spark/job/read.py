"""The job's read: a DataFrame of the batch's shard ranges, read by ``mapInArrow``.

* A DataFrame of shard ranges read with ``mapInArrow`` (works classic and over Spark Connect),
  in as many tasks as Spark runs at once (``--read-tasks``, default: the default parallelism,
  at most one per range). Each task reads all of its ranges at the same time, one thread per
  range (``airflow_kinesis_spark.core.concurrent_read.read_concurrently``): reading Kinesis is waiting on
  each shard's read budget, so every shard is kept busy even with fewer cores than shards. The
  task hands Spark its rows in joined Arrow record batches (:data:`HANDOVER_ROWS`,
  :data:`HANDOVER_BYTES`), not one per ``GetRecords`` page.
* Each range ends with one report row (``_report``, JSON; :mod:`~airflow_kinesis_spark.job.reports`
  collects them); corrupt Kinesis records and dead letters are marked (``_quarantine_reason``,
  ``_error_kind``) and kept out of the output by the write side
  (:mod:`~airflow_kinesis_spark.sinks.spark_write`).

The read function runs in Spark's Python workers (the executors, or a Spark Connect server's):
it and what it uses import only the Airflow-free core, boto3 and pyarrow. No Airflow import.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from airflow_kinesis_spark.core.schema import JOB_COLUMNS, arrow_schema, spark_ddl

log = logging.getLogger("airflow_kinesis_spark.spark_job")

__all__ = [
    "JOB_COLUMNS",
    "HANDOVER_ROWS",
    "HANDOVER_BYTES",
    "job_schema",
    "make_reader_function",
    "joined_batches",
    "default_parallelism",
    "read_batch",
]


#: A task hands Spark its rows in Arrow record batches of up to about this many rows, or bytes:
#: consecutive smaller ones (a small batch's pages of a few KiB, the one-row reports) are joined.
#: Each record batch costs the JVM's Arrow reader some work: at 256 shard ranges of 20 records,
#: 512 record batches took about 0.2 s more of its CPU than a few joined ones (an isolated local[2] run).
#: The rows are Spark's own default batch (``spark.sql.execution.arrow.maxRecordsPerBatch``).
HANDOVER_ROWS = 10_000
#: Kinesis calls one Spark task's polling readers have in flight at most (the connections its
#: client pools): a reader waits between its calls (pacing, the shard's read budget) without
#: holding one, so a few dozen connections serve hundreds of ranges.
TASK_CONNECTIONS = 64
HANDOVER_BYTES = 8 * 1024 * 1024


def job_schema(decoder: Any = None) -> tuple[Any, str]:
    """What ``mapInArrow`` yields with ``decoder`` (a ``core.records.RecordDecoder``; ``None``:
    raw records): ``(pyarrow.Schema, Spark DDL)``: the output columns, the decoded columns
    (``decoder.schema``), then :data:`JOB_COLUMNS`."""
    import pyarrow as pa

    from airflow_kinesis_spark.core.record_schemas import spark_type

    schema = arrow_schema()
    decoded = decoder.schema if decoder is not None else []
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

        from airflow_kinesis_spark.core.pool import CallGate, gated, share_data_loader
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
        connections = max(10, 2 * len(ranges))
        if consumer_arn is None:
            connections = min(connections, TASK_CONNECTIONS)
        client = own_throttling(session.client(  # throttling is the readers' to retry, in step with each shard's budget
            "kinesis",
            endpoint_url=aws_env.get("AWS_ENDPOINT_URL_KINESIS") or aws_env.get("AWS_ENDPOINT_URL"),
            verify=aws_env.get("AWS_CA_BUNDLE") or None,
            config=Config(
                retries={"mode": "standard", "max_attempts": 10}, connect_timeout=10, read_timeout=60,
                max_pool_connections=connections,
            ),
        ))
        # Polling readers share the client's connections: no more calls in flight than it pools (a
        # task of 2,048 ranges opened 4,096 connections at once). A subscription (enhanced fan-out)
        # holds its connection for as long as it reads, so each reader keeps one of its own.
        gate = CallGate(connections) if consumer_arn is None else None
        from airflow_kinesis_spark.core.records import RecordDecoder

        decoder = RecordDecoder(records) if records else None  # one per task: the schema and every page's decoding
        schema, _ = job_schema(decoder)
        readers = [
            ShardReader(
                gated(client, gate) if gate else client, stream_name, rng, limit=options["limit"],
                min_call_interval=options["min_call_interval"],
                read_bytes_per_second=options.get("read_bytes_per_second"), consumer_arn=consumer_arn,
            )
            for rng in ranges
        ]  # fmt: skip
        quarantine_only = bool(options.get("quarantine_only"))
        yield from joined_batches(_read_batches(readers, schema, decoder, quarantine_only), HANDOVER_ROWS, HANDOVER_BYTES)

    def _read_batches(readers: list[Any], schema: Any, decoder: Any, quarantine_only: bool) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_kinesis_spark.core.concurrent_read import read_concurrently

        # Decoded records leave their bytes behind (the output drops ``data``): only the rows kept
        # raw (a corrupt Kinesis record, a dead letter) hand them to the JVM.
        drop_data = decoder is not None and records is not None and not records.get("keep_raw_data")
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
            data = pa.array(page.datas, pa.binary())
            if decoder is not None:
                # a corrupt Kinesis record is not decoded: its reason stays the reader's
                corrupt = reasons.to_pylist()
                result = decoder.decode([b"" if c is not None else d for d, c in zip(page.datas, corrupt)])
                decoded = result.columns
                if result.dead_letters:
                    kinds = pa.array(["corrupt_aggregate" if c is not None else k for c, k in zip(corrupt, result.kinds)], pa.string())
                    reasons = pa.array([c if c is not None else m for c, m in zip(corrupt, result.messages)], pa.string())
                    dead = sum(1 for c, k in zip(corrupt, result.kinds) if c is None and k is not None)
                    dead_letters[id(reader)] = dead_letters.get(id(reader), 0) + dead
                if drop_data:
                    data = pc.if_else(pc.is_valid(reasons), data, pa.nulls(n, pa.binary()))
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(row_stream_name, pa.string()), n),
                    pa.repeat(pa.scalar(page.shard_id, pa.string()), n),
                    pa.array(page.sequence_numbers, pa.string()).take(index),
                    pa.array(page.sub_sequence_numbers, pa.int64()),
                    pa.array(page.partition_keys, pa.string()),
                    pa.array(page.explicit_hash_keys, pa.string()),
                    pa.array(page.arrivals, pa.timestamp("us", tz="UTC")).take(index),
                    data,
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
    from airflow_kinesis_spark.core.records import RecordDecoder

    return range_df.mapInArrow(reader, job_schema(RecordDecoder(records) if records else None)[1])
