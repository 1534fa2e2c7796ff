"""Shard listing and the shard lineage graph (resharding: parents before children).

The ordering rule of the whole project lives here: a child shard may be read only when every
parent (``ParentShardId`` and, for a merge, ``AdjacentParentShardId``) is checkpointed at
``SHARD_END``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from botocore.exceptions import ClientError

from airflow_kinesis_spark.core.names import parse_stream_arn, stream_params
from airflow_kinesis_spark.core.positions import Checkpoint, parse_sequence_number
from airflow_kinesis_spark.exceptions import StreamAccessDeniedError, StreamNotFoundError

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from airflow_kinesis_spark.core.aio import AsyncKinesisClient
    from airflow_kinesis_spark.core.stream_summary import SummaryBudget

log = logging.getLogger(__name__)

__all__ = ["Shard", "ShardLineage", "ListShardsPager", "list_shards", "describe_stream_summary", "raise_for_stream"]


@dataclass(frozen=True)
class Shard:
    """One shard as ``ListShards`` describes it.

    :param shard_id: e.g. ``shardId-000000000003``.
    :param parent_shard_id: the shard it was split from or merged from (``ParentShardId``).
    :param adjacent_parent_shard_id: the second parent of a merge (``AdjacentParentShardId``).
    :param starting_sequence_number: first sequence number of the shard (decimal string).
    :param ending_sequence_number: last sequence number of a closed shard, else ``None``.
    :param starting_hash_key: lower bound of the shard's hash key range (decimal string).
    :param ending_hash_key: upper bound, inclusive (decimal string).
    """

    shard_id: str
    parent_shard_id: str | None
    adjacent_parent_shard_id: str | None
    starting_sequence_number: str
    ending_sequence_number: str | None
    starting_hash_key: str
    ending_hash_key: str

    @property
    def is_closed(self) -> bool:
        return self.ending_sequence_number is not None

    @property
    def parents(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Shard:
        seq = data["SequenceNumberRange"]
        hashes = data["HashKeyRange"]
        return cls(
            shard_id=data["ShardId"],
            parent_shard_id=data.get("ParentShardId"),
            adjacent_parent_shard_id=data.get("AdjacentParentShardId"),
            starting_sequence_number=seq["StartingSequenceNumber"],
            ending_sequence_number=seq.get("EndingSequenceNumber"),
            starting_hash_key=hashes["StartingHashKey"],
            ending_hash_key=hashes["EndingHashKey"],
        )

    def contains_sequence_number(self, sequence_number: str) -> bool:
        """Whether ``sequence_number`` lies in the shard's sequence number range."""
        value = parse_sequence_number(sequence_number)
        if value < int(self.starting_sequence_number):
            return False
        return self.ending_sequence_number is None or value <= int(self.ending_sequence_number)


def raise_for_stream(err: ClientError, stream_name: str, client: KinesisClient | AsyncKinesisClient) -> NoReturn:
    """Raise what a Kinesis call's error on ``stream_name`` (a name or ARN) means:
    :class:`StreamNotFoundError` (from ``err``) for ``ResourceNotFoundException``,
    :class:`StreamAccessDeniedError` for ``AccessDeniedException`` (naming the stream's account
    and the policies to check), else ``err`` itself.

    One rule for every call that names a stream (``ListShards``, ``DescribeStreamSummary``), sync
    (boto3) or async (aiobotocore): both raise botocore's ``ClientError`` with the error code in
    ``response["Error"]["Code"]``.

    :param client: the client that made the call (its region and endpoint go into the message).
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    :raises StreamAccessDeniedError: the principal may not call it.
    :raises ClientError: ``err``, for any other error.
    """
    error = err.response.get("Error", {})
    arn = parse_stream_arn(stream_name)
    if error.get("Code") == "ResourceNotFoundException":
        raise StreamNotFoundError.for_client(stream_name, client, account=arn.account if arn else None) from err
    if error.get("Code") in ("AccessDeniedException", "AccessDenied"):
        operation = getattr(err, "operation_name", None) or "the call"
        raise StreamAccessDeniedError.for_call(stream_name, arn.account if arn else None, operation, error.get("Message", "")) from err
    raise err


class ListShardsPager:
    """What to ask ``ListShards`` next, from the previous page or error: the paging of
    :func:`list_shards` and ``aio.list_shards``, which only make the calls.

    Protocol: while :attr:`request` is not ``None``, call ``ListShards(**request)``; pass the page
    to :meth:`accept`, or a ``ClientError`` to :meth:`refused` (which raises, or sets up the
    retry). :attr:`shards` then holds every shard in the order the service listed them.

    Pages hold at most 1,000 shards (``ListShards``, Kinesis API reference). The first request
    names the stream (and the ``ShardFilter``); the next ones carry only ``NextToken``: the real
    API rejects ``StreamName`` next to it, as the token names the stream (API reference, ListShards).

    :param stream_name: the stream's name or ARN.
    :param shard_filter: ListShards' ``ShardFilter``, on the first request only.
    """

    def __init__(self, stream_name: str, shard_filter: Mapping[str, Any] | None = None) -> None:
        self.stream_name = stream_name
        self.shards: list[Shard] = []
        self.request: dict[str, Any] | None = {
            **stream_params(stream_name), **({"ShardFilter": dict(shard_filter)} if shard_filter else {})
        }  # fmt: skip
        # Emulator workaround (DESIGN.md, emulator quirks): moto's server needs StreamName again
        # with NextToken; it refuses the token alone with InvalidToken ("Input inconsistent with
        # page token": the token's checksum covers the stream's name). Once a token alone is
        # refused so, the name goes with every token. The real API never sees the retry.
        self._name_with_token = False

    def accept(self, page: Mapping[str, Any]) -> None:
        """Take a ``ListShards`` response: its shards, and the next request (``None`` after the last page)."""
        self.shards.extend(Shard.from_api(s) for s in page.get("Shards", []))
        token = page.get("NextToken")
        if not token:
            self.request = None
        else:
            self.request = {"NextToken": token, **(stream_params(self.stream_name) if self._name_with_token else {})}

    def refused(self, err: ClientError, client: KinesisClient | AsyncKinesisClient) -> None:
        """Take the error of :attr:`request`: a token sent alone and refused as ``InvalidToken``
        is sent again with the stream's name (the moto workaround); otherwise raise.

        :param client: the client that made the call (named by the error).
        :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
        :raises ClientError: ``err``, for any other error.
        """
        request = self.request or {}
        token_alone = "NextToken" in request and "StreamName" not in request and "StreamARN" not in request
        if token_alone and err.response.get("Error", {}).get("Code") == "InvalidToken":
            log.debug("ListShards refused NextToken alone (%s); sending StreamName with it (moto)", err)
            self._name_with_token = True
            self.request = {**request, **stream_params(self.stream_name)}
            return
        raise_for_stream(err, self.stream_name, client)


def list_shards(client: KinesisClient, stream_name: str, shard_filter: Mapping[str, Any] | None = None) -> list[Shard]:
    """List every shard of a stream (open and closed, within the retention period).

    Pages through ``ListShards`` (at most 1,000 shards a page, Kinesis API reference) as
    :class:`ListShardsPager` decides. Not boto3's paginator: it cannot send the stream's name
    again with the token, which moto's server needs (DESIGN.md, emulator quirks).

    :param client: a boto3 Kinesis client.
    :param stream_name: the stream's name.
    :param shard_filter: ListShards' ``ShardFilter`` (e.g. ``{"Type": "FROM_TIMESTAMP", "Timestamp": t}``:
        shards open at or after ``t``). The emulators ignore it, so callers must not rely on it
        for correctness, only to save calls.
    :returns: shards in the order the service lists them.
    :raises StreamNotFoundError: when the stream does not exist; it names the stream, the region
        and the endpoint the client talked to.
    """
    pager = ListShardsPager(stream_name, shard_filter)
    while pager.request is not None:
        try:
            page = client.list_shards(**pager.request)
        except ClientError as err:
            pager.refused(err, client)
            continue
        pager.accept(page)
    return pager.shards


def describe_stream_summary(
    client: KinesisClient, stream_name: str, *, budget: SummaryBudget | None = None, max_age: float = 0.0
) -> dict[str, Any]:
    """``DescribeStreamSummary``'s ``StreamDescriptionSummary``: status, retention period (hours),
    open shard count (boto3 client).

    With a ``budget`` (``core.stream_summary``): a summary the host's callers asked for at most
    ``max_age`` seconds ago answers without a call; otherwise the call waits for its slot of the
    host's pacer (DescribeStreamSummary: 20 calls per second per account, Kinesis API reference).
    Without one: one call, as asked. A ``LimitExceededException`` is retried by botocore's retry
    handler (every retry mode) before it reaches the caller.

    :param budget: the host's budget and cache, or ``None``.
    :param max_age: seconds; 0: no cached summary (the call is still paced).
    :raises StreamNotFoundError: the stream does not exist (names stream, region, endpoint).
    """
    if budget is not None:
        summary, delay = budget.reserve(client, stream_name, max_age)
        if summary is not None:
            return summary
        if delay > 0:
            time.sleep(delay)
            summary = budget.cached(client, stream_name, max_age)  # another caller's answer meanwhile
            if summary is not None:
                return summary
    try:
        answer: dict[str, Any] = dict(client.describe_stream_summary(**stream_params(stream_name))["StreamDescriptionSummary"])
    except ClientError as err:
        raise_for_stream(err, stream_name, client)
    if budget is not None:
        budget.remember(client, stream_name, answer)
    return answer


class ShardLineage:
    """The shards of a stream as a graph of parents and children.

    :param shards: every listed shard.
    """

    def __init__(self, shards: Iterable[Shard]) -> None:
        self.shards: dict[str, Shard] = {s.shard_id: s for s in shards}
        self.children: dict[str, list[str]] = {}
        for shard in self.shards.values():
            for parent in shard.parents:
                self.children.setdefault(parent, []).append(shard.shard_id)

    def ordered(self) -> list[Shard]:
        """Shards with every parent before its children (then by shard id)."""
        done: set[str] = set()
        out: list[Shard] = []

        def visit(shard_id: str, path: tuple[str, ...]) -> None:
            if shard_id in done or shard_id not in self.shards:
                return
            if shard_id in path:
                raise ValueError(f"shard lineage has a cycle through {shard_id}")
            for parent in self.shards[shard_id].parents:
                visit(parent, (*path, shard_id))
            done.add(shard_id)
            out.append(self.shards[shard_id])

        for shard_id in sorted(self.shards):
            visit(shard_id, ())
        return out

    def parents_finished(self, shard: Shard, checkpoints: Mapping[str, Checkpoint]) -> bool:
        """Whether every parent of ``shard`` is checkpointed at ``SHARD_END`` (ORDER).

        A parent that is no longer listed (aged out of the retention period) counts as finished
        only if its checkpoint says ``SHARD_END``; one never seen at all counts as finished, since
        the stream's history before this consumer's first batch is not this consumer's to read.
        """
        for parent in shard.parents:
            checkpoint = checkpoints.get(parent)
            if checkpoint is not None:
                if not checkpoint.is_shard_end:
                    return False
            elif parent in self.shards:
                return False
        return True
