"""Positions in a shard: extended sequence numbers and the checkpoint sentinels.

A Kinesis ``SequenceNumber`` is a decimal string of up to 128 bits (real ones have 56 digits).
It is compared as an ``int`` and stored as a ``str``: a DynamoDB number holds only 38 digits.
A KPL-aggregated Kinesis record carries several user records; each has a sub-sequence number
(0..n-1) and the pair (sequence number, sub-sequence number) is the *extended sequence number*.

A checkpoint is either an extended sequence number ("everything up to and including this user
record is committed") or one of the sentinels of the KCL:

* ``TRIM_HORIZON`` — nothing of the shard consumed yet; start at the oldest record kept.
* ``LATEST`` — start at the tip. Resolved by the planner to ``AT_TIMESTAMP`` (plan time) so a
  re-run of the same plan reads the same records.
* ``AT_TIMESTAMP`` — nothing before ``timestamp`` is wanted (or, after a batch that found no
  records, nothing before it exists).
* ``SHARD_END`` — the shard is closed and every record of it is committed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from functools import total_ordering
from typing import Any

__all__ = [
    "Sentinel",
    "ExtendedSequenceNumber",
    "Checkpoint",
    "parse_sequence_number",
    "to_utc",
    "format_timestamp",
    "parse_timestamp",
]

# The Kinesis API reference gives SequenceNumber the pattern 0|([1-9]\d{0,128}) (ASCII digits).
_SEQUENCE_NUMBER = re.compile(r"0|[1-9][0-9]{0,128}")


class Sentinel(str, Enum):
    """Checkpoint sentinels, named as in the KCL's ``SentinelCheckpoint``."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


def parse_sequence_number(value: str) -> int:
    """Return a Kinesis sequence number as an ``int``.

    :param value: the decimal string from the Kinesis API.
    :raises ValueError: when ``value`` is not a decimal string of at most 129 digits
        (``SequenceNumber`` pattern in the Kinesis API reference).
    """
    if not isinstance(value, str) or not _SEQUENCE_NUMBER.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kinesis sequence number (a decimal string such as "
            "'49590338271490256608559692538361571095921575989136588898')"
        )
    return int(value)


def to_utc(value: datetime) -> datetime:
    """Return ``value`` as a plain aware UTC :class:`datetime.datetime`; a naive one is taken to be UTC.

    Subclasses (pendulum's ``DateTime``, which Airflow puts in ``data_interval_end``) become plain
    datetimes: pendulum drops a ``datetime.timezone.utc`` tzinfo in arithmetic, and the naive
    result would not compare with aware ones.
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    value = value.astimezone(timezone.utc)
    return datetime(value.year, value.month, value.day, value.hour, value.minute, value.second,
                    value.microsecond, tzinfo=timezone.utc)  # fmt: skip


def format_timestamp(value: datetime) -> str:
    """ISO 8601 UTC with milliseconds, the precision of ``ApproximateArrivalTimestamp``."""
    return to_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(value: str | datetime) -> datetime:
    """Parse an ISO 8601 timestamp (``Z`` or an offset; naive means UTC) to aware UTC."""
    if isinstance(value, datetime):
        return to_utc(value)
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return to_utc(datetime.fromisoformat(text))
    except ValueError as err:
        raise ValueError(f"{value!r} is not an ISO 8601 timestamp such as 2015-05-17T10:05:00Z") from err


@total_ordering
@dataclass(frozen=True)
class ExtendedSequenceNumber:
    """A user record's position: (sequence number, sub-sequence number).

    ``sub_sequence_number`` is ``None`` for a record that was not KPL-aggregated; it sorts
    before sub-sequence number 0 of the same sequence number (the two never share one).

    :param sequence_number: decimal string, compared as ``int``.
    :param sub_sequence_number: index of the user record in its aggregate (0..n-1) or ``None``.
    """

    sequence_number: str
    sub_sequence_number: int | None = None

    def __post_init__(self) -> None:
        parse_sequence_number(self.sequence_number)
        if self.sub_sequence_number is not None and self.sub_sequence_number < 0:
            raise ValueError(f"sub-sequence number must be >= 0, got {self.sub_sequence_number}")

    @property
    def key(self) -> tuple[int, int]:
        """Sort key: (sequence number as int, sub-sequence number or -1)."""
        sub = -1 if self.sub_sequence_number is None else self.sub_sequence_number
        return (int(self.sequence_number), sub)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self.key < other.key

    def to_dict(self) -> dict[str, Any]:
        return {"sequence_number": self.sequence_number, "sub_sequence_number": self.sub_sequence_number}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExtendedSequenceNumber:
        return cls(str(data["sequence_number"]), data.get("sub_sequence_number"))

    def __str__(self) -> str:
        if self.sub_sequence_number is None:
            return self.sequence_number
        return f"{self.sequence_number}/{self.sub_sequence_number}"


@dataclass(frozen=True)
class Checkpoint:
    """A shard's committed position: a sentinel, or an extended sequence number.

    Exactly one of these shapes:

    * ``Checkpoint(Sentinel.TRIM_HORIZON)``, ``Checkpoint(Sentinel.SHARD_END)``
    * ``Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=...)``
    * ``Checkpoint(position=ExtendedSequenceNumber(...))``
    """

    sentinel: Sentinel | None = None
    position: ExtendedSequenceNumber | None = None
    timestamp: datetime | None = None
    #: Every record after this checkpoint arrived at or after this time, as far as the batch that
    #: made it knows (UTC). Metadata for the trim-horizon check: not part of the position.
    clear_until: datetime | None = field(default=None, compare=False)
    #: The ``NextShardIterator`` of the read that made this checkpoint, when that read ended at the
    #: shard's tip (``caught_up``): it points just after the checkpoint, so the next batch's probe
    #: may call ``GetRecords`` with it instead of ``GetShardIterator`` + ``GetRecords`` while it is
    #: valid (``resume_iterator_at``: seconds since the epoch when the read got it). A hint, not
    #: part of the position (see ``core.probes.probe_ranges``).
    resume_iterator: str | None = field(default=None, compare=False)
    resume_iterator_at: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.sentinel is None) == (self.position is None):
            raise ValueError("a checkpoint is either a sentinel or an extended sequence number")
        if self.sentinel is Sentinel.LATEST:
            raise ValueError("LATEST is resolved to AT_TIMESTAMP by the planner; it is never stored")
        if (self.sentinel is Sentinel.AT_TIMESTAMP) != (self.timestamp is not None):
            raise ValueError("AT_TIMESTAMP checkpoints, and only they, carry a timestamp")
        if self.timestamp is not None:
            object.__setattr__(self, "timestamp", to_utc(self.timestamp))
        if self.clear_until is not None:
            object.__setattr__(self, "clear_until", to_utc(self.clear_until))

    def with_clear_until(self, value: datetime | None) -> Checkpoint:
        """A copy that knows no record after it arrived before ``value``."""
        return replace(self, clear_until=value)

    def with_resume_iterator(self, iterator: str | None, issued_at: float | None) -> Checkpoint:
        """A copy with ``resume_iterator`` (``None``: none) got at ``issued_at`` (epoch seconds)."""
        return replace(self, resume_iterator=iterator, resume_iterator_at=issued_at if iterator else None)

    def without_resume_iterator(self) -> Checkpoint:
        """A copy without ``resume_iterator``."""
        return self.with_resume_iterator(None, None) if self.resume_iterator else self

    def resume_iterator_for(self, now: float, max_age: float) -> str | None:
        """``resume_iterator`` if it was got less than ``max_age`` seconds before ``now`` (epoch
        seconds), else ``None``."""
        if self.resume_iterator and self.resume_iterator_at is not None and 0 <= now - self.resume_iterator_at < max_age:
            return self.resume_iterator
        return None

    @classmethod
    def at(cls, sequence_number: str, sub_sequence_number: int | None = None) -> Checkpoint:
        return cls(position=ExtendedSequenceNumber(sequence_number, sub_sequence_number))

    @property
    def is_shard_end(self) -> bool:
        return self.sentinel is Sentinel.SHARD_END

    def _sentinel(self) -> Sentinel:
        """The sentinel of a checkpoint without a position (a checkpoint has one or the other)."""
        assert self.sentinel is not None, "a checkpoint without a position has a sentinel"
        return self.sentinel

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, as stored in the batch log."""
        if self.position is not None:
            out: dict[str, Any] = {"type": "SEQUENCE", **self.position.to_dict()}
        else:
            out = {"type": self._sentinel().value}
        if self.timestamp is not None:
            out["timestamp"] = format_timestamp(self.timestamp)
        if self.clear_until is not None:
            out["clear_until"] = format_timestamp(self.clear_until)
        if self.resume_iterator:
            out["resume_iterator"] = self.resume_iterator
            out["resume_iterator_at"] = self.resume_iterator_at
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        kind = data["type"]
        clear_until = parse_timestamp(data["clear_until"]) if data.get("clear_until") else None
        if kind == "SEQUENCE":
            checkpoint = cls(position=ExtendedSequenceNumber.from_dict(data), clear_until=clear_until)
        else:
            ts = parse_timestamp(data["timestamp"]) if data.get("timestamp") else None
            checkpoint = cls(sentinel=Sentinel(kind), timestamp=ts, clear_until=clear_until)
        iterator, at = data.get("resume_iterator"), data.get("resume_iterator_at")
        if iterator is not None and not isinstance(iterator, str):
            raise TypeError(f"resume_iterator: expected a string or null, found {type(iterator).__name__}")
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float))):
            raise TypeError(f"resume_iterator_at: expected a number or null, found {type(at).__name__}")
        return checkpoint.with_resume_iterator(iterator or None, float(at) if at is not None else None)

    def __str__(self) -> str:
        if self.position is not None:
            return str(self.position)
        if self.timestamp is not None:
            return f"AT_TIMESTAMP {format_timestamp(self.timestamp)}"
        return self._sentinel().value
