"""ShardReader with enhanced fan-out (SubscribeToShard) against a fake client: the same stop
rules and reports as GetRecords, renewed subscriptions, retried ResourceInUseException.

A fake is right here: a unit test of the reader alone (the local SubscribeToShard endpoint is
exercised by the integration tests)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import EventStreamError

from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber
from airflow_kinesis_spark.core.reader import ShardReader
from tests.unit.core.test_reader import (
    SHARD,
    STREAM,
    T0,
    FakeKinesis,
    Sleeps,
    aggregated,
    assert_report_valid,
    client_error,
    keys,
    make_range,
    plain,
    seq,
)

CONSUMER = f"arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}/consumer/lake:1"


class EventStream:
    """``failure``: raised (as botocore raises an exception event) after the events."""

    def __init__(self, events: list[dict], failure: Exception | None = None) -> None:
        self.events = events
        self.failure = failure
        self.closed = False

    def __iter__(self):
        for event in self.events:
            if self.closed:
                return
            yield event
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self.closed = True


class FakeFanOut(FakeKinesis):
    """SubscribeToShard over the fake's records: ``per_event`` records an event, at most
    ``per_subscription`` events before the subscription ends; ``refuse`` errors first."""

    def __init__(self, records: list[dict], *, closed: bool = False, per_event: int = 2, per_subscription: int = 100) -> None:
        super().__init__(records, closed=closed)
        self.per_event = per_event
        self.per_subscription = per_subscription
        self.refuse: list[Exception] = []
        #: exception events that end the next subscriptions (after their events)
        self.fail: list[Exception] = []
        self.subscriptions: list[dict[str, Any]] = []

    def subscribe_to_shard(self, **kwargs: Any) -> dict[str, Any]:
        self.subscriptions.append(kwargs)
        if self.refuse:
            raise self.refuse.pop(0)
        assert kwargs["ConsumerARN"] == CONSUMER and kwargs["ShardId"] == SHARD
        position = kwargs["StartingPosition"]
        request = {"ShardIteratorType": position["Type"], "StreamName": STREAM, "ShardId": SHARD}
        if "SequenceNumber" in position:
            request["StartingSequenceNumber"] = position["SequenceNumber"]
        if "Timestamp" in position:
            request["Timestamp"] = position["Timestamp"]
        pos = int(self.get_shard_iterator(**request)["ShardIterator"].split(":")[1])
        events = []
        while len(events) < self.per_subscription:
            page = self.records[pos : pos + self.per_event]
            pos += len(page)
            self.served += len(page)
            at_end = pos >= len(self.records)
            event: dict[str, Any] = {"Records": [dict(r) for r in page], "MillisBehindLatest": 0 if at_end else 1000}
            if not (self.closed and at_end):
                event["ContinuationSequenceNumber"] = page[-1]["SequenceNumber"] if page else seq(pos)
            else:
                event["ChildShards"] = [{"ShardId": "shardId-000000000009", "ParentShards": [SHARD]}]
            events.append({"SubscribeToShardEvent": event})
            if at_end:
                break
        return {"EventStream": EventStream(events, self.fail.pop(0) if self.fail else None)}


def read_efo(client: FakeFanOut, rng, **kwargs):
    reader = ShardReader(client, STREAM, rng, sleep=Sleeps(), min_call_interval=0, read_bytes_per_second=None,
                         consumer_arn=CONSUMER, **kwargs)  # fmt: skip
    records, report = reader.read_all()
    assert_report_valid(rng, report, records)
    return records, report


def records_of(n: int) -> list[dict]:
    return [aggregated(i, 3) if i % 3 == 0 else plain(i) for i in range(n)]


def test_efo_reads_what_polling_reads_and_stops_caught_up():
    data = records_of(10)
    polled, polled_report = ShardReader(FakeKinesis(data), STREAM, make_range(), sleep=Sleeps(), min_call_interval=0,
                                        read_bytes_per_second=None).read_all()  # fmt: skip
    pushed, report = read_efo(FakeFanOut(data), make_range())
    assert keys(pushed) == keys(polled) and len(pushed) == 10 + 4 * 2  # four aggregates of three user records
    assert report.stop_reason == "caught_up" == polled_report.stop_reason
    assert (report.first, report.last, report.records) == (polled_report.first, polled_report.last, polled_report.records)


def test_a_subscription_that_ends_mid_range_is_renewed_after_the_last_record_read():
    client = FakeFanOut(records_of(9), per_event=2, per_subscription=2)  # ends after 4 records
    records, report = read_efo(client, make_range())
    assert len(client.subscriptions) >= 3 and report.expired_iterators == len(client.subscriptions) - 1
    assert client.subscriptions[0]["StartingPosition"] == {"Type": "TRIM_HORIZON"}
    assert client.subscriptions[1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": seq(3)}
    assert client.served == 9  # nothing read twice, nothing skipped
    assert len(keys(records)) == len(set(keys(records))) == 9 + 3 * 2


def test_resource_in_use_is_retried_with_backoff():
    client = FakeFanOut(records_of(4))
    client.refuse = [client_error("ResourceInUseException", "SubscribeToShard")] * 2
    records, report = read_efo(client, make_range())
    assert report.throttled_calls == 2 and report.records == len(records) == 4 + 2 * 2
    assert [type(e).__name__ for e in client.refuse] == [] and len(client.subscriptions) >= 3


def stream_error(code: str) -> EventStreamError:
    return EventStreamError({"Error": {"Code": code, "Message": f"{code} (injected)"}}, "SubscribeToShard")


def test_a_subscription_that_fails_mid_range_is_renewed_after_the_last_record_read():
    """An exception event (the service's InternalFailureException; ResourceInUseException when
    another subscription of the consumer took the shard over) ends a subscription: renewed."""
    client = FakeFanOut(records_of(9), per_event=2, per_subscription=2)
    client.fail = [stream_error("InternalFailureException"), stream_error("ResourceInUseException")]
    records, report = read_efo(client, make_range())
    assert client.fail == [] and client.served == 9  # nothing read twice, nothing skipped
    assert client.subscriptions[1]["StartingPosition"] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": seq(3)}
    assert len(keys(records)) == len(set(keys(records))) == 9 + 3 * 2 and report.stop_reason == "caught_up"
    assert report.throttled_calls == 2


def test_a_subscription_that_fails_again_and_again_without_progress_gives_up():
    client = FakeFanOut(records_of(4), per_event=2, per_subscription=0)  # every subscription fails at once
    client.fail = [stream_error("InternalFailureException")] * 20
    with pytest.raises(EventStreamError, match="InternalFailureException"):
        read_efo(client, make_range(), max_throttle_retries=3)
    assert len(client.subscriptions) == 4


def test_other_subscribe_errors_are_raised():
    client = FakeFanOut(records_of(4))
    client.refuse = [client_error("AccessDeniedException", "SubscribeToShard")]
    with pytest.raises(Exception, match="AccessDeniedException"):
        read_efo(client, make_range())


def test_shard_end_from_an_event_without_continuation():
    _, report = read_efo(FakeFanOut(records_of(5), closed=True), make_range())
    assert report.shard_end and report.stop_reason == "shard_end"


def test_cutoff_and_start_after_a_checkpoint_hold_for_efo():
    data = [plain(i) for i in range(10)]
    rng = make_range(Checkpoint(position=ExtendedSequenceNumber(seq(2))), cutoff=T0 + timedelta(seconds=6))
    records, report = read_efo(FakeFanOut(data), rng)
    assert [r.sequence_number for r in records] == [seq(i) for i in (3, 4, 5)] and report.stop_reason == "cutoff"


def test_10_mib_records_and_an_aggregate_over_1_mib_larger_than_the_byte_cap_are_read_once_over_ranges():
    """Records up to 10 MiB (Kinesis since October 2025), pushed one a event: a range capped at
    4 MiB takes its first Kinesis record whole (10 MiB, or an aggregate of 3.6 MiB) and stops
    before the next; ranges from each one's last extended sequence number read every user record
    once, as polling does."""
    from aws_kinesis_agg.aggregator import AggRecord

    mib = 1024 * 1024
    aggregate = AggRecord(max_size=10 * mib)
    for j in range(3):
        aggregate.add_user_record(f"k{j}", bytes([j]) * (1200 * 1024))
    big = [plain(0, b"a" * (10 * mib)), plain(1, b"b" * (10 * mib - 1)), plain(3, b"c" * (10 * mib))]
    records = big[:2] + [{**plain(2), "Data": aggregate.get_contents()[2]}] + big[2:]
    # the user records' data sizes, range by range
    expected_sizes = [[b"a" * (10 * mib)], [b"b" * (10 * mib - 1)], [b"." * (1200 * 1024)] * 3, [b"c" * (10 * mib)], []]
    seen: list[tuple[str, int | None]] = []
    checkpoint, ranges = None, 0
    while True:
        got, report = read_efo(FakeFanOut(records, per_event=1), make_range(checkpoint, max_bytes=4 * mib))
        ranges += 1
        seen += [(r.sequence_number, r.sub_sequence_number) for r in got]
        assert [len(r.data) for r in got] == [len(u) for u in expected_sizes.pop(0)]
        if not report.records:
            break
        # one Kinesis record's user records (a range from inside the aggregate re-reads it first)
        assert len({k[0] for k in keys(got)}) == 1 and report.stop_reason in ("max_bytes", "caught_up")
        checkpoint = Checkpoint.at(report.last.sequence_number, report.last.sub_sequence_number)
    assert seen == [(seq(0), None), (seq(1), None), (seq(2), 0), (seq(2), 1), (seq(2), 2), (seq(3), None)]
    assert ranges == 5
