"""Checkpoint administration shared by the checkpoint operators and the command-line tool (rewind,
discarding a pending batch and, safely, its output directory), and the endpoint check shared by
the hooks and the command-line tool. No Airflow import."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow_kinesis_spark.core.planner import BatchPlan, rewind_checkpoints
from airflow_kinesis_spark.core.locations import batch_output_location, committed_record_location, plan_id
from airflow_kinesis_spark.core.lease import DEFAULT_LEASE_SECONDS
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import (
    BatchLeaseHeldError,
    CheckpointConflictError,
    CheckpointStoreCorruptError,
    EndpointUnreachableError,
)

__all__ = ["rewind", "discard_pending", "check_endpoint", "ArgumentNames", "OPERATOR_ARGUMENTS", "CLI_FLAGS"]


if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

    from airflow_kinesis_spark.core.head import Head
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

log = logging.getLogger(__name__)

#: Budget of :func:`check_endpoint`: connect timeout (seconds), read timeout (seconds) and
#: attempts. botocore's defaults are 60 s, 60 s and 5 attempts (legacy retry mode): a connection
#: pointing nowhere would take minutes to fail. Real AWS endpoints answer within milliseconds.
CHECK_CONNECT_TIMEOUT = 3.0
CHECK_READ_TIMEOUT = 5.0
CHECK_ATTEMPTS = 2
#: Per service, a call without parameters used as the probe. Sent unsigned, AWS rejects it
#: (``MissingAuthenticationToken``) before any authorization, so it needs no IAM permission.
_PROBES = {"kinesis": ("list_streams", {"Limit": 1}), "dynamodb": ("list_tables", {"Limit": 1}),
           "sts": ("get_caller_identity", {})}  # fmt: skip


#: Probe clients are made from one botocore session per process, under this lock: a new
#: session would load the endpoint rules and service models from disk again (~0.1 s each).
_PROBE_SESSION_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _probe_session() -> Any:
    import botocore.session

    return botocore.session.get_session()


def check_endpoint(client: Any, source: str, *, hint: str = "", verify: bool | str | None = None) -> None:
    """Fail fast when the endpoint of ``client`` does not answer.

    Sends one unsigned request (``ListStreams``, ``ListTables`` or ``GetCallerIdentity``) to the
    client's endpoint, with the client's region, proxies and TLS settings, on a short budget
    (:data:`CHECK_CONNECT_TIMEOUT`, :data:`CHECK_READ_TIMEOUT`, :data:`CHECK_ATTEMPTS`; lower
    timeouts of the client's own config are kept). Any HTTP answer, an error included, means the
    endpoint is reachable; the answer is discarded. Only a failure to connect (refused,
    unresolvable host, connect timeout, proxy or TLS failure) or no answer within the read
    timeout raises. The client itself, and its retry settings, are not touched.

    :param client: a boto3 client of Kinesis, DynamoDB or STS.
    :param source: where the endpoint came from, for the message, e.g. ``aws connection 'aws_default'``.
    :param hint: what to check, appended to the message.
    :param verify: TLS verification of the client (``False`` or a CA bundle path), as given to boto3.
    :raises EndpointUnreachableError: naming the service, the endpoint, the region and ``source``.
    """
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ConnectionError as BotocoreConnectionError
    from botocore.exceptions import ReadTimeoutError

    meta = client.meta
    service = meta.service_model.service_name
    own = meta.config
    config = own.merge(
        Config(
            signature_version=UNSIGNED,
            connect_timeout=min(own.connect_timeout or CHECK_CONNECT_TIMEOUT, CHECK_CONNECT_TIMEOUT),
            read_timeout=min(own.read_timeout or CHECK_READ_TIMEOUT, CHECK_READ_TIMEOUT),
            retries={"mode": "standard", "total_max_attempts": CHECK_ATTEMPTS},
        )
    )
    with _PROBE_SESSION_LOCK:
        probe = _probe_session().create_client(
            service, region_name=meta.region_name, endpoint_url=meta.endpoint_url, config=config, verify=verify
        )
    operation, params = _PROBES[service]
    try:
        getattr(probe, operation)(**params)
    except (BotocoreConnectionError, ReadTimeoutError) as err:
        name = meta.service_model.service_id
        raise EndpointUnreachableError(
            f"Cannot reach {name} at {meta.endpoint_url} ({source}, region {meta.region_name!r}): {err} "
            f"[{CHECK_ATTEMPTS} attempts, connect timeout {config.connect_timeout:g} s, read timeout {config.read_timeout:g} s]."
            + (f" {hint}" if hint else ""),
            service=name,
            endpoint=meta.endpoint_url,
            region=meta.region_name,
            source=source,
        ) from err
    except Exception:  # noqa: BLE001, S110 - any answer, an error included, means the endpoint answered
        pass
    finally:
        probe.close()


# -- discarding a pending batch ----------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentNames:
    """How the caller names the settings this module's messages point at: the checkpoint
    operators' arguments (:data:`OPERATOR_ARGUMENTS`) or ``kinesis-spark``'s flags (:data:`CLI_FLAGS`).

    :param discard_pending: how to ask a rewind to drop a pending batch first.
    :param output_path: the consumer's output root.
    :param lease_seconds: the consumer's lease.
    """

    discard_pending: str
    output_path: str
    lease_seconds: str


#: The names of ``KinesisCheckpointRewindOperator`` / ``KinesisDiscardPendingBatchOperator``.
OPERATOR_ARGUMENTS = ArgumentNames(discard_pending="discard_pending=True", output_path="output_path", lease_seconds="lease_seconds")
#: The flags of ``kinesis-spark rewind`` / ``kinesis-spark discard-pending``.
CLI_FLAGS = ArgumentNames(discard_pending="--discard-pending", output_path="--output-path", lease_seconds="--lease-seconds")

#: The keys :func:`discard_pending` and :func:`rewind` report about a discarded pending batch.
_NOTHING_DISCARDED: dict[str, Any] = {
    "discarded_batch_id": None, "holder": None, "heartbeat_age_seconds": None, "deleted_path": None, "discarded_output": None,
}  # fmt: skip


@dataclass(frozen=True)
class _OutputAction:
    """What discarding a pending batch does to its output: delete ``path``, or nothing and why.

    :param shown: the location messages name: the batch's directory (absolute when local), or
        the stored plan's location quoted (``repr``: read from the table, not trusted to be printable).
    """

    path: Path | None
    reason: str | None
    shown: str | None

    def describe(self, dry_run: bool) -> str:
        if self.path is not None:
            return f"{'would delete' if dry_run else 'deleted'} {self.path}"
        return f"{'would delete nothing' if dry_run else 'nothing deleted'}: {self.reason}"


def _keep(reason: str, shown: str | None) -> _OutputAction:
    return _OutputAction(path=None, reason=reason, shown=shown)


def _local_path(location: str) -> Path | None:
    """The absolute, normalised local path of ``location`` (a plain path or a ``file:`` URI on
    this host); ``None`` for anything else (``s3a://``, ``hdfs://``, ``file://otherhost/``)."""
    parsed = urlparse(location)
    if parsed.scheme == "":
        return Path(os.path.abspath(location))
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(os.path.abspath(parsed.path))
    return None


def _output_action(head: Head, plan: BatchPlan | None, output_path: str | None, names: ArgumentNames) -> _OutputAction:
    """Decide what discarding the pending batch of ``head`` may delete.

    The checkpoint table is state that anyone with write access to it can change, so nothing read
    from it names what to delete. The only directory that may be deleted is the one this project
    derives for the batch, :func:`~airflow_kinesis_spark.core.locations.batch_output_location` of
    ``output_path`` and the pending batch id, and only when: the pending batch id follows the
    committed one; the stored plan names exactly that location (else someone other than this
    task wrote the plan); it is local; and it is a directory, not a symbolic link. Values read
    from the table are quoted (``repr``) in the reasons: they are not trusted to be printable.

    :param names: how the caller names ``output_path`` in the reasons.
    """
    batch_id = head.pending_batch_id
    stored = plan.output_location if plan is not None else None
    if plan is None:
        return _keep(f"the plan of batch {batch_id} could not be read from the checkpoint table", None)
    if batch_id != head.committed_batch_id + 1:
        return _keep(
            f"pending batch {batch_id} does not follow committed batch {head.committed_batch_id}; check who wrote "
            "the checkpoint table", repr(stored) if stored else None,
        )  # fmt: skip
    if not stored:
        return _keep(f"the stored plan of batch {batch_id} names no output location", None)
    if not output_path:
        return _keep(
            f"the stored plan names {stored!r}; give {names.output_path} (the consumer's output root) to delete the "
            "batch's directory", repr(stored),
        )  # fmt: skip
    computed = batch_output_location(output_path, batch_id)
    if stored == batch_output_location(output_path, batch_id, plan_id(plan)):
        computed = stored  # a table output's folder, named by the plan's id (locations.planned_output_location)
    local = _local_path(computed)
    shown = str(local) if local is not None else computed
    if head.pending_report_owner:
        return _keep(
            f"batch {batch_id}'s job recorded its report, so a table commit may reference {shown} already; delete it "
            "yourself only after checking the table's snapshots or versions (docs/output.md, leftover files)", shown,
        )  # fmt: skip
    record = _local_path(committed_record_location(output_path, batch_id))
    if record is not None and record.exists():
        return _keep(
            f"{output_path} holds a committed record of batch {batch_id} (another checkpoint history committed it): its "
            "files are committed output", shown,
        )  # fmt: skip
    if stored != computed:
        return _keep(
            f"the stored plan names {stored!r}, not the batch's directory under the output root {shown}; check who "
            "wrote the checkpoint table", shown,
        )  # fmt: skip
    if local is None:
        return _keep(f"{computed} is not local; delete it yourself, the discarded batch may have written there", shown)
    if local.is_symlink():  # before exists(): a dangling link does not exist
        return _keep(f"{shown} is a symbolic link, not a directory the batch wrote; check who made it", shown)
    if not local.exists():
        return _keep(f"{shown} does not exist", shown)
    if not local.is_dir():
        return _keep(f"{shown} is not a directory", shown)
    return _OutputAction(path=local, reason=None, shown=shown)


def _readable_pending_plan(store: DynamoDBCheckpointStore, head: Head) -> BatchPlan | None:
    """The pending batch's plan, or ``None`` when it is missing or corrupt: discarding the batch is
    the fix for a corrupt plan (``CheckpointStoreCorruptError`` says so), so it must not need the
    plan. Without a plan, :func:`_output_action` deletes nothing."""
    try:
        return store.pending_plan(head)
    except CheckpointStoreCorruptError as err:
        log.warning("discarding pending batch %s without reading its plan: %s", head.pending_batch_id, err)
        return None


def _heartbeat_age(head: Head) -> float | None:
    """Seconds since the pending batch holder's last heartbeat; ``None`` without one, or when the
    holder released its lease (``DynamoDBCheckpointStore.release`` sets the heartbeat to 0)."""
    if not head.pending_heartbeat:
        return None
    return round(max(0.0, time.time() - head.pending_heartbeat / 1000), 3)


def _discard(
    store: DynamoDBCheckpointStore, head: Head, *, output_path: str | None, dry_run: bool, owner: str, lease_seconds: float,
    expected_batch_id: int | None, names: ArgumentNames,
) -> dict[str, Any]:  # fmt: skip
    """Take the pending batch of ``head`` over, delete its output if :func:`_output_action` allows,
    and drop it. With ``dry_run``, only say what that would do."""
    batch_id = head.pending_batch_id
    if expected_batch_id is not None and batch_id != expected_batch_id:
        now_pending = f"batch {batch_id} is pending now" if batch_id is not None else "no batch is pending now"
        raise CheckpointConflictError(
            f"consumer {store.consumer_name!r}: {now_pending}, not batch {expected_batch_id} (committed batch "
            f"{head.committed_batch_id}). Nothing was discarded or deleted; look again before discarding.",
            pending_batch_id=batch_id, expected_batch_id=expected_batch_id,
        )  # fmt: skip
    if batch_id is None:
        return dict(_NOTHING_DISCARDED)
    action = _output_action(head, _readable_pending_plan(store, head), output_path, names)
    result = {"discarded_batch_id": batch_id, "holder": head.pending_owner, "heartbeat_age_seconds": _heartbeat_age(head)}
    if dry_run:
        return {**result, "deleted_path": str(action.path) if action.path else None, "discarded_output": action.describe(True)}
    try:
        store.take_over(batch_id, owner, lease_seconds)  # never discard a batch a live run holds
    except BatchLeaseHeldError as err:
        fields = err.fields
        age, left = fields.get("heartbeat_age_seconds"), fields.get("seconds_left")
        beat = f"last heartbeat {age:.1f} s ago, at {fields.get('heartbeat_at')}" if isinstance(age, (int, float)) else "heartbeat unknown"
        when = (f"in {left:.0f} s (at {fields.get('takeover_at')})" if isinstance(left, (int, float))
                else "once its lease expired")  # fmt: skip
        raise BatchLeaseHeldError(
            f"pending batch {batch_id} of stream {store.stream_name!r}, consumer {store.consumer_name!r} is held by "
            f"{fields.get('holder')} ({beat}; lease: {names.lease_seconds} {lease_seconds:g}): a live run may be "
            f"writing {action.shown or 'its output'}. Nothing was discarded or deleted. If that run is dead, its batch "
            f"may be discarded {when}; if it is alive, it renews its lease: wait until it ends. Then try again.",
            batch_id=batch_id, holder=fields.get("holder"), heartbeat_age_seconds=age, heartbeat_at=fields.get("heartbeat_at"),
            seconds_left=left, takeover_at=fields.get("takeover_at"), lease_seconds=lease_seconds, path=action.shown,
        ) from err  # fmt: skip
    # Decided again now that this writer holds the batch: what is on disk may have changed meanwhile.
    action = _output_action(head, _readable_pending_plan(store, head), output_path, names)
    if action.path is not None:
        try:
            shutil.rmtree(action.path)  # refuses a symbolic link, and does not follow those inside
        except OSError:
            store.release(batch_id, owner)  # still pending: let the consumer's next run take it at once
            raise
        log.warning("deleted %s, the output directory of discarded batch %d", action.path, batch_id)
    else:
        log.warning("batch %d: %s", batch_id, action.describe(False))
    store.discard_pending(batch_id, owner)
    return {**result, "deleted_path": str(action.path) if action.path else None, "discarded_output": action.describe(False)}


def discard_pending(
    store: DynamoDBCheckpointStore,
    *,
    output_path: str | None = None,
    dry_run: bool = False,
    owner: str,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    expected_batch_id: int | None = None,
    names: ArgumentNames = OPERATOR_ARGUMENTS,
) -> dict[str, Any]:
    """Drop a consumer's pending (planned, uncommitted) batch, and its output directory when that is safe.

    The committed checkpoints are not touched: the consumer's next run plans the same batch id
    anew from them. This is what to do when a pending plan no longer fits the task (for example
    after its ``output_path`` changed). Shared by ``KinesisDiscardPendingBatchOperator`` and
    ``kinesis-spark discard-pending``; :func:`rewind` discards the same way.

    In order: the batch is taken over (refused while its holder's lease is alive), its output
    directory is deleted if allowed, and the batch is dropped from the HEAD (its plan stays in the
    batch log, never re-used). The only directory ever deleted is
    ``batch_output_location(output_path, batch_id)``, computed, never read from the stored plan,
    and only when the stored plan names exactly that location, it is local (a plain path or
    ``file://``), and it is a directory, not a symbolic link. A remote one is named for the caller
    to delete. Without ``output_path`` nothing is deleted.

    :param store: the consumer's ``DynamoDBCheckpointStore``.
    :param output_path: the consumer's output root, as the ingestion operator's ``output_path``.
    :param dry_run: change nothing; report what a real run would do.
    :param owner: the writer name used for the take-over.
    :param lease_seconds: the consumer's lease (seconds), as the ingestion operator's
        ``lease_seconds``: a holder whose last heartbeat is more recent is a live run.
    :param expected_batch_id: the pending batch the caller showed and had confirmed: if another
        batch (or none) is pending now, nothing is done.
    :param names: how the caller names its settings in messages (:data:`OPERATOR_ARGUMENTS`,
        :data:`CLI_FLAGS`).
    :returns: ``stream_name``, ``consumer_name``, ``dry_run``, ``committed_batch_id``,
        ``discarded_batch_id`` (the pending batch, dropped or, for a dry run, to be dropped;
        ``None`` when none is pending), ``holder`` and ``heartbeat_age_seconds`` (its holder and
        the age in seconds of its last heartbeat before the take-over; ``None`` without one or once
        the holder released its lease), ``deleted_path`` (the local directory
        deleted, or that a real run would delete; else ``None``) and ``discarded_output`` (one
        line: ``deleted <path>`` / ``would delete <path>``, or ``nothing deleted: <why>`` /
        ``would delete nothing: <why>``; ``None`` when none is pending).
    :raises BatchLeaseHeldError: a live run holds the batch (names the batch, the holder, its last
        heartbeat's age and time, the path, and in how many seconds the batch may be discarded if
        the holder is dead: fields ``seconds_left``, ``takeover_at``).
    :raises CheckpointConflictError: not ``expected_batch_id`` pending, or another writer moved first.
    :raises OSError: the directory could not be deleted; the batch stays pending, its lease released.
    """
    head = store.head()
    result = _discard(store, head, output_path=output_path, dry_run=dry_run, owner=owner, lease_seconds=lease_seconds,
                      expected_batch_id=expected_batch_id, names=names)  # fmt: skip
    return {"stream_name": store.stream_name, "consumer_name": store.consumer_name, "dry_run": dry_run,
            "committed_batch_id": head.committed_batch_id, **result}  # fmt: skip


def rewind(
    kinesis_client: KinesisClient,
    store: DynamoDBCheckpointStore,
    to: str | datetime,
    *,
    dry_run: bool = False,
    discard_pending: bool = False,
    output_path: str | None = None,
    owner: str,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    expected_batch_id: int | None = None,
    names: ArgumentNames = OPERATOR_ARGUMENTS,
) -> dict[str, Any]:
    """Set a consumer's checkpoints to ``to`` (``TRIM_HORIZON``, ``LATEST`` or a timestamp).

    Shared by the operator and the command-line tool. A dry run checks what a real run checks
    (a pending batch without ``discard_pending`` fails it too) and reports what it would do.

    :param kinesis_client: boto3 Kinesis client (for the shard list).
    :param store: the consumer's ``DynamoDBCheckpointStore``.
    :param dry_run: only compute and return the per-shard positions, and what would be discarded.
    :param discard_pending: drop a pending (planned, uncommitted) batch first, as
        :func:`discard_pending` does (never one a live run holds); without it a pending batch
        makes the rewind fail, since its retry would re-use the old plan.
    :param output_path: the consumer's output root (the ingestion operator's ``output_path``):
        the discarded batch's directory under it is deleted when :func:`discard_pending` allows.
    :param lease_seconds: the consumer's lease (seconds), see :func:`discard_pending`.
    :param expected_batch_id: see :func:`discard_pending`.
    :param names: see :func:`discard_pending`.
    :returns: ``to``, ``dry_run``, ``batch_id`` (of the rewind, ``None`` for a dry run),
        ``discarded_batch_id``, ``holder``, ``heartbeat_age_seconds``, ``deleted_path`` and
        ``discarded_output`` (as :func:`discard_pending` returns them) and ``shards`` (shard id ->
        ``from``, ``to``). The rewind commits under the discarded batch's id, so whatever that
        batch wrote to its directory would count as committed: delete it (``output_path``), or
        delete it yourself.
    :raises CheckpointConflictError: a batch is pending (without ``discard_pending``), or another
        writer moved first.
    :raises BatchLeaseHeldError: ``discard_pending``, and a live run holds the pending batch.
    :raises ValueError: ``to`` is not a valid target.
    """
    now = datetime.now(timezone.utc)
    shards = list_shards(kinesis_client, store.stream_ref)
    new = rewind_checkpoints(shards, to, now=now)
    head = store.head()
    current = store.committed_checkpoints(head)
    changes = {
        shard_id: {"from": str(current[shard_id]) if shard_id in current else None, "to": str(new.get(shard_id)) if shard_id in new else None}
        for shard_id in sorted(set(new) | set(current))
    }
    if head.pending_batch_id is not None and not discard_pending:
        raise CheckpointConflictError(
            f"consumer {store.consumer_name!r} has pending batch {head.pending_batch_id} (held by "
            f"{head.pending_owner}); its retry would re-use the old plan. Nothing was changed. Wait for it to finish, or "
            f"rewind with {names.discard_pending} to drop it first (with {names.output_path}, also its output directory).",
            pending_batch_id=head.pending_batch_id,
        )  # fmt: skip
    discarded = (
        _discard(store, head, output_path=output_path, dry_run=dry_run, owner=owner, lease_seconds=lease_seconds,
                 expected_batch_id=expected_batch_id, names=names)
        if discard_pending else dict(_NOTHING_DISCARDED)
    )  # fmt: skip
    result: dict[str, Any] = {"to": str(to), "dry_run": dry_run, "batch_id": None, **discarded, "shards": changes}
    if dry_run:
        return result
    store.ensure_table()
    result["batch_id"] = store.rewind(new, owner, now=now, open_shards=[s.shard_id for s in shards if not s.is_closed])
    return result
