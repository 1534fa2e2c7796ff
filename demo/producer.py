"""Test producer: puts records (plain and KPL-aggregated) and keeps a log of what was produced.

The log is what the verifier checks committed output against: one entry per user record, with
its shard, sequence number, sub-sequence number (None when not aggregated), partition key and a
digest of its data.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aws_kinesis_agg.aggregator import RecordAggregator

#: PutRecords takes at most 500 records per call (Kinesis API reference, PutRecords).
PUT_RECORDS_MAX = 500


@dataclass(frozen=True)
class Produced:
    shard_id: str
    sequence_number: str
    sub_sequence_number: int | None
    partition_key: str
    digest: str

    @property
    def key(self) -> tuple[str, str, int | None]:
        return (self.shard_id, self.sequence_number, self.sub_sequence_number)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(client: Any, stream: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PutRecords with retries of failed entries; returns one result per entry, in order."""
    results: list[dict[str, Any] | None] = [None] * len(entries)
    pending = list(range(len(entries)))
    for _ in range(10):
        if not pending:
            break
        response = client.put_records(StreamName=stream, Records=[entries[i] for i in pending])
        retry = []
        for index, result in zip(pending, response["Records"], strict=True):
            if "SequenceNumber" in result:
                results[index] = result
            else:
                retry.append(index)
        pending = retry
    if pending:
        raise RuntimeError(f"{len(pending)} records could not be put")
    # Arrival timestamps are whole milliseconds, and a batch's cutoff (clamped to its planning
    # time) is exclusive: a batch planned in the millisecond of a record's arrival leaves that
    # record for the next batch. Return in a later millisecond, so a batch planned right after
    # the put includes it (the tests put records, then run a batch at once).
    time.sleep(0.002)
    return results  # type: ignore[return-value]


def put_plain(client: Any, stream: str, records: Sequence[tuple[str, bytes]]) -> list[Produced]:
    """Put ``(partition_key, data)`` records one Kinesis record each."""
    produced: list[Produced] = []
    for start in range(0, len(records), PUT_RECORDS_MAX):
        chunk = records[start : start + PUT_RECORDS_MAX]
        results = _put(client, stream, [{"PartitionKey": pk, "Data": data} for pk, data in chunk])
        for (pk, data), result in zip(chunk, results, strict=True):
            produced.append(Produced(result["ShardId"], result["SequenceNumber"], None, pk, digest(data)))
    return produced


def put_aggregated(client: Any, stream: str, records: Sequence[tuple[str, bytes]], per_aggregate: int = 25) -> list[Produced]:
    """Put records KPL-aggregated with aws_kinesis_agg, records of one partition key together.

    Grouping by partition key keeps every user record in the shard its own key hashes to, as
    the KPL does.
    """
    by_key: dict[str, list[bytes]] = defaultdict(list)
    for pk, data in records:
        by_key[pk].append(data)
    aggregates: list[tuple[dict[str, Any], list[tuple[str, bytes]]]] = []
    for pk, datas in by_key.items():
        for start in range(0, len(datas), per_aggregate):
            aggregator = RecordAggregator()
            members = [(pk, d) for d in datas[start : start + per_aggregate]]
            for key, data in members:
                aggregator.add_user_record(key, data)
            agg_pk, agg_ehk, blob = aggregator.clear_and_get().get_contents()
            entry = {"PartitionKey": agg_pk, "Data": blob}
            if agg_ehk:
                entry["ExplicitHashKey"] = agg_ehk
            aggregates.append((entry, members))
    produced: list[Produced] = []
    for start in range(0, len(aggregates), PUT_RECORDS_MAX):
        chunk = aggregates[start : start + PUT_RECORDS_MAX]
        results = _put(client, stream, [entry for entry, _ in chunk])
        for (_, members), result in zip(chunk, results, strict=True):
            for sub, (pk, data) in enumerate(members):
                produced.append(Produced(result["ShardId"], result["SequenceNumber"], sub, pk, digest(data)))
    return produced


def put_raw(client: Any, stream: str, blobs: Iterable[tuple[str, bytes, list[tuple[int | None, str, bytes]]]]) -> list[Produced]:
    """Put Kinesis records as-is; ``user_records`` says what each de-aggregates into."""
    produced: list[Produced] = []
    for pk, blob, user_records in blobs:
        result = client.put_record(StreamName=stream, PartitionKey=pk, Data=blob)
        for sub, user_pk, data in user_records:
            produced.append(Produced(result["ShardId"], result["SequenceNumber"], sub, user_pk, digest(data)))
    return produced


@dataclass
class Verdict:
    """What ``verify`` found: totals, and ``per_shard`` (shard id -> the same counts)."""

    records_in: int
    records_out: int
    rows: int
    duplicates: int
    missing: int
    unexpected: int
    data_mismatches: int
    per_shard: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.records_out == self.records_in and not (self.duplicates or self.missing or self.unexpected or self.data_mismatches)


def verify(produced: Sequence[Produced], rows: Iterable[tuple[str, str, int | None, str, bytes]]) -> Verdict:
    """Compare the producer's log with output rows ``(shard_id, sequence_number, sub, partition_key, data)``."""
    expected = {p.key: p for p in produced}
    seen: dict[tuple[str, str, int | None], int] = defaultdict(int)
    mismatches = 0
    for shard_id, seq, sub, pk, data in rows:
        key = (shard_id, seq, sub)
        seen[key] += 1
        p = expected.get(key)
        if p is not None and seen[key] == 1 and (p.partition_key != pk or p.digest != digest(data)):
            mismatches += 1
    per_shard: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("records_in", "records_out", "duplicates", "missing", "unexpected"), 0))
    for key in expected:
        per_shard[key[0]]["records_in"] += 1
        per_shard[key[0]]["missing"] += key not in seen
    for key, n in seen.items():
        per_shard[key[0]]["records_out"] += 1
        per_shard[key[0]]["duplicates"] += n - 1
        per_shard[key[0]]["unexpected"] += key not in expected
    return Verdict(
        records_in=len(expected),
        records_out=len(seen),
        rows=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values()),
        missing=len(set(expected) - set(seen)),
        unexpected=len(set(seen) - set(expected)),
        data_mismatches=mismatches,
        per_shard=dict(sorted(per_shard.items())),
    )


#: The output columns that identify a user record and its content, in ``verify``'s row order.
KEY_COLUMNS = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "data")


def committed_rows(
    output: Path, committed_batch_id: int, columns: Sequence[str] = KEY_COLUMNS, *, with_batch_id: bool = False
) -> list[tuple]:
    """Rows of every committed batch's output (``{output}/batch_id=N``, ``N <= committed_batch_id``).

    A batch that committed checkpoints without records wrote nothing and is skipped.

    :param with_batch_id: put the batch id first in each row.
    """
    import pyarrow.parquet as pq

    rows: list[tuple] = []
    for batch_id in range(1, committed_batch_id + 1):
        path = Path(output) / f"batch_id={batch_id}"
        if path.exists():
            table = pq.read_table(path, columns=list(columns)).to_pydict()
            batch_rows = zip(*(table[c] for c in columns), strict=True)
            rows.extend((batch_id, *row) if with_batch_id else row for row in batch_rows)
    return rows
