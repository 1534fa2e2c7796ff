"""The PySpark job in-process: mapInArrow reading, output schema, transform, empty batches."""

from __future__ import annotations

import gzip
import importlib.util
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.transforms.apache_log import parse_combined_log
from demo.producer import put_aggregated, put_plain, verify
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kinesis_batch", ROOT / "spark_scripts" / "kinesis_batch.py")
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)


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
