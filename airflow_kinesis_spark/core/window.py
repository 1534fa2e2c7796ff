"""Window mode (backfill by time): plan the reading of ``[start, end)`` by ``ApproximateArrivalTimestamp``.

A window is read on every shard that may have been open during it (closed ones included): each
range starts with an ``AT_TIMESTAMP start`` iterator and stops at the first record arriving at or
after ``end`` (the reader's cutoff rule). A window never touches the incremental checkpoints, and
since it lies in the past its records are fixed: reading it again gives the same rows.

With few shards a window is cut into ``k`` time slices per shard, read in parallel; slice ``i``
is ``[t_i, t_{i+1})``, so a record on a boundary belongs to exactly one slice. This assumes what
the service gives: arrival timestamps that do not decrease along a shard's sequence numbers.

No Airflow import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    Sentinel,
    format_timestamp,
    to_utc,
)
from airflow_kinesis_spark.core.ranges import ShardRange, StartPosition
from airflow_kinesis_spark.core.shards import Shard, ShardLineage
from airflow_kinesis_spark.exceptions import DataLossError

__all__ = [
    "validate_window",
    "slice_bounds",
    "derive_slices",
    "plan_window",
    "validate_window_report",
    "window_label",
    "window_summary",
    "MAX_SLICES",
]

#: Slices per shard at most; more only adds GetShardIterator calls (5 per second per shard).
MAX_SLICES = 64


def _ms(value: datetime) -> datetime:
    """Truncate to milliseconds, the precision of ``ApproximateArrivalTimestamp``."""
    value = to_utc(value)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def validate_window(
    start: datetime, end: datetime, *, now: datetime, trim_horizon: datetime | None = None, allow_data_loss: bool = False
) -> str | None:
    """Check a window; return a description of the part lost to the trim horizon, if allowed.

    :param trim_horizon: now minus the stream's retention period (``None``: not checked).
    :raises ValueError: ``start >= end``, or ``end`` in the future (the window is not complete).
    :raises DataLossError: ``start`` is before the trim horizon and ``allow_data_loss`` is false.
    """
    start, end, now = to_utc(start), to_utc(end), to_utc(now)
    if start >= end:
        raise ValueError(f"window start {format_timestamp(start)} is not before its end {format_timestamp(end)}")
    if end > now:
        raise ValueError(
            f"window end {format_timestamp(end)} is in the future (now {format_timestamp(now)}): records may still "
            "arrive in it, so a re-run could differ. Backfill complete windows only."
        )
    if trim_horizon is not None and start < to_utc(trim_horizon):
        gap = f"[{format_timestamp(start)}, {format_timestamp(min(end, to_utc(trim_horizon)))}) is before the trim horizon {format_timestamp(trim_horizon)}"
        if not allow_data_loss:
            raise DataLossError(
                f"window {gap}: records that arrived then are no longer kept. Choose a window after the trim horizon, "
                "or pass allow_data_loss=True to read what exists and report the gap.",
                trim_horizon=format_timestamp(trim_horizon),
            )
        return gap
    return None


def derive_slices(start: datetime, end: datetime, shard_count: int, *, slice_length: timedelta, parallelism: int) -> int:
    """Slices per shard: enough to keep ``parallelism`` tasks busy, at most one per ``slice_length``.

    :returns: 1..``MAX_SLICES``.
    """
    by_length = max(1, math.ceil((to_utc(end) - to_utc(start)) / slice_length))
    by_tasks = max(1, math.ceil(parallelism / max(1, shard_count)))
    return max(1, min(MAX_SLICES, by_length, by_tasks))


def slice_bounds(start: datetime, end: datetime, slices: int) -> list[tuple[datetime, datetime]]:
    """``slices`` consecutive ``[t_i, t_{i+1})`` covering ``[start, end)``, on millisecond boundaries.

    :raises ValueError: ``slices`` outside 1..``MAX_SLICES``.
    """
    if not 1 <= slices <= MAX_SLICES:
        raise ValueError(f"time slices must be 1..{MAX_SLICES}; got {slices!r}")
    start, end = _ms(start), _ms(end)
    step = (end - start) / slices
    points = [start] + [_ms(start + step * i) for i in range(1, slices)] + [end]
    return [(a, b) for a, b in zip(points, points[1:], strict=False) if a < b]


def window_label(start: datetime, end: datetime) -> str:
    """The output partition value of a window, safe in any file system path.

    E.g. ``20261121T000000Z-20261121T001500Z`` (milliseconds appear when not zero).
    """

    def compact(value: datetime) -> str:
        value = _ms(value)
        text = value.strftime("%Y%m%dT%H%M%S")
        if value.microsecond:
            text += f".{value.microsecond // 1000:03d}"
        return text + "Z"

    return f"{compact(start)}-{compact(end)}"


def plan_window(
    *,
    stream_name: str,
    consumer_name: str,
    shards: Iterable[Shard],
    start: datetime,
    end: datetime,
    slices: int,
    now: datetime,
    output_location: str,
) -> BatchPlan:
    """Plan the ranges of a window: every listed shard, ``slices`` time slices each.

    A shard that closed before ``start`` or opened after ``end`` yields no record (its range
    ends at once: shard end, or the first record is past ``end``), so listing a few shards too
    many costs calls, not correctness.
    """
    bounds = slice_bounds(start, end, slices)
    ranges: list[ShardRange] = []
    for shard in ShardLineage(shards).ordered():
        for index, (a, b) in enumerate(bounds):
            ranges.append(
                ShardRange(
                    shard_id=shard.shard_id,
                    start=StartPosition("AT_TIMESTAMP", timestamp=a),
                    start_checkpoint=Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=a),
                    cutoff=b,
                    ending_sequence_number=shard.ending_sequence_number,
                    slice_index=index,
                    starting_hash_key=shard.starting_hash_key,
                    ending_hash_key=shard.ending_hash_key,
                )
            )
    return BatchPlan(
        batch_id=0,
        stream_name=stream_name,
        consumer_name=consumer_name,
        cutoff=_ms(end),
        created_at=to_utc(now),
        ranges=tuple(ranges),
        checkpoints={},
        output_location=output_location,
        mode="window",
        window_start=_ms(start),
    )


def window_summary(reports: Iterable[Any]) -> dict[str, Any]:
    """Per shard totals of a window's slice reports (JSON-safe)."""
    shards: dict[str, dict[str, Any]] = {}
    for report in reports:
        entry = shards.setdefault(report.shard_id, {"records": 0, "bytes": 0, "slices": 0, "quarantined": 0, "dead_letters": 0,
                                                     "out_of_range": 0})  # fmt: skip
        entry["records"] += report.records
        entry["bytes"] += report.bytes
        entry["slices"] += 1
        entry["quarantined"] += report.quarantined
        entry["dead_letters"] += report.dead_letters
        entry["out_of_range"] += report.out_of_range
    return shards


def validate_window_report(plan: BatchPlan, reports: Iterable[Any]) -> None:
    """Check that every planned (shard, slice) was read exactly once and none other.

    :raises ReportValidationError: naming the missing, repeated or unplanned ranges.
    """
    from collections import Counter

    from airflow_kinesis_spark.exceptions import ReportValidationError

    planned = Counter((r.shard_id, r.slice_index) for r in plan.ranges)
    seen = Counter((r.shard_id, r.slice_index) for r in reports)
    if seen != planned:
        missing = sorted(set(planned) - set(seen))
        extra = sorted(set(seen) - set(planned))
        twice = sorted(k for k, n in seen.items() if n > 1)
        raise ReportValidationError(
            f"window [{format_timestamp(plan.window_start or plan.cutoff)}, {format_timestamp(plan.cutoff)}): the Spark "
            f"job's report does not match the plan (missing {missing}, unplanned {extra}, repeated {twice})"
        )
