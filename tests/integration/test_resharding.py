"""Resharding in the batch protocol, on kinesalite (split and merge; children after parents)."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from airflow_kinesis_spark.core.positions import Sentinel
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain, verify
from tests.conftest import create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration


def wait_active(client, stream: str) -> None:
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 200})


def put_numbered(client, stream: str, counters: dict[str, int], n: int):
    records = []
    for i in range(n):
        key = f"key-{i % 13}"
        counters[key] += 1
        records.append((key, json.dumps({"key": key, "n": counters[key]}).encode()))
    return put_plain(client, stream, records)


def test_split_then_merge_reads_parents_to_the_end_before_children(kinesalite, dynamodb, unique_name):
    stream = unique_name
    create_stream(kinesalite, stream, 2)
    store = DynamoDBCheckpointStore(dynamodb, f"{stream}_ckpt", stream, "c")
    store.ensure_table()
    counters: dict[str, int] = defaultdict(int)
    produced = put_numbered(kinesalite, stream, counters, 80)
    batches: list[list] = []

    def batch():
        plan, reports, records = run_batch_without_spark(kinesalite, store, batch_id=len(batches) + 1)
        batches.append(records)
        return plan, reports

    batch()
    # split shard 0 at the middle of its hash range
    shard0, shard1 = list_shards(kinesalite, stream)
    middle = (int(shard0.starting_hash_key) + int(shard0.ending_hash_key)) // 2 + 1
    kinesalite.split_shard(StreamName=stream, ShardToSplit=shard0.shard_id, NewStartingHashKey=str(middle))
    wait_active(kinesalite, stream)
    produced += put_numbered(kinesalite, stream, counters, 80)

    plan, reports = batch()
    by_shard = {r.shard_id: r for r in reports}
    assert by_shard[shard0.shard_id].shard_end and by_shard[shard0.shard_id].stop_reason == "shard_end"
    children = [s for s in list_shards(kinesalite, stream) if s.parent_shard_id == shard0.shard_id]
    assert len(children) == 2
    # children are only planned once the parent's SHARD_END is committed
    assert {c.shard_id for c in children} <= set(plan.waiting)
    assert not {c.shard_id for c in children} & set(by_shard)
    assert store.committed_checkpoints()[shard0.shard_id].sentinel is Sentinel.SHARD_END

    def drain():
        """Batches until one reads nothing and no shard waits (kinesalite stamps child-shard records
        up to a second in the future, so they may land one batch later than the parent's end)."""
        for _ in range(12):
            plan, reports = batch()
            if not plan.waiting and all(r.records == 0 and r.stop_reason in ("caught_up", "shard_end") for r in reports):
                return
            time.sleep(0.3)  # let the future-stamped records' arrival time pass
        pytest.fail("the stream did not drain in 12 batches")

    drain()
    child_ranges = [r for b in batches for r in b if r.shard_id in {c.shard_id for c in children}]
    assert child_ranges, "the children were read"

    # merge the upper child with shard 1 (adjacent hash ranges)
    upper = max(children, key=lambda s: int(s.starting_hash_key))
    assert int(upper.ending_hash_key) + 1 == int(shard1.starting_hash_key)
    kinesalite.merge_shards(StreamName=stream, ShardToMerge=upper.shard_id, AdjacentShardToMerge=shard1.shard_id)
    wait_active(kinesalite, stream)
    produced += put_numbered(kinesalite, stream, counters, 80)
    merged = next(s for s in list_shards(kinesalite, stream) if s.adjacent_parent_shard_id)
    assert {merged.parent_shard_id, merged.adjacent_parent_shard_id} == {upper.shard_id, shard1.shard_id}

    plan, reports = batch()
    assert merged.shard_id in plan.waiting  # both parents must reach SHARD_END first
    drain()
    checkpoints = store.committed_checkpoints()
    assert checkpoints[upper.shard_id].is_shard_end and checkpoints[shard1.shard_id].is_shard_end
    assert checkpoints[merged.shard_id].position is not None

    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for b in batches for r in b]
    assert verify(produced, rows).ok
    # ORDER: per key, every record of a batch was produced after every record of earlier batches
    last_n: dict[str, int] = {}
    for records in batches:
        for key in {r.partition_key for r in records}:
            ns = sorted(json.loads(r.data)["n"] for r in records if r.partition_key == key)
            assert ns[0] > last_n.get(key, 0), f"{key}: batch holds n={ns[0]} but an earlier batch had {last_n.get(key)}"
            last_n[key] = ns[-1]
    kinesalite.delete_stream(StreamName=stream)


def test_on_moto_a_closed_parent_is_read_to_its_ending_sequence_number_and_no_further(kinesis, dynamodb, unique_name):
    """moto keeps writing to a split parent and never ends its iterator chain (DESIGN.md quirks):
    the reader still stops at the EndingSequenceNumber, with everything before it, and ends the shard."""
    create_stream(kinesis, unique_name, 1)
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_ckpt", unique_name, "c")
    store.ensure_table()
    produced = put_plain(kinesis, unique_name, [(f"k{i}", f"before {i}".encode()) for i in range(5)])
    (parent,) = list_shards(kinesis, unique_name)
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2
    kinesis.split_shard(StreamName=unique_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    wait_active(kinesis, unique_name)
    produced += put_plain(kinesis, unique_name, [(f"k{i}", f"after {i}".encode()) for i in range(6)])
    assert {p.shard_id for p in produced} == {parent.shard_id}  # the quirk: all of it went to the parent
    ending = next(s for s in list_shards(kinesis, unique_name) if s.shard_id == parent.shard_id).ending_sequence_number
    plan, reports, records = run_batch_without_spark(kinesis, store, batch_id=1)
    (report,) = [r for r in reports if r.shard_id == parent.shard_id]
    assert report.shard_end and report.last.sequence_number == ending  # stopped at the end, not hanging
    assert report.get_records_calls <= 2
    rows = [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records]
    assert verify(produced, rows).ok  # nothing lost
    assert set(plan.waiting) == {s.shard_id for s in list_shards(kinesis, unique_name) if s.parent_shard_id}
    _, reports, records = run_batch_without_spark(kinesis, store, batch_id=2)
    assert records == [] and {r.shard_id for r in reports} == set(plan.waiting)  # children next, empty
