"""KPL de-aggregation: the user records of one Kinesis record.

A Kinesis record written by the Kinesis Producer Library may aggregate many user records:
``MAGIC + AggregatedRecord protobuf + MD5(protobuf)`` (awslabs/amazon-kinesis-producer,
aggregation-format.md). A record without the magic is one user record. One that carries it but
fails the MD5 check or does not parse raises :class:`~airflow_kinesis_spark.exceptions.CorruptAggregateError`
(the reader quarantines it). An aggregate's user records may carry explicit hash keys that route
them outside the shard the aggregate was written to; the reader counts those (``out_of_range``).

No Airflow import: this module runs in Spark executors.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

# aws_kinesis_agg's generated messages_pb2 imports "config_pb2" as a top-level module; its
# deaggregator module puts the package folder on sys.path first. Import it for that side effect.
import aws_kinesis_agg
import aws_kinesis_agg.deaggregator  # noqa: F401
import google.protobuf.message
from aws_kinesis_agg import messages_pb2

from airflow_kinesis_spark.exceptions import CorruptAggregateError

__all__ = ["deaggregate"]


class _Users(NamedTuple):
    """The user records of one Kinesis record, column by column (equal-length lists).

    ``partition_key_index`` / ``explicit_hash_key_index`` (``-1``: none) point into the
    aggregate's key tables, so a per-key question (is this hash key in the shard's range?) is
    answered once per table entry, not once per user record.
    """

    sub_sequence_numbers: list[int | None]
    partition_keys: list[str]
    explicit_hash_keys: list[str | None]
    datas: list[bytes]
    partition_key_index: list[int]
    explicit_hash_key_index: list[int]
    partition_key_table: list[str]
    explicit_hash_key_table: list[str]

    def out_of_range(self, low: int, high: int) -> int:
        """User records whose explicit hash key (else the MD5 of the partition key, as Kinesis
        maps keys to shards) lies outside ``low..high``."""
        outside_ehk = [not low <= int(k) <= high for k in self.explicit_hash_key_table]
        if not any(outside_ehk) and -1 not in self.explicit_hash_key_index:
            return 0
        outside_pk: dict[int, bool] = {}
        count = 0
        for pk, ehk in zip(self.partition_key_index, self.explicit_hash_key_index, strict=True):
            if ehk >= 0:
                count += outside_ehk[ehk]
            else:
                if pk not in outside_pk:
                    value = int(hashlib.md5(self.partition_key_table[pk].encode()).hexdigest(), 16)  # noqa: S324
                    outside_pk[pk] = not low <= value <= high
                count += outside_pk[pk]
        return count


def _user_records(data: bytes, partition_key: str) -> _Users:
    """:func:`deaggregate`, column by column; ``sub_sequence_numbers`` is ``[None]`` for a record
    that is not aggregated (its index lists are then empty)."""
    magic = aws_kinesis_agg.MAGIC
    digest_size = aws_kinesis_agg.DIGEST_SIZE
    if not data.startswith(magic) or len(data) <= len(magic) + digest_size:
        return _Users([None], [partition_key], [None], [data], [], [], [], [])
    body, digest = data[len(magic) : -digest_size], data[-digest_size:]
    if hashlib.md5(body).digest() != digest:  # noqa: S324 - the KPL format's checksum
        raise CorruptAggregateError("KPL aggregate failed its MD5 check", reason="md5_mismatch")
    aggregate = messages_pb2.AggregatedRecord()
    try:
        aggregate.ParseFromString(body)
        keys = list(aggregate.partition_key_table)
        hash_keys = list(aggregate.explicit_hash_key_table)
        records = aggregate.records
        pk_index = [r.partition_key_index for r in records]
        ehk_index = [r.explicit_hash_key_index if r.HasField("explicit_hash_key_index") else -1 for r in records]
        datas = [r.data for r in records]
        partition_keys = [keys[i] for i in pk_index]
        explicit_hash_keys = [hash_keys[i] if i >= 0 else None for i in ehk_index]
    except (google.protobuf.message.DecodeError, IndexError) as err:
        raise CorruptAggregateError(f"KPL aggregate does not parse: {err}", reason="bad_protobuf") from err
    return _Users(list(range(len(datas))), partition_keys, explicit_hash_keys, datas, pk_index, ehk_index, keys, hash_keys)


def deaggregate(data: bytes, partition_key: str) -> list[tuple[int | None, str, str | None, bytes]]:
    """Split a Kinesis record's data into its user records.

    The KPL aggregation format is ``MAGIC + AggregatedRecord protobuf + MD5(protobuf)``
    (awslabs/amazon-kinesis-producer, aggregation-format.md); the magic, digest size and protobuf
    message definitions come from aws_kinesis_agg. Unlike its ``deaggregate_records``, a record
    that carries the magic but fails the MD5 check or does not parse is an error here, never a
    user record.

    :param data: the Kinesis record's ``Data`` (raw bytes, as boto3 returns it).
    :param partition_key: the Kinesis record's ``PartitionKey``.
    :returns: ``[(sub_sequence_number, partition_key, explicit_hash_key, data)]``; a record that
        is not aggregated gives one tuple with sub-sequence number ``None``.
    :raises CorruptAggregateError: on an MD5 mismatch or a protobuf that does not parse.
    """
    users = _user_records(data, partition_key)
    return list(zip(users.sub_sequence_numbers, users.partition_keys, users.explicit_hash_keys, users.datas, strict=True))
