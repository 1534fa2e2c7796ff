"""``make demo-resharding``: split and merge shards while producing and ingesting, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dags
@pytest.mark.slow
def test_resharding_demo_is_exactly_once_and_in_order(tmp_path):
    binary = os.environ.get("KINESALITE_BIN") or str(ROOT / ".cache/node/node_modules/.bin/kinesalite")
    if not Path(binary).exists():
        pytest.fail(f"kinesalite not installed at {binary}: run 'make kinesalite' (make test does it)")
    env = dict(os.environ, KINESALITE_BIN=binary)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_resharding", "--work-dir", str(tmp_path / "resharding")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["records_in"] > 0
    assert result["records_out"] == result["records_in"]
    assert result["duplicates"] == 0 and result["missing"] == 0
    assert result["unexpected"] == 0 and result["data_mismatches"] == 0
    assert result["order_violations"] == 0 and result["in_shard_order_violations"] == 0
    assert result["splits"] >= 1 and result["merges"] >= 1
    assert result["batches"] >= 4
