"""The benchmark's backlog and the consumer we compare against.

* :func:`load_backlog` fills S shards with about B MiB of Apache access-log lines (the shared
  data set, repeated with a counter so every user record is distinct), KPL-aggregated with
  aws_kinesis_agg into records of about 50 KiB (the KPL's default ``AggregationMaxSize`` is
  51,200 bytes), each aggregate sent to one shard by an explicit hash key, so the shards get the
  same share and loading takes few PutRecords calls.
* :func:`naive_consume` is the consumer most hand-written code is: one thread, one shard after
  the other, ``GetRecords`` with ``Limit=10000`` in a loop until caught up, de-aggregation with
  aws_kinesis_agg, a one-second sleep when throttled (after boto3's own retries).
"""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aws_kinesis_agg.aggregator import RecordAggregator
from aws_kinesis_agg.deaggregator import iter_deaggregate_records

__all__ = ["access_log_lines", "load_backlog", "naive_consume", "NaiveResult", "AGGREGATE_BYTES"]

AGGREGATE_BYTES = 51_200
#: PutRecords: at most 500 records and 5 MiB per call (Kinesis API reference, PutRecords).
PUT_RECORDS_MAX_RECORDS = 500
PUT_RECORDS_MAX_BYTES = 5 * 1024 * 1024 - 64 * 1024


def _hash_key_midpoints(client: Any, stream: str) -> list[str]:
    shards = client.list_shards(StreamName=stream)["Shards"]
    keys = []
    for shard in shards:
        low = int(shard["HashKeyRange"]["StartingHashKey"])
        high = int(shard["HashKeyRange"]["EndingHashKey"])
        keys.append(str((low + high) // 2))
    return keys


def access_log_lines(path: Path) -> list[bytes]:
    """The lines of the shared Apache access log (gzip)."""
    with gzip.open(path, "rb") as fh:
        return [line.rstrip(b"\n") for line in fh if line.strip()]


def load_backlog(client: Any, stream: str, mib: float, lines: list[bytes], *, aggregate_bytes: int = AGGREGATE_BYTES,
                 user_records: int | None = None, payload: Callable[[int], bytes] | None = None) -> dict[str, int]:  # fmt: skip
    """Put about ``mib`` MiB of user record data into ``stream``, spread evenly over its open shards.

    The MiB count Kinesis record data of full aggregates, so at least one aggregate (about 50 KiB)
    is put; ``user_records`` puts exactly that many user records instead (round robin over the
    shards, each shard's in one aggregate while they fit).

    :param lines: user record payloads, repeated (with a counter appended) until ``mib`` is reached.
    :param user_records: put exactly this many user records (``mib`` is then ignored).
    :param payload: user record ``i``'s data is ``payload(i)`` (``i`` from 0; ``lines`` is then
        not used), e.g. typed records (``benchmarks/typed.py``).
    :returns: ``{"user_records", "kinesis_records", "bytes"}`` (bytes: Kinesis record data put).
    """
    targets = _hash_key_midpoints(client, stream)
    aggregators = [RecordAggregator(max_size=aggregate_bytes) for _ in targets]
    budget = int(mib * 1024 * 1024)
    pending: list[dict[str, Any]] = []
    pending_bytes = 0
    counts = {"user_records": 0, "kinesis_records": 0, "bytes": 0}

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            for _ in range(10):
                response = client.put_records(StreamName=stream, Records=pending)
                pending = [entry for entry, result in zip(pending, response["Records"], strict=True) if "SequenceNumber" not in result]
                if not pending:
                    break
            if pending:
                raise RuntimeError(f"{len(pending)} records could not be put")
        pending, pending_bytes = [], 0

    def add(blob: tuple[str, str | None, bytes], target: str) -> None:
        nonlocal pending_bytes
        pk, _, data = blob
        if len(pending) >= PUT_RECORDS_MAX_RECORDS or pending_bytes + len(data) > PUT_RECORDS_MAX_BYTES:
            flush()
        pending.append({"PartitionKey": pk, "ExplicitHashKey": target, "Data": data})
        pending_bytes += len(data)
        counts["kinesis_records"] += 1
        counts["bytes"] += len(data)

    i = 0
    while (counts["user_records"] < user_records) if user_records is not None else (counts["bytes"] < budget):
        shard = i % len(targets)
        line = payload(i) if payload is not None else lines[i % len(lines)] + b" #%d" % i
        full = aggregators[shard].add_user_record(f"pk-{i % 1000}", line, explicit_hash_key=targets[shard])
        counts["user_records"] += 1
        if full is not None:
            add(full.get_contents(), targets[shard])
        i += 1
    for shard, aggregator in enumerate(aggregators):
        if aggregator.get_num_user_records():
            add(aggregator.clear_and_get().get_contents(), targets[shard])
    flush()
    return counts


@dataclass
class NaiveResult:
    user_records: int
    kinesis_records: int
    bytes: int
    seconds: float
    get_records_calls: int
    throttled: int

    @property
    def records_per_second(self) -> float:
        return self.user_records / self.seconds

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds


def naive_consume(client: Any, stream: str) -> NaiveResult:
    """Read every record of every shard once, one shard after the other (see the module doc)."""
    started = time.monotonic()
    result = NaiveResult(0, 0, 0, 0.0, 0, 0)
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            try:
                result.get_records_calls += 1
                response = client.get_records(ShardIterator=iterator, Limit=10_000)
            except client.exceptions.ProvisionedThroughputExceededException:
                result.throttled += 1
                time.sleep(1.0)
                continue
            records = response["Records"]
            for user_record in iter_deaggregate_records(records, data_format="Boto3"):
                result.user_records += 1
                assert user_record["kinesis"]["data"]  # touch the payload, as a consumer would
            result.kinesis_records += len(records)
            result.bytes += sum(len(r["Data"]) for r in records)
            iterator = response.get("NextShardIterator")
            if not records and response.get("MillisBehindLatest", 0) == 0:
                break
    result.seconds = time.monotonic() - started
    return result
