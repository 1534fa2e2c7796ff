"""Where batches and windows write, and the id that names one plan of a batch.

Every location is derived from the task's output root and the plan's identity, never read from a
stored plan: a batch's folder (:func:`batch_output_location`; with the plan's :func:`plan_id` for
a table output, :func:`planned_output_location`), a Parquet batch's committed record
(:func:`committed_record_location`, :func:`committed_record_of`) and a window's folder
(:func:`window_output_location`). The protocol (``core.protocol``) plans with them, the pending
plan's check (``core.pending``) compares with them, the job (``core.job``) and the sinks derive
the same locations from them.

No Airflow import.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_kinesis_spark.core.names import stream_name_of
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import format_timestamp
from airflow_kinesis_spark.core.window import window_label

if TYPE_CHECKING:
    from airflow_kinesis_spark.sinks import Sink

__all__ = [
    "batch_output_location",
    "planned_output_location",
    "plan_id",
    "committed_record_location",
    "committed_record_of",
    "COMMITTED_DIR",
    "window_output_location",
]


def _is_table(sink: Sink | None) -> bool:
    """Whether ``sink`` writes a table (Iceberg, Delta), not Parquet folders."""
    return sink is not None and sink.format != "parquet"


def batch_output_location(output_root: str, batch_id: int, plan_id: str | None = None) -> str:
    """``{output_root}/batch_id={batch_id}`` (Parquet: the folder readers see as the batch), or with
    ``plan_id`` (tables) ``{output_root}/batch_id={batch_id}-{plan_id}``: a folder only that plan
    of the batch writes, so no attempt of another plan (a re-created checkpoint table, another
    consumer) can replace files a table's snapshot or version references."""
    return f"{output_root.rstrip('/')}/batch_id={batch_id}" + (f"-{plan_id}" if plan_id else "")


#: The folder of Parquet output's committed records under the output root (a ``_`` folder:
#: readers of the output root skip it; ``airflow_kinesis_spark.sinks.parquet``).
COMMITTED_DIR = "_committed"


def committed_record_location(output_root: str, batch_id: int) -> str:
    """``{output_root}/_committed/batch_id={batch_id}/manifest``: Parquet batch ``batch_id``'s
    committed record (its data files, one URI per line)."""
    return f"{output_root.rstrip('/')}/{COMMITTED_DIR}/batch_id={batch_id}/manifest"


def committed_record_of(output_location: str) -> str | None:
    """The committed record a Parquet batch folder ``{root}/batch_id=N`` would have
    (:func:`committed_record_location`); ``None`` for any other location (a table's plan folder,
    a window's)."""
    root, _, name = output_location.rstrip("/").rpartition("/")
    number = name.removeprefix("batch_id=")
    return committed_record_location(root, int(number)) if name.startswith("batch_id=") and number.isdigit() else None


def plan_id(plan: BatchPlan) -> str:
    """12 hex digits that identify one plan of a batch: a digest of its stream, consumer,
    checkpoint table, batch id and creation time (ms). A re-run of the batch re-uses the plan
    and so the id; a batch of the same id planned by another checkpoint history gets another."""
    text = "\n".join([stream_name_of(plan.stream_name), plan.consumer_name, plan.checkpoint_table or "", str(plan.batch_id),
                      format_timestamp(plan.created_at)])  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def planned_output_location(output_root: str, plan: BatchPlan, sink: Sink | None) -> str:
    """Where batch ``plan`` writes: :func:`batch_output_location` of the task's root, with the
    plan's :func:`plan_id` for a table output. Derived from the task's settings and the plan's
    identity, never read from a stored plan."""
    return batch_output_location(output_root, plan.batch_id, plan_id(plan) if _is_table(sink) else None)


def window_output_location(output_root: str, start: datetime, end: datetime) -> str:
    """``{output_root}/window={label}`` (:func:`~airflow_kinesis_spark.core.window.window_label`)."""
    return f"{output_root.rstrip('/')}/window={window_label(start, end)}"
