"""Chunk items of the checkpoint table: where a payload's chunks are, writing them, joining and parsing them.

A payload (a batch's plan, the job's report, the checkpoints after a batch; a window run's plan
or report) is JSON of any size; DynamoDB items hold at most 400 KB (DynamoDB developer guide). The
store writes it in items of at most :data:`CHUNK_CHARS` characters, sort keys
``{prefix}00000``, ``{prefix}00001``, ..., each with the chunk count (``chunks``), its part of the
text (``body``) and ``written_at``:

* the keys: :func:`item_key`, :func:`batch_prefix` and :func:`payload_prefix`
  (``BATCH#{id:020d}#{kind}#{owner}#``), :func:`prefix_request` (the ``Query`` that finds them);
* writing: :func:`put_chunks` (``PutItem`` each; :data:`TTL_ATTRIBUTE` when they expire);
* reading: :func:`query_items`, then :func:`join_chunks` / :func:`load_chunks` (every chunk there
  once, the same count in each, JSON that parses) and :func:`parse_payload_chunks` (a plan, a
  report or checkpoints: ``core.payloads``). Every error is a
  :class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError` naming the item and field.

``core.store`` calls these with its client, table and key (``DynamoDBCheckpointStore._write_chunks``,
``_query_items``, ``parse_chunks``, ``chunks_request``) and passes its own ``CHUNK_CHARS``, looked
up there at each call. This module does not import ``core.store``.

No Airflow import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.corrupt import (
    FIX_PENDING,
    FIX_RESTORE,
    _attribute,
    _explain,
    _key_text,
    _Malformed,
    _whole_number,
)
from airflow_kinesis_spark.core.head import _now
from airflow_kinesis_spark.core.payloads import _checkpoints_at, _plan_at, _reports_at
from airflow_kinesis_spark.exceptions import CheckpointStoreCorruptError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = [
    "CHUNK_CHARS", "TTL_ATTRIBUTE", "item_key", "batch_prefix", "payload_prefix", "prefix_request", "put_chunks",
    "query_items", "join_chunks", "load_chunks", "parse_payload_chunks",
]  # fmt: skip

#: Characters of JSON per chunk item; a DynamoDB item holds at most 400 KB.
CHUNK_CHARS = 350_000

#: The batch log's TTL attribute (a number, epoch seconds; DynamoDB developer guide, "Using time to live").
TTL_ATTRIBUTE = "expires_at"

#: A chunk's number at the end of its sort key (:func:`put_chunks`).
_CHUNK_NUMBER = re.compile(r"[0-9]{5}")
#: What a payload's chunks hold, by kind, in messages.
_KIND_WORDS = {"PLAN": "plan", "REPORT": "job's report", "CKPT": "checkpoints"}


def item_key(pk: str, sk: str) -> dict[str, Any]:
    """The key of item (``pk``, ``sk``) as the client takes it (both strings: the table's key schema)."""
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def batch_prefix(batch_id: int) -> str:
    """The start of every batch-log key of ``batch_id`` (zero-padded: keys sort by batch id)."""
    return f"BATCH#{batch_id:020d}#"


def payload_prefix(batch_id: int, kind: str, owner: str) -> str:
    """The start of the sort keys of one payload's chunks (``kind``: ``PLAN``, ``REPORT`` or ``CKPT``;
    ``owner``: the writer that wrote them)."""
    return f"{batch_prefix(batch_id)}{kind}#{owner}#"


def prefix_request(table_name: str, pk: str, prefix: str) -> dict[str, Any]:
    """``Query`` arguments for the items of ``pk`` whose sort key starts with ``prefix`` (strongly consistent)."""
    return {
        "TableName": table_name,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": pk}, ":prefix": {"S": prefix}},
        "ConsistentRead": True,
    }


def put_chunks(
    client: DynamoDBClient, table_name: str, pk: str, prefix: str, payload: Any, *, chunk_chars: int = CHUNK_CHARS,
    expires_at: int | None = None,
) -> None:  # fmt: skip
    """Write ``payload`` as JSON in items of at most ``chunk_chars`` characters under ``prefix``
    (one ``PutItem`` each); with ``expires_at`` (epoch seconds), each gets :data:`TTL_ATTRIBUTE`."""
    text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    chunks = [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)] or [""]
    for index, chunk in enumerate(chunks):
        item = {
            **item_key(pk, f"{prefix}{index:05d}"),
            "body": {"S": chunk},
            "chunks": {"N": str(len(chunks))},
            "written_at": {"S": _now()},
        }
        if expires_at is not None:
            item[TTL_ATTRIBUTE] = {"N": str(expires_at)}
        client.put_item(TableName=table_name, Item=item)


def query_items(client: DynamoDBClient, request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every item the ``Query`` of ``request`` finds (boto3's ``Query`` paginator)."""
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("query").paginate(**request):
        items.extend(page.get("Items", []))
    return items


@dataclass(frozen=True)
class _Joined:
    """A payload joined from its chunk items: the JSON, the first chunk's key, the chunk count."""

    data: Any
    pk: str
    sk: str
    chunks: int


def _join(items: Sequence[Mapping[str, Any]], prefix: str | None = None) -> _Joined | None:
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
            chunks = _whole_number(_attribute(item, "chunks", "N", required=True), "chunks", 1)
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
        bodies[int(number)] = (pk, sk, body)
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


def join_chunks(items: Sequence[Mapping[str, Any]], what: str, *, table_name: str | None = None) -> Any | None:
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


def load_chunks(
    items: Sequence[Mapping[str, Any]], prefix: str, what: str, fix: str, parse: Callable[[Any], Any], *, table_name: str,
    pk: str,
) -> Any | None:  # fmt: skip
    """Join chunk items under ``prefix`` and ``parse`` the JSON; every error of either as a
    :class:`CheckpointStoreCorruptError` naming the item (of table ``table_name``; ``pk``: the key
    named when the error names none) and field, ``what`` it holds and ``fix``."""
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
            table_name, bad.pk or pk, bad.sk or f"{prefix}00000", bad.field, bad.problem, what=what, fix=fix
        ) from bad.__cause__


def parse_payload_chunks(
    items: Sequence[Mapping[str, Any]], batch_id: int, kind: str, owner: str, *, pending: bool, table_name: str, pk: str
) -> Any | None:
    """The chunk items of one payload of the batch log, joined and parsed (``PLAN``: a
    :class:`~airflow_kinesis_spark.core.planner.BatchPlan`, ``REPORT``: a list of
    :class:`~airflow_kinesis_spark.core.ranges.ShardReport`, ``CKPT``: shard id -> checkpoint);
    ``DynamoDBCheckpointStore.parse_chunks`` (``core.store``) says what it returns and raises."""
    what = f"the {_KIND_WORDS[kind]} of {'pending' if pending else 'committed'} batch {batch_id}"
    if kind == "PLAN":
        parse: Callable[[Any], Any] = lambda data: _plan_at(data, batch_id)  # noqa: E731
    elif kind == "REPORT":
        parse = _reports_at
    elif kind == "CKPT":
        parse = lambda data: _checkpoints_at(data, "checkpoints")  # noqa: E731
    else:
        raise ValueError(f"kind must be PLAN, REPORT or CKPT; got {kind!r}")
    return load_chunks(
        items, payload_prefix(batch_id, kind, owner), what, FIX_PENDING if pending else FIX_RESTORE, parse,
        table_name=table_name, pk=pk,
    )  # fmt: skip
