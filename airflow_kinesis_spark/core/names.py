"""Names checked against AWS's rules before any call: streams, consumers, checkpoint tables.

One place for every name rule, used by the operators, the sensors, the triggers, the CLI and the
store. Each check returns the name unchanged or raises ``ValueError`` naming the rule.

No Airflow import.
"""

from __future__ import annotations

import re

__all__ = ["validate_stream_name", "validate_consumer_name", "validate_table_name"]

#: Kinesis stream names: 1-128 characters of a-z, A-Z, 0-9, '_', '-', '.' (Kinesis API reference, CreateStream).
_STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
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
    """Return ``name`` if it is a valid Kinesis stream name.

    :raises ValueError: naming the rule (1-128 characters of ``a-z A-Z 0-9 _ - .``).
    """
    return _check(name, _STREAM_NAME, "stream name", "1-128 characters of a-z, A-Z, 0-9, '_', '-' and '.' (a Kinesis stream name)")


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
