"""Async drivers for the triggers: the same decisions as the sync code, over aiobotocore clients.

Only the calls differ; every rule comes from ``reader`` (stop rules, backoff), ``store`` (keys,
head and chunk parsing), ``shards`` (ListShards paging, a missing stream) and ``lag`` (plans and
summaries). No Airflow import.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.names import stream_params
from airflow_kinesis_spark.core.lag import (
    COUNT_MAX_GET_RECORDS_CALLS,
    backlog_from_counts,
    count_reader,
    lag_from_probes,
    lag_plan,
)
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint
from airflow_kinesis_spark.core.read_options import MIN_CALL_INTERVAL_S
from airflow_kinesis_spark.core.probes import probe_reader
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport
from airflow_kinesis_spark.core.shards import ListShardsPager, Shard, raise_for_stream
from airflow_kinesis_spark.core.head import Head
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.core.stream_summary import SummaryBudget

if TYPE_CHECKING:
    from botocore.client import ClientMeta

__all__ = [
    "AsyncKinesisClient",
    "AsyncDynamoDBClient",
    "list_shards",
    "probe_range",
    "count_range",
    "read_head",
    "committed_state",
    "measure_lag",
    "measure_backlog",
    "describe_stream_summary",
]

#: Shards counted at once by :func:`measure_backlog` (as many connections to Kinesis).
BACKLOG_CONCURRENCY = 16


class AsyncKinesisClient(Protocol):
    """The calls this module makes on an aiobotocore Kinesis client: boto3's requests (keyword
    arguments) and responses (dicts); ``meta`` is botocore's (region and endpoint, for messages)."""

    meta: ClientMeta

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]: ...

    async def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]: ...

    async def get_records(self, **kwargs: Any) -> dict[str, Any]: ...

    async def describe_stream_summary(self, **kwargs: Any) -> dict[str, Any]: ...


class AsyncDynamoDBClient(Protocol):
    """The calls this module makes on an aiobotocore DynamoDB client (``GetItem``, and ``Query``
    through its paginator, whose pages are iterated with ``async for``)."""

    async def get_item(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_paginator(self, operation_name: str) -> Any: ...


async def _call(reader: ShardReader, method: Callable[..., Awaitable[dict[str, Any]]], **kwargs: Any) -> dict[str, Any]:
    """Await ``method`` (an aiobotocore client's), retrying throttling errors as ``ShardReader._call`` does."""
    attempt, waited = 0, 0.0
    while True:
        try:
            return await method(**kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            delay = reader.throttle_delay(code, attempt, getattr(method, "__name__", ""), waited)
            if delay is None:
                raise
            await asyncio.sleep(delay)
            attempt, waited = attempt + 1, waited + delay


async def list_shards(client: AsyncKinesisClient, stream_name: str, shard_filter: Mapping[str, Any] | None = None) -> list[Shard]:
    """Async ``shards.list_shards``: the same requests (``shards.ListShardsPager``), awaited.

    :param client: an aiobotocore Kinesis client.
    :param shard_filter: ListShards' ``ShardFilter`` (the emulators ignore it).
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    """
    pager = ListShardsPager(stream_name, shard_filter)
    while pager.request is not None:
        try:
            page = await client.list_shards(**pager.request)
        except ClientError as err:
            pager.refused(err, client)
            continue
        pager.accept(page)
    return pager.shards


async def _step(reader: ShardReader, client: AsyncKinesisClient) -> None:
    """One ``GetRecords`` of the reader's range, applied to it; an expired shard iterator is
    renewed after the last record read instead."""
    iterator = reader.next_iterator
    if iterator is None:  # the caller steps a reader only while it has an iterator (not done)
        raise RuntimeError(f"shard {reader.range.shard_id}: no shard iterator to read from")
    try:
        response = await _call(reader, client.get_records, **reader.records_request(iterator))
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "ExpiredIteratorException":
            raise
        reader.iterator_expired()
        reader.start((await _call(reader, client.get_shard_iterator, **reader.iterator_request())).get("ShardIterator"))
        return
    reader.accept(response)


async def probe_range(client: AsyncKinesisClient, stream_name: str, shard_range: ShardRange) -> ShardReport:
    """Async ``probes.probe_range``: at most one Kinesis record of the range."""
    reader = probe_reader(None, stream_name, shard_range, min_call_interval=0)
    response = await _call(reader, client.get_shard_iterator, **reader.iterator_request())
    reader.start(response.get("ShardIterator"))
    while not reader.done:
        await _step(reader, client)
    return reader.finish()


async def count_range(
    client: AsyncKinesisClient, stream_name: str, shard_range: ShardRange, bound: int, *,
    max_calls: int = COUNT_MAX_GET_RECORDS_CALLS, call_interval: float = MIN_CALL_INTERVAL_S,
) -> tuple[ShardReport, bool]:  # fmt: skip
    """Count up to ``bound`` user records of a range (see ``lag.count_reader``).

    Calls: one ``GetShardIterator``, then at most ``max_calls`` ``GetRecords`` (an expired
    iterator's renewal counts as one), ``call_interval`` seconds apart (GetRecords: 5 calls per
    second per shard, Kinesis API reference).

    :returns: the report and whether the call budget ran out before a stop rule held (the
        count is then a lower bound).
    """
    reader = count_reader(stream_name, shard_range, bound)
    reader.start((await _call(reader, client.get_shard_iterator, **reader.iterator_request())).get("ShardIterator"))
    calls = 0
    while not reader.done and calls < max_calls:
        if calls:
            await asyncio.sleep(call_interval)
        calls += 1
        await _step(reader, client)
    budget_spent = not reader.done
    return reader.finish(), budget_spent


async def _committed(client: AsyncDynamoDBClient, store: DynamoDBCheckpointStore, batch_id: int, kind: str, owner: str) -> Any | None:
    """A payload of the committed batch: the store's ``chunks_request`` through aiobotocore's
    ``Query`` paginator, parsed by the store's ``parse_chunks`` (as the sync store reads it).

    :raises CheckpointStoreCorruptError: its items do not parse.
    """
    pages = client.get_paginator("query").paginate(**store.chunks_request(batch_id, kind, owner))
    items = [item async for page in pages for item in page.get("Items", [])]
    return store.parse_chunks(items, batch_id, kind, owner, pending=False)


async def read_head(client: AsyncDynamoDBClient, store: DynamoDBCheckpointStore) -> Head:
    """Async ``store.head()``: a table that does not exist yet reads as no head.

    :raises CheckpointStoreCorruptError: the head item does not parse (``store.parse_head``).
    """
    try:
        item = (await client.get_item(**store.head_request())).get("Item")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise
        return Head()
    return store.parse_head(item)


async def committed_state(
    client: AsyncDynamoDBClient, store: DynamoDBCheckpointStore, *, with_plan: bool = True
) -> tuple[Head, dict[str, Checkpoint], BatchPlan | None]:
    """Async ``store.head()``, ``store.committed_checkpoints(head)`` and, with ``with_plan``,
    ``store.committed_plan(head)``.

    A table that does not exist yet reads as a consumer with no committed batch.

    :raises CheckpointStoreCorruptError: the head or the committed batch's items do not parse, or
        its checkpoints are missing (as the sync store).
    """
    head = await read_head(client, store)
    if head.committed_batch_id == 0 or head.committed_owner is None:
        return head, {}, None
    checkpoints = await _committed(client, store, head.committed_batch_id, "CKPT", head.committed_owner)
    if checkpoints is None:  # as DynamoDBCheckpointStore.committed_checkpoints: never read as "no checkpoints" (LOUD)
        raise store.missing_checkpoints_error(head)
    plan = None
    if with_plan and head.committed_plan_owner:
        plan = await _committed(client, store, head.committed_batch_id, "PLAN", head.committed_plan_owner)
    return head, checkpoints, plan


async def describe_stream_summary(
    client: AsyncKinesisClient, stream_name: str, *, budget: SummaryBudget | None = None, max_age: float = 0.0
) -> dict[str, Any]:
    """Async ``shards.describe_stream_summary``: status, retention period (hours), open shard count;
    with a ``budget``, from the host's cache or paced as the sync one (the budget's file
    operations run in a thread, the wait is ``asyncio.sleep``: the event loop is never blocked).

    :param budget: the host's budget and cache (``core.stream_summary``), or ``None``.
    :param max_age: seconds; 0: no cached summary (the call is still paced).
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    """
    if budget is not None:
        summary, delay = await asyncio.to_thread(budget.reserve, client, stream_name, max_age)
        if summary is not None:
            return summary
        if delay > 0:
            await asyncio.sleep(delay)
            summary = await asyncio.to_thread(budget.cached, client, stream_name, max_age)
            if summary is not None:
                return summary
    try:
        summary = (await client.describe_stream_summary(**stream_params(stream_name)))["StreamDescriptionSummary"]
    except ClientError as err:
        raise_for_stream(err, stream_name, client)
    if budget is not None:
        await asyncio.to_thread(budget.remember, client, stream_name, summary)
    return summary


async def _lag_plan(
    kinesis: AsyncKinesisClient, dynamodb: AsyncDynamoDBClient, store: DynamoDBCheckpointStore, initial_position: str
) -> tuple[Head, BatchPlan, datetime]:
    """The head, the ``lag.lag_plan`` from its committed checkpoints, and the time it is made for."""
    now = datetime.now(timezone.utc)
    shards = await list_shards(kinesis, store.stream_ref)
    head, checkpoints, _ = await committed_state(dynamodb, store, with_plan=False)
    return head, lag_plan(store.stream_ref, store.consumer_name, shards, checkpoints, now, initial_position), now


async def measure_lag(
    kinesis: AsyncKinesisClient, dynamodb: AsyncDynamoDBClient, store: DynamoDBCheckpointStore, *, initial_position: str = "TRIM_HORIZON"
) -> dict[str, Any]:
    """Async ``lag.measure_lag``: probes every readable shard concurrently.

    :returns: ``lag.lag_from_probes``' summary.
    :raises StreamNotFoundError: the stream does not exist.
    """
    _, plan, now = await _lag_plan(kinesis, dynamodb, store, initial_position)
    probes = await asyncio.gather(*(probe_range(kinesis, store.stream_ref, r) for r in plan.ranges))
    return lag_from_probes(plan, probes, now)


async def measure_backlog(
    kinesis: AsyncKinesisClient, dynamodb: AsyncDynamoDBClient, store: DynamoDBCheckpointStore, *, bound: int, initial_position: str = "TRIM_HORIZON"
) -> dict[str, Any]:
    """A consumer's backlog: ``lag.backlog_from_counts`` (ages and records waiting, counted up to
    ``bound`` per shard) plus ``committed_batch_id``, the head the count was made from.

    Calls: one ``ListShards`` (paginated), the head (``GetItem``) and the committed checkpoints
    (``Query``), and per readable shard those of :func:`count_range`; at most
    ``BACKLOG_CONCURRENCY`` shards at once.
    """
    head, plan, now = await _lag_plan(kinesis, dynamodb, store, initial_position)
    gate = asyncio.Semaphore(BACKLOG_CONCURRENCY)

    async def count(shard_range: ShardRange) -> tuple[ShardReport, bool]:
        async with gate:
            return await count_range(kinesis, store.stream_ref, shard_range, bound)

    counts = await asyncio.gather(*(count(r) for r in plan.ranges))
    return {**backlog_from_counts(plan, counts, now, bound), "committed_batch_id": head.committed_batch_id}
