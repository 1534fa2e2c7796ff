"""What a read hands on: :class:`Page` (the user records of one ``GetRecords`` response or
``SubscribeToShard`` event, column by column) and :class:`UserRecord` (one of them as a tuple).

:class:`~airflow_kinesis_spark.core.reader.ShardReader` makes the pages; the job turns them into
Arrow columns (``airflow_kinesis_spark.job``).

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, repeat
from typing import NamedTuple

from airflow_kinesis_spark.core.kpl import _Users
from airflow_kinesis_spark.core.positions import ExtendedSequenceNumber

__all__ = ["UserRecord", "Page"]


class UserRecord(NamedTuple):
    """One user record, in the output schema's order (``data`` is the user record's bytes).

    A tuple (not a dataclass): a batch makes one per user record, and the Spark job turns a page
    of them into columns with one ``zip(*page)``.

    A corrupt KPL aggregate is carried as one record with ``quarantine_reason`` set: it goes to
    the quarantine output, never to the data output.
    """

    shard_id: str
    sequence_number: str
    sub_sequence_number: int | None
    partition_key: str
    explicit_hash_key: str | None
    approximate_arrival_timestamp: datetime
    data: bytes
    #: Set for a Kinesis record that is quarantined (``data`` is then its raw bytes), else ``None``.
    quarantine_reason: str | None = None


class Page:
    """The user records of one ``GetRecords`` response, column by column.

    A batch holds millions of user records: columns (lists of strings, ints and bytes) cost no
    Python object per record and give Arrow its arrays directly. What all user records of one
    Kinesis record share is kept once per Kinesis record. Iterating a page gives
    :class:`UserRecord` tuples; ``len(page)`` is its number of user records.

    * Once per Kinesis record (equal-length lists): ``sequence_numbers``, ``arrivals``
      (``ApproximateArrivalTimestamp``, aware UTC), ``quarantine_reasons`` (``None`` but for a
      quarantined Kinesis record) and ``counts`` (how many of the page's user records it gave,
      0 when all of them were committed before).
    * Once per user record (equal-length lists, ``sum(counts)`` long, in order):
      ``sub_sequence_numbers``, ``partition_keys``, ``explicit_hash_keys`` and ``datas``.
    """

    __slots__ = ("shard_id", "sequence_numbers", "arrivals", "quarantine_reasons", "counts",
                 "sub_sequence_numbers", "partition_keys", "explicit_hash_keys", "datas")  # fmt: skip

    def __init__(self, shard_id: str) -> None:
        self.shard_id = shard_id
        self.sequence_numbers: list[str] = []
        self.arrivals: list[datetime] = []
        self.quarantine_reasons: list[str | None] = []
        self.counts: list[int] = []
        self.sub_sequence_numbers: list[int | None] = []
        self.partition_keys: list[str] = []
        self.explicit_hash_keys: list[str | None] = []
        self.datas: list[bytes] = []

    def add(self, sequence_number: str, arrival: datetime, users: _Users, start: int = 0) -> None:
        """The user records of one Kinesis record, from the ``start``-th on."""
        self.sequence_numbers.append(sequence_number)
        self.arrivals.append(arrival)
        self.quarantine_reasons.append(None)
        self.counts.append(len(users.datas) - start)
        if start:
            self.sub_sequence_numbers += users.sub_sequence_numbers[start:]
            self.partition_keys += users.partition_keys[start:]
            self.explicit_hash_keys += users.explicit_hash_keys[start:]
            self.datas += users.datas[start:]
        else:
            self.sub_sequence_numbers += users.sub_sequence_numbers
            self.partition_keys += users.partition_keys
            self.explicit_hash_keys += users.explicit_hash_keys
            self.datas += users.datas

    def add_quarantined(self, sequence_number: str, partition_key: str, arrival: datetime, data: bytes, reason: str) -> None:
        """A corrupt Kinesis record, raw, with the reason it is quarantined."""
        self.sequence_numbers.append(sequence_number)
        self.arrivals.append(arrival)
        self.quarantine_reasons.append(reason)
        self.counts.append(1)
        self.sub_sequence_numbers.append(None)
        self.partition_keys.append(partition_key)
        self.explicit_hash_keys.append(None)
        self.datas.append(data)

    def kinesis_record_index(self) -> list[int]:
        """For each user record, the position of its Kinesis record in the per-Kinesis-record lists."""
        return list(chain.from_iterable(repeat(i, n) for i, n in enumerate(self.counts)))

    def __len__(self) -> int:
        return len(self.datas)

    def __iter__(self) -> Iterator[UserRecord]:
        shard, seqs, arrivals, reasons = self.shard_id, self.sequence_numbers, self.arrivals, self.quarantine_reasons
        for k, sub, key, hash_key, data in zip(self.kinesis_record_index(), self.sub_sequence_numbers, self.partition_keys,
                                               self.explicit_hash_keys, self.datas, strict=True):  # fmt: skip
            yield UserRecord(shard, seqs[k], sub, key, hash_key, arrivals[k], data, reasons[k])


@dataclass
class _Progress:
    """What a :class:`~airflow_kinesis_spark.core.reader.ShardReader` read so far: the counts and
    positions its report is made of."""

    records: int = 0
    bytes: int = 0
    kinesis_records: int = 0
    kinesis_bytes: int = 0
    first: ExtendedSequenceNumber | None = None
    last: ExtendedSequenceNumber | None = None
    last_kinesis_sequence: str | None = None
    calls: int = 0
    throttled: int = 0
    expired: int = 0
    millis_behind_latest: int | None = None
    stop_reason: str | None = None
    quarantined: int = 0
    out_of_range: int = 0
    first_arrival: datetime | None = None
    last_arrival: datetime | None = None
    response_bytes: int = 0
    read_started: float | None = None
    read_ended: float | None = None
