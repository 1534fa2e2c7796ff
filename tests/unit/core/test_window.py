"""Window planning rules (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_kinesis_spark.core.window import derive_slices, slice_bounds, validate_window, window_label
from airflow_kinesis_spark.exceptions import DataLossError

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def test_slices_are_contiguous_millisecond_bounds_covering_the_window():
    start, end = NOW - timedelta(minutes=10), NOW - timedelta(seconds=1, microseconds=500)
    bounds = slice_bounds(start, end, 7)
    assert bounds[0][0] == start and bounds[-1][1] == end.replace(microsecond=999000)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(t.microsecond % 1000 == 0 for pair in bounds for t in pair)


def test_a_window_shorter_than_its_slices_gives_fewer_slices():
    assert len(slice_bounds(NOW, NOW + timedelta(milliseconds=3), 10)) == 3


@pytest.mark.parametrize("slices", [0, 65])
def test_slice_count_is_bounded(slices):
    with pytest.raises(ValueError, match="time slices must be 1..64"):
        slice_bounds(NOW, NOW + timedelta(hours=1), slices)


def test_derived_slices_follow_window_length_and_parallelism():
    hour = (NOW - timedelta(hours=1), NOW)
    assert derive_slices(*hour, 1, slice_length=timedelta(minutes=15), parallelism=8) == 4
    assert derive_slices(*hour, 1, slice_length=timedelta(minutes=1), parallelism=8) == 8
    assert derive_slices(*hour, 16, slice_length=timedelta(minutes=1), parallelism=8) == 1


def test_window_validation():
    with pytest.raises(ValueError, match="is not before its end"):
        validate_window(NOW, NOW, now=NOW)
    with pytest.raises(ValueError, match="in the future"):
        validate_window(NOW - timedelta(hours=1), NOW + timedelta(seconds=1), now=NOW)
    horizon = NOW - timedelta(hours=24)
    with pytest.raises(DataLossError, match="before the trim horizon 2026-11-20T12:00:00.000Z"):
        validate_window(horizon - timedelta(hours=1), horizon + timedelta(hours=1), now=NOW, trim_horizon=horizon)
    gap = validate_window(horizon - timedelta(hours=1), horizon + timedelta(hours=1), now=NOW, trim_horizon=horizon,
                          allow_data_loss=True)  # fmt: skip
    assert gap == "[2026-11-20T11:00:00.000Z, 2026-11-20T12:00:00.000Z) is before the trim horizon 2026-11-20T12:00:00.000Z"
    assert validate_window(horizon, NOW, now=NOW, trim_horizon=horizon) is None


def test_window_label_is_path_safe():
    label = window_label(NOW, NOW + timedelta(minutes=15, milliseconds=250))
    assert label == "20261121T120000Z-20261121T121500.250Z"
    assert ":" not in label and "/" not in label


def test_a_window_report_must_cover_every_planned_slice_once():
    from airflow_kinesis_spark.core.ranges import ShardReport
    from airflow_kinesis_spark.core.shards import Shard
    from airflow_kinesis_spark.core.window import plan_window, validate_window_report
    from airflow_kinesis_spark.exceptions import ReportValidationError

    shard = Shard("shardId-000000000000", None, None, "1", None, "0", "9")
    plan = plan_window(stream_name="s", consumer_name="w", shards=[shard], start=NOW - timedelta(hours=1), end=NOW,
                       slices=3, now=NOW, output_location="memory://w")  # fmt: skip

    def report(index: int) -> ShardReport:
        return ShardReport(shard.shard_id, None, None, 0, 0, 0, 0, False, "cutoff", slice_index=index)

    validate_window_report(plan, [report(2), report(0), report(1)])
    with pytest.raises(ReportValidationError, match=r"missing \[\('shardId-000000000000', 2\)\]"):
        validate_window_report(plan, [report(0), report(1)])
    with pytest.raises(ReportValidationError, match="repeated"):
        validate_window_report(plan, [report(0), report(1), report(2), report(1)])
