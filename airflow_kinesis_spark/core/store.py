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

The store's parts live in modules of one concern each; this module keeps
:class:`DynamoDBCheckpointStore` (reading the head and the batch log, the conditional writes that
begin, record, commit, discard and rewind a batch, windows):

* ``core.store_setup``: the table's creation, deletion protection, point-in-time recovery and TTL
  (:meth:`DynamoDBCheckpointStore.ensure_table` calls it);
* ``core.head``: :class:`Head`, the head item parsed and checked;
* ``core.corrupt``: the checks of an item's attributes and the fixes named in
  :class:`~airflow_kinesis_spark.exceptions.CheckpointStoreCorruptError`;
* ``core.payloads``: a stored plan, report or checkpoints parsed and checked;
* ``core.chunks``: the keys of the batch log, writing a payload in chunk items, joining and parsing them;
* ``core.lease``: the lease on a pending batch (``LeaseHolding``, a mixin of the store);
* ``core.retention``: marking old batches to expire; ``core.mirror``: the KCL-style ``LEASE#`` items.

None of them imports this module. Their log lines keep this module's logger.

No Airflow import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.chunks import (
    _KIND_WORDS,
    CHUNK_CHARS,
    item_key,
    load_chunks,
    parse_payload_chunks,
    payload_prefix,
    prefix_request,
    put_chunks,
    query_items,
)
from airflow_kinesis_spark.core.corrupt import FIX_PENDING, FIX_RESTORE
from airflow_kinesis_spark.core.head import Head, _now
from airflow_kinesis_spark.core.lease import LeaseHolding
from airflow_kinesis_spark.core.mirror import mirror_leases
from airflow_kinesis_spark.core.names import stream_name_of, validate_table_name
from airflow_kinesis_spark.core.payloads import _plan_at, _reports_at
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.retention import DEFAULT_KEEP_BATCHES, expire_old_batches
from airflow_kinesis_spark.core.store_setup import BACKUPS_RETRY_SECONDS, ensure_table
from airflow_kinesis_spark.exceptions import CheckpointConflictError, CheckpointStoreCorruptError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# CHUNK_CHARS and BACKUPS_RETRY_SECONDS are looked up in this module at each call and passed on
# (``_put_chunks``, ``ensure_table``): tests patch them here.

log = logging.getLogger(__name__)

__all__ = ["DynamoDBCheckpointStore", "FIX_WINDOW"]

#: Days a window run's plan and report stay in the table (``write_window``).
WINDOW_DAYS = 7

#: How to mend a corrupt item of a window run (``write_window``).
FIX_WINDOW = (
    "run the window task again: its new attempt stores the window's plan and report anew under its own writer id "
    f"(these items expire {WINDOW_DAYS} days after they were written)"
)


class DynamoDBCheckpointStore(LeaseHolding):
    """Checkpoints and the batch log of one (stream, consumer) in a DynamoDB table.

    Calls go to the boto3 client as given: botocore retries throttling, 5xx errors and lost
    connections per the client's ``retries`` config; the store retries nothing itself. A retried
    update that already applied is recognised (see :meth:`_update_head`).

    The batch log keeps the last ``keep_batches`` batches: after the commit of batch ``N``, the
    chunk items (plan, report, checkpoints) of every batch ``<= N - keep_batches`` are marked with
    ``expires_at`` and DynamoDB's TTL deletes them, typically within a few days (DynamoDB developer
    guide, "Using time to live"). The committed and the pending batch are always kept; the head and
    the ``LEASE#`` items never expire.

    The lease methods (:meth:`take_over`, :meth:`claim`, :meth:`heartbeat`, :meth:`release`,
    :meth:`release_handed`, :meth:`hold_lease`, :meth:`hold_hand_off`) come from
    :class:`~airflow_kinesis_spark.core.lease.LeaseHolding`, which uses :meth:`head`,
    :meth:`_update_head`, ``stream_name`` and ``consumer_name`` of this class. Everything else is
    defined here, delegating to the functions of ``core.store_setup``, ``core.chunks``,
    ``core.retention`` and ``core.mirror`` with explicit arguments.

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
    :param clock: seconds since the epoch (default ``time.time``): the time of the heartbeats
        this store writes and of the lease it compares them with (``core.lease``); tests move it
        instead of sleeping.
    :raises ValueError: an invalid table name, or ``keep_batches`` below 1.
    :raises TypeError: ``keep_batches`` is not an ``int``, or ``point_in_time_recovery`` /
        ``deletion_protection`` is not a ``bool``.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        stream_name: str,
        consumer_name: str,
        *,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        point_in_time_recovery: bool = True,
        deletion_protection: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(keep_batches, bool) or not isinstance(keep_batches, int):
            raise TypeError(f"keep_batches must be an int (a number of batches); got {keep_batches!r}")
        if keep_batches < 1:
            raise ValueError(f"keep_batches must be >= 1 (the committed batch is always kept); got {keep_batches}")
        for name, value in (("point_in_time_recovery", point_in_time_recovery), ("deletion_protection", deletion_protection)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool (True or False); got {value!r}")
        self.client = client
        self.clock = clock
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
        retention, see :func:`~airflow_kinesis_spark.core.store_setup.ensure_ttl`), then the head item
        (:func:`~airflow_kinesis_spark.core.store_setup.ensure_table`).

        A table this call creates gets on-demand billing, deletion protection (CreateTable's
        ``DeletionProtectionEnabled``, unless ``deletion_protection=False``) and, once it is
        ``ACTIVE``, point-in-time recovery (unless ``point_in_time_recovery=False``; see
        :func:`~airflow_kinesis_spark.core.store_setup.enable_point_in_time_recovery`: a failure
        there is a warning, not an error). A table that exists, or that another process created at
        the same time, is left as its owner configured it; its settings are logged at INFO once per
        process (see :func:`~airflow_kinesis_spark.core.store_setup.log_protection`).

        :param wait_seconds: how long to wait for the table to become ``ACTIVE``; for a table this
            call created, also how long to keep retrying ``UpdateContinuousBackups`` while DynamoDB
            answers ``ContinuousBackupsUnavailableException`` (backups of a new table still being set up).
        :raises TimeoutError: if the table is not ``ACTIVE`` within ``wait_seconds``.
        """
        ensure_table(
            self.client, self.table_name, self.pk, self.stream_name, self.consumer_name,
            deletion_protection=self.deletion_protection, point_in_time_recovery=self.point_in_time_recovery,
            wait_seconds=wait_seconds, backups_retry_seconds=BACKUPS_RETRY_SECONDS,  # looked up here: tests patch it
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
        return prefix_request(self.table_name, self.pk, self._prefix(batch_id, kind, owner))

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
        self, items: Sequence[Mapping[str, Any]], batch_id: int, kind: str, owner: str, *, pending: bool
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
        return parse_payload_chunks(items, batch_id, kind, owner, pending=pending, table_name=self.table_name, pk=self.pk)

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

    def missing_plan_error(self, head: Head) -> CheckpointStoreCorruptError:
        """The error for a head whose committed batch's plan is not in the table (every commit
        stores one: ``commit`` and ``rewind``)."""
        prefix = self._prefix(head.committed_batch_id, "PLAN", head.committed_plan_owner or "")
        return self._missing(
            "committed_plan_owner", f"the plan of committed batch {head.committed_batch_id} is missing (no item with sk "
            f"{prefix}00000)", fix=FIX_RESTORE,
        )  # fmt: skip

    def committed_plan(self, head: Head | None = None) -> BatchPlan | None:
        """The plan of the last committed batch (``None`` before the first commit).

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.committed_batch_id == 0 or head.committed_plan_owner is None:
            return None
        return self._read_batch(head.committed_batch_id, "PLAN", head.committed_plan_owner, pending=False)

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
        return checkpoints

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
        return plan

    def pending_report(self, head: Head | None = None) -> list[ShardReport] | None:
        """The recorded job report of the pending batch, if its output was written.

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.pending_batch_id is None or head.pending_report_owner is None:
            return None
        return self._read_batch(head.pending_batch_id, "REPORT", head.pending_report_owner, pending=True)

    def committed_report(self, head: Head | None = None) -> list[ShardReport] | None:
        """The job report the last committed batch was committed with (``None``: committed
        without a job, or no batch committed yet).

        :raises CheckpointStoreCorruptError: its items do not parse (:meth:`parse_chunks`).
        """
        head = head or self.head()
        if head.committed_batch_id == 0 or head.committed_report_owner is None:
            return None
        return self._read_batch(head.committed_batch_id, "REPORT", head.committed_report_owner, pending=False)

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
             ":prev": {"N": str(plan.batch_id - 1)}, ":hb": {"N": str(self.now_ms())}},
            action=f"begin batch {plan.batch_id}",
            owner=owner,
            applied=lambda h: h.pending_batch_id == plan.batch_id and h.pending_plan_owner == owner,
        )  # fmt: skip
        log.info("batch %d planned and persisted (%d shard ranges, owner %s)", plan.batch_id, len(plan.ranges), owner)

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
        return item_key(self.pk, sk)

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

    def _prefix(self, batch_id: int, kind: str, owner: str) -> str:
        return payload_prefix(batch_id, kind, owner)

    def _write_chunks(self, batch_id: int, kind: str, owner: str, payload: Any) -> None:
        self._put_chunks(self._prefix(batch_id, kind, owner), payload)

    def _put_chunks(self, prefix: str, payload: Any, expires_at: int | None = None) -> None:
        # CHUNK_CHARS looked up here, at each call: tests patch it in this module.
        put_chunks(self.client, self.table_name, self.pk, prefix, payload, chunk_chars=CHUNK_CHARS, expires_at=expires_at)

    def _query_items(self, prefix: str) -> list[dict[str, Any]]:
        """Every item whose sort key starts with ``prefix`` (boto3's ``Query`` paginator)."""
        return query_items(self.client, prefix_request(self.table_name, self.pk, prefix))

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
        return self._read_window(label, "PLAN", owner, lambda data: _plan_at(data, None))

    def window_report(self, label: str, owner: str) -> list[ShardReport] | None:
        """The ``REPORT`` :meth:`write_window` stored for window ``label`` (``None``: nothing).

        :raises CheckpointStoreCorruptError: its items do not parse (names the item and field).
        """
        return self._read_window(label, "REPORT", owner, _reports_at)

    def _read_window(self, label: str, kind: str, owner: str, parse: Callable[[Any], Any]) -> Any | None:
        prefix = f"WINDOW#{label}#{kind}#{owner}#"
        return load_chunks(
            self._query_items(prefix), prefix, f"the {_KIND_WORDS[kind]} of window {label}", FIX_WINDOW, parse,
            table_name=self.table_name, pk=self.pk,
        )  # fmt: skip

    # -- after a commit (best effort) ----------------------------------------------------------

    def _expire_old_batches(self, committed_batch_id: int) -> int:
        """Mark the chunk items of every batch ``<= committed_batch_id - keep_batches`` to expire
        (:func:`~airflow_kinesis_spark.core.retention.expire_old_batches`: never raises).

        :returns: the number of items marked.
        """
        return expire_old_batches(self.client, self.table_name, self.pk, self.keep_batches, committed_batch_id)

    def _mirror_leases(self, plan: BatchPlan, checkpoints: Mapping[str, Checkpoint]) -> None:
        """Write the per-shard KCL-style ``LEASE#`` items of the planned shards
        (:func:`~airflow_kinesis_spark.core.mirror.mirror_leases`: never raises)."""
        mirror_leases(self.client, self.table_name, self.pk, self.consumer_name, plan, checkpoints)
