"""The batch plan's and the job's report's value types: start position, shard range, shard report.

Every part of the batch protocol passes these: the planner makes shard ranges, the reader reads
them and returns shard reports, the store keeps both as JSON (``to_dict``/``from_dict``), and the
commit validates the reports against the ranges. Frozen dataclasses; no I/O.

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    ExtendedSequenceNumber,
    Sentinel,
    format_timestamp,
    parse_timestamp,
)

__all__ = ["StartPosition", "ShardRange", "ShardReport"]


@dataclass(frozen=True)
class StartPosition:
    """Where a shard iterator starts.

    :param iterator_type: ``TRIM_HORIZON``, ``AT_TIMESTAMP``, ``AT_SEQUENCE_NUMBER`` or
        ``AFTER_SEQUENCE_NUMBER`` (the ``ShardIteratorType`` of GetShardIterator).
    :param sequence_number: for the two sequence-number types.
    :param skip_through_sub_sequence_number: with ``AT_SEQUENCE_NUMBER``: user records of that
        aggregate with a sub-sequence number at or below this are already committed.
    :param timestamp: for ``AT_TIMESTAMP`` (aware UTC).
    """

    iterator_type: str
    sequence_number: str | None = None
    skip_through_sub_sequence_number: int | None = None
    timestamp: datetime | None = None

    @classmethod
    def after(cls, checkpoint: Checkpoint) -> StartPosition:
        """The position just after a committed checkpoint (not ``SHARD_END``)."""
        if checkpoint.position is not None:
            pos = checkpoint.position
            if pos.sub_sequence_number is None:
                return cls("AFTER_SEQUENCE_NUMBER", sequence_number=pos.sequence_number)
            # A sub-sequence checkpoint may sit inside an aggregate (e.g. imported from the KCL):
            # re-read the aggregate and skip what is committed.
            return cls(
                "AT_SEQUENCE_NUMBER",
                sequence_number=pos.sequence_number,
                skip_through_sub_sequence_number=pos.sub_sequence_number,
            )
        if checkpoint.sentinel is Sentinel.TRIM_HORIZON:
            return cls("TRIM_HORIZON")
        if checkpoint.sentinel is Sentinel.AT_TIMESTAMP:
            return cls("AT_TIMESTAMP", timestamp=checkpoint.timestamp)
        raise ValueError(f"there is nothing after checkpoint {checkpoint}")

    def iterator_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"ShardIteratorType": self.iterator_type}
        if self.sequence_number is not None:
            kwargs["StartingSequenceNumber"] = self.sequence_number
        if self.timestamp is not None:
            kwargs["Timestamp"] = self.timestamp
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return {
            "iterator_type": self.iterator_type,
            "sequence_number": self.sequence_number,
            "skip_through_sub_sequence_number": self.skip_through_sub_sequence_number,
            "timestamp": format_timestamp(self.timestamp) if self.timestamp else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StartPosition:
        ts = data.get("timestamp")
        return cls(
            iterator_type=data["iterator_type"],
            sequence_number=data.get("sequence_number"),
            skip_through_sub_sequence_number=data.get("skip_through_sub_sequence_number"),
            timestamp=parse_timestamp(ts) if ts else None,
        )

    def __str__(self) -> str:
        if self.sequence_number:
            skip = self.skip_through_sub_sequence_number
            return f"{self.iterator_type} {self.sequence_number}" + (f" (skip subs <= {skip})" if skip is not None else "")
        if self.timestamp:
            return f"AT_TIMESTAMP {format_timestamp(self.timestamp)}"
        return self.iterator_type


@dataclass(frozen=True)
class ShardRange:
    """One shard's part of a batch plan.

    :param shard_id: the shard.
    :param start: where reading starts (exclusive of the committed checkpoint).
    :param start_checkpoint: the committed checkpoint ``start`` was derived from.
    :param cutoff: records with ``ApproximateArrivalTimestamp`` at or after this are not read (UTC).
    :param ending_sequence_number: the shard's ``EndingSequenceNumber`` when it is closed.
    :param max_records: cap on user records (``None``: no cap).
    :param max_bytes: cap on Kinesis record data bytes (``None``: no cap).
    :param slice_index: in window mode, which time slice of the shard this range is (0-based).
    :param starting_hash_key: the shard's hash key range (decimal strings), to count aggregated
        user records whose hash key falls outside it.
    :param ending_hash_key: inclusive upper bound.
    """

    shard_id: str
    start: StartPosition
    start_checkpoint: Checkpoint
    cutoff: datetime
    ending_sequence_number: str | None = None
    max_records: int | None = None
    max_bytes: int | None = None
    slice_index: int = 0
    starting_hash_key: str | None = None
    ending_hash_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "slice_index": self.slice_index,
            "starting_hash_key": self.starting_hash_key,
            "ending_hash_key": self.ending_hash_key,
            "start": self.start.to_dict(),
            "start_checkpoint": self.start_checkpoint.to_dict(),
            "cutoff": format_timestamp(self.cutoff),
            "ending_sequence_number": self.ending_sequence_number,
            "max_records": self.max_records,
            "max_bytes": self.max_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardRange:
        return cls(
            shard_id=data["shard_id"],
            start=StartPosition.from_dict(data["start"]),
            start_checkpoint=Checkpoint.from_dict(data["start_checkpoint"]),
            cutoff=parse_timestamp(data["cutoff"]),
            ending_sequence_number=data.get("ending_sequence_number"),
            max_records=data.get("max_records"),
            max_bytes=data.get("max_bytes"),
            slice_index=int(data.get("slice_index", 0)),
            starting_hash_key=data.get("starting_hash_key"),
            ending_hash_key=data.get("ending_hash_key"),
        )


@dataclass(frozen=True)
class ShardReport:
    """What reading one range found; the commit validates it against the plan.

    :param first: extended sequence number of the first user record read, or ``None``.
    :param last: of the last user record read, or ``None``.
    :param records: user records read.
    :param bytes: user record data bytes read.
    :param kinesis_records: Kinesis records read (an aggregate counts once).
    :param kinesis_bytes: Kinesis record data bytes read (what the caps and the service limit).
    :param shard_end: whether the shard's end was reached.
    :param stop_reason: one of ``cutoff``, ``caught_up``, ``shard_end``, ``max_records``, ``max_bytes``.
    :param millis_behind_latest: ``MillisBehindLatest`` of the last response (ms), if any.
    :param get_records_calls: responses read: ``GetRecords`` calls when polling; with enhanced
        fan-out, ``SubscribeToShardEvent`` events received (one per pushed batch of records).
    :param throttled_calls: calls the service throttled (``ProvisionedThroughputExceededException``,
        after botocore's own retries); with enhanced fan-out, ``SubscribeToShard`` calls answered
        ``LimitExceededException`` or ``ResourceInUseException`` (each retried with backoff).
    :param expired_iterators: shard iterators renewed after ``ExpiredIteratorException`` when
        polling; with enhanced fan-out, subscriptions renewed after they ended (the service ends
        each one after 5 minutes) or failed.
    :param first_arrival: ``ApproximateArrivalTimestamp`` of the first user record read (UTC).
    :param last_arrival: of the last user record read (UTC).
    :param quarantined: Kinesis records sent to quarantine (corrupt aggregates); ``last`` covers
        them, so the checkpoint moves past them: they are kept in the quarantine output, not lost.
    :param out_of_range: aggregated user records whose explicit hash key (or the MD5 of their
        partition key) is outside the shard's hash key range; kept, as the KCL does not
        (awslabs/amazon-kinesis-client #343).
    :param dead_letters: user records (counted in ``records``) that did not decode by the
        task's record schema (``core.records``); kept raw in the quarantine output with their
        error, not in the output's rows, and ``last`` covers them.
    :param read_started: when the read began (seconds since the epoch), for throughput figures.
    :param read_ended: when it stopped (seconds since the epoch).
    :param response_bytes: data bytes of every Kinesis record GetRecords returned, read or not
        (what the service's 2 MiB/s per-shard read limit counts).
    :param next_iterator: a polled read that stopped ``caught_up``: the last response's
        ``NextShardIterator`` (just after ``last``, or after the start when nothing was read);
        ``None`` otherwise. The commit keeps it in the checkpoint for the next probe
        (``Checkpoint.resume_iterator``).
    :param next_iterator_at: when the read got ``next_iterator`` (seconds since the epoch).
    """

    shard_id: str
    first: ExtendedSequenceNumber | None
    last: ExtendedSequenceNumber | None
    records: int
    bytes: int
    kinesis_records: int
    kinesis_bytes: int
    shard_end: bool
    stop_reason: str
    millis_behind_latest: int | None = None
    get_records_calls: int = 0
    throttled_calls: int = 0
    expired_iterators: int = 0
    first_arrival: datetime | None = None
    last_arrival: datetime | None = None
    quarantined: int = 0
    out_of_range: int = 0
    slice_index: int = 0
    read_started: float | None = None
    read_ended: float | None = None
    response_bytes: int = 0
    dead_letters: int = 0
    next_iterator: str | None = None
    next_iterator_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "first": self.first.to_dict() if self.first else None,
            "last": self.last.to_dict() if self.last else None,
            "records": self.records,
            "bytes": self.bytes,
            "kinesis_records": self.kinesis_records,
            "kinesis_bytes": self.kinesis_bytes,
            "shard_end": self.shard_end,
            "stop_reason": self.stop_reason,
            "millis_behind_latest": self.millis_behind_latest,
            "get_records_calls": self.get_records_calls,
            "throttled_calls": self.throttled_calls,
            "expired_iterators": self.expired_iterators,
            "first_arrival": format_timestamp(self.first_arrival) if self.first_arrival else None,
            "last_arrival": format_timestamp(self.last_arrival) if self.last_arrival else None,
            "slice_index": self.slice_index,
            "quarantined": self.quarantined,
            "out_of_range": self.out_of_range,
            "read_started": self.read_started,
            "read_ended": self.read_ended,
            "response_bytes": self.response_bytes,
            "dead_letters": self.dead_letters,
            "next_iterator": self.next_iterator,
            "next_iterator_at": self.next_iterator_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardReport:
        values = dict(data)
        for key in ("first", "last"):
            values[key] = ExtendedSequenceNumber.from_dict(values[key]) if values.get(key) else None
        for key in ("first_arrival", "last_arrival"):
            values[key] = parse_timestamp(values[key]) if values.get(key) else None
        return cls(**values)
