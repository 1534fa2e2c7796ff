"""The PySpark job, in-process and under spark-submit: mapInArrow reading, output schema, transform, empty batches."""

from __future__ import annotations

import gzip
import importlib.util
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_kinesis_spark import job
from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.transforms.apache_log import parse_combined_log
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def _plan(kinesis, stream: str, output: Path, cutoff: datetime | None = None):
    now = datetime.now(timezone.utc)
    return plan_incremental(
        batch_id=1, stream_name=stream, consumer_name="c", shards=list_shards(kinesis, stream), checkpoints={},
        cutoff=cutoff or now, now=now, output_location=str(output / "batch_id=1"),
    ).to_dict()  # fmt: skip


OPTIONS = {"limit": 10_000, "min_call_interval": 0.0, "read_bytes_per_second": None, "read_tasks": None}


def _aws_env(endpoint: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL_KINESIS": endpoint}  # fmt: skip


def test_job_writes_every_record_once_with_the_documented_schema(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 3)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(200)])
    produced += put_aggregated(kinesis, unique_name, [(f"k{i % 9}", f"agg {i}".encode()) for i in range(300)])
    result = job.run(spark, _plan(kinesis, unique_name, tmp_path), None, _aws_env(moto_endpoint), OPTIONS)
    assert result["records"] == 500 and len(result["reports"]) == 3
    df = spark.read.parquet(result["output_location"])
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("stream_name", "string"), ("shard_id", "string"), ("sequence_number", "string"),
        ("sub_sequence_number", "bigint"), ("partition_key", "string"), ("explicit_hash_key", "string"),
        ("approximate_arrival_timestamp", "timestamp"), ("data", "binary"),
    ]  # fmt: skip
    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, bytes(r.data)) for r in df.collect()]
    assert verify(produced, rows).ok
    # one read task per shard range: the per-shard reports add up to the rows
    assert sum(r["records"] for r in result["reports"]) == df.count()


def test_job_with_no_records_before_the_cutoff_writes_nothing(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=5)  # before every record
    put_plain(kinesis, unique_name, [("k", b"late")])
    result = job.run(spark, _plan(kinesis, unique_name, tmp_path, cutoff), None, _aws_env(moto_endpoint), OPTIONS)
    assert result["records"] == 0 and result["output_location"] is None
    assert result["reports"][0]["stop_reason"] == "cutoff"
    assert not (tmp_path / "batch_id=1").exists()


def test_apache_log_transform_parses_real_lines(spark):
    with gzip.open(ROOT / "data" / "apache_access_log.gz", "rt", encoding="utf-8") as fh:
        lines = [next(fh).rstrip("\n") for _ in range(300)]
    truncated = ('46.118.127.106 - - [20/May/2015:12:05:17 +0000] "GET /scripts/grok-py-test/configlib.py HTTP/1.1" '
                 '200 235 "-" "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html')  # fmt: skip
    rows = [(line.encode(),) for line in [*lines, truncated, "not a log line"]]
    df = parse_combined_log(spark.createDataFrame(rows, "data binary"))
    out = df.collect()
    assert len(out) == 302  # nothing dropped
    first = out[0]
    assert first.client_ip == "83.149.9.216" and first.method == "GET" and first.status == 200
    assert first.bytes == 203023 and first.protocol == "HTTP/1.1"
    assert first.path == "/presentations/logstash-monitorama-2013/images/kibana-search.png"
    assert first.timestamp == datetime(2015, 5, 17, 10, 5, 3)  # UTC session time zone, naive in Python
    assert first.referrer == "http://semicomplete.com/presentations/logstash-monitorama-2013/"
    assert first.user_agent.startswith("Mozilla/5.0 (Macintosh")
    assert all(r.log_parsed for r in out[:301])
    assert out[300].referrer is None and out[300].user_agent.startswith("Mozilla/5.0 (compatible; Googlebot")
    assert out[301].log_parsed is False and out[301].client_ip is None


ONE_PASS = {**OPTIONS, "records_expected": True}


def _corrupt_aggregate() -> bytes:
    import aws_kinesis_agg
    from aws_kinesis_agg.aggregator import RecordAggregator

    agg = RecordAggregator()
    agg.add_user_record("a", b"one")
    agg.add_user_record("b", b"two")
    blob = agg.clear_and_get().get_contents()[2]
    assert blob.startswith(aws_kinesis_agg.MAGIC)
    return blob[:-1] + bytes([blob[-1] ^ 0xFF])  # MD5 mismatch


def test_one_pass_writes_every_record_once_and_quarantines_by_a_second_read(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(100)])
    produced += put_aggregated(kinesis, unique_name, [(f"k{i % 7}", f"agg {i}".encode()) for i in range(150)])
    bad = _corrupt_aggregate()
    kinesis.put_record(StreamName=unique_name, PartitionKey="bad", Data=bad)
    produced += put_plain(kinesis, unique_name, [("after", b"after the corrupt one")])
    plan = _plan(kinesis, unique_name, tmp_path)
    result = job.run(spark, plan, None, _aws_env(moto_endpoint), ONE_PASS)
    assert result["records"] == 251 and len(result["reports"]) == 2
    assert [r["shard_id"] for r in result["reports"]] == [r["shard_id"] for r in plan["ranges"]]  # the plan's order
    assert sum(r["quarantined"] for r in result["reports"]) == 1
    df = spark.read.parquet(result["output_location"])
    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, bytes(r.data)) for r in df.collect()]
    assert verify(produced, rows).ok
    quarantine = spark.read.parquet(result["quarantine_location"]).collect()
    assert [(q.reason, bytes(q.data), q.partition_key) for q in quarantine] == [("md5_mismatch", bad, "bad")]


def test_one_pass_fails_when_a_transform_does_not_read_everything(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(400)])
    with pytest.raises(RuntimeError, match="no read report for .* A transform must consume all of its input"):
        job.run(spark, _plan(kinesis, unique_name, tmp_path), lambda df: df.limit(3), _aws_env(moto_endpoint),
                {**ONE_PASS, "read_tasks": 1})  # fmt: skip
    with pytest.raises(RuntimeError, match="does not depend on the records read"):
        job.run(spark, _plan(kinesis, unique_name, tmp_path), lambda df: df.limit(0), _aws_env(moto_endpoint), ONE_PASS)


def test_one_pass_fails_loudly_when_the_expected_records_are_not_there(spark, kinesis, moto_endpoint, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 1)
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=5)  # before every record
    put_plain(kinesis, unique_name, [("k", b"late")])
    with pytest.raises(RuntimeError, match="found no user record although the operator's probes saw one"):
        job.run(spark, _plan(kinesis, unique_name, tmp_path, cutoff), None, _aws_env(moto_endpoint), ONE_PASS)


def test_reports_of_a_range_read_twice_must_agree():
    import json

    plan = {"ranges": [{"shard_id": "s-0", "slice_index": 0}, {"shard_id": "s-1", "slice_index": 0}]}
    a = {"shard_id": "s-0", "slice_index": 0, "first": None, "last": {"sequence_number": "9"}, "records": 3, "stop_reason": "cutoff"}
    b = {"shard_id": "s-1", "slice_index": 0, "first": None, "last": None, "records": 0, "stop_reason": "caught_up"}
    retried = {**a, "get_records_calls": 7, "read_started": 1.0}  # timings differ; what was read does not
    assert job.collect_reports(plan, [json.dumps(b), json.dumps(a), json.dumps(retried)]) == [a, b]
    with pytest.raises(RuntimeError, match="read twice with different results"):
        job.collect_reports(plan, [json.dumps(a), json.dumps({**a, "records": 4}), json.dumps(b)])
    with pytest.raises(RuntimeError, match="no read report for 1 of 2"):
        job.collect_reports(plan, [json.dumps(a)])


def test_default_parallelism_when_the_conf_does_not_say(spark):
    """Over Spark Connect with a ``local[*]`` or cluster master neither a SparkContext nor the conf
    gives the number: Spark's own partition count of a range does."""

    class ConnectLike:  # what a Spark Connect session offers: no SparkContext, a master without a number
        conf = type("Conf", (), {"get": staticmethod(lambda key, default=None: "local[*]" if key == "spark.master" else default)})()

        @property
        def sparkContext(self):
            raise AttributeError("sparkContext is not available over Spark Connect")

        def range(self, *args):
            return spark.range(*args)

    assert job.default_parallelism(ConnectLike()) == spark.sparkContext.defaultParallelism
    assert job.default_parallelism(spark) == spark.sparkContext.defaultParallelism


def test_observed_metrics_are_read_back_on_classic_sessions_and_spark_connect_4(spark):
    import pyspark

    assert job.observation_supported(spark)  # a classic session, Spark 3.5 and 4
    # A session of the Spark Connect client (its class lives in pyspark.sql.connect.session)
    # reads observed metrics back from pyspark 4.0 on only.
    assert importlib.util.find_spec("pyspark.sql.connect.session") is not None
    connect_session = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    assert job.observation_supported(connect_session) is (int(pyspark.__version__.split(".")[0]) >= 4)


def test_one_pass_falls_back_to_the_cached_read_where_observed_metrics_cannot_be_read(
    spark, kinesis, moto_endpoint, unique_name, tmp_path, monkeypatch
):
    """What a Spark Connect 3.5 client does: the same output and reports, and the same loud
    failure when the probes' user record is not there."""
    monkeypatch.setattr(job, "observation_supported", lambda session: False)
    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(60)])
    plan = _plan(kinesis, unique_name, tmp_path)
    result = job.run(spark, plan, None, _aws_env(moto_endpoint), ONE_PASS)
    assert result["records"] == 60 and [r["shard_id"] for r in result["reports"]] == [r["shard_id"] for r in plan["ranges"]]
    df = spark.read.parquet(result["output_location"])
    assert verify(produced, [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, bytes(r.data)) for r in df.collect()]).ok
    with pytest.raises(RuntimeError, match="found no user record although the operator's probes saw one"):
        early = datetime.now(timezone.utc) - timedelta(minutes=5)  # before every record
        job.run(spark, _plan(kinesis, unique_name, tmp_path / "early", early), None, _aws_env(moto_endpoint), ONE_PASS)


def test_the_job_takes_its_batch_from_the_store_under_spark_submit(kinesis, dynamodb, moto_endpoint, unique_name, tmp_path):
    """The job as a cluster's job task starts it: only its arguments and the checkpoint store
    (core.job). It claims the batch, publishes its output from staging through Hadoop's file
    system API (on Spark 3.5 and 4) and records its report, fenced on its own writer id."""
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from airflow_kinesis_spark.core.job import JobArguments
    from airflow_kinesis_spark.core.planner import BatchPlan
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

    create_stream(kinesis, unique_name, 2)
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"plain {i}".encode()) for i in range(50)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "c")
    store.ensure_table()
    plan = BatchPlan.from_dict(_plan(kinesis, unique_name, tmp_path))
    store.begin(plan, "plan-task")
    arguments = JobArguments(checkpoint_table=store.table_name, stream_name=unique_name, consumer_name="c", batch_id=1,
                             lease_owner="plan-task", lease_seconds=30, records_expected=True, region_name=REGION,
                             plan_digest=plan.digest(), output_root=plan.output_location.rsplit("/", 1)[0])  # fmt: skip
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, **_aws_env(moto_endpoint), "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint,
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}  # fmt: skip
    proc = subprocess.run(
        [str(spark_submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(ROOT / "spark_scripts" / "kinesis_batch.py"),
         *arguments.to_args(), "--min-call-interval", "0"],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    head = store.head()
    assert head.pending_batch_id == 1 and head.pending_report_owner.startswith("plan-task/driver-")
    assert head.pending_heartbeat == 0  # released: the commit may claim the batch at once
    reports = store.pending_report(head)
    assert sum(r.records for r in reports) == 50
    table = pq.read_table(plan.output_location)
    rows = list(zip(*(table.column(c).to_pylist() for c in ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data"))))
    assert verify(produced, rows).ok
    assert not (tmp_path / "_staging").exists()  # published by a rename; the emptied _staging folder removed


def test_platform_arguments_are_ignored_and_flags_take_values():
    """Glue passes arguments as name/value pairs and adds its own (--JOB_NAME, --JOB_RUN_ID): the
    job ignores what it does not take (logged) and reads ``--records-expected true|false``."""
    base = ["--checkpoint-table", "kinesis_checkpoints", "--stream", "orders", "--consumer", "lake", "--batch-id", "7",
            "--lease-owner", "plan-task"]  # fmt: skip
    args = job.parse_args([*base, "--records-expected", "true", "--JOB_NAME", "ingest", "--JOB_RUN_ID", "jr_1"])
    assert args.records_expected is True and args.batch_id == 7
    assert job.parse_args([*base, "--records-expected", "false"]).records_expected is False
    assert job.parse_args([*base, "--records-expected", "--limit", "5"]).records_expected is True
    assert job.parse_args(base).records_expected is False
    with pytest.raises(SystemExit):
        job.parse_args([*base, "--records-expected", "maybe"])
    with pytest.raises(SystemExit):  # a plan in a file is no way to run a batch: only the store hands one over
        job.parse_args(["--plan-file", "plan.json", "--report-file", "report.json"])


# A task hands Spark its rows in joined Arrow record batches (``joined_batches``): consecutive small
# ones become one, in order, within the row and byte bounds (here on both pyarrow lines the job runs
# with: make test and make test-spark35).

ARROW_SCHEMA = pa.schema([("shard_id", pa.string()), ("n", pa.int64())])


def arrow_batch(shard: str, rows: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([shard] * rows), pa.array(range(start, start + rows), pa.int64())], schema=ARROW_SCHEMA)


def arrow_rows(batches: list[pa.RecordBatch]) -> list[tuple[str, int]]:
    return [(r["shard_id"], r["n"]) for b in batches for r in b.to_pylist()]


def test_small_batches_are_joined_in_order_within_the_row_bound():
    given = [arrow_batch(f"shard-{i}", 20, i * 20) for i in range(256)]
    out = list(job.joined_batches(iter(given), 1_000, 1 << 30))
    assert [b.num_rows for b in out] == [1_000] * 5 + [120]
    assert arrow_rows(out) == arrow_rows(given)
    assert all(b.schema == ARROW_SCHEMA for b in out)


def test_a_batch_beyond_the_bounds_passes_as_it_is_after_the_pending_ones():
    big = arrow_batch("shard-big", 50)
    given = [arrow_batch("a", 3), arrow_batch("b", 4), big, arrow_batch("c", 5)]
    out = list(job.joined_batches(iter(given), 10, 1 << 30))
    assert [b.num_rows for b in out] == [7, 50, 5]
    assert out[1] is big
    assert arrow_rows(out) == arrow_rows(given)


def test_a_batch_that_fills_the_bound_is_handed_on_before_the_next_one_is_read():
    read: list[str] = []

    def produced():
        for name, rows in (("a", 4), ("b", 6), ("c", 1)):
            read.append(name)
            yield arrow_batch(name, rows)

    out = job.joined_batches(produced(), 10, 1 << 30)
    assert next(out).num_rows == 10 and read == ["a", "b"]  # "c" not read yet: nothing waits for it
    assert [b.num_rows for b in out] == [1]


def test_the_byte_bound_joins_fewer():
    given = [arrow_batch("a", 10) for _ in range(4)]
    out = list(job.joined_batches(iter(given), 1_000, 2 * given[0].nbytes))
    assert [b.num_rows for b in out] == [20, 20]


def test_nothing_in_nothing_out():
    assert list(job.joined_batches(iter([]), 10, 10)) == []
