"""``make demo-typed`` at a smaller size: GSR JSON and Avro and plain protobuf records decoded into
Iceberg and Delta tables through the example DAG, broken records as dead letters, a registry
version that adds a column mid-stream, a run killed (-9) between the table commit and the
checkpoint commit, a window re-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dags
@pytest.mark.slow
@pytest.mark.spark
def test_typed_demo_decodes_every_good_record_once_and_quarantines_the_broken_ones(tmp_path):
    count, broken = 60, 4  # per stream and part; two parts, three streams
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_typed", "--work-dir", str(tmp_path / "typed"), "--count", str(count),
         "--broken", str(broken)],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] is True
    assert result["records_in"] == 3 * 2 * (count + broken) and result["broken_in"] == 3 * 2 * broken
    assert result["typed_rows"] == result["records_in"] - result["broken_in"]
    assert result["dead_letters"] == result["summary_dead_letters"] == result["broken_in"]
    assert result["duplicates"] == result["missing"] == result["unexpected"] == 0
    assert result["value_mismatches"] == 0 and result["dead_letter_kind_mismatches"] == 0
    # version 2 of orders-json adds coupon, of orders-avro channel: filled for every version-2 order
    assert result["evolved_columns"] == ["channel", "coupon"] and result["evolved_filled"] == 2 * count
    assert result["window_identical"] and result["window_rows"] == count and result["window_dead_letters"] == broken
    # two parts: two batches per consumer, one of them killed between table and checkpoint commit and rolled forward
    assert result["batches"] == 6 and result["killed_between_table_and_checkpoint_commit"] == 1
    assert result["one_commit_per_batch"]
