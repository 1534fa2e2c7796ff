"""Shard listing and ShardReader against Kinesis emulators over HTTP (kinesalite and moto)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from airflow_kinesis_spark.core.planner import BatchPlan, advance, plan_incremental, validate_report
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber, Sentinel, format_timestamp
from airflow_kinesis_spark.core.pages import UserRecord
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.ranges import ShardReport, StartPosition
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import StreamNotFoundError
from tests.conftest import REGION, create_stream

pytestmark = pytest.mark.integration


@pytest.fixture(params=["kinesalite", "moto"])
def emulator(request) -> Any:
    """A Kinesis client of each emulator (``kinesalite`` fixture, or ``kinesis`` for moto)."""
    return request.getfixturevalue("kinesalite" if request.param == "kinesalite" else "kinesis")


@pytest.fixture
def stream(emulator, unique_name) -> Iterator[str]:
    create_stream(emulator, unique_name, 1)
    yield unique_name
    emulator.delete_stream(StreamName=unique_name)  # frees kinesalite's account-wide shard limit


@dataclass(frozen=True)
class Put:
    """One user record as written, and where Kinesis put it."""

    sequence_number: str
    sub_sequence_number: int | None
    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    shard_id: str


def put_plain(client: Any, stream: str, key: str, data: bytes) -> list[Put]:
    response = client.put_record(StreamName=stream, PartitionKey=key, Data=data)
    return [Put(response["SequenceNumber"], None, key, None, data, response["ShardId"])]


def put_aggregate(client: Any, stream: str, records: list[tuple[str, bytes, str | None]]) -> list[Put]:
    agg = RecordAggregator()
    for key, data, ehk in records:
        agg.add_user_record(key, data, explicit_hash_key=ehk)
    pk, ehk, blob = agg.clear_and_get().get_contents()
    kwargs = {"ExplicitHashKey": ehk} if ehk else {}
    response = client.put_record(StreamName=stream, PartitionKey=pk, Data=blob, **kwargs)
    return [
        Put(response["SequenceNumber"], i, key, ehk_i, data, response["ShardId"])
        for i, (key, data, ehk_i) in enumerate(records)
    ]


def put_vector(client: Any, stream: str, vector: dict) -> list[Put]:
    """A KPL-produced Kinesis record, exactly as the KPL wrote it."""
    response = client.put_record(StreamName=stream, PartitionKey=vector["partition_key"], Data=vector["data"])
    return [
        Put(
            response["SequenceNumber"],
            u["sub_sequence_number"],
            u["partition_key"],
            u["explicit_hash_key"],
            u["data"].encode("utf-8"),
            response["ShardId"],
        )
        for u in vector["expected_user_records"]
    ]


def planning_time() -> datetime:
    # Both emulators truncate arrival times to milliseconds, and plans hold their cutoff in
    # milliseconds too: a record put in the planning millisecond would arrive *at* the cutoff and
    # rightly be left for the next batch. Plan in a later millisecond than every put before.
    time.sleep(0.002)
    return datetime.now(timezone.utc)


def stored(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint as the store keeps it: timestamps in milliseconds, the precision of plans'
    cutoffs (a LATEST start is planned at ``now`` in microseconds, a hair after its cutoff)."""
    return Checkpoint.from_dict(checkpoint.to_dict())


def plan_batch(
    client: Any,
    stream: str,
    batch_id: int,
    checkpoints: dict[str, Checkpoint],
    **kwargs: Any,
) -> BatchPlan:
    now = planning_time()
    return plan_incremental(
        batch_id=batch_id,
        stream_name=stream,
        consumer_name="it",
        shards=list_shards(client, stream),
        checkpoints=checkpoints,
        cutoff=now,
        now=now,
        output_location=f"memory://{stream}/{batch_id}",
        **kwargs,
    )


def read_plan(client: Any, plan: BatchPlan) -> tuple[dict[str, list[UserRecord]], list[ShardReport]]:
    records: dict[str, list[UserRecord]] = {}
    reports = []
    for rng in plan.ranges:
        got, report = ShardReader(client, plan.stream_name, rng, min_call_interval=0).read_all()
        records[rng.shard_id] = got
        reports.append(report)
    return records, reports


def as_puts(records: list[UserRecord]) -> list[Put]:
    return [
        Put(r.sequence_number, r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data, r.shard_id)
        for r in records
    ]


# -- shard listing ------------------------------------------------------------------------------------


class MaxResultsClient:
    """A client whose ListShards pages hold at most ``page`` shards (more pages than the default)."""

    def __init__(self, client: Any, page: int) -> None:
        self._client = client
        self.page = page
        self.list_shards_calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.list_shards_calls.append(dict(kwargs))
        return self._client.list_shards(MaxResults=self.page, **kwargs)


def test_list_shards_pages_through_150_shards_on_moto(kinesis, unique_name):
    create_stream(kinesis, unique_name, 150)
    expected = [f"shardId-{n:012d}" for n in range(150)]
    assert [s.shard_id for s in list_shards(kinesis, unique_name)] == expected

    paged = MaxResultsClient(kinesis, page=40)
    shards = list_shards(paged, unique_name)
    assert [s.shard_id for s in shards] == expected  # all, once, in order
    assert len(paged.list_shards_calls) >= 4
    # moto refuses NextToken alone (DESIGN.md, emulator quirks): the name is sent with it
    assert any("NextToken" in c and "StreamName" in c for c in paged.list_shards_calls)
    assert all(not s.is_closed and s.parents == () for s in shards)
    kinesis.delete_stream(StreamName=unique_name)


def test_list_shards_lists_150_shards_on_kinesalite(kinesalite, unique_name):
    create_stream(kinesalite, unique_name, 150)  # kinesalite runs with --shardLimit 200
    try:
        shards = list_shards(kinesalite, unique_name)
        assert [s.shard_id for s in shards] == [f"shardId-{n:012d}" for n in range(150)]
        hash_ranges = sorted((int(s.starting_hash_key), int(s.ending_hash_key)) for s in shards)
        assert hash_ranges[0][0] == 0 and hash_ranges[-1][1] == 2**128 - 1
        assert all(b[0] == a[1] + 1 for a, b in zip(hash_ranges, hash_ranges[1:]))
        assert all(len(s.starting_sequence_number) == 56 for s in shards)
    finally:
        kinesalite.delete_stream(StreamName=unique_name)


def test_missing_stream_names_stream_region_and_endpoint(emulator, unique_name):
    with pytest.raises(StreamNotFoundError) as info:
        list_shards(emulator, unique_name)
    err = info.value
    endpoint = emulator.meta.endpoint_url
    assert repr(unique_name) in str(err)
    assert REGION in str(err)
    assert endpoint in str(err)
    assert (err.stream_name, err.region, err.endpoint) == (unique_name, REGION, endpoint)


# -- reading -------------------------------------------------------------------------------------------


def test_read_every_user_record_once_then_only_new_ones(emulator, stream, kpl_vectors):
    client = emulator
    puts: list[Put] = []
    puts += put_plain(client, stream, "alpha", b"first plain record")
    puts += put_aggregate(
        client,
        stream,
        [("k1", b"agg one", None), ("k2", b"\x00\xffbinary", "85070591730234615865843651857942052864"), ("k1", b"", None)],
    )
    for vector in kpl_vectors:
        puts += put_vector(client, stream, vector)
    puts += put_plain(client, stream, "beta", "plain ünïcødé".encode())
    # The batch ends on the last user record of an aggregate, so the next batch starts
    # AT_SEQUENCE_NUMBER on it and must skip every one of its user records.
    puts += put_aggregate(client, stream, [(f"tail-{i}", b"tail %d" % i, None) for i in range(4)])
    assert len(puts) == 1 + 3 + 17 + 1 + 4

    plan1 = plan_batch(client, stream, 1, {})
    (rng,) = plan1.ranges
    assert rng.start == StartPosition("TRIM_HORIZON")
    records, reports = read_plan(client, plan1)
    got = records[rng.shard_id]
    assert as_puts(got) == puts  # every user record, once, in order, with its sub-sequence number
    (report,) = reports
    assert report.records == len(puts)
    assert report.kinesis_records == 1 + 1 + 4 + 1 + 1
    assert report.stop_reason == "caught_up"
    assert report.first == ExtendedSequenceNumber(puts[0].sequence_number)
    assert report.last == ExtendedSequenceNumber(puts[-1].sequence_number, 3)
    sequence_numbers = [int(r.sequence_number) for r in got]
    assert sequence_numbers == sorted(sequence_numbers)
    assert all(r.approximate_arrival_timestamp < plan1.cutoff for r in got)

    checkpoints = validate_report(plan1, reports)
    assert checkpoints[rng.shard_id] == advance(rng, report) == Checkpoint.at(puts[-1].sequence_number, 3)

    # nothing new: the next batch reads nothing and the checkpoint stays
    plan2 = plan_batch(client, stream, 2, checkpoints)
    (rng2,) = plan2.ranges
    assert rng2.start == StartPosition.after(checkpoints[rng.shard_id])
    assert rng2.start == StartPosition(
        "AT_SEQUENCE_NUMBER", sequence_number=puts[-1].sequence_number, skip_through_sub_sequence_number=3
    )
    records2, reports2 = read_plan(client, plan2)
    assert records2[rng.shard_id] == []
    assert reports2[0].stop_reason == "caught_up"
    checkpoints2 = validate_report(plan2, reports2)
    assert checkpoints2 == checkpoints

    # more records: exactly the new ones
    new: list[Put] = []
    new += put_plain(client, stream, "gamma", b"after the first batch")
    new += put_aggregate(client, stream, [("d", b"d0", None), ("e", b"e1", None)])
    new += put_plain(client, stream, "delta", b"last")
    plan3 = plan_batch(client, stream, 3, checkpoints2)
    records3, reports3 = read_plan(client, plan3)
    assert as_puts(records3[rng.shard_id]) == new
    checkpoints3 = validate_report(plan3, reports3)
    assert checkpoints3[rng.shard_id] == Checkpoint.at(new[-1].sequence_number)

    plan4 = plan_batch(client, stream, 4, checkpoints3)
    assert plan4.ranges[0].start == StartPosition("AFTER_SEQUENCE_NUMBER", sequence_number=new[-1].sequence_number)
    records4, _ = read_plan(client, plan4)
    assert records4[rng.shard_id] == []


def test_kinesalite_sequence_numbers_are_56_digit_strings(kinesalite, unique_name, kpl_vectors):
    create_stream(kinesalite, unique_name, 1)
    try:
        puts = put_plain(kinesalite, unique_name, "k", b"x") + put_vector(kinesalite, unique_name, kpl_vectors[0])
        plan = plan_batch(kinesalite, unique_name, 1, {})
        records, reports = read_plan(kinesalite, plan)
        got = records[plan.ranges[0].shard_id]
        assert as_puts(got) == puts
        for r in got:
            assert isinstance(r.sequence_number, str)
            assert len(r.sequence_number) == 56 and r.sequence_number.isdigit()
        assert len(reports[0].last.sequence_number) == 56
        # stored as strings, compared as ints: the checkpoint keeps every digit
        checkpoint = validate_report(plan, reports)[plan.ranges[0].shard_id]
        assert Checkpoint.from_dict(checkpoint.to_dict()) == checkpoint
        assert checkpoint.position.sequence_number == puts[-1].sequence_number
    finally:
        kinesalite.delete_stream(StreamName=unique_name)


def test_capped_batches_over_several_shards_read_each_record_exactly_once(emulator, unique_name):
    client = emulator
    create_stream(client, unique_name, 3)
    try:
        puts: list[Put] = []
        for i in range(12):
            if i % 4 == 3:
                puts += put_aggregate(client, unique_name, [(f"agg{i}-{j}", b"a%d-%d" % (i, j), None) for j in range(5)])
            else:
                puts += put_plain(client, unique_name, f"key-{i}", b"plain %d" % i)
        assert len({p.shard_id for p in puts}) > 1  # spread over shards

        seen: list[Put] = []
        checkpoints: dict[str, Checkpoint] = {}
        for batch_id in range(1, 30):
            plan = plan_batch(client, unique_name, batch_id, checkpoints, max_records_per_shard=3)
            assert len(plan.ranges) == 3
            records, reports = read_plan(client, plan)
            checkpoints = validate_report(plan, reports)
            new = [p for shard_records in records.values() for p in as_puts(shard_records)]
            for report in reports:
                # an aggregate is never cut: only a first aggregate may exceed the cap
                assert report.records <= 3 or report.kinesis_records == 1
            if not new:
                break
            seen += new
        else:
            pytest.fail("the capped batches never caught up")

        assert sorted(seen, key=_order) == sorted(puts, key=_order)
        assert len(seen) == len(set(seen)) == len(puts)
        for shard in {p.shard_id for p in puts}:
            in_shard = [p for p in seen if p.shard_id == shard]
            assert in_shard == sorted(in_shard, key=_order)  # per-shard order kept across batches
    finally:
        client.delete_stream(StreamName=unique_name)


def _order(p: Put) -> tuple[str, int, int]:
    return (p.shard_id, int(p.sequence_number), -1 if p.sub_sequence_number is None else p.sub_sequence_number)


def test_latest_start_reads_what_arrives_after_planning(emulator, stream):
    client = emulator
    early = put_plain(client, stream, "a", b"before planning")
    plan1 = plan_batch(client, stream, 1, {}, initial_position="LATEST")
    (rng,) = plan1.ranges
    assert rng.start == StartPosition("AT_TIMESTAMP", timestamp=plan1.created_at)
    late = put_plain(client, stream, "b", b"after planning")
    records1, reports1 = read_plan(client, plan1)
    assert records1[rng.shard_id] == []  # "early" is before the start, "late" after the cutoff
    assert reports1[0].stop_reason == "cutoff"
    checkpoints = validate_report(plan1, reports1)
    assert stored(checkpoints[rng.shard_id]) == Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=plan1.cutoff)

    plan2 = plan_batch(client, stream, 2, checkpoints)
    assert plan2.ranges[0].start.iterator_type == "AT_TIMESTAMP"
    assert format_timestamp(plan2.ranges[0].start.timestamp) == format_timestamp(plan1.cutoff)
    records2, reports2 = read_plan(client, plan2)
    assert as_puts(records2[rng.shard_id]) == late
    assert early[0] not in as_puts(records2[rng.shard_id])
    assert validate_report(plan2, reports2)[rng.shard_id] == Checkpoint.at(late[0].sequence_number)


def test_at_timestamp_start_with_nothing_after_it_on_moto(kinesis, unique_name):
    # moto only: kinesalite 3.3.3 never answers GetShardIterator AT_TIMESTAMP when no record
    # arrived at or after the timestamp (the request hangs).
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, "a", b"before")
    plan = plan_batch(kinesis, unique_name, 1, {}, initial_position="LATEST")
    (rng,) = plan.ranges
    records, reports = read_plan(kinesis, plan)
    assert records[rng.shard_id] == []
    assert reports[0].stop_reason == "caught_up"
    checkpoints = validate_report(plan, reports)
    assert stored(checkpoints[rng.shard_id]) == Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=plan.cutoff)
    late = put_plain(kinesis, unique_name, "b", b"after")
    # Arrival timestamps and cutoffs are milliseconds: a cutoff in the record's own millisecond
    # rightly leaves it for the next batch (arrival >= cutoff), so plan strictly after it.
    time.sleep(0.01)
    records2, _ = read_plan(kinesis, plan_batch(kinesis, unique_name, 2, checkpoints))
    assert as_puts(records2[rng.shard_id]) == late
    kinesis.delete_stream(StreamName=unique_name)
