"""Batch planning: committed checkpoints + shard lineage + mode -> a batch plan; and the checks
that turn a Spark job's per-shard report into the next checkpoints.

No Airflow import: the plan is built by the operator and read by the Spark job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    ExtendedSequenceNumber,
    Sentinel,
    format_timestamp,
    parse_timestamp,
    to_utc,
)
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.core.shards import Shard, ShardLineage
from airflow_kinesis_spark.exceptions import DataLossError, ReportValidationError

log = logging.getLogger(__name__)

__all__ = [
    "BatchPlan",
    "plan_incremental",
    "initial_checkpoint",
    "advance",
    "validate_report",
    "rewind_checkpoints",
    "output_settings",
    "INITIAL_POSITIONS",
]

INITIAL_POSITIONS = ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP")


@dataclass(frozen=True)
class BatchPlan:
    """One planned batch, persisted before any record is read.

    :param batch_id: monotonically increasing per (stream, consumer), from 1.
    :param stream_name: the stream.
    :param consumer_name: the consumer (application) name: the checkpoints' namespace.
    :param cutoff: records arriving at or after this are left for a later batch (UTC).
    :param created_at: when the plan was made (UTC).
    :param ranges: the shard ranges to read, parents before children.
    :param checkpoints: every committed checkpoint the plan starts from, by shard id.
    :param output_location: where the batch's output goes (derived from the batch id).
    :param waiting: shards not planned and why (e.g. a parent not at ``SHARD_END``).
    :param lost_shards: checkpointed shards that vanished before ``SHARD_END`` and were passed
        over with ``allow_data_loss=True`` (their unread records are lost).
    :param open_shards: the stream's open shards at planning time (the topology the resharding
        sensor compares against).
    :param trim_gaps: shard id -> description of records that may have aged out unread after the
        checkpoint, passed over with ``allow_data_loss=True``.
    :param mode: ``incremental``, or ``window`` (then ``cutoff`` is the window's end).
    :param window_start: in window mode, the window's start (UTC).
    :param checkpoint_table: the DynamoDB table the plan is stored in (checked when a pending plan
        is re-used; ``None`` in plans of earlier versions and window plans).
    :param output: what the job writes for the output form
        (:meth:`airflow_kinesis_spark.sinks.OutputSpec.to_dict`; ``None``: Parquet, as plans of
        earlier versions).
    :param consumer_arn: with enhanced fan-out (``consumer_type="efo"``), the registered stream
        consumer the job subscribes as (``core.consumers``); ``None``: polling (GetRecords).
    :param task_settings: settings of the task that planned the batch which the ranges do not
        show, compared when the pending plan is re-used (``transform``: ``module:function`` or
        ``None``); ``None`` in plans of earlier versions (nothing to compare).
    """

    batch_id: int
    stream_name: str
    consumer_name: str
    cutoff: datetime
    created_at: datetime
    ranges: tuple[ShardRange, ...]
    checkpoints: Mapping[str, Checkpoint]
    output_location: str
    mode: str = "incremental"
    waiting: Mapping[str, str] = field(default_factory=dict)
    lost_shards: tuple[str, ...] = ()
    open_shards: tuple[str, ...] = ()
    trim_gaps: Mapping[str, str] = field(default_factory=dict)
    window_start: datetime | None = None
    checkpoint_table: str | None = None
    output: Mapping[str, Any] | None = None
    consumer_arn: str | None = None
    task_settings: Mapping[str, Any] | None = None

    @property
    def shard_ids(self) -> list[str]:
        return [r.shard_id for r in self.ranges]

    @property
    def window(self) -> tuple[datetime, datetime]:
        """A window plan's ``(start, end)``: arrival times, UTC, end excluded.

        :raises ValueError: an incremental plan (it has no window).
        """
        if self.window_start is None:
            raise ValueError(f"batch {self.batch_id} of {self.stream_name!r} is an incremental plan: it has no window")
        return self.window_start, self.cutoff

    def without_resume_iterators(self) -> BatchPlan:
        """This plan without the checkpoints' stored shard iterators (``Checkpoint.resume_iterator``):
        the probes use them before the plan is persisted; the persisted plan need not carry them
        (the job reads from the positions, and its report brings the new ones)."""
        return replace(
            self,
            ranges=tuple(replace(r, start_checkpoint=r.start_checkpoint.without_resume_iterator()) for r in self.ranges),
            checkpoints={k: v.without_resume_iterator() for k, v in self.checkpoints.items()},
        )

    def digest(self) -> str:
        """SHA-256 (hex) of the plan's canonical form (its :meth:`to_dict` as JSON, keys sorted):
        what a job checks the stored plan against (``core.job``, BOUND). A plan read back from
        the store has the digest of the plan that was stored."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "stream_name": self.stream_name,
            "consumer_name": self.consumer_name,
            "mode": self.mode,
            "cutoff": format_timestamp(self.cutoff),
            "created_at": format_timestamp(self.created_at),
            "output_location": self.output_location,
            "ranges": [r.to_dict() for r in self.ranges],
            "checkpoints": {k: v.to_dict() for k, v in sorted(self.checkpoints.items())},
            "waiting": dict(self.waiting),
            "lost_shards": list(self.lost_shards),
            "open_shards": list(self.open_shards),
            "trim_gaps": dict(self.trim_gaps),
            "window_start": format_timestamp(self.window_start) if self.window_start else None,
            "checkpoint_table": self.checkpoint_table,
            "output": dict(self.output) if self.output else None,
            "consumer_arn": self.consumer_arn,
            "task_settings": dict(self.task_settings) if self.task_settings is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchPlan:
        return cls(
            batch_id=int(data["batch_id"]),
            stream_name=data["stream_name"],
            consumer_name=data["consumer_name"],
            mode=data.get("mode", "incremental"),
            cutoff=parse_timestamp(data["cutoff"]),
            created_at=parse_timestamp(data["created_at"]),
            output_location=data["output_location"],
            ranges=tuple(ShardRange.from_dict(r) for r in data["ranges"]),
            checkpoints={k: Checkpoint.from_dict(v) for k, v in data["checkpoints"].items()},
            waiting=dict(data.get("waiting", {})),
            lost_shards=tuple(data.get("lost_shards", ())),
            open_shards=tuple(data.get("open_shards", ())),
            trim_gaps=dict(data.get("trim_gaps", {})),
            window_start=parse_timestamp(data["window_start"]) if data.get("window_start") else None,
            checkpoint_table=data.get("checkpoint_table"),
            output=data.get("output"),
            consumer_arn=data.get("consumer_arn"),
            task_settings=data.get("task_settings"),
        )


def output_settings(output: Mapping[str, Any]) -> dict[str, Any]:
    """The DAG author's settings of a plan's output spec (``BatchPlan.output``): the spec without
    the ``max_records_per_file`` a ``target_file_size`` derives at planning. What a pending plan
    is compared on; specs of earlier versions have no ``target_file_size`` (``0``: none)."""
    data = {"target_file_size": 0, **output}
    if data["target_file_size"]:
        data.pop("max_records_per_file", None)
    if data.get("records") and "versions" in data["records"]:  # resolved at planning from the registry
        data["records"] = {k: v for k, v in data["records"].items() if k != "versions"}
    return data


def initial_checkpoint(initial_position: str, *, now: datetime, initial_timestamp: datetime | None = None) -> Checkpoint:
    """The checkpoint a never-seen shard starts from.

    ``LATEST`` becomes ``AT_TIMESTAMP now``: a fixed point, so a re-run of the plan reads the
    same records.

    :raises ValueError: on an unknown position, or ``AT_TIMESTAMP`` without a timestamp.
    """
    if initial_position == "TRIM_HORIZON":
        return Checkpoint(Sentinel.TRIM_HORIZON)
    if initial_position == "LATEST":
        return Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=now)
    if initial_position == "AT_TIMESTAMP":
        if initial_timestamp is None:
            raise ValueError("initial_position='AT_TIMESTAMP' needs initial_timestamp (an ISO 8601 UTC time)")
        return Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=initial_timestamp)
    raise ValueError(f"initial_position must be one of {', '.join(INITIAL_POSITIONS)}; got {initial_position!r}")


def plan_incremental(
    *,
    batch_id: int,
    stream_name: str,
    consumer_name: str,
    shards: Iterable[Shard],
    checkpoints: Mapping[str, Checkpoint],
    cutoff: datetime,
    now: datetime,
    output_location: str,
    initial_position: str = "TRIM_HORIZON",
    initial_timestamp: datetime | None = None,
    max_records_per_shard: int | None = None,
    max_bytes_per_shard: int | None = None,
    allow_data_loss: bool = False,
) -> BatchPlan:
    """Plan an incremental batch: from each committed checkpoint up to ``cutoff``.

    * A shard at ``SHARD_END`` is done and not planned.
    * A never-seen shard starts at ``initial_position``; a child of shards this consumer has
      checkpointed starts at ``TRIM_HORIZON``, once every parent is at ``SHARD_END`` (ORDER).
    * ``cutoff`` is clamped to ``now``: a record arriving after planning can never be in the
      plan's range, so re-running the plan reads the same records.

    :param cutoff: the run's ``data_interval_end`` (or now), UTC.
    :param now: the planning time, UTC.
    :param allow_data_loss: go on when a shard with a checkpoint short of ``SHARD_END`` is no
        longer listed (its unread records are lost); logged as a warning.
    :returns: the plan; it may have no ranges.
    :raises ValueError: on a cap below 1 or an unknown initial position.
    :raises DataLossError: a checkpointed shard vanished before reaching ``SHARD_END`` (LOUD).
    """
    for name, cap in (("max_records_per_shard", max_records_per_shard), ("max_bytes_per_shard", max_bytes_per_shard)):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be a positive integer or None; got {cap!r}")
    # Milliseconds, the precision of ApproximateArrivalTimestamp and of the stored plan: the probes
    # (on this plan) and every attempt of the job (on the stored plan) then stop at the same record,
    # and a LATEST start (at now) is never after the cutoff.
    now = parse_timestamp(format_timestamp(to_utc(now)))
    cutoff = min(parse_timestamp(format_timestamp(to_utc(cutoff))), now)
    lineage = ShardLineage(shards)
    vanished = sorted(k for k, v in checkpoints.items() if k not in lineage.shards and not v.is_shard_end)
    if vanished:
        message = (
            f"shards {', '.join(vanished)} of stream {stream_name!r} have checkpoints short of SHARD_END "
            f"but are no longer listed: their unread records aged out of the retention period"
        )
        if not allow_data_loss:
            raise DataLossError(
                message + ". Nothing was read. To go on without those records, re-run with allow_data_loss=True.",
                shard_ids=vanished,
            )
        log.warning("%s; going on because allow_data_loss=True: they count as SHARD_END", message)
    known = {k: (Checkpoint(Sentinel.SHARD_END) if k in vanished else v) for k, v in checkpoints.items()}
    # A shard at SHARD_END that aged out of the stream is retired once all its children have
    # checkpoints of their own (until then it tells the planner its children start at TRIM_HORIZON).
    retired = sorted(
        k for k, v in known.items()
        if v.is_shard_end and k not in lineage.shards and all(c in known for c in lineage.children.get(k, ()))
    )  # fmt: skip
    for shard_id in retired:
        log.info("shard %s: at SHARD_END and no longer listed; retired from the checkpoints", shard_id)
    ranges: list[ShardRange] = []
    waiting: dict[str, str] = {}
    for shard in lineage.ordered():
        checkpoint = known.get(shard.shard_id)
        if checkpoint is not None and checkpoint.is_shard_end:
            continue
        # ORDER: a shard is read only after every parent reached SHARD_END, whether it has a
        # checkpoint or not (a rewind gives children checkpoints before their parents finish).
        if not lineage.parents_finished(shard, known):
            waiting[shard.shard_id] = "waiting for parent shards " + ", ".join(shard.parents) + " to reach SHARD_END"
            log.info("shard %s: not planned, %s", shard.shard_id, waiting[shard.shard_id])
            continue
        if checkpoint is None:
            if any(p in known for p in shard.parents):
                checkpoint = Checkpoint(Sentinel.TRIM_HORIZON)
            else:
                checkpoint = initial_checkpoint(initial_position, now=now, initial_timestamp=initial_timestamp)
        ranges.append(
            ShardRange(
                shard_id=shard.shard_id,
                start=StartPosition.after(checkpoint),
                start_checkpoint=checkpoint,
                cutoff=cutoff,
                ending_sequence_number=shard.ending_sequence_number,
                max_records=max_records_per_shard,
                max_bytes=max_bytes_per_shard,
                starting_hash_key=shard.starting_hash_key,
                ending_hash_key=shard.ending_hash_key,
            )
        )
    return BatchPlan(
        batch_id=batch_id,
        stream_name=stream_name,
        consumer_name=consumer_name,
        cutoff=cutoff,
        created_at=now,
        ranges=tuple(ranges),
        checkpoints={k: v for k, v in known.items() if k not in retired},
        output_location=output_location,
        waiting=waiting,
        lost_shards=tuple(vanished),
        open_shards=tuple(sorted(s.shard_id for s in lineage.shards.values() if not s.is_closed)),
    )


def restart_from_trim_horizon(plan: BatchPlan, gaps: Mapping[str, str]) -> BatchPlan:
    """``plan`` with the ranges of the gapped shards starting at the oldest record kept.

    What ``allow_data_loss=True`` does to a shard whose checkpoint fell behind the trim horizon
    (:func:`~airflow_kinesis_spark.core.lag.find_trim_gaps`): read from ``TRIM_HORIZON``, and
    record the gap in the plan (``trim_gaps``) so the summary reports it.
    """
    from_horizon = Checkpoint(Sentinel.TRIM_HORIZON)
    ranges = tuple(
        replace(r, start=StartPosition.after(from_horizon), start_checkpoint=from_horizon) if r.shard_id in gaps else r
        for r in plan.ranges
    )
    return replace(plan, ranges=ranges, trim_gaps={**plan.trim_gaps, **gaps})


def advance(shard_range: ShardRange, report: ShardReport) -> Checkpoint:
    """The checkpoint of a shard after its range's output is committed.

    ``SHARD_END`` if the shard's end was reached; else the last user record read; else, when
    nothing was read from an ``AT_TIMESTAMP`` start, ``AT_TIMESTAMP cutoff`` (no record arrived
    in between); else the starting checkpoint, unchanged. The result's ``clear_until`` is the
    cutoff when reading stopped at the cutoff or the tip (every later record arrives after it),
    else the last record's arrival. Its ``resume_iterator`` is the report's ``next_iterator``
    (a polled read that stopped at the tip; none otherwise).
    """
    if report.shard_end:
        return Checkpoint(Sentinel.SHARD_END)
    return _advanced(shard_range, report).with_resume_iterator(report.next_iterator, report.next_iterator_at)


def _advanced(shard_range: ShardRange, report: ShardReport) -> Checkpoint:
    reached_cutoff = report.stop_reason in ("cutoff", "caught_up")
    start = shard_range.start_checkpoint
    if report.last is not None:
        return Checkpoint(position=report.last, clear_until=shard_range.cutoff if reached_cutoff else report.last_arrival)
    if not reached_cutoff:
        return start
    if start.sentinel is Sentinel.AT_TIMESTAMP:
        assert start.timestamp is not None
        moved = max(start.timestamp, shard_range.cutoff)
        return Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=moved, clear_until=moved)
    return start.with_clear_until(max(shard_range.cutoff, start.clear_until or shard_range.cutoff))


def validate_report(plan: BatchPlan, reports: Iterable[ShardReport]) -> dict[str, Checkpoint]:
    """Check a job's per-shard report against the plan; return every checkpoint after the batch.

    :returns: shard id -> checkpoint, for every shard the plan knew plus every planned one.
    :raises ReportValidationError: a planned shard missing or reported twice, an unplanned
        shard, counts that do not add up, or positions outside the planned range.
    """
    by_shard: dict[str, ShardReport] = {}
    for report in reports:
        if report.shard_id in by_shard:
            raise ReportValidationError(f"batch {plan.batch_id}: shard {report.shard_id} reported twice")
        by_shard[report.shard_id] = report
    planned = {r.shard_id: r for r in plan.ranges}
    problems: list[str] = []
    if missing := sorted(set(planned) - set(by_shard)):
        problems.append(f"planned shards missing from the report: {', '.join(missing)}")
    if extra := sorted(set(by_shard) - set(planned)):
        problems.append(f"unplanned shards in the report: {', '.join(extra)}")
    checkpoints = dict(plan.checkpoints)
    for shard_id, rng in planned.items():
        shard_report = by_shard.get(shard_id)
        if shard_report is None:
            continue
        problems.extend(f"shard {shard_id}: {p}" for p in _range_problems(rng, shard_report))
        checkpoints[shard_id] = advance(rng, shard_report)
    if problems:
        raise ReportValidationError(
            f"batch {plan.batch_id} of {plan.stream_name}/{plan.consumer_name}: the Spark job's report does "
            "not match the plan, so nothing is committed: " + "; ".join(problems),
            batch_id=plan.batch_id,
        )
    return checkpoints


def _range_problems(rng: ShardRange, report: ShardReport) -> list[str]:
    problems = []
    if report.records < 0 or report.bytes < 0:
        problems.append("negative counts")
    consumed = report.records + report.quarantined
    if (consumed == 0) != (report.last is None) or (report.first is None) != (report.last is None):
        problems.append(f"{report.records} records, {report.quarantined} quarantined, but first={report.first}, last={report.last}")
    if report.first is not None and report.last is not None:
        if report.last < report.first:
            problems.append(f"last {report.last} before first {report.first}")
        start = rng.start_checkpoint.position
        if start is not None and not _after(report.first, start):
            problems.append(f"first record {report.first} is not after the checkpoint {start}")
        if rng.ending_sequence_number and int(report.last.sequence_number) > int(rng.ending_sequence_number):
            problems.append(f"last record {report.last} is past the shard's end {rng.ending_sequence_number}")
        # The cap is passed only by the first Kinesis record holding user records (an aggregate
        # is never cut), so all of them then share one sequence number.
        single_aggregate = report.first.sequence_number == report.last.sequence_number or report.kinesis_records <= 1
        if rng.max_records is not None and report.records > rng.max_records and not single_aggregate:
            problems.append(f"{report.records} records exceed the cap of {rng.max_records}")
    return problems


def _after(position: ExtendedSequenceNumber, checkpoint: ExtendedSequenceNumber) -> bool:
    if checkpoint.sub_sequence_number is None:
        return int(position.sequence_number) > int(checkpoint.sequence_number)
    return position.key > checkpoint.key


def rewind_checkpoints(shards: Iterable[Shard], to: str | datetime, *, now: datetime) -> dict[str, Checkpoint]:
    """The checkpoints that make a consumer re-read (or skip) from a point in time.

    * ``TRIM_HORIZON``: every listed shard from its oldest record kept.
    * ``LATEST``: open shards from ``now`` (``AT_TIMESTAMP``); closed shards at ``SHARD_END``.
    * a timestamp: every listed shard ``AT_TIMESTAMP`` it (a shard closed before it ends at once).

    Children wait for their parents as always (ORDER), so a rewind never reorders a key.

    :param to: ``TRIM_HORIZON``, ``LATEST``, or an aware/ISO 8601 timestamp (UTC), not in the future.
    :raises ValueError: on anything else.
    """
    shard_list = list(shards)
    if to == "TRIM_HORIZON":
        return {s.shard_id: Checkpoint(Sentinel.TRIM_HORIZON) for s in shard_list}
    now = to_utc(now)
    if to == "LATEST":
        return {
            s.shard_id: Checkpoint(Sentinel.SHARD_END) if s.is_closed else Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=now)
            for s in shard_list
        }
    try:
        moment = parse_timestamp(to)
    except (TypeError, ValueError) as err:
        raise ValueError(f"rewind target {to!r} is not TRIM_HORIZON, LATEST or an ISO 8601 timestamp") from err
    if moment > now:
        raise ValueError(f"rewind target {format_timestamp(moment)} is in the future")
    return {s.shard_id: Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=moment) for s in shard_list}
