"""The checkpoint store: DynamoDB implementation of the batch log and the head pointer.

Layout (one table, created on first use with on-demand billing, deletion protection and
point-in-time recovery; any number of consumers):

====================================  =========================================================
key (``pk``, ``sk``)                  item
====================================  =========================================================
``{stream}|{consumer}``, ``HEAD``     the head: ``committed_batch_id``, ``committed_owner``,
                                      ``committed_plan_owner``, ``pending_batch_id``,
                                      ``pending_plan_owner``, ``pending_owner``,
                                      ``pending_report_owner``
``..., BATCH#{id}#PLAN#{owner}#n``    chunk ``n`` of a batch's plan (JSON, at most 350 KB a chunk)
``..., BATCH#{id}#REPORT#{owner}#n``  chunk ``n`` of the job's per-shard report
``..., BATCH#{id}#CKPT#{owner}#n``    chunk ``n`` of every checkpoint after the batch
                                      (``{id}``: the batch id, 20 digits, zero-padded). Every
                                      chunk item of a batch that fell out of the retention
                                      (``id <= committed id - keep_batches``) gets
                                      ``expires_at`` (a number: epoch seconds), the table's
                                      TTL attribute: DynamoDB deletes it afterwards
``..., WINDOW#{label}#...#n``         a window run's ``PLAN`` and ``REPORT`` chunks, keyed by
                                      kind and owner (a window job that takes its plan from
                                      the store); ``expires_at`` 7 days after they are written
``..., LEASE#{shard id}``             per-shard mirror in the KCL's attribute names (``leaseKey``,
                                      ``leaseOwner`` = consumer, ``checkpoint``,
                                      ``checkpointSubSequenceNumber``) plus ``batchId`` and, for
                                      ``AT_TIMESTAMP``, ``checkpointTimestamp``: for people and
                                      tools; not authoritative, written after the commit; never
                                      expires
====================================  =========================================================

Chunks are keyed by the writer (``owner``), so two writers never overwrite each other's items;
only the head says which ones count. Every state change of the head is one conditional
``UpdateItem``: beginning a batch (no batch pending, committed id as read), taking over a pending
batch, recording a report, and committing (committed id as planned, this batch pending, held by
this writer). A commit is therefore atomic for any number of shards (DynamoDB items are at most
400 KB, DynamoDB developer guide; chunking removes the limit on shard count).

Retention: the head and the ``LEASE#`` items live as long as the consumer; the batch log keeps
the last ``keep_batches`` batches (counted in batches, up to the committed one) and the pending
one. Older chunk items are marked with ``expires_at`` after each commit and DynamoDB's TTL deletes
them, typically within a few days of that time (DynamoDB developer guide, "Using time to live");
until then they stay readable. No state the protocol reads (the committed batch's plan and
checkpoints, the pending batch's plan and report) is ever marked.

Untrusted state: anyone allowed to write the table can plant items. Every item read is checked
against what the provider writes (DynamoDB types, whole batch ids >= 0, every chunk there once,
JSON that parses into a plan, report or checkpoints, a plan's batch id that of its key); an item
that is not fails with :class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`,
which names the table, the item, the field and the fix, before anything is planned or committed
from it.

No Airflow import.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from airflow_kinesis_spark.core.names import stream_name_of, validate_table_name
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.pool import pool_threads
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel, format_timestamp, parse_sequence_number, parse_timestamp
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.exceptions import (
    BatchLeaseHeldError,
    CheckpointConflictError,
    CheckpointStoreCorruptError,
)

log = logging.getLogger(__name__)

__all__ = [
    "Head", "DynamoDBCheckpointStore", "CHUNK_CHARS", "TTL_ATTRIBUTE", "DEFAULT_KEEP_BATCHES", "DEFAULT_LEASE_SECONDS",
    "HEARTBEATS_PER_LEASE", "heartbeat_interval", "join_chunks", "PARSE_ERRORS", "FIX_RESTORE", "FIX_PENDING", "FIX_WINDOW",
]  # fmt: skip

#: The lease on a pending batch by default (seconds): a holder that sent no heartbeat for this
#: long may be taken over. It bounds how long a retry after a run that died without a word (kill
#: -9, OOM, a lost machine) waits; a run that fails gives its lease back at once. 60 s: four
#: renewals (:data:`HEARTBEATS_PER_LEASE`) 15 s apart, each one conditional ``UpdateItem`` of a
#: few milliseconds, so a holder keeps its lease through two failed renewals in a row with a
#: quarter of the lease to spare, and loses it only when DynamoDB refused or lost its renewals for
#: 45 s or more. Losing it is safe (the holder is fenced: its report and commit are refused, a
#: driver publishes nothing), never a double write; the cost is a re-run. It must stay well above
#: the clock difference between workers and Spark drivers (the heartbeat's age is the reader's
#: clock minus the holder's) and, over Spark Connect, above the time a batch's job runs (a killed
#: worker's job goes on running on the server: docs/guarantees.md).
DEFAULT_LEASE_SECONDS = 60.0

#: Renewals per lease: a holder renews its lease every ``lease_seconds / 4`` (:func:`heartbeat_interval`).
HEARTBEATS_PER_LEASE = 4


def heartbeat_interval(lease_seconds: float) -> float:
    """Seconds between two renewals of a lease of ``lease_seconds`` (a quarter of it)."""
    return lease_seconds / HEARTBEATS_PER_LEASE


def lease_held_error(
    what: str, batch_id: int, holder: str | None, heartbeat_ms: int, lease_seconds: float, *, now_ms: int, advice: str,
) -> BatchLeaseHeldError:  # fmt: skip
    """The error for ``what`` (e.g. ``batch 7 of stream 's', consumer 'c'``) held by ``holder``
    whose last heartbeat was at ``heartbeat_ms`` (epoch milliseconds): who holds it, its last
    heartbeat (age and time), the lease, and in how many seconds (and when) it may be taken over
    if the holder does not renew it. ``advice`` (what the caller should do) ends the message.

    Fields: ``batch_id``, ``holder``, ``heartbeat_age_seconds``, ``heartbeat_at`` and
    ``takeover_at`` (ISO 8601 UTC), ``lease_seconds``, ``seconds_left``.
    """
    age = max(0.0, (now_ms - heartbeat_ms) / 1000)
    left = max(0.0, lease_seconds - age)
    beat_at = format_timestamp(datetime.fromtimestamp(heartbeat_ms / 1000, timezone.utc))
    takeover_at = format_timestamp(datetime.fromtimestamp(heartbeat_ms / 1000 + lease_seconds, timezone.utc))
    return BatchLeaseHeldError(
        f"{what} is being run by {holder} (last heartbeat {age:.1f}s ago, lease {lease_seconds:g}s): it may be taken "
        f"over in {left:.0f}s (at {takeover_at}) if that holder does not renew its lease; its last heartbeat was at "
        f"{beat_at}, and a live holder renews it every {heartbeat_interval(lease_seconds):g}s. {advice}",
        batch_id=batch_id, holder=holder, heartbeat_age_seconds=age, heartbeat_at=beat_at, takeover_at=takeover_at,
        lease_seconds=lease_seconds, seconds_left=left,
    )  # fmt: skip


#: Batches of the batch log kept by default (see ``DynamoDBCheckpointStore(keep_batches=...)``).
DEFAULT_KEEP_BATCHES = 100

#: Characters of JSON per chunk item; a DynamoDB item holds at most 400 KB.
CHUNK_CHARS = 350_000

#: Days a window run's plan and report stay in the table (``write_window``).
WINDOW_DAYS = 7

#: The batch log's TTL attribute (a number, epoch seconds; DynamoDB developer guide, "Using time to live").
TTL_ATTRIBUTE = "expires_at"

#: Seconds between ``UpdateContinuousBackups`` attempts on a new table whose continuous backups are
#: not set up yet (``ContinuousBackupsUnavailableException``, DynamoDB API reference).
BACKUPS_RETRY_SECONDS = 2.0

# (endpoint, table) pairs whose protection settings this process has logged (see _log_protection).
_logged_tables: set[tuple[str | None, str]] = set()
_logged_tables_lock = threading.Lock()


#: Put requests per ``BatchWriteItem`` call (DynamoDB API reference, BatchWriteItem: up to 25).
BATCH_WRITE_MAX_ITEMS = 25
#: Attempts of a ``BatchWriteItem`` call's unprocessed items (the service returns them when a
#: partition's throughput is exceeded; botocore does not retry them), 0.05 s, 0.1 s, ... apart.
BATCH_WRITE_ATTEMPTS = 5

#: What parsing a malformed item may raise (``json.JSONDecodeError`` and ``UnicodeError`` are
#: ``ValueError``s, ``decimal.InvalidOperation`` an ``ArithmeticError``, JSON nested too deeply a
#: ``RecursionError``). The store turns each into :class:`CheckpointStoreCorruptError`, naming the
#: item and the field.
PARSE_ERRORS: tuple[type[Exception], ...] = (
    KeyError, IndexError, ValueError, TypeError, AttributeError, ArithmeticError, RecursionError,
)  # fmt: skip

#: How to mend a corrupt item that a head pointer or the head itself holds (the message of
#: :class:`CheckpointStoreCorruptError` ends with it).
FIX_RESTORE = (
    "restore the table from its point-in-time recovery backup (DynamoDB restores into a new table) to a time before "
    "the item changed, then copy the item back or point checkpoint_table at the restored table"
)
#: How to mend a corrupt item of the pending batch: dropping the batch is enough.
FIX_PENDING = (
    "discard the pending batch (kinesis-spark discard-pending, or KinesisDiscardPendingBatchOperator): the committed "
    "checkpoints stay and the next run plans the batch anew from them; or " + FIX_RESTORE
)
#: How to mend a corrupt item of a window run (``write_window``).
FIX_WINDOW = (
    "run the window task again: its new attempt stores the window's plan and report anew under its own writer id "
    f"(these items expire {WINDOW_DAYS} days after they were written)"
)

#: DynamoDB's attribute type descriptors (DynamoDB API reference, AttributeValue).
_DYNAMODB_TYPES = {"S": "string", "N": "number", "B": "binary", "BOOL": "boolean", "NULL": "null", "M": "map",
                   "L": "list", "SS": "string set", "NS": "number set", "BS": "binary set"}  # fmt: skip
#: A chunk's number at the end of its sort key (``_put_chunks``).
_CHUNK_NUMBER = re.compile(r"[0-9]{5}")
#: The sentinels a stored checkpoint may hold (``LATEST`` is resolved by the planner, never stored).
_STORED_SENTINELS = tuple(s.value for s in Sentinel if s is not Sentinel.LATEST)
#: What a payload's chunks hold, by kind, in messages.
_KIND_WORDS = {"PLAN": "plan", "REPORT": "job's report", "CKPT": "checkpoints"}


class _Malformed(Exception):
    """A field of an item that does not parse. Internal: the store adds the item's key and raises
    :class:`CheckpointStoreCorruptError`; ``__cause__`` is the parser's own error, if any."""

    def __init__(self, field: str, problem: str, *, pk: str | None = None, sk: str | None = None) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem, self.pk, self.sk = field, problem, pk, sk


def _show(value: Any, limit: int = 80) -> str:
    """``repr`` of a value read from the table, cut to ``limit`` characters: it is not trusted to
    be short or printable."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _explain(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text if len(text) <= 200 else text[:199] + '…'}"


def _key_text(item: Mapping[str, Any], name: str) -> str:
    """The item's key attribute ``name`` (``pk``, ``sk``: strings by the table's key schema)."""
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return _show(value)


def _attribute(item: Mapping[str, Any], name: str, kind: str, *, required: bool = False) -> str | None:
    """The value of attribute ``name``, of DynamoDB type ``kind`` (``S`` or ``N``: both come as
    strings); ``None`` when it is absent and not ``required``."""
    if name not in item:
        if required:
            raise _Malformed(name, "missing")
        return None
    value = item[name]
    if isinstance(value, Mapping) and len(value) == 1 and isinstance(value.get(kind), str):
        return str(value[kind])
    if isinstance(value, Mapping) and len(value) == 1:
        ((found, inner),) = value.items()
        shown = f"a DynamoDB {_DYNAMODB_TYPES.get(found, 'value')} ({found}) {_show(inner)}"
    else:
        shown = _show(value)
    raise _Malformed(name, f"expected a DynamoDB {_DYNAMODB_TYPES[kind]} ({kind}), found {shown}")


def _whole_number(text: str, field: str, minimum: int) -> int:
    """A DynamoDB number that must be a whole number ``>= minimum`` (DynamoDB numbers have up to 38
    significant digits: DynamoDB developer guide, "Data types")."""
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError, TypeError):
        raise _Malformed(field, f"{_show(text)} is not a number") from None
    if not number.is_finite() or number.adjusted() > 38 or number != number.to_integral_value():
        raise _Malformed(field, f"{_show(text)} is not a whole number of at most 38 digits")
    value = int(number)
    if value < minimum:
        raise _Malformed(field, f"{value} is below {minimum}, the least it may be")
    return value


def _json_kind(value: Any) -> str:
    """What a JSON value is, for messages: ``an array [1, 2]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, (int, float)):
        kind = "a number"
    elif isinstance(value, str):
        kind = "a string"
    elif isinstance(value, list):
        kind = "an array"
    elif isinstance(value, dict):
        kind = "an object"
    else:
        kind = type(value).__name__
    return f"{kind} {_show(value, 60)}"


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(path, f"expected a JSON object, found {_json_kind(value)}")
    return value


def _array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Malformed(path, f"expected a JSON array, found {_json_kind(value)}")
    return value


def _required(data: Mapping[str, Any], name: str, path: str) -> Any:
    if name not in data:
        raise _Malformed(_at(path, name), "missing")
    return data[name]


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parsed(path: str, parse: Callable[[Any], Any], value: Any) -> Any:
    """``parse(value)``; its error (any of :data:`PARSE_ERRORS`) as the field ``path``'s."""
    try:
        return parse(value)
    except PARSE_ERRORS as err:
        raise _Malformed(path, _explain(err)) from err


def _timestamp_at(value: Any, path: str) -> None:
    if not isinstance(value, str):
        raise _Malformed(path, f"expected an ISO 8601 timestamp (a string), found {_json_kind(value)}")
    _parsed(path, parse_timestamp, value)


def _position_at(data: Mapping[str, Any], path: str) -> None:
    """Check an extended sequence number's fields (``sequence_number``: a decimal string;
    ``sub_sequence_number``: ``null`` or a whole number >= 0)."""
    number = _required(data, "sequence_number", path)
    if not isinstance(number, str):
        raise _Malformed(_at(path, "sequence_number"), f"expected a decimal string, found {_json_kind(number)}")
    _parsed(_at(path, "sequence_number"), parse_sequence_number, number)
    sub = data.get("sub_sequence_number")
    if sub is not None and not (_is_whole(sub) and sub >= 0):
        raise _Malformed(_at(path, "sub_sequence_number"), f"expected null or a whole number >= 0, found {_json_kind(sub)}")


def _checkpoint_at(value: Any, path: str) -> Checkpoint:
    """A stored checkpoint (``Checkpoint.to_dict``), every field checked."""
    data = _object(value, path)
    kind = _required(data, "type", path)
    if kind != "SEQUENCE" and kind not in _STORED_SENTINELS:
        raise _Malformed(
            _at(path, "type"), f"unknown checkpoint type {_show(kind)}: expected SEQUENCE, {', '.join(_STORED_SENTINELS)}"
        )
    if kind == "SEQUENCE":
        _position_at(data, path)
    for name in ("timestamp", "clear_until"):
        if data.get(name):
            _timestamp_at(data[name], _at(path, name))
    return _parsed(path, Checkpoint.from_dict, data)  # type: ignore[no-any-return]


def _checkpoints_at(value: Any, path: str) -> dict[str, Checkpoint]:
    """Shard id -> stored checkpoint; a checkpoint that does not parse is named by its shard id."""
    out = {}
    for shard_id, item in _object(value, path).items():
        where = f"{path}[{_show(shard_id)}]"
        try:
            out[shard_id] = Checkpoint.from_dict(_object(item, where))
        except PARSE_ERRORS as err:
            _checkpoint_at(item, where)  # names the field
            raise _Malformed(where, _explain(err)) from err
        sub = item.get("sub_sequence_number")
        if item["type"] == "SEQUENCE" and not (isinstance(item["sequence_number"], str) and (sub is None or _is_whole(sub))):
            _checkpoint_at(item, where)  # from_dict takes 12 for "12" and 1.5 for a sub-sequence number
    return out


def _range_at(value: Any, path: str) -> ShardRange:
    """A planned shard range (``ShardRange.to_dict``); on an error, the field is located."""
    data = _object(value, path)
    try:
        return ShardRange.from_dict(data)
    except PARSE_ERRORS as err:
        if not isinstance(_required(data, "shard_id", path), str):
            raise _Malformed(_at(path, "shard_id"), f"expected a string, found {_json_kind(data['shard_id'])}") from err
        _parsed(_at(path, "start"), StartPosition.from_dict, _object(_required(data, "start", path), _at(path, "start")))
        _checkpoint_at(_required(data, "start_checkpoint", path), _at(path, "start_checkpoint"))
        _timestamp_at(_required(data, "cutoff", path), _at(path, "cutoff"))
        raise _Malformed(path, _explain(err)) from err


#: A plan's top-level fields that must be present, and the JSON types of its fields.
_PLAN_REQUIRED = ("batch_id", "stream_name", "consumer_name", "cutoff", "created_at", "output_location", "ranges",
                  "checkpoints")  # fmt: skip
_PLAN_STRINGS = ("stream_name", "consumer_name", "output_location")
_PLAN_OPTIONAL_STRINGS = ("mode", "checkpoint_table", "consumer_arn")
_PLAN_OPTIONAL_OBJECTS = ("waiting", "trim_gaps", "output", "task_settings")
_PLAN_STRING_LISTS = ("lost_shards", "open_shards")


def _plan_at(value: Any, batch_id: int | None) -> BatchPlan:
    """A stored plan (``BatchPlan.to_dict``): the JSON types of its fields, its batch id (that of
    the item's key, ``batch_id``; ``None``: a window's, any id >= 0), then ``BatchPlan.from_dict``.
    On a parse error, the field is located (a range or checkpoint by its index or shard id)."""
    data = _object(value, "body")
    for name in _PLAN_REQUIRED:
        _required(data, name, "")
    found = data["batch_id"]
    if not _is_whole(found) or found < 0:
        raise _Malformed("batch_id", f"expected a whole number >= 0, found {_json_kind(found)}")
    if batch_id is not None and found != batch_id:
        raise _Malformed("batch_id", f"the plan says batch {found}, but its item is batch {batch_id}'s")
    for name in _PLAN_STRINGS:
        if not isinstance(data[name], str):
            raise _Malformed(name, f"expected a string, found {_json_kind(data[name])}")
    for name in _PLAN_OPTIONAL_STRINGS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise _Malformed(name, f"expected a string or null, found {_json_kind(data[name])}")
    for name in _PLAN_OPTIONAL_OBJECTS:
        if data.get(name) is not None:
            _object(data[name], name)
    for name in _PLAN_STRING_LISTS:
        for index, shard_id in enumerate(_array(data.get(name, []), name)):
            if not isinstance(shard_id, str):
                raise _Malformed(f"{name}[{index}]", f"expected a shard id (a string), found {_json_kind(shard_id)}")
    ranges = _array(data["ranges"], "ranges")
    for index, item in enumerate(ranges):
        _object(item, f"ranges[{index}]")
    for shard_id, item in _object(data["checkpoints"], "checkpoints").items():
        _object(item, f"checkpoints[{_show(shard_id)}]")
    try:
        return BatchPlan.from_dict(data)
    except PARSE_ERRORS as err:
        for name in ("cutoff", "created_at"):
            _timestamp_at(data[name], name)
        if data.get("window_start"):
            _timestamp_at(data["window_start"], "window_start")
        for index, item in enumerate(ranges):
            _range_at(item, f"ranges[{index}]")
        _checkpoints_at(data["checkpoints"], "checkpoints")
        raise _Malformed("body", _explain(err)) from err


_REPORT_FIELDS = {f.name: str(f.type) for f in dataclasses.fields(ShardReport)}
_REPORT_REQUIRED = tuple(
    f.name for f in dataclasses.fields(ShardReport)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)  # fmt: skip
#: JSON checks of a shard report's plain fields, by the type annotation of the field.
_REPORT_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: _is_whole(v) and v >= 0, "a whole number >= 0"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
}


def _reports_at(value: Any) -> list[ShardReport]:
    """A job's stored report (a list of ``ShardReport.to_dict``), every field checked."""
    out = []
    for index, item in enumerate(_array(value, "body")):
        path = f"reports[{index}]"
        data = _object(item, path)
        for name in _REPORT_REQUIRED:
            _required(data, name, path)
        for name, field_value in data.items():
            annotation = _REPORT_FIELDS.get(name)
            if annotation is None:
                raise _Malformed(_at(path, name), "not a field of a shard report")
            nullable = annotation.endswith(" | None")
            check = _REPORT_KINDS.get(annotation.removesuffix(" | None"))
            if field_value is None and nullable:
                continue
            if check is not None and not check[0](field_value):
                raise _Malformed(_at(path, name), f"expected {check[1]}{' or null' if nullable else ''}, found {_json_kind(field_value)}")
            if name in ("first", "last"):
                _position_at(_object(field_value, _at(path, name)), _at(path, name))
            elif name in ("first_arrival", "last_arrival"):
                _timestamp_at(field_value, _at(path, name))
        out.append(_parsed(path, ShardReport.from_dict, data))
    return out


@dataclass(frozen=True)
class _Joined:
    """A payload joined from its chunk items: the JSON, the first chunk's key, the chunk count."""

    data: Any
    pk: str
    sk: str
    chunks: int


def _join(items: list[Mapping[str, Any]], prefix: str | None = None) -> _Joined | None:
    """Join chunk items (any order; ``prefix``: their sort keys' common start, when known) and
    parse their JSON; ``None`` when there are none.

    Every item must have ``chunks`` (a number >= 1, the same in every item) and ``body`` (a
    string), a sort key ending in its chunk number (5 digits) below ``chunks``, and every chunk
    number must be there once.
    """
    if not items:
        return None
    count: int | None = None
    first: tuple[str, str] | None = None
    bodies: dict[int, tuple[str, str, str]] = {}
    for item in items:
        pk, sk = _key_text(item, "pk"), _key_text(item, "sk")
        try:
            number = sk[len(prefix) :] if prefix is not None and sk.startswith(prefix) else sk.rpartition("#")[2]
            if not _CHUNK_NUMBER.fullmatch(number):
                raise _Malformed("sk", "does not end in a chunk number of 5 digits")
            chunks = _whole_number(_attribute(item, "chunks", "N", required=True), "chunks", 1)  # type: ignore[arg-type]
            body = _attribute(item, "body", "S", required=True)
            if count is None or first is None:
                count, first = chunks, (pk, sk)
            elif chunks != count:
                raise _Malformed("chunks", f"says {chunks} chunks, but the item with sk {first[1]!r} says {count}")
            if int(number) >= chunks:
                raise _Malformed("sk", f"chunk {number} of a payload of {chunks} chunks (numbered from 00000)")
            if int(number) in bodies:
                raise _Malformed("sk", f"a second chunk {number} (the other: sk {bodies[int(number)][1]!r})")
        except _Malformed as bad:
            bad.pk, bad.sk = pk, sk
            raise
        bodies[int(number)] = (pk, sk, body)  # type: ignore[assignment]
    assert count is not None and first is not None
    if len(bodies) < count:  # every number is below count and there once: one of 0..len(bodies) is missing
        missing = next(n for n in range(len(bodies) + 1) if n not in bodies)
        raise _Malformed(
            "chunks", f"says {count} chunks, but {len(bodies)} were found (chunk {missing:05d} is missing)",
            pk=first[0], sk=first[1],
        )  # fmt: skip
    ordered = [bodies[n] for n in range(count)]
    try:
        data = json.loads("".join(body for _, _, body in ordered))
    except json.JSONDecodeError as err:
        start = 0
        for index, (pk, sk, body) in enumerate(ordered):
            if err.pos < start + len(body) or index == count - 1:
                raise _Malformed("body", f"not JSON: {err.msg} at character {err.pos - start} of this chunk", pk=pk, sk=sk) from err
            start += len(body)
        raise  # not reached
    except (ValueError, RecursionError) as err:  # a number of over 4300 digits, JSON nested too deeply
        raise _Malformed("body", f"JSON this store does not read: {_explain(err)}", pk=ordered[0][0], sk=ordered[0][1]) from err
    return _Joined(data, ordered[0][0], ordered[0][1], count)


@dataclass(frozen=True)
class Head:
    """The head item of one (stream, consumer)."""

    committed_batch_id: int = 0
    committed_owner: str | None = None
    pending_batch_id: int | None = None
    pending_plan_owner: str | None = None
    pending_owner: str | None = None
    pending_report_owner: str | None = None
    committed_plan_owner: str | None = None
    #: The writer whose recorded report the committed batch was committed with (``None``: a batch
    #: committed without a job, or by a version before 0.9).
    committed_report_owner: str | None = None
    #: Epoch milliseconds of the pending batch holder's last heartbeat (its lease).
    pending_heartbeat: int | None = None
    #: The committed incremental batch's plan creation time (``format_timestamp``; ``None``: a
    #: rewind, or a commit by a version that did not record it).
    committed_plan_created_at: str | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None, *, table_name: str | None = None) -> Head:
        """Parse the head item as ``GetItem`` returns it (``None``: no head yet).

        :param table_name: the table, named in the error.
        :raises CheckpointStoreCorruptError: ``committed_batch_id`` is missing (the provider
            writes it with the head), an attribute is of another DynamoDB type (a number ``N``
            for a batch id or heartbeat, a string ``S`` for a writer), or a batch id or heartbeat
            is not a whole number ``>= 0`` (a pending batch id: ``>= 1``).
        """
        if not item:
            return cls()

        def num(name: str, minimum: int, *, required: bool = False) -> int | None:
            text = _attribute(item, name, "N", required=required)
            return None if text is None else _whole_number(text, name, minimum)

        def text(name: str) -> str | None:
            return _attribute(item, name, "S")

        try:
            return cls(
                committed_batch_id=num("committed_batch_id", 0, required=True) or 0,
                committed_owner=text("committed_owner"),
                pending_batch_id=num("pending_batch_id", 1),
                pending_plan_owner=text("pending_plan_owner"),
                pending_owner=text("pending_owner"),
                pending_report_owner=text("pending_report_owner"),
                committed_plan_owner=text("committed_plan_owner"),
                committed_report_owner=text("committed_report_owner"),
                pending_heartbeat=num("pending_heartbeat", 0),
                committed_plan_created_at=text("committed_plan_created_at"),
            )
        except _Malformed as bad:
            raise CheckpointStoreCorruptError.for_item(
                table_name, _key_text(item, "pk"), _key_text(item, "sk"), bad.field, bad.problem,
                what="the head: the committed and the pending batch", fix=FIX_RESTORE,
            ) from bad.__cause__  # fmt: skip


def join_chunks(items: list[Mapping[str, Any]], what: str, *, table_name: str | None = None) -> Any | None:
    """The JSON payload of chunk items (any order); ``None`` when there are none.

    :param what: what the chunks hold (``PLAN of batch 7``), named in the error.
    :param table_name: the table, named in the error.
    :raises CheckpointStoreCorruptError: a chunk is missing or repeated, an item lacks ``chunks``
        or ``body`` or has them of another DynamoDB type, the items disagree on ``chunks``, or the
        joined text is not JSON. The error names the item and the field.
    """
    try:
        joined = _join(items)
    except _Malformed as bad:
        raise CheckpointStoreCorruptError.for_item(
            table_name, bad.pk or "?", bad.sk or "?", bad.field, bad.problem, what=what, fix=FIX_RESTORE
        ) from bad.__cause__
    return None if joined is None else joined.data


def _now() -> str:
    return format_timestamp(datetime.now(timezone.utc))


def _on_off(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "off")


def _error_code(err: Exception) -> str:
    """An AWS error's code (``AccessDeniedException``), or the exception's class name."""
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code") or type(err).__name__)
    return type(err).__name__


def _now_ms() -> int:
    return int(time.time() * 1000)


class DynamoDBCheckpointStore:
    """Checkpoints and the batch log of one (stream, consumer) in a DynamoDB table.

    Calls go to the boto3 client as given: botocore retries throttling, 5xx errors and lost
    connections per the client's ``retries`` config; the store retries nothing itself. A retried
    update that already applied is recognised (see :meth:`_update_head`).

    The batch log keeps the last ``keep_batches`` batches: after the commit of batch ``N``, the
    chunk items (plan, report, checkpoints) of every batch ``<= N - keep_batches`` are marked with
    ``expires_at`` and DynamoDB's TTL deletes them, typically within a few days (DynamoDB developer
    guide, "Using time to live"). The committed and the pending batch are always kept; the head and
    the ``LEASE#`` items never expire.

    :param client: a boto3 DynamoDB client (``None``: only to build requests, e.g. for an async client).
    :param table_name: the table; created on first use (:meth:`ensure_table`).
    :param stream_name: the stream's name or ARN.
    :param consumer_name: the consumer (application) name.
    :param keep_batches: batches of the batch log to keep, counted back from the committed one
        (itself included); at least 1. Default 100.
    :param point_in_time_recovery: turn on point-in-time recovery (``UpdateContinuousBackups``)
        when :meth:`ensure_table` creates the table. Default ``True``. A table that exists is never
        changed.
    :param deletion_protection: create the table with ``DeletionProtectionEnabled``: DynamoDB then
        refuses ``DeleteTable`` until it is turned off (``UpdateTable``). Default ``True``. A table
        that exists is never changed.
    :raises ValueError: an invalid table name, or ``keep_batches`` below 1.
    :raises TypeError: ``keep_batches`` is not an ``int``, or ``point_in_time_recovery`` /
        ``deletion_protection`` is not a ``bool``.
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        stream_name: str,
        consumer_name: str,
        *,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        point_in_time_recovery: bool = True,
        deletion_protection: bool = True,
    ) -> None:
        if isinstance(keep_batches, bool) or not isinstance(keep_batches, int):
            raise TypeError(f"keep_batches must be an int (a number of batches); got {keep_batches!r}")
        if keep_batches < 1:
            raise ValueError(f"keep_batches must be >= 1 (the committed batch is always kept); got {keep_batches}")
        for name, value in (("point_in_time_recovery", point_in_time_recovery), ("deletion_protection", deletion_protection)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool (True or False); got {value!r}")
        self.client = client
        self.keep_batches = keep_batches
        self.point_in_time_recovery = point_in_time_recovery
        self.deletion_protection = deletion_protection
        self.table_name = validate_table_name(table_name)
        #: The stream as the caller named it (name or ARN): what Kinesis calls address.
        self.stream_ref = stream_name
        #: The stream's name (also from an ARN): what the items are keyed by, so a stream's name and
        #: its ARN share one consumer's checkpoints.
        self.stream_name = stream_name_of(stream_name)
        self.consumer_name = consumer_name
        self.pk = f"{self.stream_name}|{consumer_name}"

    # -- table ---------------------------------------------------------------------------------

    def ensure_table(self, wait_seconds: float = 120.0) -> None:
        """Create the table if it does not exist, enable its TTL on ``expires_at`` (the batch log's
        retention, see :meth:`_ensure_ttl`), then the head item.

        A table this call creates gets on-demand billing, deletion protection (CreateTable's
        ``DeletionProtectionEnabled``, unless ``deletion_protection=False``) and, once it is
        ``ACTIVE``, point-in-time recovery (unless ``point_in_time_recovery=False``; see
        :meth:`_enable_point_in_time_recovery`: a failure there is a warning, not an error). A table
        that exists, or that another process created at the same time, is left as its owner
        configured it; its settings are logged at INFO once per process (see :meth:`_log_protection`).

        :param wait_seconds: how long to wait for the table to become ``ACTIVE``; for a table this
            call created, also how long to keep retrying ``UpdateContinuousBackups`` while DynamoDB
            answers ``ContinuousBackupsUnavailableException`` (backups of a new table still being set up).
        :raises TimeoutError: if the table is not ``ACTIVE`` within ``wait_seconds``.
        """
        created = False
        try:
            table = self.client.describe_table(TableName=self.table_name)["Table"]
        except self.client.exceptions.ResourceNotFoundException:
            log.info(
                "creating checkpoint table %s (on-demand billing, deletion protection %s, point-in-time recovery %s)",
                self.table_name, _on_off(self.deletion_protection), _on_off(self.point_in_time_recovery),
            )  # fmt: skip
            request: dict[str, Any] = {
                "TableName": self.table_name,
                "AttributeDefinitions": [
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                "BillingMode": "PAY_PER_REQUEST",
            }
            if self.deletion_protection:
                # Only when asked for: DynamoDB's default is off, and emulators that predate the
                # parameter then see the request they know.
                request["DeletionProtectionEnabled"] = True
            try:
                self.client.create_table(**request)
                created = True
            except self.client.exceptions.ResourceInUseException:
                pass  # created concurrently: its creator configures it
            table = {"TableStatus": "CREATING"}
        deadline = time.monotonic() + wait_seconds
        while table["TableStatus"] != "ACTIVE":
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint table {self.table_name} not ACTIVE after {wait_seconds}s")
            time.sleep(0.5)
            table = self.client.describe_table(TableName=self.table_name)["Table"]
        if not created:
            self._log_protection(table)
        elif self.point_in_time_recovery:
            self._enable_point_in_time_recovery(wait_seconds)
        self._ensure_ttl()
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": {"S": self.pk},
                    "sk": {"S": "HEAD"},
                    "committed_batch_id": {"N": "0"},
                    "stream_name": {"S": self.stream_name},
                    "consumer_name": {"S": self.consumer_name},
                    "created_at": {"S": _now()},
                },
                ConditionExpression="attribute_not_exists(pk)",
            )
        except self.client.exceptions.ConditionalCheckFailedException:
            pass

    def _enable_point_in_time_recovery(self, wait_seconds: float) -> None:
        """Turn on point-in-time recovery of the table this store just created.

        ``UpdateContinuousBackups`` with ``PointInTimeRecoveryEnabled``. DynamoDB may answer
        ``ContinuousBackupsUnavailableException`` for a short while after a table is created (its
        continuous backups are still being set up; DynamoDB API reference): retried every
        :data:`BACKUPS_RETRY_SECONDS` for up to ``wait_seconds``. Best effort otherwise: any other
        error (e.g. a role without ``dynamodb:UpdateContinuousBackups``, or an emulator without the
        action) is logged as a warning that names the action, and the run goes on without it.

        :param wait_seconds: how long to keep retrying while backups are unavailable.
        """
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self.client.update_continuous_backups(
                    TableName=self.table_name,
                    PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
                )
                log.info("point-in-time recovery enabled on checkpoint table %s", self.table_name)
                return
            except self.client.exceptions.ContinuousBackupsUnavailableException as err:
                if time.monotonic() + BACKUPS_RETRY_SECONDS > deadline:
                    failure: Exception = err
                    break
                time.sleep(BACKUPS_RETRY_SECONDS)
            except (ClientError, BotoCoreError) as err:
                failure = err
                break
        log.warning(
            "could not enable point-in-time recovery on the new checkpoint table %s (%s): the table works "
            "without it, but cannot be restored to an earlier time. Grant dynamodb:UpdateContinuousBackups on "
            "it and turn it on (UpdateContinuousBackups), or create stores with point_in_time_recovery=False "
            "to not ask for it: %s", self.table_name, _error_code(failure), failure,
        )  # fmt: skip

    def _log_protection(self, table: Mapping[str, Any]) -> None:
        """Log, at INFO and once per process and table, how a table this store did not create is protected.

        Deletion protection comes from the ``DescribeTable`` answer at hand (``table``);
        point-in-time recovery costs one ``DescribeContinuousBackups`` call. Nothing is changed. A
        failed call (e.g. a role without ``dynamodb:DescribeContinuousBackups``) only makes the
        logged status ``unknown``.

        :param table: the table's description (``DescribeTable``'s ``Table``).
        """
        key = (getattr(getattr(self.client, "meta", None), "endpoint_url", None), self.table_name)
        with _logged_tables_lock:
            if key in _logged_tables:
                return
            _logged_tables.add(key)
        flag = table.get("DeletionProtectionEnabled")
        deletion = _on_off(flag if isinstance(flag, bool) else None)
        try:
            backups = self.client.describe_continuous_backups(TableName=self.table_name)["ContinuousBackupsDescription"]
            status = str(backups.get("PointInTimeRecoveryDescription", {}).get("PointInTimeRecoveryStatus", "unknown"))
            pitr = {"ENABLED": "on", "DISABLED": "off"}.get(status, status.lower())
        except (ClientError, BotoCoreError) as err:
            pitr = f"unknown (DescribeContinuousBackups: {_error_code(err)})"
        log.info(
            "checkpoint table %s exists, left as configured: deletion protection %s, point-in-time recovery %s",
            self.table_name, deletion, pitr,
        )  # fmt: skip

    def _ensure_ttl(self) -> None:
        """Enable the table's TTL on :data:`TTL_ATTRIBUTE` unless it is on already.

        ``DescribeTimeToLive`` first; ``UpdateTimeToLive`` only when TTL is ``DISABLED`` (a new
        table, or one created before the retention existed). "Already enabled" (a concurrent
        enabler) is success. Best effort otherwise: the retention only saves storage, so an error
        (e.g. a role without ``dynamodb:DescribeTimeToLive`` / ``dynamodb:UpdateTimeToLive``, or
        TTL on another attribute) is logged as a warning and the old batches are simply kept.
        """
        try:
            ttl = self.client.describe_time_to_live(TableName=self.table_name).get("TimeToLiveDescription", {})
            status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
            if status in ("ENABLED", "ENABLING"):
                if attribute != TTL_ATTRIBUTE:
                    log.warning(
                        "checkpoint table %s has TTL on attribute %s, not %s: old batches of the batch log "
                        "will not be deleted", self.table_name, attribute, TTL_ATTRIBUTE,
                    )  # fmt: skip
                return
            if status == "DISABLING":
                log.warning("checkpoint table %s: TTL is being disabled; not re-enabling it now", self.table_name)
                return
            log.info("enabling TTL on attribute %s of checkpoint table %s", TTL_ATTRIBUTE, self.table_name)
            self.client.update_time_to_live(
                TableName=self.table_name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        except self.client.exceptions.ClientError as err:
            message = str(err.response.get("Error", {}).get("Message", ""))
            if "already enabled" in message.lower():
                log.info("TTL of checkpoint table %s is already enabled", self.table_name)
                return
            log.warning(
                "could not enable TTL on attribute %s of checkpoint table %s (old batches of the batch log "
                "will be kept): %s", TTL_ATTRIBUTE, self.table_name, err,
            )  # fmt: skip

    # -- reading -------------------------------------------------------------------------------

    def head_request(self) -> dict[str, Any]:
        """``GetItem`` arguments for the head (strongly consistent)."""
        return {"TableName": self.table_name, "Key": self._key("HEAD"), "ConsistentRead": True}

    def chunks_request(self, batch_id: int, kind: str, owner: str) -> dict[str, Any]:
        """``Query`` arguments for the chunks of one payload (strongly consistent).

        The one definition of where a payload's chunks are: the store (and the async reader in
        ``core.aio``) page through it and hand the items to :meth:`parse_chunks`.

        :param kind: ``PLAN``, ``REPORT`` or ``CKPT``.
        """
        return self._prefix_request(self._prefix(batch_id, kind, owner))

    def _prefix_request(self, prefix: str) -> dict[str, Any]:
        return {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": {"S": self.pk}, ":prefix": {"S": prefix}},
            "ConsistentRead": True,
        }

    def head(self) -> Head:
        """Read the head item (strongly consistent); a table not created yet reads as no head.

        :raises CheckpointStoreCorruptError: the head item does not parse (:meth:`parse_head`).
        """
        try:
            item = self.client.get_item(**self.head_request()).get("Item")
        except self.client.exceptions.ResourceNotFoundException:
            return Head()
        return self.parse_head(item)

    def parse_head(self, item: Mapping[str, Any] | None) -> Head:
        """The head item as ``GetItem`` returns it, parsed (``None``: no head yet); the sync and the
        async reader (``core.aio``) share it.

        :raises CheckpointStoreCorruptError: see :meth:`Head.from_item`.
        """
        return Head.from_item(item, table_name=self.table_name)

    def parse_chunks(
        self, items: list[Mapping[str, Any]], batch_id: int, kind: str, owner: str, *, pending: bool
    ) -> Any | None:
        """The chunk items of one payload of the batch log (what a ``Query`` of
        :meth:`chunks_request` returns, any order), joined and parsed: ``PLAN`` a
        :class:`BatchPlan` (its batch id must be ``batch_id``), ``REPORT`` a list of
        :class:`ShardReport`, ``CKPT`` shard id -> :class:`Checkpoint`. ``None`` when there are no
        items. The sync and the async reader (``core.aio``) share it.

        :param pending: the payload belongs to the pending batch (the error's fix: discard it),
            else to the committed one (restore the item).
        :raises CheckpointStoreCorruptError: a chunk is missing, repeated or malformed (see
            :func:`join_chunks`), or the payload does not parse; the error names the item (the
            first chunk's key for the payload's fields) and the field (``ranges[2].cutoff``).
        """
        what = f"the {_KIND_WORDS[kind]} of {'pending' if pending else 'committed'} batch {batch_id}"
        if kind == "PLAN":
            parse: Callable[[Any], Any] = lambda data: _plan_at(data, batch_id)  # noqa: E731
        elif kind == "REPORT":
            parse = _reports_at
        elif kind == "CKPT":
            parse = lambda data: _checkpoints_at(data, "checkpoints")  # noqa: E731
        else:
            raise ValueError(f"kind must be PLAN, REPORT or CKPT; got {kind!r}")
        return self._load(items, self._prefix(batch_id, kind, owner), what, FIX_PENDING if pending else FIX_RESTORE, parse)

    def _load(
        self, items: list[Mapping[str, Any]], prefix: str, what: str, fix: str, parse: Callable[[Any], Any]
    ) -> Any | None:
        """Join chunk items under ``prefix`` and ``parse`` the JSON; every error of either as a
        :class:`CheckpointStoreCorruptError` naming the item and field, ``what`` it holds and ``fix``."""
        try:
            joined = _join(items, prefix)
            if joined is None:
                return None
            try:
                return parse(joined.data)
            except _Malformed as bad:
                bad.pk, bad.sk = joined.pk, joined.sk
                if joined.chunks > 1:
                    bad.problem += f" (in the JSON of its {joined.chunks} chunks, {prefix}00000 on)"
                raise
        except _Malformed as bad:
            raise CheckpointStoreCorruptError.for_item(
                self.table_name, bad.pk or self.pk, bad.sk or f"{prefix}00000", bad.field, bad.problem, what=what, fix=fix
            ) from bad.__cause__

    def _read_batch(self, batch_id: int, kind: str, owner: str, *, pending: bool) -> Any | None:
        """:meth:`parse_chunks` of the items :meth:`chunks_request` finds."""
        return self.parse_chunks(self._query_items(self._prefix(batch_id, kind, owner)), batch_id, kind, owner, pending=pending)

    def _missing(self, head_field: str, problem: str, *, fix: str) -> CheckpointStoreCorruptError:
        """The error for a head whose ``head_field`` points at chunks that are not there."""
        return CheckpointStoreCorruptError.for_item(
            self.table_name, self.pk, "HEAD", head_field, problem, what="the head: the committed and the pending batch",
            fix=fix,
        )  # fmt: skip

    def missing_checkpoints_error(self, head: Head) -> CheckpointStoreCorruptError:
        """The error for a head whose committed batch's checkpoints are not in the table (never
        read as "no checkpoints": that would plan from the initial position, LOUD)."""
        prefix = self._prefix(head.committed_batch_id, "CKPT", head.committed_owner or "")
        return self._missing(
            "committed_owner", f"the checkpoints of committed batch {head.committed_batch_id} are missing (no item with sk "
            f"{prefix}00000)", fix=FIX_RESTORE,
        )  # fmt: skip

    def committed_plan(self, head: Head | None = None) -> BatchPlan | None:
        """The plan of the last committed batch (``None`` before the first commit).

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.committed_batch_id == 0 or head.committed_plan_owner is None:
            return None
        return self._read_batch(head.committed_batch_id, "PLAN", head.committed_plan_owner, pending=False)  # type: ignore[no-any-return]

    def committed_checkpoints(self, head: Head | None = None) -> dict[str, Checkpoint]:
        """Every shard's committed checkpoint (empty before the first commit).

        :raises CheckpointStoreCorruptError: the committed batch's checkpoints are missing, or
            their items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.committed_batch_id == 0 or head.committed_owner is None:
            return {}
        checkpoints = self._read_batch(head.committed_batch_id, "CKPT", head.committed_owner, pending=False)
        if checkpoints is None:
            raise self.missing_checkpoints_error(head)
        return checkpoints  # type: ignore[no-any-return]

    def pending_plan(self, head: Head | None = None) -> BatchPlan | None:
        """The plan of the pending (planned, uncommitted) batch, if there is one.

        :raises CheckpointStoreCorruptError: the head names a plan that is not in the table, or
            its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.pending_batch_id is None or head.pending_plan_owner is None:
            return None
        plan = self._read_batch(head.pending_batch_id, "PLAN", head.pending_plan_owner, pending=True)
        if plan is None:
            prefix = self._prefix(head.pending_batch_id, "PLAN", head.pending_plan_owner)
            raise self._missing(
                "pending_plan_owner", f"pending batch {head.pending_batch_id} has no stored plan (no item with sk {prefix}00000)",
                fix=FIX_PENDING,
            )  # fmt: skip
        return plan  # type: ignore[no-any-return]

    def pending_report(self, head: Head | None = None) -> list[ShardReport] | None:
        """The recorded job report of the pending batch, if its output was written.

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.pending_batch_id is None or head.pending_report_owner is None:
            return None
        return self._read_batch(head.pending_batch_id, "REPORT", head.pending_report_owner, pending=True)  # type: ignore[no-any-return]

    def committed_report(self, head: Head | None = None) -> list[ShardReport] | None:
        """The job report the last committed batch was committed with (``None``: committed
        without a job, or no batch committed yet).

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.committed_batch_id == 0 or head.committed_report_owner is None:
            return None
        return self._read_batch(head.committed_batch_id, "REPORT", head.committed_report_owner, pending=False)  # type: ignore[no-any-return]

    # -- state changes (each one conditional update of the head) --------------------------------

    def begin(self, plan: BatchPlan, owner: str) -> None:
        """Persist ``plan`` and make it the pending batch.

        :raises CheckpointConflictError: another batch is pending, or the committed batch is no
            longer ``plan.batch_id - 1`` (another writer moved on).
        """
        self._write_chunks(plan.batch_id, "PLAN", owner, plan.to_dict())
        self._update_head(
            "SET pending_batch_id = :n, pending_plan_owner = :o, pending_owner = :o, pending_since = :t, "
            "pending_heartbeat = :hb REMOVE pending_report_owner",
            "committed_batch_id = :prev AND attribute_not_exists(pending_batch_id)",
            {":n": {"N": str(plan.batch_id)}, ":o": {"S": owner}, ":t": {"S": _now()},
             ":prev": {"N": str(plan.batch_id - 1)}, ":hb": {"N": str(_now_ms())}},
            action=f"begin batch {plan.batch_id}",
            owner=owner,
            applied=lambda h: h.pending_batch_id == plan.batch_id and h.pending_plan_owner == owner,
        )  # fmt: skip
        log.info("batch %d planned and persisted (%d shard ranges, owner %s)", plan.batch_id, len(plan.ranges), owner)

    def take_over(self, batch_id: int, owner: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Head:
        """Become the holder of pending batch ``batch_id`` (a retry re-using its plan).

        Only once the holder's lease expired: no heartbeat for ``lease_seconds``. The previous
        holder is fenced off: its heartbeat, report and commit are refused from now on.

        :raises BatchLeaseHeldError: the holder's lease is alive (another run is at work).
        :raises CheckpointConflictError: ``batch_id`` is no longer pending.
        """
        head = self.head()
        self._raise_if_leased(head, batch_id, owner, lease_seconds)
        try:
            self._update_lease(batch_id, owner, lease_seconds)
        except CheckpointConflictError:
            self._raise_if_leased(self.head(), batch_id, owner, lease_seconds)  # renewed meanwhile
            raise
        log.info("took over pending batch %d from %s", batch_id, head.pending_owner)
        return self.head()

    def claim(
        self, batch_id: int, lease_owner: str, writer: str, lease_seconds: float = DEFAULT_LEASE_SECONDS, *,
        before_report: bool = False,
    ) -> Head:
        """Become the holder of pending batch ``batch_id`` as ``writer``, on behalf of ``lease_owner``.

        The hand-off between the run that planned a batch (``lease_owner``: the operator, or the
        plan task of a split task group) and the processes it hands the batch to (a Spark
        driver, the commit task); each of those claims under its own ``writer`` id, by
        convention ``{lease_owner}/{role}-{random}`` (:func:`writer_id`). The claim applies when
        the batch is pending and held

        * by ``lease_owner`` itself (it handed the batch over; its lease need not have expired),
        * by ``writer`` already (a retried request), or
        * by another writer of ``lease_owner`` whose lease expired (a driver that died) or was
          released (:meth:`release`: a driver that finished), or, unless ``before_report``, that
          recorded the batch's report already (it is done; its release may not have landed yet).

        Every earlier writer is fenced off from then on: its heartbeat, report and commit are refused.

        :param before_report: claim only while no report is recorded (a driver: a batch whose
            output another driver published and recorded is never run again, even by a driver
            that found no report before it claimed and stalled meanwhile).
        :returns: the head after the claim.
        :raises BatchLeaseHeldError: another writer of ``lease_owner`` holds a live lease (another
            driver of this batch is at work).
        :raises CheckpointConflictError: ``batch_id`` is not pending, or another run took it over
            (a holder that is not ``lease_owner`` nor one of its writers): this caller's
            arguments are stale; or, with ``before_report``, a report is recorded.
        """
        if writer != lease_owner and not writer.startswith(lease_owner + "/"):
            raise ValueError(f"writer {writer!r} must be {lease_owner!r} or start with {lease_owner + '/'!r}")
        head = self.head()
        # A writer that recorded the report is done with the batch even before it releases its
        # lease (the commit may claim it at once: no race with the release).
        reported = not before_report and head.pending_report_owner is not None and head.pending_report_owner == head.pending_owner
        if head.pending_batch_id == batch_id and head.pending_owner not in (lease_owner, writer) and not reported:
            if (head.pending_owner or "").startswith(lease_owner + "/"):
                self._raise_if_leased(head, batch_id, writer, lease_seconds)
        self._update_head(
            "SET pending_owner = :w, pending_since = :t, pending_heartbeat = :hb",
            ("attribute_not_exists(pending_report_owner) AND " if before_report else "")
            + "pending_batch_id = :n AND (pending_owner = :lo OR pending_owner = :w OR (begins_with(pending_owner, :lop) "
            "AND (attribute_not_exists(pending_heartbeat) OR pending_heartbeat < :stale"
            + ("" if before_report else " OR pending_report_owner = pending_owner")
            + ")))",
            {":n": {"N": str(batch_id)}, ":w": {"S": writer}, ":lo": {"S": lease_owner}, ":lop": {"S": lease_owner + "/"},
             ":t": {"S": _now()}, ":hb": {"N": str(_now_ms())}, ":stale": {"N": str(_now_ms() - int(lease_seconds * 1000))}},
            action=f"claim pending batch {batch_id} for {lease_owner}{' before its report is recorded' if before_report else ''}",
            owner=writer,
            applied=lambda h: h.pending_batch_id == batch_id and h.pending_owner == writer,
        )  # fmt: skip
        log.info("writer %s claimed pending batch %d (from %s)", writer, batch_id, head.pending_owner)
        return self.head()

    def _raise_if_leased(self, head: Head, batch_id: int, owner: str, lease_seconds: float) -> None:
        """Raise :class:`BatchLeaseHeldError` when another writer's lease on ``batch_id`` is alive."""
        if head.pending_batch_id == batch_id and head.pending_owner != owner and head.pending_heartbeat is not None:
            now_ms = _now_ms()
            age = (now_ms - head.pending_heartbeat) / 1000
            if age < lease_seconds:
                raise lease_held_error(
                    f"batch {batch_id} of stream {self.stream_name!r}, consumer {self.consumer_name!r}", batch_id,
                    head.pending_owner, head.pending_heartbeat, lease_seconds, now_ms=now_ms,
                    advice=f"Another run of this consumer is at work, or one that died less than {lease_seconds:g}s ago; "
                    "retry after that (a task's retry_delay longer than lease_seconds does it: docs/troubleshooting.md).",
                )  # fmt: skip

    def _update_lease(self, batch_id: int, owner: str, lease_seconds: float) -> None:
        self._update_head(
            "SET pending_owner = :o, pending_since = :t, pending_heartbeat = :hb",
            "pending_batch_id = :n AND (attribute_not_exists(pending_heartbeat) OR pending_heartbeat < :stale "
            "OR pending_owner = :o)",
            {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":t": {"S": _now()}, ":hb": {"N": str(_now_ms())},
             ":stale": {"N": str(_now_ms() - int(lease_seconds * 1000))}},
            action=f"take over pending batch {batch_id}",
            owner=owner,
            applied=lambda h: h.pending_batch_id == batch_id and h.pending_owner == owner,
        )  # fmt: skip

    def release(self, batch_id: int, owner: str) -> None:
        """Give up the lease on pending batch ``batch_id`` (this run failed and stops): the next
        attempt may take the batch over at once. A no-op if another writer holds it already."""
        try:
            self._update_head(
                "SET pending_heartbeat = :zero",
                "pending_batch_id = :n AND pending_owner = :o",
                {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":zero": {"N": "0"}},
                action=f"release the lease on batch {batch_id}",
                owner=owner,
            )
        except CheckpointConflictError:
            log.info("lease on batch %d already taken over; nothing to release", batch_id)

    def release_handed(self, batch_id: int, lease_owner: str) -> None:
        """Give up the lease on pending batch ``batch_id`` for ``lease_owner`` and its writers
        (:meth:`claim`): the run that handed the batch to a job knows the job's processes ended
        (its spark-submit returned), so a retry need not wait for the lease to expire. A no-op if
        another run holds the batch."""
        try:
            self._update_head(
                "SET pending_heartbeat = :zero",
                "pending_batch_id = :n AND (pending_owner = :lo OR begins_with(pending_owner, :lop))",
                {":n": {"N": str(batch_id)}, ":lo": {"S": lease_owner}, ":lop": {"S": lease_owner + "/"}, ":zero": {"N": "0"}},
                action=f"release the lease on batch {batch_id}",
                owner=lease_owner,
            )
        except CheckpointConflictError:
            log.info("lease on batch %d is held by another run; nothing to release", batch_id)

    @contextmanager
    def hold_hand_off(self, batch_id: int, lease_owner: str, lease_seconds: float) -> Iterator[None]:
        """Keep ``lease_owner``'s lease on pending batch ``batch_id`` alive while the batch waits for
        its job to claim it (:meth:`claim`): spark-submit, the JVM's start or a cluster's queue may
        take longer than the lease, and another run of the consumer must not take over a batch
        that a live run is handing to its job.

        A daemon thread renews the heartbeat (:meth:`heartbeat` as ``lease_owner``) every
        ``lease_seconds / 4`` (:func:`heartbeat_interval`) and stops at the first renewal that finds another holder: the job's
        driver claimed the batch and renews its own lease from then on (or the batch moved on).
        Any other renewal error is logged as a warning and retried at the next renewal. On exit
        the thread is stopped and joined (at most 10 s); nothing is released (see
        :meth:`release_handed`).

        :raises ValueError: ``lease_seconds`` is not > 0.
        """
        if not lease_seconds or lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {lease_seconds!r}")
        done = threading.Event()

        def renew() -> None:
            while not done.wait(heartbeat_interval(lease_seconds)):
                try:
                    self.heartbeat(batch_id, lease_owner)
                except CheckpointConflictError:
                    log.info("batch %d is no longer held by %s (its job claimed it): the job renews the lease now",
                             batch_id, lease_owner)  # fmt: skip
                    return
                except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                    log.warning("could not renew the lease on handed batch %d (writer %s): %s", batch_id, lease_owner, err)

        thread = threading.Thread(target=renew, name=f"hand-off-batch-{batch_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=10)

    def heartbeat(self, batch_id: int, owner: str) -> None:
        """Renew this writer's lease on pending batch ``batch_id``.

        :raises CheckpointConflictError: another writer took the batch over (this one is fenced).
        """
        self._update_head(
            "SET pending_heartbeat = :hb",
            "pending_batch_id = :n AND pending_owner = :o",
            {":n": {"N": str(batch_id)}, ":o": {"S": owner}, ":hb": {"N": str(_now_ms())}},
            action=f"renew the lease on batch {batch_id}",
            owner=owner,
        )

    @contextmanager
    def hold_lease(
        self,
        batch_id: int,
        owner: str,
        lease_seconds: float,
        on_lost: Callable[[CheckpointConflictError], None] | None = None,
    ) -> Iterator[None]:
        """Hold the lease on pending batch ``batch_id`` while the body runs (e.g. the Spark job).

        A daemon thread renews the lease (:meth:`heartbeat`) every ``lease_seconds / 4``
        (:func:`heartbeat_interval`). If a
        renewal finds that another writer took the batch over (this run stalled past its lease),
        the lease is lost: the error is logged, ``on_lost(err)`` is called from the thread (the
        caller kills its job there: its output must not race the other writer's) and renewing
        stops. Any other renewal error is logged as a warning and retried at the next renewal.

        On exit the thread is stopped and joined (at most 10 s), and:

        - the body raised and the lease was lost: the :class:`CheckpointConflictError` is raised
          (``from None``: the body's failure is a consequence of the take-over);
        - the body raised otherwise: the lease is released (:meth:`release`, best effort), so a
          retry need not wait for it to expire, and the body's exception is re-raised;
        - the body returned but the lease was lost: the :class:`CheckpointConflictError` is raised.

        :param batch_id: the pending batch this writer holds (after :meth:`begin` or :meth:`take_over`).
        :param owner: this writer.
        :param lease_seconds: the lease, seconds (as given to :meth:`take_over`); renewed every
            quarter of it. Must be > 0.
        :param on_lost: called once, from the renewal thread, when the lease is lost; an error it
            raises is logged.
        :raises ValueError: ``lease_seconds`` is not > 0 (before anything starts).
        :raises CheckpointConflictError: the lease was lost while the body ran.
        """
        if not lease_seconds or lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 seconds; got {lease_seconds!r}")
        done = threading.Event()
        lost: list[CheckpointConflictError] = []

        def renew() -> None:
            while not done.wait(heartbeat_interval(lease_seconds)):
                try:
                    self.heartbeat(batch_id, owner)
                except CheckpointConflictError as err:
                    lost.append(err)
                    log.error("lost the lease on batch %d (writer %s): %s", batch_id, owner, err)
                    if on_lost is not None:
                        try:
                            on_lost(err)
                        except Exception:  # noqa: BLE001 - the loss itself is raised on exit
                            log.exception("on_lost callback for batch %d failed", batch_id)
                    return
                except Exception as err:  # noqa: BLE001 - a missed heartbeat is retried next time
                    log.warning("could not renew the lease on batch %d (writer %s): %s", batch_id, owner, err)

        thread = threading.Thread(target=renew, name=f"lease-batch-{batch_id}", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join(timeout=10)

        try:
            yield
        except Exception:
            stop()
            if lost:
                raise lost[0] from None
            try:
                self.release(batch_id, owner)  # this run stops here: its retry need not wait for the lease
            except Exception as err:  # noqa: BLE001 - the body's error is the one to report; the lease expires
                log.warning("could not release the lease on batch %d (writer %s): %s", batch_id, owner, err)
            raise
        finally:
            stop()
        if lost:
            raise lost[0]

    def record_report(self, batch_id: int, owner: str, reports: Iterable[ShardReport]) -> None:
        """Record that batch ``batch_id``'s output is written, with the job's report.

        :raises CheckpointConflictError: this writer no longer holds the batch.
        """
        self._write_chunks(batch_id, "REPORT", owner, [r.to_dict() for r in reports])
        self._update_head(
            "SET pending_report_owner = :o",
            "pending_batch_id = :n AND pending_owner = :o",
            {":n": {"N": str(batch_id)}, ":o": {"S": owner}},
            action=f"record the report of batch {batch_id}",
            owner=owner,
            applied=lambda h: h.pending_batch_id == batch_id and h.pending_report_owner == owner,
        )

    def commit(self, plan: BatchPlan, checkpoints: Mapping[str, Checkpoint], owner: str) -> None:
        """Advance every checkpoint of the batch in one conditional update of the head.

        Idempotent: if an earlier attempt's commit of this batch by this owner applied (an
        ambiguous outcome), this returns quietly.

        Afterwards (both ways, best effort) the KCL-style ``LEASE#`` mirror is written and the
        batches that fell out of the retention are marked to expire (:meth:`_expire_old_batches`).

        :raises CheckpointConflictError: the head moved (another writer committed, or took the
            batch over); the message names the other writer and batch.
        """
        head = self.head()
        if head.committed_batch_id == plan.batch_id and head.committed_owner == owner:
            log.info("batch %d was already committed by this writer (earlier attempt)", plan.batch_id)
            self._mirror_leases(plan, self.committed_checkpoints(head))
            self._expire_old_batches(plan.batch_id)
            return
        if head.pending_batch_id != plan.batch_id or head.pending_owner != owner:
            raise self._conflict(f"commit batch {plan.batch_id}", owner, head)
        # Chunks keyed by this owner: never the ones a committed head points at.
        self._write_chunks(plan.batch_id, "CKPT", owner, {k: v.to_dict() for k, v in checkpoints.items()})
        # The report the batch is committed with stays readable (an idempotent re-run of a commit task).
        report_set, report_remove, report_value = "", ", committed_report_owner", {}
        if head.pending_report_owner:
            report_set, report_remove = ", committed_report_owner = :ro", ""
            report_value = {":ro": {"S": head.pending_report_owner}}
        # The committed plan's creation time, for the output checks before each run (a batch of the
        # same id written by another checkpoint history), without reading the plan's chunks.
        plan_set, plan_remove, plan_value = ", committed_plan_created_at = :pc", "", {":pc": {"S": format_timestamp(plan.created_at)}}
        if plan.mode != "incremental":
            plan_set, plan_remove, plan_value = "", ", committed_plan_created_at", {}
        self._update_head(
            f"SET committed_batch_id = :n, committed_owner = :o, committed_plan_owner = :po, committed_at = :t{report_set}{plan_set} "
            f"REMOVE pending_batch_id, pending_plan_owner, pending_owner, pending_since, pending_report_owner, "
            f"pending_heartbeat{report_remove}{plan_remove}",
            "committed_batch_id = :prev AND pending_batch_id = :n AND pending_owner = :o AND pending_plan_owner = :po",
            {":n": {"N": str(plan.batch_id)}, ":o": {"S": owner}, ":t": {"S": _now()},
             ":prev": {"N": str(plan.batch_id - 1)}, ":po": {"S": head.pending_plan_owner or ""}, **report_value, **plan_value},
            action=f"commit batch {plan.batch_id}",
            owner=owner,
            applied=lambda h: h.committed_batch_id == plan.batch_id and h.committed_owner == owner,
        )  # fmt: skip
        log.info("batch %d committed: %d shard checkpoints", plan.batch_id, len(checkpoints))
        self._mirror_leases(plan, checkpoints)
        self._expire_old_batches(plan.batch_id)

    def discard_pending(self, batch_id: int, owner: str) -> None:
        """Drop pending batch ``batch_id`` (its plan is kept in the log, but never re-used).

        Its output, if any was written, stays uncommitted and invisible.

        :raises CheckpointConflictError: ``batch_id`` is no longer pending.
        """
        self._update_head(
            "REMOVE pending_batch_id, pending_plan_owner, pending_owner, pending_since, pending_report_owner, "
            "pending_heartbeat",
            "pending_batch_id = :n",
            {":n": {"N": str(batch_id)}},
            action=f"discard pending batch {batch_id}",
            owner=owner,
        )
        log.warning("pending batch %d discarded by %s", batch_id, owner)

    def rewind(
        self, checkpoints: Mapping[str, Checkpoint], owner: str, *, now: datetime | None = None, open_shards: Iterable[str] = ()
    ) -> int:
        """Commit ``checkpoints`` as a batch that reads nothing (mode ``rewind``).

        Shards not in ``checkpoints`` lose their checkpoint. Same fencing as any batch: it fails
        if a batch is pending (see :meth:`discard_pending`) or another writer moves first.

        :param open_shards: the stream's open shards now (the resharding sensor's baseline).
        :returns: the batch id of the rewind.
        :raises CheckpointConflictError: a batch is pending, or another writer moved first.
        """
        head = self.head()
        now = now or datetime.now(timezone.utc)
        plan = BatchPlan(
            batch_id=head.committed_batch_id + 1, stream_name=self.stream_name, consumer_name=self.consumer_name,
            cutoff=now, created_at=now, ranges=(), checkpoints=self.committed_checkpoints(head), output_location="",
            mode="rewind", open_shards=tuple(sorted(open_shards)),
        )  # fmt: skip
        self.begin(plan, owner)
        self.commit(plan, checkpoints, owner)
        return plan.batch_id

    # -- helpers -------------------------------------------------------------------------------

    def _key(self, sk: str) -> dict[str, Any]:
        return {"pk": {"S": self.pk}, "sk": {"S": sk}}

    def _update_head(
        self, update: str, condition: str, values: dict[str, Any], *, action: str, owner: str,
        applied: Callable[[Head], bool] | None = None,
    ) -> None:  # fmt: skip
        """One conditional update of the head.

        :param applied: tells from the head whether this very update already applied. The SDK
            retries a request whose response was lost; a retry of an applied update fails its
            condition, and that is success, not a conflict.
        """
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key=self._key("HEAD"),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except self.client.exceptions.ConditionalCheckFailedException as err:
            head = self.head()
            if applied is not None and applied(head):
                log.info("%s: already applied (a retried request whose first response was lost)", action)
                return
            raise self._conflict(action, owner, head) from err

    def _conflict(self, action: str, owner: str, head: Head) -> CheckpointConflictError:
        """The error for a lost conditional write, naming the other writer and batch."""
        return CheckpointConflictError(
            f"could not {action} for stream {self.stream_name!r}, consumer {self.consumer_name!r} "
            f"(writer {owner}): the checkpoint store moved on. Committed batch is "
            f"{head.committed_batch_id} (by {head.committed_owner}); pending batch is "
            f"{head.pending_batch_id} held by {head.pending_owner}. Another run of this consumer "
            "is active or finished first; this run's output is not committed.",
            stream_name=self.stream_name,
            consumer_name=self.consumer_name,
            committed_batch_id=head.committed_batch_id,
            pending_batch_id=head.pending_batch_id,
            other_owner=head.pending_owner or head.committed_owner,
        )

    @staticmethod
    def _batch_prefix(batch_id: int) -> str:
        """The start of every batch-log key of ``batch_id`` (zero-padded: keys sort by batch id)."""
        return f"BATCH#{batch_id:020d}#"

    def _prefix(self, batch_id: int, kind: str, owner: str) -> str:
        return f"{self._batch_prefix(batch_id)}{kind}#{owner}#"

    def _write_chunks(self, batch_id: int, kind: str, owner: str, payload: Any) -> None:
        self._put_chunks(self._prefix(batch_id, kind, owner), payload)

    def _put_chunks(self, prefix: str, payload: Any, expires_at: int | None = None) -> None:
        text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
        chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
        for index, chunk in enumerate(chunks):
            item = {
                **self._key(f"{prefix}{index:05d}"),
                "body": {"S": chunk},
                "chunks": {"N": str(len(chunks))},
                "written_at": {"S": _now()},
            }
            if expires_at is not None:
                item[TTL_ATTRIBUTE] = {"N": str(expires_at)}
            self.client.put_item(TableName=self.table_name, Item=item)

    def _query_items(self, prefix: str) -> list[dict[str, Any]]:
        """Every item whose sort key starts with ``prefix`` (boto3's ``Query`` paginator)."""
        items: list[dict[str, Any]] = []
        for page in self.client.get_paginator("query").paginate(**self._prefix_request(prefix)):
            items.extend(page.get("Items", []))
        return items

    # -- windows (backfill) ----------------------------------------------------------------------

    def write_window(self, label: str, kind: str, owner: str, payload: Any) -> None:
        """Store a window run's ``PLAN`` or ``REPORT`` (``owner``: the run that planned it), for a
        window job that takes its plan from the store (``core.job``). Windows never touch the head
        or the checkpoints; these items expire after :data:`WINDOW_DAYS` days (TTL): a window is
        re-run from its bounds, never from them."""
        self._put_chunks(f"WINDOW#{label}#{kind}#{owner}#", payload, expires_at=int(time.time()) + WINDOW_DAYS * 86400)

    def read_window(self, label: str, kind: str, owner: str) -> Any | None:
        """What :meth:`write_window` stored, as JSON (``None``: nothing); :meth:`window_plan` and
        :meth:`window_report` parse it too.

        :raises CheckpointStoreCorruptError: a chunk is missing, repeated or malformed, or the
            joined text is not JSON.
        """
        return self._read_window(label, kind, owner, lambda data: data)

    def window_plan(self, label: str, owner: str) -> BatchPlan | None:
        """The ``PLAN`` :meth:`write_window` stored for window ``label`` (``None``: nothing).

        :raises CheckpointStoreCorruptError: its items do not parse (names the item and field).
        """
        return self._read_window(label, "PLAN", owner, lambda data: _plan_at(data, None))  # type: ignore[no-any-return]

    def window_report(self, label: str, owner: str) -> list[ShardReport] | None:
        """The ``REPORT`` :meth:`write_window` stored for window ``label`` (``None``: nothing).

        :raises CheckpointStoreCorruptError: its items do not parse (names the item and field).
        """
        return self._read_window(label, "REPORT", owner, _reports_at)  # type: ignore[no-any-return]

    def _read_window(self, label: str, kind: str, owner: str, parse: Callable[[Any], Any]) -> Any | None:
        prefix = f"WINDOW#{label}#{kind}#{owner}#"
        return self._load(self._query_items(prefix), prefix, f"the {_KIND_WORDS[kind]} of window {label}", FIX_WINDOW, parse)

    def _expire_old_batches(self, committed_batch_id: int) -> int:
        """Mark the chunk items of every batch ``<= committed_batch_id - keep_batches`` to expire.

        One ``Query`` (boto3 paginator) over this (stream, consumer)'s batch-log keys up to that
        batch, of the items without ``expires_at`` (keys only), then one ``UpdateItem`` each
        setting ``expires_at`` to now (epoch seconds). An item deleted meanwhile is not recreated.
        The committed batch and the pending one (``committed_batch_id + 1``) are above the bound
        since ``keep_batches >= 1``; ``HEAD`` and ``LEASE#`` keys are outside the key range.

        Note: a filter does not reduce what the ``Query`` reads (DynamoDB developer guide, "Filter
        expressions for Query"): marked items are read again until TTL deleted them.

        Best effort: never raises; an error is logged as a warning and the next commit retries.

        :returns: the number of items marked.
        """
        last = committed_batch_id - self.keep_batches
        if last < 1:
            return 0
        # Keys of batch ``last`` are ``BATCH#{last:020d}#{kind}#...``: the kind (ASCII) sorts below
        # U+FFFF, and every key of batch last + 1 sorts above the bound (20 digits, zero-padded).
        low, high = self._batch_prefix(0), self._batch_prefix(last) + "\uffff"
        marked = 0
        try:
            now = int(time.time())
            pages = self.client.get_paginator("query").paginate(
                TableName=self.table_name,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                FilterExpression="attribute_not_exists(#expires)",
                ProjectionExpression="pk, sk",
                ExpressionAttributeNames={"#expires": TTL_ATTRIBUTE},
                ExpressionAttributeValues={":pk": {"S": self.pk}, ":low": {"S": low}, ":high": {"S": high}},
            )
            for page in pages:
                for item in page.get("Items", []):
                    try:
                        self.client.update_item(
                            TableName=self.table_name,
                            Key={"pk": item["pk"], "sk": item["sk"]},
                            UpdateExpression="SET #expires = :now",
                            ConditionExpression="attribute_exists(sk) AND attribute_not_exists(#expires)",
                            ExpressionAttributeNames={"#expires": TTL_ATTRIBUTE},
                            ExpressionAttributeValues={":now": {"N": str(now)}},
                        )
                        marked += 1
                    except self.client.exceptions.ConditionalCheckFailedException:
                        pass  # deleted or marked meanwhile
        except Exception as err:  # noqa: BLE001 - retention is housekeeping; it never fails a commit
            log.warning(
                "could not mark the batch log of batches <= %d to expire (marked %d items; the next commit "
                "retries): %s", last, marked, err,
            )  # fmt: skip
            return marked
        if marked:
            log.info("batch log: %d chunk items of batches <= %d marked to expire (keep_batches %d)",
                     marked, last, self.keep_batches)  # fmt: skip
        return marked

    def _mirror_leases(self, plan: BatchPlan, checkpoints: Mapping[str, Checkpoint]) -> None:
        """Write the per-shard KCL-style items of the planned shards. Best effort: never raises.

        Called by :meth:`commit` only once the head shows this batch committed (just now, or by an
        earlier attempt), so the mirror moves forward: a retried commit of an older batch is a
        conflict and writes nothing. The items go in
        ``BatchWriteItem`` calls of up to :data:`BATCH_WRITE_MAX_ITEMS` (25: the service's limit),
        on as many threads as the client pools connections (``core.pool``): 256 shards take 11
        calls, not 256 (a conditional ``PutItem`` per item cost the emulator as much as reading
        the batch; ``TransactWriteItems`` takes conditions, at twice the write capacity). No
        per-item condition: two runs of one consumer that commit within the moment between the
        head update and the write could leave an item one batch behind until the next commit;
        the mirror is for people and tools, the head is what the protocol reads.
        """
        puts = []
        for shard_id in sorted({r.shard_id for r in plan.ranges}):
            checkpoint = checkpoints.get(shard_id)
            if checkpoint is None:  # not among the batch's checkpoints (e.g. retired): nothing to mirror
                continue
            position = checkpoint.position
            item = {
                **self._key(f"LEASE#{shard_id}"),
                "leaseKey": {"S": shard_id},
                "leaseOwner": {"S": self.consumer_name},
                "checkpoint": {"S": position.sequence_number if position else checkpoint.sentinel.value},  # type: ignore[union-attr]
                "checkpointSubSequenceNumber": {"N": str((position.sub_sequence_number or 0) if position else 0)},
                "batchId": {"N": str(plan.batch_id)},
            }
            if checkpoint.timestamp is not None:
                item["checkpointTimestamp"] = {"S": format_timestamp(checkpoint.timestamp)}
            puts.append(item)

        def write(chunk: list[dict[str, Any]]) -> None:
            requests = [{"PutRequest": {"Item": item}} for item in chunk]
            try:
                for attempt in range(BATCH_WRITE_ATTEMPTS):
                    if attempt:
                        time.sleep(0.05 * 2 ** (attempt - 1))
                    unprocessed = self.client.batch_write_item(RequestItems={self.table_name: requests}).get("UnprocessedItems", {})
                    requests = unprocessed.get(self.table_name, [])
                    if not requests:
                        return
                log.warning("could not update the KCL-style lease mirror of %d shards (unprocessed after %d attempts)",
                            len(requests), BATCH_WRITE_ATTEMPTS)  # fmt: skip
            except Exception as err:  # noqa: BLE001 - the mirror is derived data
                log.warning("could not update the KCL-style lease mirror of %d shards (%s ... %s): %s",
                            len(chunk), chunk[0]["leaseKey"]["S"], chunk[-1]["leaseKey"]["S"], err)  # fmt: skip

        chunks = [puts[i : i + BATCH_WRITE_MAX_ITEMS] for i in range(0, len(puts), BATCH_WRITE_MAX_ITEMS)]
        if chunks:
            with ThreadPoolExecutor(max_workers=pool_threads(self.client, len(chunks))) as pool:
                list(pool.map(write, chunks))
