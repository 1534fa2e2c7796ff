"""The freshness benchmark's arithmetic and report section (no deployment: a result as run_freshness returns it)."""

from __future__ import annotations

import pytest

from benchmarks.freshness import _percentile, freshness_section, freshness_targets

RESULT = {
    "p50_s": 12.34, "p95_s": 31.0, "max_s": 40.0, "batches": 30, "records": 2400, "records_per_second": 4.0, "shards": 4,
    "poll_seconds": 5.0, "warmup_batches": 2, "warmup_max_s": [80.0, 60.5], "commit_interval_median_s": 7.5,
    "records_committed_checked": 2500, "missing": 0, "duplicates": 0,
    "stages_s": {"arrival_to_trigger": 6.0, "trigger_to_event": 0.7, "plan_to_job": 1.5, "job_to_commit": 2.0, "some_new_stage": 0.1},
}  # fmt: skip


def test_percentile_interpolates_between_the_closest_ranks():
    assert _percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert _percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert _percentile(list(range(101)), 0.95) == pytest.approx(95.0)
    assert _percentile([7.0], 0.95) == 7.0
    with pytest.raises(ValueError):
        _percentile([], 0.5)


def test_targets_say_which_are_met():
    assert freshness_targets(RESULT) == [
        ("freshness p50 <= 15 s (event-driven DAG)", "12.3 s", True),
        ("freshness p95 <= 30 s (event-driven DAG)", "31.0 s", False),
    ]


def test_section_shows_the_figures_and_every_stage():
    text = "\n".join(freshness_section(RESULT))
    assert text.startswith("## Freshness")
    assert "| p50 | **12.3** |" in text and "| p95 | **31.0** |" in text
    assert "30 batches (2,400 records) measured after 2 warm-up batches" in text
    assert "4 records/s" in text and "4 shards" in text and "every 5 s" in text
    assert "0 missing, 0 duplicated" in text
    for label, value in (("(triggerer)", "0.70"), ("PySpark's import", "1.50"), ("Parquet write", "2.00"), ("some_new_stage", "0.10")):
        assert any(label in line and line.endswith(f"| {value} |") for line in text.splitlines()), label
