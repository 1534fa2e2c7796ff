"""The sections that run.py adds to a written report (benchmarks.report.add_section): numbered after
the report's last section, before "Against the targets", their targets at the end of that table
(no emulator: a report file and results as the sections return them)."""

from __future__ import annotations

from benchmarks.large_records import add_to_report, large_records_targets

MIB = 1024 * 1024
REPORT = """# Benchmarks

## 1. Throttled

text

## Against the targets

| target | measured | met |
| --- | --- | --- |
| throttled read rate >= 0.85 x the limit | 0.941 | yes |

## Raw results
"""


def _memory_run(records: int, peak: float) -> dict:
    return {"records": records, "peak_total_mib": peak, "peak_jvm_mib": peak * 0.7, "peak_python_mib": peak * 0.3,
            "heap_after_gc_mib": None, "wall_s": 100.0}  # fmt: skip


RESULT = {
    "backlog_mib": 160.0, "records": 16, "record_mib": 10, "limit_bytes_per_second": 8 * MIB, "lower_bound_s": 20.0,
    "ours": {"read_bytes_per_second": 7 * MIB, "get_records": 25, "throttled": 1, "expired": 0,
             "largest_response_bytes": 10 * MIB, "wall_s": 40.0, "records": 16},
    "memory": {"backlog_mib": 160.0, "heap": "1g", "repeat": 1, "peak_total_mib": {"10MiB": 2200.0, "1MiB": 2000.0},
               "runs": {"1MiB": [_memory_run(160, 2000.0)], "10MiB": [_memory_run(16, 2200.0)]}},
}  # fmt: skip


def test_the_large_records_section_goes_before_the_targets_and_its_targets_into_their_table(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(REPORT, encoding="utf-8")
    add_to_report(path, {"large_records": RESULT})
    text = path.read_text(encoding="utf-8")
    assert text.index("## 2. Large records: 10 MiB") < text.index("## Against the targets") < text.index("## Raw results")
    assert "**0.875 of the limit**" in text and "2,200 / 2,000 = **1.100**" in text
    assert "| 10 MiB (16) | 2,200 | 1,540 | 660 | - | 100 |" in text
    table = text[text.index("## Against the targets"):text.index("## Raw results")]
    assert "| 10 MiB records: throttled read rate >= 0.85 x the limit | 0.875 | yes |" in table
    assert "| 10 MiB records: peak memory <= 1.2 x that of 1 MiB records (same bytes) | 1.100 | yes |" in table
    slow = {**RESULT, "ours": {**RESULT["ours"], "read_bytes_per_second": 5 * MIB}}
    assert large_records_targets(slow)[0] == ("10 MiB records: throttled read rate >= 0.85 x the limit", "0.625", False)
