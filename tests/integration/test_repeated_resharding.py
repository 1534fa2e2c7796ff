"""Automatic resharding as On-Demand streams do it: splits and merges, again and again, while a
producer keeps writing and batches keep running; then every record exactly once (EXACT) and in
order across parents and children and within each shard (ORDER).

kinesalite serves SplitShard and MergeShards (not UpdateShardCount, which the service carries
out as the same splits and merges); the batches are the protocol with the reader in this
process (``tests.helpers.run_batch_without_spark``); the checks are the resharding demo's
(``demo.producer.verify``, ``demo.run_resharding.order_violations``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict

import pytest

from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain, verify
from demo.run_resharding import ancestors_of, order_violations
from tests.conftest import create_stream
from tests.helpers import run_batch_without_spark

pytestmark = pytest.mark.integration

RESHARDS = 8  # alternating splits and merges, about one a second


def wait_active(client, stream: str) -> None:
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})


def reshard(client, stream: str, split: bool, rng: random.Random) -> str:
    """Split a random open shard at its middle, or merge two open shards with adjacent hash ranges."""
    shards = sorted((s for s in list_shards(client, stream) if not s.is_closed), key=lambda s: int(s.starting_hash_key))
    if split or len(shards) < 2:
        shard = rng.choice(shards)
        middle = (int(shard.starting_hash_key) + int(shard.ending_hash_key)) // 2 + 1
        client.split_shard(StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str(middle))
        return f"split {shard.shard_id}"
    i = rng.randrange(len(shards) - 1)
    lower, upper = shards[i], shards[i + 1]
    client.merge_shards(StreamName=stream, ShardToMerge=lower.shard_id, AdjacentShardToMerge=upper.shard_id)
    return f"merge {lower.shard_id}+{upper.shard_id}"


def test_repeated_splits_and_merges_while_ingesting_are_exactly_once_and_in_order(kinesalite, dynamodb, unique_name):
    stream = unique_name
    create_stream(kinesalite, stream, 2)
    store = DynamoDBCheckpointStore(dynamodb, f"{stream}_ckpt", stream, "c")
    store.ensure_table()
    produced, counters, stop, errors = [], defaultdict(int), threading.Event(), []

    def produce() -> None:
        try:
            while not stop.is_set():
                records = []
                for i in range(20):
                    key = f"key-{i % 13}"
                    counters[key] += 1
                    records.append((key, json.dumps({"key": key, "n": counters[key]}).encode()))
                produced.extend(put_plain(kinesalite, stream, records))
                time.sleep(0.05)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    def reshard_repeatedly() -> None:
        rng = random.Random(31)
        try:
            for n in range(RESHARDS):
                time.sleep(0.8)
                done.append(reshard(kinesalite, stream, split=n % 2 == 0, rng=rng))
                wait_active(kinesalite, stream)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    done: list[str] = []
    rows: list[tuple] = []
    batch_id = 0

    def batch() -> tuple:
        nonlocal batch_id
        batch_id += 1
        plan, reports, records = run_batch_without_spark(kinesalite, store, batch_id=batch_id)
        rows.extend((batch_id, r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key, r.data) for r in records)
        return plan, reports

    producer, resharder = threading.Thread(target=produce), threading.Thread(target=reshard_repeatedly)
    producer.start()
    resharder.start()
    while resharder.is_alive():  # batches all along the resharding
        batch()
        time.sleep(0.2)
    resharder.join()
    time.sleep(0.5)
    stop.set()
    producer.join()
    assert not errors, errors
    for _ in range(20):  # drain: kinesalite stamps child-shard records up to a second in the future
        plan, reports = batch()
        if not plan.waiting and all(r.records == 0 and r.stop_reason in ("caught_up", "shard_end") for r in reports):
            break
        time.sleep(0.3)
    else:
        pytest.fail("the stream did not drain in 20 batches")

    assert len(done) == RESHARDS and sum(d.startswith("merge") for d in done) >= 3, done
    verdict = verify(produced, [row[1:] for row in rows])
    assert verdict.ok, verdict
    assert verdict.records_in == len(produced) > 1000
    shards = [s for page in kinesalite.get_paginator("list_shards").paginate(StreamName=stream) for s in page["Shards"]]
    assert len(shards) >= 2 + 2 * RESHARDS // 2, [s["ShardId"] for s in shards]
    across, within = order_violations(rows, ancestors_of(shards))
    assert (across, within) == (0, 0)
    checkpoints = store.committed_checkpoints()
    assert all(checkpoints[s["ShardId"]].is_shard_end for s in shards if "EndingSequenceNumber" in s["SequenceNumberRange"])
    assert batch_id >= RESHARDS
    kinesalite.delete_stream(StreamName=stream)
