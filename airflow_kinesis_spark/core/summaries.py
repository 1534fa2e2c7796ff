"""What a run reports: the summary it returns (the operator's XCom) and the task log's account.

* :func:`incremental_summary`: an incremental run's summary, JSON-safe (committed, committed
  without records, or no new records);
* :func:`window_run_summary`: a window run's;
* :func:`log_outcome`: from a summary and the job's reports, one INFO line per shard range, one
  for the batch or window, and a WARNING for quarantined, undecodable or out-of-range records.

The task log's lines keep the protocol's logger (``airflow_kinesis_spark.core.protocol``), where
they were written before this module held them: logging configurations and readers of the task
log filter on it. The protocol (``core.protocol``) calls these; this module does not import it.

No Airflow import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.positions import Checkpoint, format_timestamp
from airflow_kinesis_spark.core.ranges import ShardReport
from airflow_kinesis_spark.core.window import window_summary

if TYPE_CHECKING:
    from airflow_kinesis_spark.sinks import Sink

# The protocol's logger, not this module's: see the module docstring.
log = logging.getLogger("airflow_kinesis_spark.core.protocol")

__all__ = ["incremental_summary", "window_run_summary", "log_outcome"]


def incremental_summary(
    plan: BatchPlan, reports: Sequence[ShardReport], checkpoints: Mapping[str, Checkpoint], status: str, *, reused: bool,
    sink: Sink | None = None, table: Any = None,
) -> dict[str, Any]:
    """The run's summary (the operator's XCom), JSON-safe.

    :param status: ``committed``, ``committed_without_records`` or ``no_new_records``.
    :returns: ``batch_id``, ``status``, ``stream_name``, ``consumer_name``, ``records``, ``bytes``,
        ``output_path``, ``quarantined``, ``quarantine_path``, ``out_of_range``, ``cutoff``,
        ``reused_plan``, ``shards`` (per shard: ``records``, ``bytes``, ``first``, ``last``,
        ``checkpoint``, ``stop_reason``, ``shard_end``, ``quarantined``, ``out_of_range``),
        ``waiting_shards``, ``lost_shards``, ``trim_gaps``, ``output_format``, ``table`` (the
        sink's ``TableCommit`` as a dict: ``format``, ``table``, ``snapshot_id``, ``version``,
        ``files``, ``already_committed``; ``None`` when nothing was committed to a table).
    """
    committed = status == "committed"
    shards = {
        r.shard_id: {
            "records": r.records,
            "bytes": r.bytes,
            "first": str(r.first) if r.first else None,
            "last": str(r.last) if r.last else None,
            "checkpoint": str(checkpoints[r.shard_id]) if r.shard_id in checkpoints else None,
            "stop_reason": r.stop_reason,
            "shard_end": r.shard_end,
            "quarantined": r.quarantined,
            "dead_letters": r.dead_letters,
            "out_of_range": r.out_of_range,
        }
        for r in reports
    }
    records = sum(r.records for r in reports) if committed else 0
    quarantined = sum(r.quarantined for r in reports) if committed else 0
    dead_letters = sum(r.dead_letters for r in reports) if committed else 0
    return {
        "batch_id": plan.batch_id if status != "no_new_records" else None,
        "status": status,
        "stream_name": plan.stream_name,
        "consumer_name": plan.consumer_name,
        "records": records,
        "bytes": sum(r.bytes for r in reports) if committed else 0,
        "output_path": plan.output_location if records else None,
        "quarantined": quarantined,
        "dead_letters": dead_letters,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined or dead_letters else None,
        "out_of_range": sum(r.out_of_range for r in reports) if committed else 0,
        "cutoff": format_timestamp(plan.cutoff),
        "reused_plan": reused,
        "shards": shards,
        "waiting_shards": dict(plan.waiting),
        "lost_shards": list(plan.lost_shards),
        "trim_gaps": dict(plan.trim_gaps),
        "output_format": sink.format if sink is not None else "parquet",
        "table": table.to_dict() if table is not None else None,
    }


def window_run_summary(
    plan: BatchPlan, reports: Sequence[ShardReport], status: str, *, stream_name: str, start: datetime, end: datetime,
    time_slices: int, trim_gap: str | None, sink: Sink | None = None, table: Any = None,
) -> dict[str, Any]:
    """A window run's summary (the operator's XCom), JSON-safe; its per-shard part is
    :func:`~airflow_kinesis_spark.core.window.window_summary`.

    :param status: ``written`` or ``no_records``.
    :param trim_gap: the part of the window lost to the trim horizon (``allow_data_loss``), or ``None``.
    :param sink: the task's output form (``None``: Parquet folders).
    :param table: the sink's window commit (a ``TableCommit``), or ``None``.
    :returns: as ``core.window_run.run_window`` lists.
    """
    records = sum(r.records for r in reports)
    quarantined = sum(r.quarantined for r in reports)
    dead_letters = sum(r.dead_letters for r in reports)
    return {
        "mode": "window",
        "status": status,
        "stream_name": stream_name,
        "window_start": format_timestamp(start),
        "window_end": format_timestamp(end),
        "records": records,
        "bytes": sum(r.bytes for r in reports),
        "output_path": plan.output_location if records else None,
        "quarantined": quarantined,
        "dead_letters": dead_letters,
        "quarantine_path": f"{plan.output_location}/_quarantine" if quarantined or dead_letters else None,
        "out_of_range": sum(r.out_of_range for r in reports),
        "time_slices": int(time_slices),
        "shards": window_summary(reports),
        "trim_gap": trim_gap,
        "output_format": sink.format if sink is not None else "parquet",
        "table": table.to_dict() if table is not None else None,
    }


# -- what the task log says of a batch or a window --------------------------------------------


def _counts(counts: Mapping[str, int]) -> str:
    """``shardId-…1: 2, shardId-…2: 1`` (shards with a count above 0; at most five, then how many more)."""
    items = [f"{shard}: {n}" for shard, n in counts.items() if n]
    more = len(items) - 5
    return ", ".join(items[:5]) + (f" and {more} more shards" if more > 0 else "")


def _read_seconds(reports: Sequence[ShardReport]) -> float | None:
    """Seconds from the first range's read start to the last one's end, or ``None`` if the reports do not say."""
    spans = [(r.read_started, r.read_ended) for r in reports if r.read_started is not None and r.read_ended is not None]
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)


def log_outcome(plan: BatchPlan, reports: Sequence[ShardReport], summary: Mapping[str, Any], *, committed_by: str | None = None) -> None:
    """The task log's account of a committed batch or a written window, from its summary
    (:func:`incremental_summary`, :func:`window_run_summary`) and the job's reports:

    * one INFO line per shard range: shard (and time slice), start position, the last extended
      sequence number read and the stop rule that ended the read, records, bytes, seconds;
    * one INFO line for the batch: batch id (or window), shards, records, bytes, seconds reading
      and since planning, checkpoints committed, output;
    * a WARNING with the count per shard when records were quarantined (corrupt KPL aggregates),
      did not decode (``dead_letters``) or were read outside their shard's hash key range
      (``out_of_range``).

    :param committed_by: the writer that committed the batch earlier (a repeated commit).
    """
    window = summary.get("mode") == "window"
    label = (f"Window [{summary['window_start']}, {summary['window_end']})" if window else f"Batch {plan.batch_id}")
    starts = {(r.shard_id, r.slice_index): r.start for r in plan.ranges}
    for r in reports:
        slice_label = f" slice {r.slice_index}" if window else ""
        seconds = f", {r.read_ended - r.read_started:.2f} s" if r.read_started is not None and r.read_ended is not None else ""
        log.info("%s, shard %s%s: %s -> %s (%s), %d records, %d bytes%s", label, r.shard_id, slice_label,
                 starts.get((r.shard_id, r.slice_index), "?"), r.last or "nothing read", r.stop_reason, r.records, r.bytes,
                 seconds)  # fmt: skip
    read = _read_seconds(reports)
    timing = f"read in {read:.1f} s" if read is not None else "read time not reported"
    shards = len({r.shard_id for r in reports})
    if window:
        log.info("%s written: %d records, %d bytes from %d shards x %d time slices, %s; output %s", label,
                 summary["records"], summary["bytes"], shards, summary["time_slices"], timing, summary["output_path"])  # fmt: skip
    else:
        since = time.time() - plan.created_at.timestamp()
        checkpoints = sum(1 for s in summary["shards"].values() if s.get("checkpoint"))
        how = f"was committed already (by {committed_by})" if committed_by else "committed"
        log.info("%s %s: %d records, %d bytes from %d shards, %s, %.1f s since planned; %d checkpoints committed; output %s",
                 label, how, summary["records"], summary["bytes"], shards, timing, since, checkpoints,
                 summary["output_path"])  # fmt: skip
    quarantined: dict[str, int] = {}
    out_of_range: dict[str, int] = {}
    for r in reports:
        quarantined[r.shard_id] = quarantined.get(r.shard_id, 0) + r.quarantined
        out_of_range[r.shard_id] = out_of_range.get(r.shard_id, 0) + r.out_of_range
    if summary["quarantined"]:
        log.warning("%s: %d corrupt Kinesis records quarantined (%s), kept raw under %s and not in the output%s",
                    label, summary["quarantined"], _counts(quarantined), summary["quarantine_path"],
                    "" if window else "; the checkpoints moved past them")  # fmt: skip
    if summary.get("dead_letters"):
        dead: dict[str, int] = {}
        for r in reports:
            dead[r.shard_id] = dead.get(r.shard_id, 0) + r.dead_letters
        log.warning("%s: %d records did not decode (%s): dead letters kept raw with their error under %s, not in the "
                    "output's rows%s", label, summary["dead_letters"], _counts(dead), summary["quarantine_path"],
                    "" if window else "; the checkpoints moved past them because they are kept")  # fmt: skip
    if summary["out_of_range"]:
        log.warning("%s: %d user records outside their shard's hash key range (%s), kept in the output; a producer "
                    "aggregates user records of several shards into one Kinesis record",
                    label, summary["out_of_range"], _counts(out_of_range))  # fmt: skip
