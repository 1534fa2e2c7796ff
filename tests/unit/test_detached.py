"""airflow_kinesis_spark.detached: a detached job's directory goes when the job succeeds, stays when it fails."""

from __future__ import annotations

import subprocess
import sys

from airflow_kinesis_spark import detached


def test_the_directory_is_removed_after_success_and_kept_after_failure(tmp_path):
    ok, failed = tmp_path / "ok", tmp_path / "failed"
    for d in (ok, failed):
        d.mkdir()
        (d / "spark-submit.log").write_text("log")
    assert detached.main([str(ok), "--", sys.executable, "-c", "import os; open('ran', 'w')"]) == 0
    assert not ok.exists()
    assert detached.main([str(failed), "--", sys.executable, "-c", "import sys; open('ran', 'w'); sys.exit(3)"]) == 3
    assert (failed / "ran").exists() and (failed / "spark-submit.log").exists()  # ran in the directory; log kept


def test_a_bad_command_line_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "airflow_kinesis_spark.detached", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
