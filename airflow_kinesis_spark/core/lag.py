"""How far a consumer is behind: per-shard lag, backlog conditions, retention and trim-horizon gaps.

Lag here is *per consumer*: it is measured after the consumer's committed checkpoint, by looking
at the first unconsumed record of each shard (one ``GetRecords`` call with ``Limit`` 1). Its age
is what CloudWatch's ``GetRecords.IteratorAgeMilliseconds`` means, but for this consumer's
checkpoints rather than for a running reader, so it works on every emulator (kinesalite reports
``MillisBehindLatest`` 0 always; the service's value is kept where it is given).

A backlog count (for ``KinesisBacklogTrigger``) reads further: up to a bound of user records per
shard after the checkpoint, so "records waiting" is known exactly below the bound and as "at
least the bound" above it. Kinesis has no cheaper way to count records (sequence numbers are
not dense), so the bound is kept to one ``GetRecords`` ``Limit`` (10,000).

The I/O lives in the callers (sync in the sensors, async in the triggers); this module decides.
No Airflow import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_kinesis_spark.core.planner import BatchPlan, plan_incremental
from airflow_kinesis_spark.core.positions import (
    Checkpoint,
    Sentinel,
    format_timestamp,
    to_utc,
)
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.core.probes import probe_ranges
from airflow_kinesis_spark.core.read_options import GET_RECORDS_MAX_LIMIT, MIN_CALL_INTERVAL_S
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.shards import Shard, ShardLineage, describe_stream_summary, list_shards
from airflow_kinesis_spark.core.stream_summary import SummaryBudget

if TYPE_CHECKING:
    from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
    from mypy_boto3_kinesis import KinesisClient

__all__ = [
    "ShardLag",
    "LAG_INITIAL_POSITIONS",
    "validate_lag_arguments",
    "lag_plan",
    "shard_lag",
    "lag_summary",
    "lag_from_probes",
    "measure_lag",
    "backlog_ready",
    "retention_risks",
    "trim_gap",
    "known_until",
    "find_trim_gaps",
    "MIN_RETENTION",
    "topology_change",
    "ShardBacklog",
    "COUNT_MAX_GET_RECORDS_CALLS",
    "count_reader",
    "shard_backlog",
    "backlog_summary",
    "backlog_from_counts",
    "backlog_due",
]

#: The most ``GetRecords`` calls one backlog count makes on one shard: enough for a full page
#: and the empty response that shows the tip (or a few empty pages of a sparse shard).
COUNT_MAX_GET_RECORDS_CALLS = 3


@dataclass(frozen=True)
class ShardLag:
    """One shard's lag for one consumer.

    :param shard_id: the shard.
    :param checkpoint: the committed checkpoint (or the initial position) it is measured from.
    :param has_unconsumed: whether a record exists after the checkpoint.
    :param oldest_unconsumed_arrival: ``ApproximateArrivalTimestamp`` of the first unconsumed record (UTC).
    :param age_ms: milliseconds from that arrival to the measurement; ``None`` if nothing is unconsumed.
    :param millis_behind_latest: the service's ``MillisBehindLatest`` (ms) at the checkpoint, where given.
    """

    shard_id: str
    checkpoint: str
    has_unconsumed: bool
    oldest_unconsumed_arrival: datetime | None
    age_ms: int | None
    millis_behind_latest: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "has_unconsumed": self.has_unconsumed,
            "oldest_unconsumed_arrival": format_timestamp(self.oldest_unconsumed_arrival)
            if self.oldest_unconsumed_arrival
            else None,
            "age_ms": self.age_ms,
            "millis_behind_latest": self.millis_behind_latest,
        }


#: Where a lag measurement starts on a shard without a checkpoint (``AT_TIMESTAMP`` needs a
#: timestamp, which the sensors and triggers do not take).
LAG_INITIAL_POSITIONS = ("TRIM_HORIZON", "LATEST")


def validate_lag_arguments(
    *, initial_position: str = "TRIM_HORIZON", min_age_seconds: float | None = None, min_records: int | None = None
) -> None:
    """Check the arguments of a lag measurement and its thresholds (sensors and triggers alike).

    :param initial_position: one of :data:`LAG_INITIAL_POSITIONS`.
    :param min_age_seconds: ``None`` or >= 0 (seconds).
    :param min_records: ``None`` or an integer 1..10,000 (one ``GetRecords`` ``Limit``, Kinesis API reference).
    :raises ValueError: the first argument out of range, named.
    """
    if initial_position not in LAG_INITIAL_POSITIONS:
        raise ValueError(f"initial_position must be TRIM_HORIZON or LATEST; got {initial_position!r}")
    if min_age_seconds is not None and (isinstance(min_age_seconds, bool) or not min_age_seconds >= 0):
        raise ValueError(f"min_age_seconds must be >= 0 seconds or None; got {min_age_seconds!r}")
    if min_records is not None and (
        isinstance(min_records, bool) or not isinstance(min_records, int) or not 1 <= min_records <= GET_RECORDS_MAX_LIMIT
    ):
        raise ValueError(f"min_records must be an integer 1..{GET_RECORDS_MAX_LIMIT} or None; got {min_records!r}")


def lag_plan(
    stream_name: str, consumer_name: str, shards: Iterable[Shard], checkpoints: Mapping[str, Checkpoint], now: datetime,
    initial_position: str = "TRIM_HORIZON",
) -> BatchPlan:  # fmt: skip
    """The ranges whose first record tells the lag: every readable shard, from its checkpoint to now.

    Shards waiting for their parents are left out (a batch could not read them yet either).
    """
    return plan_incremental(
        batch_id=0, stream_name=stream_name, consumer_name=consumer_name, shards=shards, checkpoints=checkpoints,
        cutoff=now, now=now, output_location="", initial_position=initial_position, allow_data_loss=True,
    )  # fmt: skip


def shard_lag(shard_range: ShardRange, probe: ShardReport, now: datetime) -> ShardLag:
    """Lag of one shard from the probe of its range (see ``probes.probe_range``)."""
    arrival = probe.first_arrival if probe.records else None
    age = max(0, int((to_utc(now) - arrival).total_seconds() * 1000)) if arrival else None
    return ShardLag(
        shard_id=shard_range.shard_id,
        checkpoint=str(shard_range.start_checkpoint),
        has_unconsumed=probe.records > 0,
        oldest_unconsumed_arrival=arrival,
        age_ms=age,
        millis_behind_latest=probe.millis_behind_latest,
    )


def lag_summary(lags: Sequence[ShardLag], plan: BatchPlan, now: datetime) -> dict[str, Any]:
    """JSON-safe summary (the sensors' XCom): per shard lag, maxima, waiting shards."""
    ages = [lag.age_ms for lag in lags if lag.age_ms is not None]
    return {
        "stream_name": plan.stream_name,
        "consumer_name": plan.consumer_name,
        "measured_at": format_timestamp(now),
        "shards": {lag.shard_id: lag.to_dict() for lag in lags},
        "shards_with_unconsumed": sorted(lag.shard_id for lag in lags if lag.has_unconsumed),
        "max_age_ms": max(ages) if ages else 0,
        "waiting_shards": dict(plan.waiting),
    }


def lag_from_probes(plan: BatchPlan, probes: Sequence[ShardReport], now: datetime) -> dict[str, Any]:
    """:func:`lag_summary` of a :func:`lag_plan` from the probes of its ranges: what every lag
    measurement (sync, async, the CLI) returns once its probes are back.

    :param probes: one report per range of ``plan.ranges``, in that order (``probes.probe_range``).
    :param now: the time the plan was made for (UTC): ages are measured to it.
    :raises ValueError: not one probe per range.
    """
    return lag_summary([shard_lag(r, p, now) for r, p in zip(plan.ranges, probes, strict=True)], plan, now)


def backlog_ready(summary: Mapping[str, Any], min_age_seconds: float | None) -> bool:
    """Whether the backlog is worth a batch.

    :param min_age_seconds: with a number: the oldest unconsumed record is at least this old;
        with ``None``: any shard has an unconsumed record.
    """
    if min_age_seconds is None:
        return bool(summary["shards_with_unconsumed"])
    return bool(summary["shards_with_unconsumed"]) and summary["max_age_ms"] >= min_age_seconds * 1000


def retention_risks(summary: Mapping[str, Any], retention_period_hours: float, margin: timedelta) -> dict[str, int]:
    """Shards whose oldest unconsumed record is within ``margin`` of the retention period.

    :param retention_period_hours: the stream's ``RetentionPeriodHours`` (DescribeStreamSummary).
    :returns: shard id -> milliseconds left before the record ages out (may be negative).
    """
    limit_ms = int(retention_period_hours * 3_600_000)
    margin_ms = int(margin.total_seconds() * 1000)
    out = {}
    for shard_id, lag in summary["shards"].items():
        age = lag.get("age_ms")
        if age is not None and age >= limit_ms - margin_ms:
            out[shard_id] = limit_ms - age
    return out


def trim_gap(
    checkpoint: Checkpoint, oldest_sequence_number: str | None, oldest_arrival: datetime | None, trim_horizon: datetime
) -> bool:
    """Whether records after ``checkpoint`` may have aged out unread.

    Records after a checkpoint arrived at or after its ``clear_until`` (what the batch that made
    it knew). If that is after the trim horizon, nothing after the checkpoint can have been
    trimmed. Otherwise there is a gap when the checkpointed record itself is gone (the oldest
    record kept is past it) or, for an ``AT_TIMESTAMP`` checkpoint, the oldest record kept
    arrived after that timestamp.

    :param oldest_sequence_number: of the shard's oldest record kept (TRIM_HORIZON, Limit 1); ``None`` if empty.
    :param oldest_arrival: its ``ApproximateArrivalTimestamp``.
    :param trim_horizon: now minus the stream's retention period (UTC).
    """
    if oldest_sequence_number is None or checkpoint.sentinel in (Sentinel.TRIM_HORIZON, Sentinel.SHARD_END):
        return False
    known_until = checkpoint.clear_until or checkpoint.timestamp
    if known_until is not None and known_until >= to_utc(trim_horizon):
        return False
    if checkpoint.position is not None:
        return int(oldest_sequence_number) > int(checkpoint.position.sequence_number)
    return oldest_arrival is not None and checkpoint.timestamp is not None and oldest_arrival > checkpoint.timestamp


#: The shortest retention period a stream can have (24 hours, Kinesis developer guide).
MIN_RETENTION = timedelta(hours=24)


def known_until(checkpoint: Checkpoint) -> datetime | None:
    """Up to when the shard is known read after ``checkpoint``: the ``clear_until`` the batch that
    made it recorded, else an ``AT_TIMESTAMP`` checkpoint's timestamp; ``None`` when unknown."""
    return checkpoint.clear_until or checkpoint.timestamp


def find_trim_gaps(
    client: KinesisClient, stream_name: str, ranges: Iterable[ShardRange], now: datetime, *, min_call_interval: float = MIN_CALL_INTERVAL_S,
    budget: SummaryBudget | None = None,
) -> dict[str, str]:
    """Shards whose range starts after a checkpoint that may have fallen behind the trim horizon.

    Used for a new plan's ranges and for a pending plan's before it is re-used (a batch left
    pending for longer than the retention period). Costs nothing while every range's checkpoint
    is known good within 24 hours (:data:`MIN_RETENTION`, the shortest retention period);
    otherwise one DescribeStreamSummary and one TRIM_HORIZON probe (``Limit`` 1) per doubtful
    shard, decided by :func:`trim_gap`. The probes run in parallel (``probes.probe_ranges``: at
    most as many threads as the client pools connections).

    :param client: boto3 Kinesis client.
    :param budget: the host's ``DescribeStreamSummary`` budget (``core.stream_summary``): the
        call waits for its slot of the host's pacer (never answered from the cache: the retention
        period decides what counts as lost); ``None``: unpaced.
    :returns: shard id -> what was found (checkpoint, oldest record kept, retention, trim horizon),
        for messages; empty when no records can have aged out unread.
    """
    now = to_utc(now)
    doubtful = [
        r for r in ranges
        if r.start_checkpoint.sentinel is not Sentinel.TRIM_HORIZON
        and ((known := known_until(r.start_checkpoint)) is None or known < now - MIN_RETENTION)
    ]  # fmt: skip
    if not doubtful:
        return {}
    retention = float(describe_stream_summary(client, stream_name, budget=budget)["RetentionPeriodHours"])
    horizon = now - timedelta(hours=retention)
    from_horizon = [
        ShardRange(rng.shard_id, StartPosition("TRIM_HORIZON"), Checkpoint(Sentinel.TRIM_HORIZON), now, rng.ending_sequence_number)
        for rng in doubtful
    ]
    gaps = {}
    for rng, oldest in zip(doubtful, probe_ranges(client, stream_name, from_horizon, min_call_interval=min_call_interval), strict=True):
        oldest_seq = oldest.first.sequence_number if oldest.first else None
        if trim_gap(rng.start_checkpoint, oldest_seq, oldest.first_arrival, horizon):
            gaps[rng.shard_id] = (
                f"checkpoint {rng.start_checkpoint}, oldest record kept {oldest_seq} "
                f"(retention {retention:g} h, trim horizon {format_timestamp(horizon)})"
            )
    return gaps


def topology_change(shards: Iterable[Shard], previous_open: Sequence[str]) -> dict[str, Any]:
    """How the open shards differ from ``previous_open`` (the last committed batch's).

    :returns: ``open_shards``, ``previous_open_shards``, ``new_shards``, ``closed_shards``,
        ``children`` (parent shard id -> its child shard ids, for the new shards) and ``changed``.
    """
    lineage = ShardLineage(shards)
    now_open = sorted(s.shard_id for s in lineage.shards.values() if not s.is_closed)
    new = sorted(set(now_open) - set(previous_open))
    closed = sorted(set(previous_open) - set(now_open))
    children: dict[str, list[str]] = {}
    for shard_id in new:
        for parent in lineage.shards[shard_id].parents:
            children.setdefault(parent, []).append(shard_id)
    return {
        "open_shards": now_open,
        "previous_open_shards": sorted(previous_open),
        "new_shards": new,
        "closed_shards": closed,
        "children": {k: sorted(v) for k, v in sorted(children.items())},
        "changed": bool(new or closed),
    }


@dataclass(frozen=True)
class ShardBacklog:
    """One shard's backlog for one consumer: its lag and how many user records wait.

    :param lag: the shard's :class:`ShardLag` (from the first record of the count).
    :param records: user records counted after the checkpoint (KPL aggregates de-aggregated).
    :param exact: ``True`` when the count reached the tip, the cutoff or the shard's end;
        ``False`` when it stopped at the bound or the call budget: at least ``records`` wait.
    """

    lag: ShardLag
    records: int
    exact: bool


def count_reader(stream_name: str, shard_range: ShardRange, bound: int) -> ShardReader:
    """A reader (no client: for a driver) that counts at most ``bound`` user records of a range.

    The range's stop rules hold as in a batch (cutoff, caught up, shard end); the record cap is
    ``bound`` and ``GetRecords`` ``Limit`` is ``bound``. An aggregated first record is taken
    whole, so the count may pass the bound.

    :param bound: 1..10,000 (``GetRecords`` returns at most 10,000 records, Kinesis API reference).
    :raises ValueError: a bound out of range.
    """
    if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= GET_RECORDS_MAX_LIMIT:
        raise ValueError(f"bound must be an integer 1..{GET_RECORDS_MAX_LIMIT} (GetRecords Limit), got {bound!r}")
    return ShardReader(None, stream_name, replace(shard_range, max_records=bound), limit=bound, min_call_interval=0,
                       initial_limit=bound)  # fmt: skip


def shard_backlog(shard_range: ShardRange, report: ShardReport, now: datetime, *, budget_spent: bool) -> ShardBacklog:
    """The backlog of one shard from its count (see :func:`count_reader`).

    :param budget_spent: the driver stopped before a stop rule held (its call budget ran out).
    """
    exact = not budget_spent and report.stop_reason in ("caught_up", "cutoff", "shard_end")
    return ShardBacklog(lag=shard_lag(shard_range, report, now), records=report.records, exact=exact)


def backlog_summary(backlogs: Sequence[ShardBacklog], plan: BatchPlan, now: datetime, bound: int) -> dict[str, Any]:
    """:func:`lag_summary` plus the counts: per shard ``records_waiting`` and
    ``records_waiting_exact``; in all ``records_waiting`` (sum), ``records_waiting_exact`` (every
    shard counted to its end) and ``count_bound`` (the per-shard bound)."""
    summary = lag_summary([b.lag for b in backlogs], plan, now)
    for backlog in backlogs:
        summary["shards"][backlog.lag.shard_id].update(records_waiting=backlog.records, records_waiting_exact=backlog.exact)
    summary["records_waiting"] = sum(b.records for b in backlogs)
    summary["records_waiting_exact"] = all(b.exact for b in backlogs)
    summary["count_bound"] = bound
    return summary


def backlog_from_counts(
    plan: BatchPlan, counts: Sequence[tuple[ShardReport, bool]], now: datetime, bound: int
) -> dict[str, Any]:  # fmt: skip
    """:func:`backlog_summary` of a :func:`lag_plan` from the counts of its ranges.

    :param counts: per range of ``plan.ranges``, in that order: the count's report and whether its
        call budget ran out (``aio.count_range``).
    :raises ValueError: not one count per range.
    """
    backlogs = [shard_backlog(r, report, now, budget_spent=spent) for r, (report, spent) in zip(plan.ranges, counts, strict=True)]
    return backlog_summary(backlogs, plan, now, bound)


def backlog_due(summary: Mapping[str, Any], min_records: int | None, min_age_seconds: float | None) -> str | None:
    """Why the backlog is worth a batch, or ``None``: whichever threshold is passed first.

    :param min_records: at least this many user records wait (all shards together).
    :param min_age_seconds: the oldest unconsumed record is at least this old.
    :returns: ``"min_records"``, ``"min_age_seconds"``, ``"any_record"`` (both thresholds
        ``None`` and a record waits) or ``None``.
    """
    if not summary["shards_with_unconsumed"]:
        return None
    if min_records is None and min_age_seconds is None:
        return "any_record"
    if min_records is not None and summary["records_waiting"] >= min_records:
        return "min_records"
    if min_age_seconds is not None and summary["max_age_ms"] >= min_age_seconds * 1000:
        return "min_age_seconds"
    return None


def measure_lag(
    client: KinesisClient,
    store: DynamoDBCheckpointStore,
    *,
    initial_position: str = "TRIM_HORIZON",
    now: datetime | None = None,
    checkpoints: Mapping[str, Checkpoint] | None = None,
    on_plan: Callable[[BatchPlan, Sequence[Shard]], None] | None = None,
) -> dict[str, Any]:
    """Measure a consumer's lag with a boto3 Kinesis client: the sync driver of :func:`lag_plan`
    and :func:`lag_from_probes` (``aio.measure_lag`` is the async one).

    Calls: ``ListShards`` (paginated), the committed checkpoints unless given (``GetItem``,
    ``Query``), then one probe per readable shard (``probes.probe_ranges``: in parallel, at most
    as many calls in flight as the client pools connections).

    :param client: boto3 Kinesis client.
    :param store: the consumer's ``DynamoDBCheckpointStore``.
    :param initial_position: where shards without a checkpoint are measured from (:data:`LAG_INITIAL_POSITIONS`).
    :param now: the time of the measurement (UTC); default now.
    :param checkpoints: the committed checkpoints, when the caller read them already (shard id ->
        checkpoint); default: read from ``store``.
    :param on_plan: called with the plan and the listed shards before the probes start (e.g. for
        a progress display).
    :returns: :func:`lag_summary`'s dict.
    :raises StreamNotFoundError: the stream does not exist.
    """
    now = now or datetime.now(timezone.utc)
    shards = list_shards(client, store.stream_ref)
    if checkpoints is None:
        checkpoints = store.committed_checkpoints()
    plan = lag_plan(store.stream_ref, store.consumer_name, shards, checkpoints, now, initial_position)
    if on_plan is not None:
        on_plan(plan, shards)
    return lag_from_probes(plan, probe_ranges(client, store.stream_ref, plan.ranges, min_call_interval=0), now)
