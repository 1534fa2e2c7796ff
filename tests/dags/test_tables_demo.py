"""``make demo-tables`` at a smaller size: the example DAG into an Iceberg and a Delta table, two
runs killed (-9) between the table commit and the checkpoint commit, a window re-run."""

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
def test_tables_demo_commits_every_record_once_through_kills(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_tables", "--work-dir", str(tmp_path / "tables"), "--lines", "1500"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["records_in"] == 1500 + 17  # the log lines and the user records of kpl_vectors.json
    assert result["iceberg_rows"] == result["delta_rows"] == result["records_in"]
    assert result["duplicates"] == 0 and result["missing"] == 0
    assert result["batches"] >= 2 and result["killed_between_table_and_checkpoint_commit"] == 2
    # Three parts of records; a consumer whose task a kill stopped before it ran reads two parts in one batch.
    assert result["snapshots"] >= 2 and result["versions"] >= 2 and result["one_snapshot_or_version_per_batch"]
    assert result["window_identical"] and result["window_rows"] == 500 + 17
