"""``make demo-backfill`` at a smaller size: consecutive windows, a re-run, union == incremental."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dags
@pytest.mark.slow
def test_backfill_windows_are_exactly_once_and_rerun_identically(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_backfill", "--work-dir", str(tmp_path / "bf"), "--windows", "3",
         "--window-seconds", "8", "--lines-per-window", "150"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["windows"] == 3 and all(n > 0 for n in result["rows_per_window"])
    assert result["records_in"] == result["records_out"] == 450
    assert result["duplicates"] == 0 and result["missing"] == 0 and result["unexpected"] == 0
    assert result["rerun_identical"] is True and result["union_equals_incremental"] is True
