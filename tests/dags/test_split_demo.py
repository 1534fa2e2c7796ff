"""``make demo-split`` at a smaller size: split tasks (plan, SparkSubmitOperator, commit) over
several batches with ``airflow dags test``, exactly once."""

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
def test_split_demo_commits_every_record_exactly_once_through_the_job_task(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_split", "--work-dir", str(tmp_path / "split"), "--rounds", "2", "--lines", "3000"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["runner"] == "SparkSubmitOperator"
    assert result["batches"] == 2 and result["handed_batches"] == [1, 2]
    assert result["records_in"] == 3000 + 17  # the log lines and the user records of kpl_vectors.json
    assert result["records_out"] == result["records_in"] == sum(result["records_per_batch"])
    assert len(result["records_per_batch"]) == 2 and all(n > 0 for n in result["records_per_batch"])
    assert result["duplicates"] == 0 and result["missing"] == 0 and result["unexpected"] == 0
    assert result["data_mismatches"] == 0 and result["kpl_vector_records_ok"] == result["kpl_vector_records"] == 17
    assert result["parsed_log_lines"] == 3000
    # two runs with a job, then one with nothing new: the job task skipped, the commit task returns the plan's summary
    assert result["dag_runs"] == result["dag_runs_succeeded"] == 3
    assert (result["job_tasks_succeeded"], result["job_tasks_skipped"]) == (2, 1)
    assert result["commit_statuses"] == ["committed", "committed", "no_new_records"]
    # each job attempt had a directory of its own; no argument named a file; nothing left staged
    assert result["job_directories"] == 2 and result["job_arguments_name_files"] is False and result["staging_left"] == 0
