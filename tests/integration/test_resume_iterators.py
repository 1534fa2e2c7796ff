"""A batch that read a shard to its tip keeps the read's last shard iterator in the checkpoint
(``Checkpoint.resume_iterator``); the next run's probe of that shard is one ``GetRecords`` on it
instead of ``GetShardIterator`` + ``GetRecords`` (issue 31: fewer than two Kinesis calls per idle
shard). The stored iterator is a hint: refused, it falls back to a fresh one; a shard's end seen
on it is probed again from ``GetShardIterator`` before anything is committed.

kinesalite over HTTP (its iterators are opaque and checked, as the service's are), the checkpoint
store on moto, the protocol's real planner, probes and commit; the job is
``tests.integration.test_protocol.ReaderJob`` (the real reader in this process instead of Spark).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from airflow_kinesis_spark.core.planner import plan_incremental
from airflow_kinesis_spark.core.probes import probe_ranges
from airflow_kinesis_spark.core.protocol import run_incremental
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_aggregated, put_plain
from tests.conftest import create_stream
from tests.integration.test_protocol import ReaderJob, produced_keys, row_keys, settings

pytestmark = pytest.mark.integration


class KinesisCalls:
    """Counts a boto3 client's API calls by operation (botocore's ``before-call`` event)."""

    def __init__(self, client) -> None:
        self.counts: Counter[str] = Counter()
        client.meta.events.register("before-call.kinesis.*", self._count)

    def _count(self, model, **_) -> None:
        self.counts[model.name] += 1

    def take(self) -> Counter[str]:
        counts, self.counts = self.counts, Counter()
        return counts


@pytest.fixture
def store(dynamodb, unique_name):
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "lake")
    store.ensure_table()
    return store


def test_an_idle_run_after_a_batch_probes_each_shard_with_one_get_records(kinesalite, store, unique_name):
    create_stream(kinesalite, unique_name, 4)
    produced = put_plain(kinesalite, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(40)])
    produced += put_aggregated(kinesalite, unique_name, [(f"k{i}", f"b{i}".encode()) for i in range(40)], per_aggregate=10)
    job, calls = ReaderJob(kinesalite, store.client), KinesisCalls(kinesalite)
    first = run_incremental(kinesalite, store, job, settings(unique_name), "run-1")
    assert first["status"] == "committed" and first["records"] == 80
    checkpoints = store.committed_checkpoints()
    assert all(c.resume_iterator and time.time() - c.resume_iterator_at < 60 for c in checkpoints.values()), checkpoints
    calls.take()

    idle = run_incremental(kinesalite, store, job, settings(unique_name), "run-2")
    assert idle["status"] == "no_new_records" and len(job.runs) == 1
    counts = calls.take()
    # ListShards once; per idle shard one GetRecords on the stored iterator, no GetShardIterator
    assert counts["GetRecords"] == 4 and counts["GetShardIterator"] == 0, counts

    # records after the stored iterators are found by the probes and read once by the job (from the checkpoints)
    produced += put_aggregated(kinesalite, unique_name, [(f"k{i}", f"c{i}".encode()) for i in range(30)], per_aggregate=10)
    produced += put_plain(kinesalite, unique_name, [(f"k{i}", f"d{i}".encode()) for i in range(10)])
    third = run_incremental(kinesalite, store, job, settings(unique_name), "run-3")
    assert third["status"] == "committed" and third["records"] == 40
    # batch 2 was planned from checkpoints with stored iterators; its persisted plan holds none (the probes used them)
    assert "resume_iterator" not in json.dumps(store.committed_plan().to_dict())
    assert all(c.resume_iterator for c in store.committed_checkpoints().values())  # batch 2's reads left new ones
    assert row_keys(job.all_rows(store.head().committed_batch_id, "mem://out")) == produced_keys(produced)  # EXACT


def test_a_refused_stored_iterator_falls_back_to_get_shard_iterator(kinesalite, store, unique_name):
    create_stream(kinesalite, unique_name, 2)
    put_plain(kinesalite, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(10)])
    run_incremental(kinesalite, store, ReaderJob(kinesalite, store.client), settings(unique_name), "run-1")
    put_plain(kinesalite, unique_name, [("late", b"late")])
    # ranges starting where batch 1 ended, each with an iterator the service did not issue
    forged = {k: c.with_resume_iterator("AAAAAAAAAAHnot-an-iterator", time.time()) for k, c in store.committed_checkpoints().items()}
    now = datetime.now(timezone.utc)
    next_plan = plan_incremental(batch_id=2, stream_name=unique_name, consumer_name="lake",
                                 shards=list_shards(kinesalite, unique_name), checkpoints=forged, cutoff=now, now=now,
                                 output_location="mem://out/batch_id=2")  # fmt: skip
    calls = KinesisCalls(kinesalite)
    reports = probe_ranges(kinesalite, unique_name, next_plan.ranges, reuse_iterators=True, min_call_interval=0.0)
    counts = calls.take()
    assert sum(r.records for r in reports) == 1  # the late record, found from a fresh iterator
    assert counts["GetShardIterator"] == 2 and counts["GetRecords"] >= 4, counts  # each refused once, then fresh
    assert all(r.get_records_calls == 1 for r in reports)  # the refused call is no response


def test_a_shard_end_seen_on_a_stored_iterator_is_probed_again_before_it_is_committed(
    kinesalite, store, unique_name, monkeypatch,
):  # fmt: skip
    """A stored iterator that ends the shard's iterator chain (here: a closed shard's, planted
    on an open shard's checkpoint, as anyone who can write the checkpoint table could) must not
    end the open shard: its end is probed again from GetShardIterator, and the open shard reads on."""
    create_stream(kinesalite, unique_name, 2)
    put_plain(kinesalite, unique_name, [(f"k{i}", f"a{i}".encode()) for i in range(10)])
    job = ReaderJob(kinesalite, store.client)
    run_incremental(kinesalite, store, job, settings(unique_name), "run-1")
    shards = sorted(store.committed_checkpoints())
    open_shard, closing = shards[0], shards[1]
    # close the second shard (a merge of both would close the open one too): split it
    desc = kinesalite.list_shards(StreamName=unique_name)["Shards"]
    hash_range = next(s["HashKeyRange"] for s in desc if s["ShardId"] == closing)
    middle = (int(hash_range["StartingHashKey"]) + int(hash_range["EndingHashKey"])) // 2
    kinesalite.split_shard(StreamName=unique_name, ShardToSplit=closing, NewStartingHashKey=str(middle))
    kinesalite.get_waiter("stream_exists").wait(StreamName=unique_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    end_iterator = kinesalite.get_shard_iterator(StreamName=unique_name, ShardId=closing, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    while end_iterator:  # to the closed shard's end: the last iterator of its chain
        response = kinesalite.get_records(ShardIterator=end_iterator)
        if response.get("NextShardIterator") is None:
            break
        end_iterator = response["NextShardIterator"]
    assert response.get("NextShardIterator") is None
    stored = store.committed_checkpoints

    def planted(head=None):
        checkpoints = stored(head)
        checkpoints[open_shard] = checkpoints[open_shard].with_resume_iterator(end_iterator, time.time())
        return checkpoints

    monkeypatch.setattr(store, "committed_checkpoints", planted)
    second = run_incremental(kinesalite, store, job, settings(unique_name), "run-2")
    monkeypatch.undo()
    after = store.committed_checkpoints()
    assert not after[open_shard].is_shard_end, after[open_shard]  # the open shard was not ended
    assert after[closing].is_shard_end  # the closed one was, from a fresh probe
    assert second["status"] == "committed_without_records"
