"""What the task log says of a batch (issue 17, item 4): one line per shard range, one summary line,
probes that do not log as reads, quarantined and out-of-range records as warnings with counts.

The protocol without a JVM: moto over HTTP and the fake job of test_protocol (the real reader in
this process). The spark-submit side (Spark's INFO off) is asserted in test_operator.py.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import datetime, timedelta, timezone

import aws_kinesis_agg
import boto3
import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from botocore.config import Config

from airflow_kinesis_spark.core.protocol import commit_handed, run_incremental
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.core.window_run import WindowSettings, run_window
from airflow_kinesis_spark.core.shards import list_shards
from demo.producer import put_plain, put_raw
from tests.conftest import REGION, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream
from tests.integration.test_protocol import ReaderJob, settings, store  # noqa: F401 - the store fixture

pytestmark = pytest.mark.integration

PROTOCOL = "airflow_kinesis_spark.core.protocol"
READER = "airflow_kinesis_spark.core.reader"


def lines(caplog, logger: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


@pytest.mark.parametrize("connections", [10, 1])
def test_a_batch_logs_one_line_per_shard_range_and_one_summary_line(moto_endpoint, store, unique_name, caplog, connections):
    """``connections``: the Kinesis client's pool (botocore's ``max_pool_connections``; 10 is its
    default). With 1 the probes take turns and the first one's record almost always stops the
    other (``Probed 1 of 2``, the line a clean-clone ``make test`` once met with 10); with 10 both
    usually start before either finds its record. The assertions hold for every interleaving."""
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id=TEST_ACCESS_KEY,
                           aws_secret_access_key=TEST_SECRET_KEY, config=Config(max_pool_connections=connections))  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="airflow_kinesis_spark")
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(30)])
    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    assert summary["records"] == 30

    info = lines(caplog, PROTOCOL)
    ranges = [line for line in info if line.startswith("Batch 1, shard ")]
    assert len(ranges) == 2, info
    per_range = re.compile(r"Batch 1, shard (shardId-\d+): TRIM_HORIZON -> \d+ \((cutoff|caught_up)\), (\d+) records, (\d+) bytes, \d+\.\d\d s")
    matches = [per_range.fullmatch(line) for line in ranges]
    assert all(matches), ranges
    assert {m[1] for m in matches} == set(summary["shards"])
    assert sum(int(m[3]) for m in matches) == 30 and sum(int(m[4]) for m in matches) == summary["bytes"]
    (total,) = [line for line in info if line.startswith("Batch 1 committed")]
    assert re.fullmatch(
        rf"Batch 1 committed: 30 records, {summary['bytes']} bytes from 2 shards, read in \d+\.\d s, \d+\.\d s since planned; "
        r"2 checkpoints committed; output mem://out/batch_id=1", total,
    ), total  # fmt: skip
    # The probes: one line that says what they found, not a read that stopped at max_records. They
    # stop at the first record (core.probes.probe_ranges): 1 or 2 ranges probed, depending on
    # whether the second probe started before the first found its record; each probed range has a
    # record (both shards do), and the line counts the ranges not probed.
    (probes,) = lines(caplog, READER)
    found = re.fullmatch(
        r"Probed (?:(2)|1 of 2) shard ranges \(a first record each, GetRecords Limit 1\): records to read in (\d) \((.+)\), "
        r"nothing to read in 0(; 1 not probed \(a record was found: the job reads every range\))?", probes,
    )  # fmt: skip
    assert found, probes
    probed = 2 if found[1] else 1
    assert int(found[2]) == probed and bool(found[4]) == (probed == 1), probes
    listed = found[3].split(", ")
    assert len(set(listed)) == len(listed) == probed and set(listed) <= {r.shard_id for r in list_shards(kinesis, unique_name)}
    assert "max_records" not in caplog.text.replace("max_records_per", "")
    assert not lines(caplog, PROTOCOL, logging.WARNING)

    # A repeated commit (a split group's retried commit task) says so, once.
    caplog.clear()
    commit_handed(store, 1, "run-1", 60.0)
    info = lines(caplog, PROTOCOL)
    assert [line for line in info if " committed" in line and line.startswith("Batch 1 ")] == [
        line for line in info if line.startswith("Batch 1 was committed already (by run-1")
    ] and len([line for line in info if line.startswith("Batch 1 was committed already")]) == 1, info

    # An idle run: no range lines, no batch line.
    caplog.clear()
    idle = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-2")
    assert idle["status"] == "no_new_records"
    assert not [line for line in lines(caplog, PROTOCOL) if ", shard " in line or " committed:" in line]
    assert lines(caplog, READER)[0].endswith("records to read in 0, nothing to read in 2 (caught_up: "
                                             f"{', '.join(sorted(summary['shards']))})")


def aggregate(records: list[tuple[str, bytes, str | None]]) -> bytes:
    agg = RecordAggregator()
    for pk, data, ehk in records:
        agg.add_user_record(pk, data, ehk)
    return agg.clear_and_get().get_contents()[2]


def put_bad_records(kinesis, stream: str) -> str:
    """Two corrupt aggregates and one aggregate with a user record outside the (only) shard's range."""
    (shard,) = list_shards(kinesis, stream)
    blob = aggregate([("a", b"one", None), ("b", b"two", None)])
    md5_bad = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    body = blob[len(aws_kinesis_agg.MAGIC) : -aws_kinesis_agg.DIGEST_SIZE][:-5]
    truncated = aws_kinesis_agg.MAGIC + body + hashlib.md5(body).digest()
    for bad in (md5_bad, truncated):
        kinesis.put_record(StreamName=stream, PartitionKey="a", Data=bad)
    mixed = aggregate([("in", b"inside", "5"), ("out", b"outside", str(int(shard.ending_hash_key) + 1))])
    put_raw(kinesis, stream, [("in", mixed, [(0, "in", b"inside"), (1, "out", b"outside")])])
    return shard.shard_id


def test_quarantined_and_out_of_range_records_are_warnings_with_counts(kinesis, store, unique_name, caplog):
    caplog.set_level(logging.INFO, logger="airflow_kinesis_spark")
    create_stream(kinesis, unique_name, 1)
    start = datetime.now(timezone.utc) - timedelta(seconds=1)
    shard_id = put_bad_records(kinesis, unique_name)
    end = datetime.now(timezone.utc) + timedelta(milliseconds=5)
    while datetime.now(timezone.utc) <= end:
        pass

    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name), "run-1")
    assert summary["quarantined"] == 2 and summary["out_of_range"] == 1
    assert lines(caplog, PROTOCOL, logging.WARNING) == [
        f"Batch 1: 2 corrupt Kinesis records quarantined ({shard_id}: 2), kept raw under mem://out/batch_id=1/_quarantine "
        "and not in the output; the checkpoints moved past them",
        f"Batch 1: 1 user records outside their shard's hash key range ({shard_id}: 1), kept in the output; a producer "
        "aggregates user records of several shards into one Kinesis record",
    ]

    # A window: the same warnings, and one line per (shard, time slice) range.
    caplog.clear()
    window = WindowSettings(stream_name=unique_name, consumer_name="window", output_root="mem://w", start=start, end=end,
                            time_slices=2, min_call_interval=0.0)  # fmt: skip
    window_store = DynamoDBCheckpointStore(store.client, store.table_name, unique_name, "window")
    result = run_window(kinesis, ReaderJob(kinesis, store.client), window, store=window_store, owner="window-run")
    assert result["quarantined"] == 2 and result["out_of_range"] == 1
    label = f"Window [{result['window_start']}, {result['window_end']})"
    warnings = lines(caplog, PROTOCOL, logging.WARNING)
    assert warnings[0].startswith(f"{label}: 2 corrupt Kinesis records quarantined ({shard_id}: 2), kept raw under mem://w/window=")
    assert warnings[1].startswith(f"{label}: 1 user records outside their shard's hash key range ({shard_id}: 1)")
    assert len(warnings) == 2
    info = lines(caplog, PROTOCOL)
    assert sorted(line[len(label):].split(":")[0] for line in info if line.startswith(f"{label}, shard ")) == [
        f", shard {shard_id} slice 0", f", shard {shard_id} slice 1"]  # fmt: skip
    assert len([line for line in info if line.startswith(f"{label} written: 2 records")]) == 1


def test_a_parquet_batch_logs_no_table_commit(kinesis, store, unique_name, caplog, tmp_path):
    """Only Iceberg and Delta make a table commit; a Parquet batch's log does not claim one."""
    from airflow_kinesis_spark.sinks.parquet import ParquetSink

    caplog.set_level(logging.INFO, logger="airflow_kinesis_spark")
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [("k", b"one")])
    root = str(tmp_path / "out")
    summary = run_incremental(kinesis, store, ReaderJob(kinesis, store.client), settings(unique_name, sink=ParquetSink(root), output_root=root), "run-1")
    assert summary["status"] == "committed" and summary["records"] == 1
    assert not [line for line in lines(caplog, PROTOCOL) if "table commit" in line]
