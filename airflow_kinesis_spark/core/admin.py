"""Checkpoint administration shared by the rewind operator and the command-line tool. No Airflow import."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_kinesis_spark.core.planner import rewind_checkpoints
from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.exceptions import CheckpointConflictError

__all__ = ["rewind"]


def rewind(
    kinesis_client: Any, store: Any, to: str | datetime, *, dry_run: bool = False, discard_pending: bool = False, owner: str
) -> dict[str, Any]:
    """Set a consumer's checkpoints to ``to`` (``TRIM_HORIZON``, ``LATEST`` or a timestamp).

    Shared by the operator and the command-line tool.

    :param kinesis_client: boto3 Kinesis client (for the shard list).
    :param store: the consumer's ``DynamoDBCheckpointStore``.
    :param dry_run: only compute and return the per-shard positions.
    :param discard_pending: drop a pending (planned, uncommitted) batch first; without it a
        pending batch makes the rewind fail, since its retry would re-use the old plan.
    :returns: ``to``, ``dry_run``, ``batch_id`` (of the rewind, ``None`` for a dry run),
        ``discarded_batch_id``, ``discarded_output`` and ``shards`` (shard id -> ``from``, ``to``).
        The rewind commits under the discarded batch's id, so whatever that batch wrote would
        count as committed: a local output directory is deleted (``discarded_output`` says
        ``deleted ...``); a remote one is named for the caller to delete (``delete ...``).
    :raises CheckpointConflictError: a batch is pending (without ``discard_pending``), or another
        writer moved first.
    :raises ValueError: ``to`` is not a valid target.
    """
    now = datetime.now(timezone.utc)
    shards = list_shards(kinesis_client, store.stream_name)
    new = rewind_checkpoints(shards, to, now=now)
    head = store.head()
    current = store.committed_checkpoints(head)
    changes = {
        shard_id: {"from": str(current[shard_id]) if shard_id in current else None, "to": str(new.get(shard_id)) if shard_id in new else None}
        for shard_id in sorted(set(new) | set(current))
    }
    result: dict[str, Any] = {"to": str(to), "dry_run": dry_run, "batch_id": None, "discarded_batch_id": None,
                              "discarded_output": None, "shards": changes}  # fmt: skip
    if dry_run:
        return result
    if head.pending_batch_id is not None:
        if not discard_pending:
            raise CheckpointConflictError(
                f"consumer {store.consumer_name!r} has pending batch {head.pending_batch_id} (held by "
                f"{head.pending_owner}); its retry would re-use the old plan. Wait for it to finish, or rewind "
                "with discard_pending=True.",
                pending_batch_id=head.pending_batch_id,
            )
        discarded = store.pending_plan(head)
        store.discard_pending(head.pending_batch_id, owner)
        result["discarded_batch_id"] = head.pending_batch_id
        result["discarded_output"] = _remove_output(discarded.output_location if discarded else None)
    store.ensure_table()
    result["batch_id"] = store.rewind(new, owner, now=now, open_shards=[s.shard_id for s in shards if not s.is_closed])
    return result


def _remove_output(location: str | None) -> str | None:
    """Delete a discarded batch's local output; name a remote one. ``None`` when there is none."""
    import shutil
    from pathlib import Path
    from urllib.parse import urlparse

    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme else location)
        if not path.exists():
            return None
        shutil.rmtree(path)
        return f"deleted {location}"
    return f"delete {location}: the discarded batch may have written there"
