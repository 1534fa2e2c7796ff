"""A window into its consumer's own output may cover only what the consumer has committed.

A window run (``core.window_run.run_window``) rewrites ``[start, end)`` of a stream. When its
output also holds the consumer's incremental batches, rows the window reads past the consumer's
committed checkpoints would be added a second time by the consumer's next batches:
:func:`check_window_position` refuses such a window before anything is read. ``settings`` is the
task's ``core.window_run.WindowSettings`` (this module does not import it: ``core.window_run``
imports this one).

No Airflow import.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.lag import known_until
from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.exceptions import WindowAheadError

if TYPE_CHECKING:  # type checking only: the store imports this module's neighbours
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore

__all__ = ["check_window_position"]


def check_window_position(plan: BatchPlan, settings: Any, store: DynamoDBCheckpointStore) -> None:
    """A window into its consumer's own output (a root or table that holds the consumer's
    incremental batches, or a consumer with committed batches in ``store``) may cover only what
    the consumer has committed: every shard the window reads must be checkpointed at
    ``SHARD_END`` or known read up to the window's end (``core.lag.known_until``). Otherwise a
    later incremental batch would add the window's newer rows a second time.

    Windows into an output no incremental batch of the consumer writes are not limited.

    :raises WindowAheadError: naming the shards, how far each is committed, the latest end the
        window may have, and the ways out; nothing read or written.
    """
    assert settings.sink is not None
    head = store.head()
    # The store answers at the cost of one read; the output only when the store has committed nothing.
    incremental = head.committed_batch_id > 0 or (
        settings.sink.latest_batch(settings.stream_name, settings.consumer_name, 0) is not None)  # fmt: skip
    if not incremental:
        return
    where = settings.sink.table or settings.sink.output_path or settings.output_root
    end = plan.cutoff
    if head.committed_batch_id == 0:
        raise WindowAheadError(
            f"Output {where} holds incremental batches of stream {stream_name_of(settings.stream_name)!r}, consumer "
            f"{settings.consumer_name!r}, and this window task's checkpoint table {store.table_name!r} has committed none "
            "of them, so the window cannot be checked against the consumer's committed position. Nothing was read or "
            "written. Give the window task the consumer's checkpoint_table, or write the window to another output_path "
            "or table.",
            window_end=format_timestamp(end), committed_until=None, shards={},
        )  # fmt: skip
    committed = store.committed_checkpoints(head)
    behind: dict[str, str] = {}
    until: list[datetime] = []
    for shard_id in sorted({r.shard_id for r in plan.ranges}):
        checkpoint = committed.get(shard_id)
        if checkpoint is not None and checkpoint.is_shard_end:
            continue
        known = known_until(checkpoint) if checkpoint is not None else None
        if known is not None and known >= end:
            continue
        behind[shard_id] = f"committed up to {format_timestamp(known)}" if known else (
            "never read by the consumer" if checkpoint is None else f"at {checkpoint}, time unknown")  # fmt: skip
        if known is not None:
            until.append(known)
    if not behind:
        return
    latest = min(until) if len(until) == len(behind) else None
    shards = "; ".join(f"{k}: {v}" for k, v in list(behind.items())[:5]) + (f"; and {len(behind) - 5} more" if len(behind) > 5 else "")
    bound = f"End the window at {format_timestamp(latest)} or earlier" if latest else "Run the window after the consumer's next batches"
    raise WindowAheadError(
        f"Window [{format_timestamp(plan.window_start or end)}, {format_timestamp(end)}) into output {where} reaches past what "
        f"consumer {settings.consumer_name!r} has committed ({shards}): the consumer's next incremental batches would add "
        f"those rows again. Nothing was read or written. {bound}, or write the window to another output_path or table "
        "(docs/backfill.md, windows and incremental batches).",
        window_end=format_timestamp(end), committed_until=format_timestamp(latest) if latest else None, shards=behind,
    )  # fmt: skip
