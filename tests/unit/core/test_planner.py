"""Batch planning, checkpoint advance and report validation (core/planner.py), shard lineage."""

from __future__ import annotations

from dataclasses import replace

import json
from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.planner import (
    BatchPlan,
    advance,
    initial_checkpoint,
    plan_incremental,
    validate_report,
)
from airflow_kinesis_spark.core.positions import Checkpoint, ExtendedSequenceNumber, Sentinel
from airflow_kinesis_spark.core.ranges import ShardRange, ShardReport, StartPosition
from airflow_kinesis_spark.core.shards import Shard, ShardLineage
from airflow_kinesis_spark.exceptions import DataLossError, ReportValidationError

NOW = datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)
CUTOFF = NOW - timedelta(minutes=5)
BASE = 49590338271490256608559692538361571095921575989136588898
MAX_HASH = str(2**128 - 1)


def sid(n: int) -> str:
    return f"shardId-{n:012d}"


def seq(i: int) -> str:
    return str(BASE + i * 10**20)


def shard(
    n: int,
    *,
    parent: int | None = None,
    adjacent: int | None = None,
    start: int = 0,
    end: int | None = None,
) -> Shard:
    return Shard(
        shard_id=sid(n),
        parent_shard_id=sid(parent) if parent is not None else None,
        adjacent_parent_shard_id=sid(adjacent) if adjacent is not None else None,
        starting_sequence_number=seq(start),
        ending_sequence_number=seq(end) if end is not None else None,
        starting_hash_key="0",
        ending_hash_key=MAX_HASH,
    )


def plan(shards, checkpoints=None, **kwargs) -> BatchPlan:
    args = dict(
        batch_id=7,
        stream_name="orders",
        consumer_name="lake",
        shards=shards,
        checkpoints=checkpoints or {},
        cutoff=CUTOFF,
        now=NOW,
        output_location="s3://bucket/orders/batch_id=7",
    )
    args.update(kwargs)
    return plan_incremental(**args)


def ranges(p: BatchPlan) -> dict[str, ShardRange]:
    return {r.shard_id: r for r in p.ranges}


def report(
    shard_id: str,
    first: ExtendedSequenceNumber | None = None,
    last: ExtendedSequenceNumber | None = None,
    *,
    records: int | None = None,
    kinesis_records: int | None = None,
    shard_end: bool = False,
    stop_reason: str | None = None,
) -> ShardReport:
    if records is None:
        records = 0 if last is None else 1
    return ShardReport(
        shard_id=shard_id,
        first=first,
        last=last,
        records=records,
        bytes=10 * records,
        kinesis_records=records if kinesis_records is None else kinesis_records,
        kinesis_bytes=10 * records,
        shard_end=shard_end,
        stop_reason=stop_reason or ("shard_end" if shard_end else "caught_up"),
    )


def E(i: int, sub: int | None = None) -> ExtendedSequenceNumber:  # noqa: N802
    return ExtendedSequenceNumber(seq(i), sub)


# -- plan_incremental: start positions -----------------------------------------------------------


def test_new_shards_start_at_trim_horizon_by_default():
    p = plan([shard(0), shard(1)])
    assert p.shard_ids == [sid(0), sid(1)]
    for rng in p.ranges:
        assert rng.start == StartPosition("TRIM_HORIZON")
        assert rng.start_checkpoint == Checkpoint(Sentinel.TRIM_HORIZON)
        assert rng.cutoff == CUTOFF
        assert rng.ending_sequence_number is None
    assert p.waiting == {}
    assert p.batch_id == 7 and p.created_at == NOW and p.mode == "incremental"


def test_latest_becomes_at_timestamp_now():
    p = plan([shard(0)], initial_position="LATEST")
    (rng,) = p.ranges
    assert rng.start_checkpoint == Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=NOW)
    assert rng.start == StartPosition("AT_TIMESTAMP", timestamp=NOW)
    assert rng.start.iterator_type != "LATEST"


def test_at_timestamp_initial_position_uses_initial_timestamp():
    ts = datetime(2024, 4, 1, tzinfo=timezone.utc)
    p = plan([shard(0)], initial_position="AT_TIMESTAMP", initial_timestamp=ts)
    assert p.ranges[0].start == StartPosition("AT_TIMESTAMP", timestamp=ts)


def test_at_timestamp_without_initial_timestamp_raises():
    with pytest.raises(ValueError, match="initial_timestamp"):
        plan([shard(0)], initial_position="AT_TIMESTAMP")


def test_unknown_initial_position_raises():
    with pytest.raises(ValueError, match="initial_position"):
        plan([shard(0)], initial_position="EARLIEST")
    with pytest.raises(ValueError):
        initial_checkpoint("SHARD_END", now=NOW)


def test_initial_position_ignored_for_checkpointed_shards():
    p = plan([shard(0), shard(1)], {sid(0): Checkpoint.at(seq(4))}, initial_position="LATEST")
    r = ranges(p)
    assert r[sid(0)].start == StartPosition("AFTER_SEQUENCE_NUMBER", sequence_number=seq(4))
    assert r[sid(1)].start.iterator_type == "AT_TIMESTAMP"


def test_committed_sequence_checkpoint_starts_after_it():
    checkpoint = Checkpoint.at(seq(5))
    p = plan([shard(0)], {sid(0): checkpoint})
    (rng,) = p.ranges
    assert rng.start == StartPosition("AFTER_SEQUENCE_NUMBER", sequence_number=seq(5))
    assert rng.start_checkpoint == checkpoint
    assert p.checkpoints == {sid(0): checkpoint}


def test_sub_sequence_checkpoint_starts_at_sequence_number_with_skip():
    p = plan([shard(0)], {sid(0): Checkpoint.at(seq(5), 3)})
    (rng,) = p.ranges
    assert rng.start == StartPosition("AT_SEQUENCE_NUMBER", sequence_number=seq(5), skip_through_sub_sequence_number=3)


def test_at_timestamp_checkpoint_starts_at_that_timestamp():
    ts = NOW - timedelta(hours=1)
    p = plan([shard(0)], {sid(0): Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=ts)})
    assert p.ranges[0].start == StartPosition("AT_TIMESTAMP", timestamp=ts)


def test_shard_end_shards_are_not_planned():
    shards = [shard(0, end=9), shard(1)]
    p = plan(shards, {sid(0): Checkpoint(Sentinel.SHARD_END), sid(1): Checkpoint.at(seq(2))})
    assert p.shard_ids == [sid(1)]
    assert p.checkpoints[sid(0)] == Checkpoint(Sentinel.SHARD_END)


def test_closed_shard_range_carries_ending_sequence_number():
    p = plan([shard(0, end=9)])
    assert p.ranges[0].ending_sequence_number == seq(9)


def test_caps_are_copied_into_every_range():
    p = plan([shard(0), shard(1)], max_records_per_shard=100, max_bytes_per_shard=2048)
    assert {(r.max_records, r.max_bytes) for r in p.ranges} == {(100, 2048)}


# -- plan_incremental: resharding (ORDER) ------------------------------------------------------------


def test_split_children_wait_for_unfinished_parent():
    # shard 0 split into 1 and 2; shard 0 still has unread records
    shards = [shard(0, end=9), shard(1, parent=0, start=10), shard(2, parent=0, start=10)]
    p = plan(shards, {sid(0): Checkpoint.at(seq(4))})
    assert p.shard_ids == [sid(0)]
    assert set(p.waiting) == {sid(1), sid(2)}
    assert sid(0) in p.waiting[sid(1)]
    assert "SHARD_END" in p.waiting[sid(1)]


def test_split_children_of_never_read_parent_wait():
    shards = [shard(0, end=9), shard(1, parent=0, start=10), shard(2, parent=0, start=10)]
    p = plan(shards)
    assert p.shard_ids == [sid(0)]
    assert set(p.waiting) == {sid(1), sid(2)}


def test_split_children_of_finished_parent_start_at_trim_horizon():
    shards = [shard(0, end=9), shard(1, parent=0, start=10), shard(2, parent=0, start=10)]
    ts = NOW - timedelta(days=1)
    p = plan(
        shards,
        {sid(0): Checkpoint(Sentinel.SHARD_END)},
        initial_position="AT_TIMESTAMP",
        initial_timestamp=ts,
    )
    assert p.shard_ids == [sid(1), sid(2)]
    for rng in p.ranges:
        assert rng.start == StartPosition("TRIM_HORIZON")  # not the initial position
        assert rng.start_checkpoint == Checkpoint(Sentinel.TRIM_HORIZON)
    assert p.waiting == {}


def test_merge_child_waits_when_one_parent_is_unfinished():
    # shards 0 and 1 merged into 2
    shards = [shard(0, end=9), shard(1, end=8), shard(2, parent=0, adjacent=1, start=10)]
    checkpoints = {sid(0): Checkpoint(Sentinel.SHARD_END), sid(1): Checkpoint.at(seq(3))}
    p = plan(shards, checkpoints)
    assert p.shard_ids == [sid(1)]
    assert sid(2) in p.waiting
    assert sid(0) in p.waiting[sid(2)] and sid(1) in p.waiting[sid(2)]

    # the adjacent parent finished, the other not
    checkpoints = {sid(0): Checkpoint.at(seq(3)), sid(1): Checkpoint(Sentinel.SHARD_END)}
    p = plan(shards, checkpoints)
    assert p.shard_ids == [sid(0)]
    assert sid(2) in p.waiting


def test_merge_child_waits_when_adjacent_parent_never_read():
    shards = [shard(0, end=9), shard(1, end=8), shard(2, parent=0, adjacent=1, start=10)]
    p = plan(shards, {sid(0): Checkpoint(Sentinel.SHARD_END)})
    assert p.shard_ids == [sid(1)]
    assert sid(2) in p.waiting


def test_merge_child_of_finished_parents_starts_at_trim_horizon():
    shards = [shard(0, end=9), shard(1, end=8), shard(2, parent=0, adjacent=1, start=10)]
    checkpoints = {sid(0): Checkpoint(Sentinel.SHARD_END), sid(1): Checkpoint(Sentinel.SHARD_END)}
    p = plan(shards, checkpoints, initial_position="LATEST")
    assert p.shard_ids == [sid(2)]
    assert p.ranges[0].start == StartPosition("TRIM_HORIZON")


def test_grandchildren_wait_for_children():
    shards = [shard(0, end=9), shard(1, parent=0, start=10, end=19), shard(3, parent=1, start=20)]
    p = plan(shards, {sid(0): Checkpoint(Sentinel.SHARD_END)})
    assert p.shard_ids == [sid(1)]
    assert set(p.waiting) == {sid(3)}


def test_child_of_aged_out_parent_is_planned_with_initial_position():
    # the parent is no longer listed and this consumer never saw it
    p = plan([shard(1, parent=0, start=10)], initial_position="LATEST")
    assert p.shard_ids == [sid(1)]
    assert p.ranges[0].start.iterator_type == "AT_TIMESTAMP"


def test_vanished_shard_short_of_shard_end_is_data_loss():
    # shard 0 was checkpointed mid-way and is no longer listed: its unread records aged out (LOUD)
    with pytest.raises(DataLossError, match=sid(0)) as info:
        plan([shard(1, parent=0, start=10), shard(2)], {sid(0): Checkpoint.at(seq(3)), sid(2): Checkpoint.at(seq(1))})
    assert info.value.shard_ids == [sid(0)]
    assert "allow_data_loss" in str(info.value)


def test_vanished_shard_at_shard_end_is_not_data_loss():
    p = plan([shard(1, parent=0, start=10)], {sid(0): Checkpoint(Sentinel.SHARD_END)})
    assert p.shard_ids == [sid(1)]
    assert p.ranges[0].start == StartPosition("TRIM_HORIZON")


def test_allow_data_loss_goes_on_with_the_children_of_a_vanished_shard():
    # With allow_data_loss=True the run goes on past the lost records of shard 0; its children,
    # still within retention, must then be read, not wait forever for a parent that can never
    # reach SHARD_END.
    checkpoints = {sid(0): Checkpoint.at(seq(3)), sid(2): Checkpoint.at(seq(1))}
    p = plan([shard(1, parent=0, start=10), shard(2)], checkpoints, allow_data_loss=True)
    assert sid(2) in p.shard_ids
    assert sid(1) in p.shard_ids, f"child of the vanished shard not planned: {p.waiting}"
    assert ranges(p)[sid(1)].start == StartPosition("TRIM_HORIZON")


def test_ranges_are_ordered_parents_before_children():
    shards = [shard(5, parent=0, adjacent=1), shard(1, end=8), shard(0, end=9), shard(3)]
    checkpoints = {sid(0): Checkpoint(Sentinel.SHARD_END), sid(1): Checkpoint(Sentinel.SHARD_END)}
    p = plan(shards, checkpoints)
    assert p.shard_ids == [sid(3), sid(5)]


# -- plan_incremental: cutoff and caps ------------------------------------------------------------------


def test_cutoff_in_the_future_is_clamped_to_now():
    p = plan([shard(0)], cutoff=NOW + timedelta(hours=1))
    assert p.cutoff == NOW
    assert p.ranges[0].cutoff == NOW


def test_cutoff_in_the_past_is_kept():
    p = plan([shard(0)])
    assert p.cutoff == CUTOFF


def test_naive_cutoff_and_now_are_utc():
    p = plan([shard(0)], cutoff=CUTOFF.replace(tzinfo=None), now=NOW.replace(tzinfo=None))
    assert p.cutoff == CUTOFF
    assert p.created_at == NOW


@pytest.mark.parametrize("name", ["max_records_per_shard", "max_bytes_per_shard"])
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_caps_raise_naming_the_parameter(name, value):
    with pytest.raises(ValueError, match=name):
        plan([shard(0)], **{name: value})


def test_empty_stream_gives_an_empty_plan():
    p = plan([])
    assert p.ranges == ()
    assert p.waiting == {}


# -- BatchPlan serialisation -----------------------------------------------------------------------------


def test_batch_plan_round_trip_is_json_safe():
    ts = datetime(2024, 4, 1, 8, 0, 0, 123000, tzinfo=timezone.utc)
    shards = [
        shard(0, end=9),
        shard(1, end=8),
        shard(2, parent=0, adjacent=1, start=10),
        shard(3),
        shard(4),
        shard(6, parent=5),
        shard(5, end=3),
    ]
    checkpoints = {
        sid(0): Checkpoint(Sentinel.SHARD_END),
        sid(1): Checkpoint.at(seq(3), 2),
        sid(3): Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=ts),
        sid(4): Checkpoint.at(seq(1)),
    }
    ms_now = NOW.replace(microsecond=250000)
    p = plan(
        shards,
        checkpoints,
        cutoff=CUTOFF,
        now=ms_now,
        max_records_per_shard=500,
        max_bytes_per_shard=10_000,
    )
    assert p.waiting  # shards 2 and 6 wait
    text = json.dumps(p.to_dict())
    restored = BatchPlan.from_dict(json.loads(text))
    assert restored == p
    assert restored.to_dict() == p.to_dict()
    assert restored.ranges[0].start_checkpoint == p.ranges[0].start_checkpoint


def test_stored_cutoff_is_never_later_than_planned():
    now = datetime(2024, 5, 1, 12, 0, 0, 999999, tzinfo=timezone.utc)
    p = plan([shard(0)], cutoff=now, now=now)
    restored = BatchPlan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert restored.cutoff <= p.cutoff
    assert p.cutoff - restored.cutoff < timedelta(milliseconds=1)
    assert restored.ranges[0].cutoff == restored.cutoff


# -- advance ---------------------------------------------------------------------------------------------


def _range(checkpoint: Checkpoint, cutoff: datetime = CUTOFF, ending: str | None = None) -> ShardRange:
    return ShardRange(sid(0), StartPosition.after(checkpoint), checkpoint, cutoff, ending)


def test_advance_shard_end():
    rng = _range(Checkpoint.at(seq(1)), ending=seq(9))
    assert advance(rng, report(sid(0), E(2), E(9), records=8, shard_end=True)) == Checkpoint(Sentinel.SHARD_END)
    # also when nothing was left to read
    assert advance(rng, report(sid(0), shard_end=True)) == Checkpoint(Sentinel.SHARD_END)


def test_advance_to_last_record():
    rng = _range(Checkpoint.at(seq(1)))
    assert advance(rng, report(sid(0), E(2), E(5), records=4)) == Checkpoint.at(seq(5))
    assert advance(rng, report(sid(0), E(2), E(5, 3), records=8)) == Checkpoint.at(seq(5), 3)


def test_advance_at_timestamp_moves_to_cutoff_when_nothing_read():
    start = Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=CUTOFF - timedelta(hours=1))
    rng = _range(start)
    for reason in ("cutoff", "caught_up"):
        got = advance(rng, report(sid(0), stop_reason=reason))
        assert got == Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=CUTOFF)


def test_advance_at_timestamp_never_moves_back():
    later = CUTOFF + timedelta(minutes=1)
    rng = _range(Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=later))
    assert advance(rng, report(sid(0))) == Checkpoint(Sentinel.AT_TIMESTAMP, timestamp=later)


def test_advance_unchanged_when_nothing_read():
    for start in (Checkpoint(Sentinel.TRIM_HORIZON), Checkpoint.at(seq(3)), Checkpoint.at(seq(3), 1)):
        assert advance(_range(start), report(sid(0))) == start


def test_advance_keeps_the_reads_last_iterator_as_a_hint_for_the_next_probe():
    start = Checkpoint.at(seq(3)).with_resume_iterator("old", 1.0)
    read = replace(report(sid(0), E(4), E(5), records=2), next_iterator="it-5", next_iterator_at=1000.5)
    got = advance(_range(start), read)
    assert got == Checkpoint.at(seq(5)) and (got.resume_iterator, got.resume_iterator_at) == ("it-5", 1000.5)
    idle = advance(_range(start), replace(report(sid(0)), next_iterator="it-3", next_iterator_at=2000.0))
    assert idle == start and idle.resume_iterator == "it-3"  # nothing read: same position, the newer iterator
    # a read that stopped elsewhere than the tip has none: the old one is dropped, not carried on
    capped = advance(_range(start), report(sid(0), E(4), E(4), stop_reason="max_records"))
    assert capped.resume_iterator is None and capped.resume_iterator_at is None
    assert advance(_range(start), report(sid(0), shard_end=True)).resume_iterator is None


def test_a_checkpoints_iterator_is_stored_and_used_while_young():
    ckpt = Checkpoint.at(seq(5), 2).with_resume_iterator("it", 100.0)
    assert Checkpoint.from_dict(ckpt.to_dict()).resume_iterator == "it"
    assert Checkpoint.from_dict(ckpt.to_dict()).resume_iterator_at == 100.0
    assert "resume_iterator" not in Checkpoint.at(seq(5)).to_dict()  # none: nothing stored
    assert ckpt.resume_iterator_for(now=339.0, max_age=240.0) == "it"
    assert ckpt.resume_iterator_for(now=340.0, max_age=240.0) is None  # too old
    assert ckpt.resume_iterator_for(now=99.0, max_age=240.0) is None  # from the future: a clock or a forgery


# -- validate_report ---------------------------------------------------------------------------------------


def two_shard_plan() -> BatchPlan:
    shards = [shard(0, end=9), shard(1), shard(2, end=4)]
    checkpoints = {sid(0): Checkpoint.at(seq(2)), sid(1): Checkpoint.at(seq(3), 1), sid(2): Checkpoint(Sentinel.SHARD_END)}
    return plan(shards, checkpoints)


def test_valid_report_gives_checkpoints_including_untouched_shards():
    p = two_shard_plan()
    assert p.shard_ids == [sid(0), sid(1)]
    got = validate_report(
        p,
        [report(sid(1), E(3, 2), E(6), records=5), report(sid(0), E(3), E(9), records=7, shard_end=True)],
    )
    assert got == {
        sid(0): Checkpoint(Sentinel.SHARD_END),
        sid(1): Checkpoint.at(seq(6)),
        sid(2): Checkpoint(Sentinel.SHARD_END),  # untouched, carried over
    }


def test_valid_report_includes_new_shards_and_keeps_checkpoint_of_shard_with_nothing_new():
    p = plan([shard(0), shard(1)], {sid(0): Checkpoint.at(seq(2))})
    got = validate_report(p, [report(sid(0)), report(sid(1), E(0), E(1), records=2)])
    assert got == {sid(0): Checkpoint.at(seq(2)), sid(1): Checkpoint.at(seq(1))}


def test_missing_shard_rejected():
    p = two_shard_plan()
    with pytest.raises(ReportValidationError, match=f"missing from the report: {sid(1)}") as info:
        validate_report(p, [report(sid(0), E(3), E(4), records=2)])
    assert info.value.batch_id == 7


def test_duplicated_shard_rejected():
    p = two_shard_plan()
    with pytest.raises(ReportValidationError, match="twice"):
        validate_report(p, [report(sid(0)), report(sid(1)), report(sid(0))])


def test_unplanned_shard_rejected():
    p = two_shard_plan()
    with pytest.raises(ReportValidationError, match=f"unplanned shards in the report: {sid(2)}"):
        validate_report(p, [report(sid(0)), report(sid(1)), report(sid(2), E(1), E(1))])


def test_first_not_after_checkpoint_rejected():
    p = two_shard_plan()  # shard 0 at seq(2), shard 1 at seq(3)/1
    with pytest.raises(ReportValidationError, match="not after the checkpoint"):
        validate_report(p, [report(sid(0), E(2), E(4), records=3), report(sid(1))])
    with pytest.raises(ReportValidationError, match="not after the checkpoint"):
        validate_report(p, [report(sid(0), E(1), E(4), records=3), report(sid(1))])
    with pytest.raises(ReportValidationError, match="not after the checkpoint"):
        validate_report(p, [report(sid(0)), report(sid(1), E(3, 1), E(4), records=3)])
    # sub-records after the checkpoint of the same aggregate are fine
    validate_report(p, [report(sid(0)), report(sid(1), E(3, 2), E(4), records=3)])


def test_last_past_ending_sequence_number_rejected():
    p = two_shard_plan()  # shard 0 ends at seq(9)
    with pytest.raises(ReportValidationError, match="past the shard's end"):
        validate_report(p, [report(sid(0), E(3), E(10), records=8, shard_end=True), report(sid(1))])


def test_inconsistent_counts_rejected():
    p = two_shard_plan()
    with pytest.raises(ReportValidationError):
        validate_report(p, [report(sid(0), E(3), E(4), records=0), report(sid(1))])
    with pytest.raises(ReportValidationError):
        validate_report(p, [report(sid(0), None, None, records=2), report(sid(1))])
    with pytest.raises(ReportValidationError, match="before first"):
        validate_report(p, [report(sid(0), E(5), E(4), records=2), report(sid(1))])


def test_records_over_cap_rejected_unless_one_aggregate():
    p = plan([shard(0)], max_records_per_shard=3)
    with pytest.raises(ReportValidationError, match="exceed the cap"):
        validate_report(p, [report(sid(0), E(0), E(4), records=5, kinesis_records=5)])
    # a single aggregate bigger than the cap is taken whole
    got = validate_report(p, [report(sid(0), E(0, 0), E(0, 4), records=5, kinesis_records=1, stop_reason="max_records")])
    assert got[sid(0)] == Checkpoint.at(seq(0), 4)


# -- shard lineage ---------------------------------------------------------------------------------------


def test_lineage_ordered_puts_parents_before_children():
    # 0 splits into 1, 2; 2 and 3 merge into 4; 4 splits into 5, 6. Listed in a scrambled order.
    shards = [
        shard(6, parent=4),
        shard(4, parent=3, adjacent=2),
        shard(1, parent=0),
        shard(5, parent=4),
        shard(2, parent=0),
        shard(0, end=9),
        shard(3, end=8),
    ]
    ordered = [s.shard_id for s in ShardLineage(shards).ordered()]
    assert sorted(ordered) == sorted(s.shard_id for s in shards)
    position = {shard_id: i for i, shard_id in enumerate(ordered)}
    for s in shards:
        for parent in s.parents:
            assert position[parent] < position[s.shard_id], (parent, s.shard_id)
    assert ordered[0] == sid(0)


def test_lineage_ordered_by_shard_id_otherwise():
    shards = [shard(3), shard(1), shard(2)]
    assert [s.shard_id for s in ShardLineage(shards).ordered()] == [sid(1), sid(2), sid(3)]


def test_lineage_ignores_unlisted_parents_and_knows_children():
    lineage = ShardLineage([shard(2, parent=0, adjacent=1), shard(1)])
    assert [s.shard_id for s in lineage.ordered()] == [sid(1), sid(2)]
    assert lineage.children == {sid(0): [sid(2)], sid(1): [sid(2)]}


def test_lineage_cycle_is_an_error():
    with pytest.raises(ValueError, match="cycle"):
        ShardLineage([shard(1, parent=2), shard(2, parent=1)]).ordered()


def test_parents_finished():
    lineage = ShardLineage([shard(0, end=9), shard(1, end=8), shard(2, parent=0, adjacent=1)])
    child = lineage.shards[sid(2)]
    end = Checkpoint(Sentinel.SHARD_END)
    assert not lineage.parents_finished(child, {})
    assert not lineage.parents_finished(child, {sid(0): end})
    assert not lineage.parents_finished(child, {sid(0): end, sid(1): Checkpoint.at(seq(1))})
    assert lineage.parents_finished(child, {sid(0): end, sid(1): end})
    assert lineage.parents_finished(lineage.shards[sid(0)], {})


def test_shard_from_api_and_contains():
    s = Shard.from_api(
        {
            "ShardId": sid(4),
            "ParentShardId": sid(1),
            "AdjacentParentShardId": sid(2),
            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": MAX_HASH},
            "SequenceNumberRange": {"StartingSequenceNumber": seq(10), "EndingSequenceNumber": seq(20)},
        }
    )
    assert s.parents == (sid(1), sid(2))
    assert s.is_closed
    assert s.contains_sequence_number(seq(10)) and s.contains_sequence_number(seq(20))
    assert not s.contains_sequence_number(seq(9)) and not s.contains_sequence_number(seq(21))
    open_shard = Shard.from_api(
        {
            "ShardId": sid(5),
            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": MAX_HASH},
            "SequenceNumberRange": {"StartingSequenceNumber": seq(10)},
        }
    )
    assert open_shard.parents == ()
    assert not open_shard.is_closed
    assert open_shard.contains_sequence_number(seq(10**6))
