"""The payloads of the batch log read back: a plan, a job's report and checkpoints, every field checked.

What the store writes in chunk items (``core.chunks`` joins them into one JSON value) is parsed
here, and an item anyone planted is refused before anything is planned or committed from it:

* ``_plan_at``: a stored plan (``BatchPlan.to_dict``): the JSON types of its fields, its batch id
  (that of the item's key), then ``BatchPlan.from_dict``;
* ``_reports_at``: a job's stored report (a list of ``ShardReport.to_dict``);
* ``_checkpoints_at``: shard id -> stored checkpoint (``Checkpoint.to_dict``).

Each raises ``_Malformed`` (``core.corrupt``) naming the field (``ranges[2].cutoff``,
``checkpoints['shardId-000000000001'].type``); the caller adds the item's key and raises
:class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`. The names are internal to
the store's modules (``core.chunks``, ``core.store``), which import them from here.

No Airflow import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from airflow_kinesis_spark.core.corrupt import PARSE_ERRORS, _explain, _Malformed, _show
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint, Sentinel, parse_sequence_number, parse_timestamp
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition

#: The sentinels a stored checkpoint may hold (``LATEST`` is resolved by the planner, never stored).
_STORED_SENTINELS = tuple(s.value for s in Sentinel if s is not Sentinel.LATEST)


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
    if data.get("resume_iterator") is not None and not isinstance(data["resume_iterator"], str):
        raise _Malformed(_at(path, "resume_iterator"), f"expected a string or null, found {_json_kind(data['resume_iterator'])}")
    at = data.get("resume_iterator_at")
    if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float))):
        raise _Malformed(_at(path, "resume_iterator_at"), f"expected a number or null, found {_json_kind(at)}")
    return _parsed(path, Checkpoint.from_dict, data)


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
