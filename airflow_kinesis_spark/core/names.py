"""Names checked against AWS's rules before any call: streams (by name or ARN), consumers,
checkpoint tables.

One place for every name rule, used by the operators, the sensors, the triggers, the CLI and the
store. Each check returns the name unchanged or raises ``ValueError`` naming the rule.

No Airflow import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "validate_stream_name",
    "validate_consumer_name",
    "validate_table_name",
    "StreamArn",
    "parse_stream_arn",
    "stream_name_of",
    "stream_params",
]

#: Kinesis stream names: 1-128 characters of a-z, A-Z, 0-9, '_', '-', '.' (Kinesis API reference, CreateStream).
_STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
#: Stream ARNs: ``arn:{partition}:kinesis:{region}:{account}:stream/{name}`` (Kinesis API
#: reference, the ``StreamARN`` parameter: ``arn:aws.*:kinesis:.*:\d{12}:stream/\S+``).
_STREAM_ARN = re.compile(r"^arn:(aws[a-zA-Z-]*):kinesis:([a-z0-9-]+):(\d{12}):stream/([a-zA-Z0-9_.-]{1,128})$")
#: Consumer (application) names: as KCL application names and Kinesis stream consumer names,
#: 1-128 characters of a-z, A-Z, 0-9, '_', '-', '.' (Kinesis API reference, RegisterStreamConsumer).
_CONSUMER_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
#: DynamoDB table names: 3-255 characters of a-z, A-Z, 0-9, '_', '-', '.' (DynamoDB developer guide, naming rules).
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")


def _check(name: object, pattern: re.Pattern[str], what: str, rule: str) -> str:
    if not isinstance(name, str) or not pattern.match(name):
        raise ValueError(f"{what} {name!r} is not valid: use {rule}")
    return name


def validate_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid Kinesis stream name or stream ARN.

    :raises ValueError: naming the rule (1-128 characters of ``a-z A-Z 0-9 _ - .``, or
        ``arn:aws:kinesis:{region}:{account}:stream/{name}``).
    """
    if isinstance(name, str) and name.startswith("arn:"):
        return _check(name, _STREAM_ARN, "stream ARN", "arn:aws:kinesis:<region>:<12-digit account>:stream/<stream name>")
    return _check(name, _STREAM_NAME, "stream name", "1-128 characters of a-z, A-Z, 0-9, '_', '-' and '.' (a Kinesis stream "
                  "name), or a stream ARN arn:aws:kinesis:<region>:<account>:stream/<name>")  # fmt: skip


@dataclass(frozen=True)
class StreamArn:
    """The parts of a stream ARN."""

    partition: str
    region: str
    account: str
    name: str

    def __str__(self) -> str:
        return f"arn:{self.partition}:kinesis:{self.region}:{self.account}:stream/{self.name}"


def parse_stream_arn(stream: str) -> StreamArn | None:
    """The parts of ``stream`` when it is a stream ARN, else ``None`` (a name)."""
    match = _STREAM_ARN.match(stream or "")
    return StreamArn(*match.groups()) if match else None


def stream_name_of(stream: str) -> str:
    """The stream's name, from a name or an ARN: what checkpoints are keyed by, so runs addressing
    one stream by its name and by its ARN share them."""
    arn = parse_stream_arn(stream)
    return arn.name if arn else stream


def stream_params(stream: str) -> dict[str, str]:
    """The request parameters naming the stream: for an ARN (a stream of another account, shared
    through its resource-based policy, is addressed by it) ``StreamARN`` and its ``StreamName``
    ("you must use either the StreamARN or the StreamName parameter, or both": Kinesis API
    reference; the name alongside also keeps moto's shard iterators usable: it builds them from
    the name); else ``{"StreamName": ...}``."""
    arn = parse_stream_arn(stream)
    return {"StreamARN": stream, "StreamName": arn.name} if arn else {"StreamName": stream}


def validate_consumer_name(name: str) -> str:
    """Return ``name`` if it is a valid consumer (application) name.

    :raises ValueError: naming the rule (1-128 characters of ``a-z A-Z 0-9 _ - .``).
    """
    return _check(name, _CONSUMER_NAME, "consumer_name", "1-128 characters of a-z, A-Z, 0-9, '_', '-', '.'")


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a valid DynamoDB table name.

    :raises ValueError: naming the rule (3-255 characters of ``a-z A-Z 0-9 _ - .``).
    """
    return _check(name, _TABLE_NAME, "checkpoint table name", "3-255 characters of a-z, A-Z, 0-9, '_', '-' and '.' (a DynamoDB table name)")
