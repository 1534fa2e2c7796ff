"""ShardReader against a fake Kinesis client: stop rules, caps, backoff, expired iterators."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.planner import BatchPlan, validate_report
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber, Sentinel
from airflow_kinesis_spark.core.read_options import GET_RECORDS_MAX_LIMIT, PACING_MARGIN_S
from airflow_kinesis_spark.core.pages import UserRecord
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition

SHARD = "shardId-000000000007"
STREAM = "orders"
BASE = 49590338271490256608559692538361571095921575989136588898  # a real-looking 56-digit number
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
FAR = T0 + timedelta(days=1)


class ExpiredIteratorException(ClientError):
    """botocore's modelled error class, as ``client.exceptions.ExpiredIteratorException``."""


def client_error(code: str, operation: str = "GetRecords") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} (injected)"}}, operation)


def expired() -> ExpiredIteratorException:
    return ExpiredIteratorException(
        {"Error": {"Code": "ExpiredIteratorException", "Message": "Iterator expired"}}, "GetRecords"
    )


def seq(i: int) -> str:
    # Spaced so that string order and int order agree only by accident of equal length.
    return str(BASE + i * 1_000_000_000_000_000_000)


def plain(i: int, data: bytes | None = None, *, arrival: datetime | None = None, key: str | None = None) -> dict:
    return {
        "SequenceNumber": seq(i),
        "ApproximateArrivalTimestamp": arrival or T0 + timedelta(seconds=i),
        "Data": data if data is not None else b"plain-%d" % i,
        "PartitionKey": key or f"pk-{i}",
    }


def aggregated(i: int, n: int, *, arrival: datetime | None = None) -> dict:
    agg = RecordAggregator()
    for j in range(n):
        agg.add_user_record(f"agg{i}-key{j}", b"agg-%d-user-%d" % (i, j))
    pk, _ehk, blob = agg.clear_and_get().get_contents()
    return {
        "SequenceNumber": seq(i),
        "ApproximateArrivalTimestamp": arrival or T0 + timedelta(seconds=i),
        "Data": blob,
        "PartitionKey": pk,
    }


class FakeKinesis:
    """A one-shard Kinesis with just GetShardIterator and GetRecords.

    ``faults[operation]`` is a queue consumed one entry per call: ``None`` (answer normally), an
    exception (raise it), or ``"empty"`` (an empty page, ``MillisBehindLatest`` > 0, same iterator).
    """

    class exceptions:  # noqa: N801 - mirrors botocore's client.exceptions
        ClientError = ClientError
        ExpiredIteratorException = ExpiredIteratorException

    def __init__(self, records: list[dict], *, closed: bool = False) -> None:
        self.records = records
        self.closed = closed
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.faults: dict[str, list[Any]] = {"get_records": [], "get_shard_iterator": []}
        self.served = 0  # records handed out, duplicates included

    def _fault(self, operation: str) -> Any:
        queue = self.faults[operation]
        if queue:
            fault = queue.pop(0)
            if isinstance(fault, Exception):
                raise fault
            return fault
        return None

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("get_shard_iterator", kwargs))
        self._fault("get_shard_iterator")
        assert kwargs["StreamName"] == STREAM
        assert kwargs["ShardId"] == SHARD
        kind = kwargs["ShardIteratorType"]
        values = [int(r["SequenceNumber"]) for r in self.records]
        if kind == "TRIM_HORIZON":
            pos = 0
        elif kind == "LATEST":
            pos = len(values)
        elif kind == "AT_SEQUENCE_NUMBER":
            pos = next((i for i, v in enumerate(values) if v >= int(kwargs["StartingSequenceNumber"])), len(values))
        elif kind == "AFTER_SEQUENCE_NUMBER":
            pos = next((i for i, v in enumerate(values) if v > int(kwargs["StartingSequenceNumber"])), len(values))
        elif kind == "AT_TIMESTAMP":
            ts = kwargs["Timestamp"]
            pos = next(
                (i for i, r in enumerate(self.records) if r["ApproximateArrivalTimestamp"] >= ts), len(values)
            )
        else:  # pragma: no cover - the reader never asks for anything else
            raise AssertionError(kind)
        return {"ShardIterator": f"it:{pos}"}

    def get_records(self, *, ShardIterator: str, Limit: int) -> dict[str, Any]:  # noqa: N803 - boto3 names
        self.calls.append(("get_records", {"ShardIterator": ShardIterator, "Limit": Limit}))
        assert 1 <= Limit <= GET_RECORDS_MAX_LIMIT
        pos = int(ShardIterator.split(":")[1])
        if self._fault("get_records") == "empty":
            return {"Records": [], "NextShardIterator": ShardIterator, "MillisBehindLatest": 86_400_000}
        page = self.records[pos : pos + Limit]
        self.served += len(page)
        nxt = pos + len(page)
        at_end = nxt >= len(self.records)
        response: dict[str, Any] = {
            "Records": [dict(r) for r in page],
            "MillisBehindLatest": 0 if at_end else 1000 * (len(self.records) - nxt),
        }
        if not (self.closed and at_end):  # boto3 leaves a null NextShardIterator out
            response["NextShardIterator"] = f"it:{nxt}"
        return response

    def limits(self) -> list[int]:
        return [kw["Limit"] for op, kw in self.calls if op == "get_records"]

    def iterator_requests(self) -> list[dict[str, Any]]:
        return [kw for op, kw in self.calls if op == "get_shard_iterator"]


def make_range(
    checkpoint: Checkpoint | None = None,
    *,
    cutoff: datetime = FAR,
    ending: str | None = None,
    max_records: int | None = None,
    max_bytes: int | None = None,
) -> ShardRange:
    checkpoint = checkpoint or Checkpoint(Sentinel.TRIM_HORIZON)
    return ShardRange(
        shard_id=SHARD,
        start=StartPosition.after(checkpoint),
        start_checkpoint=checkpoint,
        cutoff=cutoff,
        ending_sequence_number=ending,
        max_records=max_records,
        max_bytes=max_bytes,
    )


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        assert seconds >= 0
        self.append(seconds)


def read(client: FakeKinesis, rng: ShardRange, **kwargs: Any) -> tuple[list[UserRecord], ShardReport, Sleeps]:
    sleeps = Sleeps()
    kwargs.setdefault("min_call_interval", 0)
    kwargs.setdefault("read_bytes_per_second", None)
    reader = ShardReader(client, STREAM, rng, sleep=sleeps, **kwargs)
    records, report = reader.read_all()
    assert_report_valid(rng, report, records)
    return records, report, sleeps


def assert_report_valid(rng: ShardRange, report: ShardReport, records: list[UserRecord]) -> None:
    """The report agrees with what was yielded, and the planner accepts it for its range."""
    assert report.shard_id == rng.shard_id
    assert report.records == len(records)
    assert report.bytes == sum(len(r.data) for r in records)
    if records:
        assert report.first == ExtendedSequenceNumber(records[0].sequence_number, records[0].sub_sequence_number)
        assert report.last == ExtendedSequenceNumber(records[-1].sequence_number, records[-1].sub_sequence_number)
    else:
        assert report.first is None and report.last is None
    assert report.shard_end == (report.stop_reason == "shard_end")
    assert ShardReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    validate_report(make_plan_for(rng), [report])


def make_plan_for(rng: ShardRange) -> BatchPlan:
    return BatchPlan(
        batch_id=1,
        stream_name=STREAM,
        consumer_name="c",
        cutoff=rng.cutoff,
        created_at=rng.cutoff,
        ranges=(rng,),
        checkpoints={},
        output_location="memory://out/batch=1",
    )


def keys(records: list[UserRecord]) -> list[tuple[str, int | None, bytes]]:
    return [(r.sequence_number, r.sub_sequence_number, r.data) for r in records]


# -- plain reading -----------------------------------------------------------------------------


def test_reads_every_record_in_order_then_caught_up():
    client = FakeKinesis([plain(i) for i in range(7)])
    records, report, sleeps = read(client, make_range(), limit=3)
    assert [r.data for r in records] == [b"plain-%d" % i for i in range(7)]
    assert [r.sequence_number for r in records] == [seq(i) for i in range(7)]
    assert all(r.sub_sequence_number is None and r.explicit_hash_key is None for r in records)
    assert [r.partition_key for r in records] == [f"pk-{i}" for i in range(7)]
    assert all(r.shard_id == SHARD for r in records)
    assert records[2].approximate_arrival_timestamp == T0 + timedelta(seconds=2)
    assert report.stop_reason == "caught_up"
    assert not report.shard_end
    assert report.first == ExtendedSequenceNumber(seq(0))
    assert report.last == ExtendedSequenceNumber(seq(6))
    assert report.kinesis_records == 7
    assert report.kinesis_bytes == report.bytes == sum(len(b"plain-%d" % i) for i in range(7))
    assert report.millis_behind_latest == 0
    # 3 + 3 + 1 records: the last response is short of its Limit at MillisBehindLatest 0
    assert client.limits() == [3, 3, 3]
    assert report.get_records_calls == 3
    assert sleeps == []


def test_a_response_short_of_its_limit_at_the_tip_is_caught_up_without_an_empty_call():
    client = FakeKinesis([plain(i) for i in range(5)])
    records, report, _ = read(client, make_range(), limit=10)
    assert len(records) == 5
    assert report.stop_reason == "caught_up"
    assert client.limits() == [10]  # no second call to be told there is nothing more


def test_a_full_response_at_millis_behind_latest_0_reads_on():
    # kinesalite answers MillisBehindLatest 0 to every call: a response that fills its Limit
    # may have more behind it, so only a short or empty one ends the read.
    client = FakeKinesis([plain(i) for i in range(6)])
    client.get_records = _always_at_the_tip(client.get_records)  # type: ignore[method-assign]
    records, report, _ = read(client, make_range(), limit=3)
    assert len(records) == 6
    assert report.stop_reason == "caught_up"
    assert client.limits() == [3, 3, 3]


def _always_at_the_tip(get_records: Any) -> Any:
    def call(**kwargs: Any) -> dict[str, Any]:
        return {**get_records(**kwargs), "MillisBehindLatest": 0}

    return call


def test_pages_yields_one_list_per_response():
    client = FakeKinesis([plain(i) for i in range(5)])
    reader = ShardReader(client, STREAM, make_range(), limit=2, min_call_interval=0, sleep=Sleeps())
    pages = list(reader.pages())
    assert [len(p) for p in pages] == [2, 2, 1]
    assert reader.report is not None and reader.report.records == 5


def test_empty_page_while_behind_does_not_stop():
    client = FakeKinesis([plain(i) for i in range(4)])
    client.faults["get_records"] = [None, "empty", "empty", None]
    records, report, _ = read(client, make_range(), limit=2)
    assert len(records) == 4
    assert report.stop_reason == "caught_up"


def test_empty_shard_is_caught_up_with_nothing_read():
    client = FakeKinesis([])
    records, report, _ = read(client, make_range())
    assert records == []
    assert report.stop_reason == "caught_up"
    assert report.first is None and report.last is None
    assert report.get_records_calls == 1


def test_start_after_sequence_number_is_exclusive():
    client = FakeKinesis([plain(i) for i in range(5)])
    records, report, _ = read(client, make_range(Checkpoint.at(seq(2))))
    assert [r.sequence_number for r in records] == [seq(3), seq(4)]
    assert client.iterator_requests()[0]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert client.iterator_requests()[0]["StartingSequenceNumber"] == seq(2)


def test_start_at_timestamp_passes_the_timestamp():
    client = FakeKinesis([plain(i) for i in range(5)])
    ts = T0 + timedelta(seconds=3)
    records, _, _ = read(client, make_range(Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=ts)))
    assert [r.sequence_number for r in records] == [seq(3), seq(4)]
    request = client.iterator_requests()[0]
    assert request["ShardIteratorType"] == "AT_TIMESTAMP"
    assert request["Timestamp"] == ts


# -- cutoff --------------------------------------------------------------------------------------


def test_cutoff_record_at_the_cutoff_is_not_taken():
    client = FakeKinesis([plain(i) for i in range(6)])
    records, report, _ = read(client, make_range(cutoff=T0 + timedelta(seconds=3)), limit=10)
    assert [r.sequence_number for r in records] == [seq(0), seq(1), seq(2)]
    assert report.stop_reason == "cutoff"
    assert not report.shard_end
    assert report.last == ExtendedSequenceNumber(seq(2))


def test_cutoff_between_records_and_across_pages():
    client = FakeKinesis([plain(i) for i in range(6)])
    records, report, _ = read(client, make_range(cutoff=T0 + timedelta(seconds=3, milliseconds=1)), limit=2)
    assert [r.sequence_number for r in records] == [seq(i) for i in range(4)]
    assert report.stop_reason == "cutoff"
    assert report.get_records_calls == 3  # stops inside the third page without another call


def test_cutoff_compares_aware_timestamps_in_any_zone():
    plus2 = timezone(timedelta(hours=2))
    rows = [plain(i, arrival=(T0 + timedelta(seconds=i)).astimezone(plus2)) for i in range(4)]
    client = FakeKinesis(rows)
    records, report, _ = read(client, make_range(cutoff=T0 + timedelta(seconds=2)))
    assert len(records) == 2
    assert report.stop_reason == "cutoff"


def test_cutoff_before_first_record_reads_nothing():
    client = FakeKinesis([plain(i) for i in range(3)])
    records, report, _ = read(client, make_range(cutoff=T0))
    assert records == []
    assert report.stop_reason == "cutoff"
    assert report.kinesis_records == 0


def test_cutoff_applies_to_a_whole_aggregate():
    client = FakeKinesis([plain(0), aggregated(1, 4), plain(2)])
    records, report, _ = read(client, make_range(cutoff=T0 + timedelta(seconds=1)))
    assert keys(records) == [(seq(0), None, b"plain-0")]
    assert report.stop_reason == "cutoff"


# -- shard end -------------------------------------------------------------------------------------


def test_shard_end_when_next_iterator_is_null():
    client = FakeKinesis([plain(i) for i in range(5)], closed=True)
    records, report, _ = read(client, make_range(), limit=2)
    assert len(records) == 5
    assert report.stop_reason == "shard_end"
    assert report.shard_end
    assert report.get_records_calls == 3


def test_shard_end_when_get_shard_iterator_returns_none():
    client = FakeKinesis([plain(0)], closed=True)

    def no_iterator(**kwargs: Any) -> dict[str, Any]:
        client.calls.append(("get_shard_iterator", kwargs))
        return {}

    client.get_shard_iterator = no_iterator  # type: ignore[method-assign]
    records, report, _ = read(client, make_range(Checkpoint.at(seq(0))))
    assert records == []
    assert report.shard_end
    assert report.get_records_calls == 0


def test_shard_end_when_ending_sequence_number_is_read():
    # Open iterator chain (as moto keeps one for a closed shard): the ending sequence number decides.
    client = FakeKinesis([plain(i) for i in range(4)])
    records, report, _ = read(client, make_range(ending=seq(3)), limit=10)
    assert [r.sequence_number for r in records] == [seq(i) for i in range(4)]
    assert report.stop_reason == "shard_end"
    assert report.shard_end
    assert report.get_records_calls == 1


def test_records_past_ending_sequence_number_are_not_taken():
    client = FakeKinesis([plain(i) for i in range(8)])
    records, report, _ = read(client, make_range(ending=seq(4)), limit=3)
    assert [r.sequence_number for r in records] == [seq(i) for i in range(5)]
    assert report.last == ExtendedSequenceNumber(seq(4))
    assert report.shard_end


def test_record_beyond_ending_without_exact_match_stops_at_shard_end():
    client = FakeKinesis([plain(0), plain(1), plain(5), plain(6)])
    records, report, _ = read(client, make_range(ending=seq(3)))
    assert [r.sequence_number for r in records] == [seq(0), seq(1)]
    assert report.shard_end


def test_ending_aggregate_is_taken_whole():
    client = FakeKinesis([plain(0), aggregated(1, 3), plain(2)])
    records, report, _ = read(client, make_range(ending=seq(1)))
    assert keys(records)[1:] == [(seq(1), j, b"agg-1-user-%d" % j) for j in range(3)]
    assert report.last == ExtendedSequenceNumber(seq(1), 2)
    assert report.shard_end


# -- caps --------------------------------------------------------------------------------------------


def test_max_records_on_plain_records():
    client = FakeKinesis([plain(i) for i in range(10)])
    records, report, _ = read(client, make_range(max_records=3))
    assert [r.sequence_number for r in records] == [seq(0), seq(1), seq(2)]
    assert report.stop_reason == "max_records"
    assert client.limits() == [3]


def test_max_records_never_cuts_an_aggregate():
    client = FakeKinesis([plain(0), aggregated(1, 5), plain(2)])
    records, report, _ = read(client, make_range(max_records=3))
    assert keys(records) == [(seq(0), None, b"plain-0")]
    assert report.stop_reason == "max_records"
    assert report.records == 1
    assert report.kinesis_records == 1


def test_first_aggregate_bigger_than_cap_is_taken_whole():
    client = FakeKinesis([aggregated(0, 5), plain(1)])
    records, report, _ = read(client, make_range(max_records=3))
    assert keys(records) == [(seq(0), j, b"agg-0-user-%d" % j) for j in range(5)]
    assert report.records == 5
    assert report.kinesis_records == 1
    assert report.stop_reason == "max_records"


def test_aggregate_that_fits_the_cap_exactly_is_taken():
    client = FakeKinesis([plain(0), aggregated(1, 2), plain(2)])
    records, report, _ = read(client, make_range(max_records=3))
    assert len(records) == 3
    assert report.last == ExtendedSequenceNumber(seq(1), 1)
    assert report.stop_reason == "max_records"


def test_limit_is_min_of_limit_and_remaining_max_records():
    client = FakeKinesis([plain(i) for i in range(20)])
    records, report, _ = read(client, make_range(max_records=10), limit=4)
    assert len(records) == 10
    assert client.limits() == [4, 4, 2]
    assert report.stop_reason == "max_records"


def test_limit_without_cap_is_the_configured_limit():
    client = FakeKinesis([plain(i) for i in range(5)])
    read(client, make_range(), limit=7)
    assert set(client.limits()) == {7}
    client = FakeKinesis([plain(i) for i in range(500)])
    read(client, make_range())
    # The first call asks for 100 (record size unknown); small records then get the maximum.
    assert client.limits()[0] == 100 and set(client.limits()[1:]) == {GET_RECORDS_MAX_LIMIT}


@pytest.mark.parametrize("limit", [0, -1, GET_RECORDS_MAX_LIMIT + 1])
def test_limit_out_of_range_rejected(limit):
    with pytest.raises(ValueError, match="limit"):
        ShardReader(FakeKinesis([]), STREAM, make_range(), limit=limit)


def test_max_bytes_stops_before_the_record_that_would_pass_it():
    client = FakeKinesis([plain(i, b"0123456789") for i in range(6)])
    records, report, _ = read(client, make_range(max_bytes=25))
    assert len(records) == 2
    assert report.kinesis_bytes == 20
    assert report.stop_reason == "max_bytes"


def test_max_bytes_reached_exactly_stops_after_the_record():
    client = FakeKinesis([plain(i, b"0123456789") for i in range(6)])
    records, report, _ = read(client, make_range(max_bytes=30), limit=2)
    assert len(records) == 3
    assert report.kinesis_bytes == 30
    assert report.stop_reason == "max_bytes"
    assert report.get_records_calls == 2


def test_max_bytes_counts_kinesis_bytes_and_first_record_is_always_taken():
    agg = aggregated(0, 4)
    client = FakeKinesis([agg, plain(1)])
    records, report, _ = read(client, make_range(max_bytes=10))
    assert len(records) == 4
    assert report.kinesis_bytes == len(agg["Data"])
    assert report.bytes == sum(len(b"agg-0-user-%d" % j) for j in range(4))
    assert report.stop_reason == "max_bytes"


# -- throttling ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["KMSThrottlingException", "LimitExceededException"])
def test_throttling_is_retried_with_backoff_and_loses_nothing(code):
    rows = [plain(0), aggregated(1, 3), plain(2), plain(3), aggregated(4, 2)]
    expected, _, _ = read(FakeKinesis(rows), make_range(), limit=2)

    client = FakeKinesis(rows)
    client.faults["get_records"] = [client_error(code), None, client_error(code), client_error(code)]
    client.faults["get_shard_iterator"] = [client_error("ProvisionedThroughputExceededException", "GetShardIterator")]
    records, report, sleeps = read(client, make_range(), limit=2, backoff_base=0.5, backoff_cap=0.75)
    assert keys(records) == keys(expected)
    assert report.throttled_calls == 4
    assert len(sleeps) == 4
    # full jitter: the n-th retry of one call sleeps at most min(cap, base * 2**n)
    assert sleeps[0] <= 0.5  # get_shard_iterator, retry 0
    assert sleeps[1] <= 0.5  # first get_records, retry 0
    assert sleeps[2] <= 0.5 and sleeps[3] <= 0.75  # a later call: retries 0 and 1 (capped)
    assert report.stop_reason == "caught_up"


def test_read_budget_throttling_is_retried_in_step_with_the_budget_and_halves_the_share():
    """GetRecords' ProvisionedThroughputExceededException (the shard's read budget is spent,
    perhaps by other consumers): retried about min_call_interval later, never with seconds of
    exponential backoff, and the reader paces itself to half its share after each such answer."""
    rows = [plain(i) for i in range(6)]
    expected, _, _ = read(FakeKinesis(rows), make_range(), limit=2)
    client = FakeKinesis(rows)
    code = "ProvisionedThroughputExceededException"
    client.faults["get_records"] = [client_error(code)] * 3
    sleeps = Sleeps()
    reader = ShardReader(client, STREAM, make_range(), limit=2, min_call_interval=0.2, read_bytes_per_second=1000,
                         backoff_base=5, sleep=sleeps, clock=lambda: 100.0)  # fmt: skip
    records, report = reader.read_all()
    assert keys(records) == keys(expected)
    assert report.throttled_calls == 3
    assert all(0.1 <= s <= 0.3 for s in sleeps[:3]), sleeps  # not backoff_base * 2**n
    # 1/8 after three halvings, + 0.1 for each of the calls answered since
    assert reader.read_share == pytest.approx(1 / 8 + 0.1 * report.get_records_calls)
    reader.last_response_bytes = 500
    assert reader.pause_after_response() == pytest.approx(0.5 / reader.read_share)


def read_throttled(code: str, answers: int, **settings: Any) -> tuple[ShardReader, FakeKinesis, Sleeps]:
    """A read whose first ``answers`` GetRecords calls are refused with ``code``; it must fail with that code."""
    client = FakeKinesis([plain(i) for i in range(3)])
    client.faults["get_records"] = [client_error(code)] * answers
    sleeps = Sleeps()
    reader = ShardReader(client, STREAM, make_range(), sleep=sleeps, **settings)
    with pytest.raises(ClientError) as info:
        reader.read_all()
    assert info.value.response["Error"]["Code"] == code
    return reader, client, sleeps


def test_read_budget_throttling_fails_after_max_budget_wait():
    reader, _, sleeps = read_throttled("ProvisionedThroughputExceededException", 100, min_call_interval=0.2, max_budget_wait=2.0)
    assert 2.0 <= sum(sleeps) < 2.0 + 0.3  # stops at the first retry that would pass the wait
    assert reader.read_share == 1 / 8  # never below


def test_other_error_is_raised_immediately():
    client = FakeKinesis([plain(i) for i in range(3)])
    client.faults["get_records"] = [client_error("AccessDeniedException")]
    sleeps = Sleeps()
    reader = ShardReader(client, STREAM, make_range(), min_call_interval=0, sleep=sleeps)
    with pytest.raises(ClientError) as info:
        reader.read_all()
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
    assert sleeps == []
    assert len(client.limits()) == 1


def test_persistent_throttling_beyond_max_retries_raises():
    _, client, sleeps = read_throttled("KMSThrottlingException", 4, min_call_interval=0, max_throttle_retries=3)
    assert len(sleeps) == 3
    assert len(client.limits()) == 4  # first try + 3 retries


def test_throttling_up_to_max_retries_succeeds():
    code = "KMSThrottlingException"
    client = FakeKinesis([plain(i) for i in range(3)])
    client.faults["get_records"] = [client_error(code)] * 3
    records, report, sleeps = read(client, make_range(), max_throttle_retries=3)
    assert len(records) == 3
    assert report.throttled_calls == 3 and len(sleeps) == 3


def test_calls_are_paced_by_min_call_interval():
    client = FakeKinesis([plain(i) for i in range(6)])
    sleeps = Sleeps()
    reader = ShardReader(
        client, STREAM, make_range(), limit=2, min_call_interval=0.2, sleep=sleeps, clock=lambda: 100.0
    )
    records, report = reader.read_all()
    assert len(records) == 6
    assert report.get_records_calls == 4
    assert sleeps == [pytest.approx(0.2 + PACING_MARGIN_S)] * 3  # before every call but the first


# -- expired iterators -------------------------------------------------------------------------------


def test_expired_iterator_renews_after_last_kinesis_record_read():
    rows = [plain(0), aggregated(1, 3), plain(2), aggregated(3, 2), plain(4), plain(5)]
    expected, _, _ = read(FakeKinesis(rows), make_range(), limit=2)

    client = FakeKinesis(rows)
    client.faults["get_records"] = [None, expired(), None, expired()]
    records, report, _ = read(client, make_range(), limit=2)
    assert keys(records) == keys(expected)
    assert len(set(keys(records))) == len(records) == 1 + 3 + 1 + 2 + 2
    assert report.expired_iterators == 2
    requests = client.iterator_requests()
    assert [r["ShardIteratorType"] for r in requests] == ["TRIM_HORIZON", "AFTER_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"]
    # after the first page (plain 0, aggregate 1): after the aggregate, never inside it
    assert requests[1]["StartingSequenceNumber"] == seq(1)
    assert requests[2]["StartingSequenceNumber"] == seq(3)


def test_expired_iterator_before_anything_read_reuses_the_range_start():
    rows = [plain(i) for i in range(5)]
    client = FakeKinesis(rows)
    client.faults["get_records"] = [expired()]
    records, report, _ = read(client, make_range(Checkpoint.at(seq(1))))
    assert [r.sequence_number for r in records] == [seq(2), seq(3), seq(4)]
    assert report.expired_iterators == 1
    requests = client.iterator_requests()
    assert len(requests) == 2
    assert requests[0] == requests[1]
    assert requests[1]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert requests[1]["StartingSequenceNumber"] == seq(1)


def test_expired_iterator_at_timestamp_start_reuses_timestamp():
    client = FakeKinesis([plain(i) for i in range(5)])
    client.faults["get_records"] = [expired()]
    ts = T0 + timedelta(seconds=2)
    records, _, _ = read(client, make_range(Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=ts)))
    assert [r.sequence_number for r in records] == [seq(2), seq(3), seq(4)]
    assert [r["Timestamp"] for r in client.iterator_requests()] == [ts, ts]


def test_expired_iterator_with_sub_sequence_start_skips_again():
    rows = [plain(0), aggregated(1, 4), plain(2)]
    client = FakeKinesis(rows)
    client.faults["get_records"] = [expired()]
    records, _, _ = read(client, make_range(Checkpoint.at(seq(1), 1)))
    assert keys(records) == [(seq(1), 2, b"agg-1-user-2"), (seq(1), 3, b"agg-1-user-3"), (seq(2), None, b"plain-2")]


# -- sub-sequence starts ---------------------------------------------------------------------------


def test_at_sequence_number_skips_committed_sub_records_of_that_aggregate_only():
    rows = [plain(0), aggregated(1, 5), aggregated(2, 3), plain(3)]
    client = FakeKinesis(rows)
    records, report, _ = read(client, make_range(Checkpoint.at(seq(1), 2)))
    request = client.iterator_requests()[0]
    assert request["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    assert request["StartingSequenceNumber"] == seq(1)
    assert keys(records) == [
        (seq(1), 3, b"agg-1-user-3"),
        (seq(1), 4, b"agg-1-user-4"),
        (seq(2), 0, b"agg-2-user-0"),
        (seq(2), 1, b"agg-2-user-1"),
        (seq(2), 2, b"agg-2-user-2"),
        (seq(3), None, b"plain-3"),
    ]
    assert report.first == ExtendedSequenceNumber(seq(1), 3)


def test_checkpoint_at_last_sub_record_reads_from_the_next_record():
    rows = [aggregated(1, 3), plain(2), aggregated(3, 2)]
    client = FakeKinesis(rows)
    records, report, _ = read(client, make_range(Checkpoint.at(seq(1), 2)))
    assert keys(records)[0] == (seq(2), None, b"plain-2")
    assert len(records) == 3
    assert report.first == ExtendedSequenceNumber(seq(2))


def test_checkpoint_at_last_sub_record_then_aggregate_bigger_than_cap():
    # The previous batch ended on the last user record of aggregate 1 (what advance() stores), so
    # this range re-reads aggregate 1 and skips all of it. Aggregate 2 is then the first record
    # the range takes: taken whole although it has more user records than the cap, and the
    # planner must accept that report, or the batch can never be committed.
    rows = [aggregated(1, 3), aggregated(2, 5), plain(3)]
    client = FakeKinesis(rows)
    records, report, _ = read(client, make_range(Checkpoint.at(seq(1), 2), max_records=3))
    assert keys(records) == [(seq(2), j, b"agg-2-user-%d" % j) for j in range(5)]
    assert report.stop_reason == "max_records"


def test_plain_record_at_kcl_style_sub_zero_checkpoint_is_skipped():
    # The KCL stores checkpointSubSequenceNumber 0 for plain records.
    client = FakeKinesis([plain(0), plain(1), plain(2)])
    records, _, _ = read(client, make_range(Checkpoint.at(seq(1), 0)))
    assert [r.sequence_number for r in records] == [seq(2)]


# -- aggregates -------------------------------------------------------------------------------------


def test_aggregated_user_records_have_raw_bytes_and_sub_sequence_numbers(kpl_vectors):
    rows = [
        {
            "SequenceNumber": v["sequence_number"],
            "ApproximateArrivalTimestamp": datetime.fromtimestamp(v["approximate_arrival_timestamp"], timezone.utc),
            "Data": v["data"],
            "PartitionKey": v["partition_key"],
        }
        for v in sorted(kpl_vectors, key=lambda v: int(v["sequence_number"]))
    ]
    client = FakeKinesis(rows)
    records, report, _ = read(client, make_range())
    expected = [
        (v["sequence_number"], u["sub_sequence_number"], u["partition_key"], u["explicit_hash_key"], u["data"].encode())
        for v in sorted(kpl_vectors, key=lambda v: int(v["sequence_number"]))
        for u in v["expected_user_records"]
    ]
    got = [(r.sequence_number, r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data) for r in records]
    assert got == expected
    assert report.kinesis_records == 4
    assert report.records == len(expected)


def test_corrupt_aggregate_is_quarantined_never_emitted_as_a_user_record():
    bad = aggregated(2, 3)
    blob = bytearray(bad["Data"])
    blob[8] ^= 0x01
    bad["Data"] = bytes(blob)
    client = FakeKinesis([plain(0), plain(1), bad, plain(3)])
    reader = ShardReader(client, STREAM, make_range(), min_call_interval=0, sleep=Sleeps())
    records, report = reader.read_all()
    users = [r for r in records if r.quarantine_reason is None]
    (quarantined,) = [r for r in records if r.quarantine_reason is not None]
    assert [r.sequence_number for r in users] == [seq(0), seq(1), seq(3)]
    assert quarantined.sequence_number == seq(2) and quarantined.quarantine_reason == "md5_mismatch"
    assert quarantined.data == bad["Data"] and quarantined.sub_sequence_number is None  # raw bytes kept
    assert report.records == 3 and report.quarantined == 1 and report.kinesis_records == 4
    assert report.last == ExtendedSequenceNumber(seq(3))


def test_a_quarantined_last_record_moves_the_checkpoint_past_it():
    bad = aggregated(1, 3)
    bad["Data"] = bad["Data"][:-3] + b"xyz"  # MD5 no longer matches
    client = FakeKinesis([plain(0), bad])
    rng = make_range()
    records, report = ShardReader(client, STREAM, rng, min_call_interval=0, sleep=Sleeps()).read_all()
    assert report.records == 1 and report.quarantined == 1
    checkpoint = validate_report(make_plan_for(rng), [report])[rng.shard_id]
    assert checkpoint.position == ExtendedSequenceNumber(seq(1))  # the next batch starts after it


# -- value objects -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "checkpoint, kind, kwargs",
    [
        (Checkpoint(Sentinel.TRIM_HORIZON), "TRIM_HORIZON", {}),
        (Checkpoint.at(seq(3)), "AFTER_SEQUENCE_NUMBER", {"StartingSequenceNumber": seq(3)}),
        (Checkpoint.at(seq(3), 4), "AT_SEQUENCE_NUMBER", {"StartingSequenceNumber": seq(3)}),
        (Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=T0), "AT_TIMESTAMP", {"Timestamp": T0}),
    ],
)
def test_start_position_after_checkpoint(checkpoint, kind, kwargs):
    start = StartPosition.after(checkpoint)
    assert start.iterator_type == kind
    assert start.iterator_kwargs() == {"ShardIteratorType": kind, **kwargs}
    assert StartPosition.from_dict(json.loads(json.dumps(start.to_dict()))) == start
    if checkpoint.position is not None and checkpoint.position.sub_sequence_number is not None:
        assert start.skip_through_sub_sequence_number == 4


def test_nothing_after_shard_end():
    with pytest.raises(ValueError):
        StartPosition.after(Checkpoint(Sentinel.SHARD_END))


def test_shard_range_round_trip():
    rng = make_range(Checkpoint.at(seq(3), 1), cutoff=T0, ending=seq(9), max_records=5, max_bytes=100)
    assert ShardRange.from_dict(json.loads(json.dumps(rng.to_dict()))) == rng


class FakeClock:
    """``time.monotonic`` that only moves when the reader sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def test_byte_pacing_pays_each_response_before_the_next_call():
    """After a response of B bytes the next GetRecords waits B / (2 MiB/s): the per-shard read
    limit is never exceeded, so the service has nothing to throttle."""
    mib = 1024 * 1024
    client = FakeKinesis([plain(i, b"x" * mib) for i in range(12)])
    clock = FakeClock()
    reader = ShardReader(client, STREAM, make_range(), limit=3, target_response_bytes=3 * mib,
                         sleep=clock.sleep, clock=clock)  # fmt: skip
    records, report = reader.read_all()
    assert len(records) == 12 and report.response_bytes == 12 * mib
    # 4 responses of 3 MiB, then the empty caught-up response: 1.5 s (+ margin) between calls
    # after a full one, counted from when the call was sent (this fake answers instantly).
    assert clock.sleeps == [pytest.approx(1.5 + PACING_MARGIN_S)] * 4
    # The shard's budget (2 MiB/s) over the whole read, as the service counts it.
    assert report.response_bytes / clock.now <= 2 * mib


def test_byte_pacing_never_calls_faster_than_five_per_second():
    client = FakeKinesis([plain(i) for i in range(5)])
    clock = FakeClock()
    ShardReader(client, STREAM, make_range(), limit=1, sleep=clock.sleep, clock=clock).read_all()
    assert clock.sleeps and all(s >= 0.2 - 1e-9 for s in clock.sleeps)


def test_byte_pacing_can_be_switched_off_for_unlimited_emulators():
    client = FakeKinesis([plain(i, b"x" * 1024 * 1024) for i in range(4)])
    clock = FakeClock()
    ShardReader(client, STREAM, make_range(), limit=2, min_call_interval=0, read_bytes_per_second=None,
                sleep=clock.sleep, clock=clock).read_all()  # fmt: skip
    assert all(s == 0 for s in clock.sleeps)


def test_limit_adapts_to_the_record_size():
    """The first call asks for at most 100 records; later ones for about ``target_response_bytes``."""
    client = FakeKinesis([plain(i, b"y" * 1000) for i in range(100)])
    _, report, _ = read(client, make_range(), limit=5, target_response_bytes=20_000)
    limits = [kwargs["Limit"] for op, kwargs in client.calls if op == "get_records"]
    assert limits[0] == 5 and limits[1:] == [5] * (len(limits) - 1)  # capped by ``limit``
    client = FakeKinesis([plain(i, b"y" * 1000) for i in range(100)])
    read(client, make_range(), limit=10_000, target_response_bytes=20_000)
    limits = [kwargs["Limit"] for op, kwargs in client.calls if op == "get_records"]
    assert limits[0] == 100 and set(limits[1:]) == {20}
    assert report.records == 100


def test_response_bytes_count_records_past_the_cutoff():
    """The service charges every byte it returned, also records the range does not take."""
    records = [plain(i, b"z" * 100) for i in range(10)]
    client = FakeKinesis(records)
    _, report, _ = read(client, make_range(cutoff=T0 + timedelta(seconds=5)))
    assert report.records == 5 and report.bytes == 500
    assert report.response_bytes >= 1000


def test_read_concurrently_interleaves_ranges_and_keeps_each_in_order():
    from airflow_kinesis_spark.core.concurrent_read import read_concurrently

    clients = [FakeKinesis([plain(i) for i in range(n)]) for n in (7, 0, 13)]
    readers = [ShardReader(c, STREAM, make_range(), limit=2, min_call_interval=0, read_bytes_per_second=None)
               for c in clients]  # fmt: skip
    seen: dict[int, list[str]] = {id(r): [] for r in readers}
    finished = []
    for reader, page in read_concurrently(readers):
        if page is None:
            finished.append(reader)
            assert reader.report is not None
        else:
            seen[id(reader)] += [r.sequence_number for r in page]
    assert sorted(map(id, finished)) == sorted(map(id, readers))
    for reader, n in zip(readers, (7, 0, 13)):
        assert seen[id(reader)] == [seq(i) for i in range(n)]
        assert reader.report.records == n


def test_read_concurrently_raises_the_first_error_and_stops_the_others():
    from airflow_kinesis_spark.core.concurrent_read import read_concurrently

    good = FakeKinesis([plain(i) for i in range(50)])
    bad = FakeKinesis([plain(i) for i in range(5)])
    bad.faults["get_records"] = [client_error("AccessDeniedException")]
    readers = [ShardReader(c, STREAM, make_range(), limit=1, min_call_interval=0.01, read_bytes_per_second=None)
               for c in (good, bad)]  # fmt: skip
    with pytest.raises(ClientError, match="AccessDenied"):
        for _ in read_concurrently(readers):
            pass
    calls = len(good.calls)
    time.sleep(0.1)
    assert len(good.calls) == calls  # the other reader stopped calling Kinesis


def test_probe_of_a_range_that_re_reads_a_committed_aggregate_takes_one_call():
    """A sub-sequence checkpoint re-reads its aggregate (all of it committed here): with ``Limit`` 2
    the probe gets the next record in the same call, not one more call ``min_call_interval`` later."""
    from airflow_kinesis_spark.core.probes import probe_reader

    client = FakeKinesis([aggregated(0, 3), plain(1), plain(2)])
    sleeps = Sleeps()
    reader = probe_reader(client, STREAM, make_range(Checkpoint.at(seq(0), 2)), min_call_interval=0.2, sleep=sleeps)
    records, report = reader.read_all()
    assert [(r.sequence_number, r.sub_sequence_number) for r in records] == [(seq(1), None)]
    assert report.first == ExtendedSequenceNumber(seq(1)) and report.stop_reason == "max_records"
    assert client.limits() == [2] and sleeps == []
    # from a plain checkpoint the probe asks for one record
    client = FakeKinesis([plain(0), plain(1)])
    probe_reader(client, STREAM, make_range(Checkpoint.at(seq(0))), min_call_interval=0.2, sleep=Sleeps()).read_all()
    assert client.limits() == [1]


def test_read_concurrently_holds_pages_by_bytes_not_by_count():
    """10 MiB records (Kinesis since October 2025): a reader whose pages reach the byte budget
    does not call GetRecords again until the consumer is done with the page it holds, so the
    pages alive per range are bounded in bytes (one 10 MiB page), not only in count (a count of
    pages held up to four 10 MiB pages per range: two queued, one in the reader's hand, one
    consumed). Fake client: a unit test of core.concurrent_read and core.reader alone."""
    from airflow_kinesis_spark.core.concurrent_read import read_concurrently

    big = b"x" * (10 * 1024 * 1024)  # one object: the fake's records share it
    client = FakeKinesis([plain(i, big) for i in range(6)])
    reader = ShardReader(client, STREAM, make_range(), limit=1, min_call_interval=0, read_bytes_per_second=None)
    ahead = []
    for i, (_, page) in enumerate(read_concurrently([reader]), start=1):
        if page is None:
            break
        time.sleep(0.1)  # the reader thread runs ahead as far as it may
        calls = sum(1 for op, _ in client.calls if op == "get_records")
        ahead.append(calls - i)
    assert reader.report is not None and reader.report.records == 6
    assert max(ahead) == 0, ahead  # GetRecords calls beyond the page the consumer holds


def test_read_concurrently_still_reads_ahead_small_pages():
    """Pages well under the byte budget keep the readers' read-ahead (more than one page waits)."""
    from airflow_kinesis_spark.core.concurrent_read import read_concurrently

    client = FakeKinesis([plain(i, b"y" * 1000) for i in range(10)])
    reader = ShardReader(client, STREAM, make_range(), limit=1, min_call_interval=0, read_bytes_per_second=None)
    ahead = []
    for i, (_, page) in enumerate(read_concurrently([reader]), start=1):
        if page is None:
            break
        time.sleep(0.1)
        ahead.append(sum(1 for op, _ in client.calls if op == "get_records") - i)
    assert max(ahead) >= 1, ahead
