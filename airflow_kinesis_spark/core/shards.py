"""Shard listing and the shard lineage graph (resharding: parents before children).

The ordering rule of the whole project lives here: a child shard may be read only when every
parent (``ParentShardId`` and, for a merge, ``AdjacentParentShardId``) is checkpointed at
``SHARD_END``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_kinesis_spark.core.positions import Checkpoint, parse_sequence_number
from airflow_kinesis_spark.exceptions import StreamNotFoundError

log = logging.getLogger(__name__)

__all__ = ["Shard", "ShardLineage", "list_shards"]


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


def list_shards(client: Any, stream_name: str, shard_filter: Mapping[str, Any] | None = None) -> list[Shard]:
    """List every shard of a stream (open and closed, within the retention period).

    Pages through ``ListShards`` (at most 1,000 shards a page, Kinesis API reference).

    :param client: a boto3 Kinesis client.
    :param stream_name: the stream's name.
    :param shard_filter: ListShards' ``ShardFilter`` (e.g. ``{"Type": "FROM_TIMESTAMP", "Timestamp": t}``:
        shards open at or after ``t``). The emulators ignore it, so callers must not rely on it
        for correctness, only to save calls.
    :returns: shards in the order the service lists them.
    :raises StreamNotFoundError: when the stream does not exist; it names the stream, the region
        and the endpoint the client talked to.
    """
    shards: list[Shard] = []
    # The real API rejects StreamName next to NextToken; moto's server needs it again
    # (DESIGN.md, emulator quirks). Send the token alone and, if refused once, both from then on.
    resend_name = False
    kwargs: dict[str, Any] = {"StreamName": stream_name, **({"ShardFilter": dict(shard_filter)} if shard_filter else {})}
    try:
        while True:
            try:
                page = client.list_shards(**kwargs)
            except client.exceptions.ClientError as err:
                if "NextToken" not in kwargs or resend_name:
                    raise
                log.debug("ListShards refused NextToken alone (%s); sending StreamName too", err)
                resend_name = True
                kwargs["StreamName"] = stream_name
                continue
            shards.extend(Shard.from_api(s) for s in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                break
            kwargs = {"NextToken": token, **({"StreamName": stream_name} if resend_name else {})}
    except client.exceptions.ResourceNotFoundException as err:
        raise StreamNotFoundError.for_client(stream_name, client) from err
    return shards


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
