"""The example DAGs load, and the main one really runs (``airflow dags test``) on the local stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def test_there_are_example_dags():
    assert [p.name for p in DAG_FILES] == [
        "kinesis_asset_downstream.py",
        "kinesis_backfill.py",
        "kinesis_emr_serverless.py",
        "kinesis_event_driven.py",
        "kinesis_microbatch.py",
        "kinesis_sensors.py",
        "kinesis_split.py",
        "kinesis_tables.py",
        "kinesis_typed.py",
    ]


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_loads_without_errors(dag_file, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file))
    assert bag.import_errors == {}
    assert bag.dags, f"{dag_file.name} defines no DAG"


def test_microbatch_dag_uses_the_operator_with_the_log_transform(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_microbatch.py")).dags["kinesis_microbatch"]
    task = dag.get_task("ingest_access_log")
    assert isinstance(task, KinesisToSparkOperator)
    assert task.transform == "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"
    assert task.retries == 2


def test_split_dag_runs_the_job_with_spark_submit_in_a_directory_of_its_own(tmp_path, monkeypatch):
    """Plan, SparkSubmitOperator, commit; the job gets the plan task's job_arguments and nothing
    else from it, and starts in its own directory, which is also its TMPDIR and Spark's scratch space."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.definitions.xcom_arg import XComArg

    from airflow_kinesis_spark.operators.split import KinesisCommitBatchOperator, KinesisPlanBatchOperator

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("KINESIS_SPARK_JOB_PACKAGE", "/srv/job/")
    monkeypatch.setenv("KINESIS_SPARK_JOB_ROOT", "/srv/jobs")
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_split.py")).dags["kinesis_split"]
    plan, job, commit = dag.get_task("split.plan"), dag.get_task("split.job"), dag.get_task("split.commit")
    assert isinstance(plan, KinesisPlanBatchOperator) and isinstance(commit, KinesisCommitBatchOperator)
    assert isinstance(job, SparkSubmitOperator)
    assert job.upstream_task_ids == {"split.plan"} and commit.upstream_task_ids == {"split.job"}
    assert (job.application, job.py_files) == ("/srv/job/kinesis_batch.py", "/srv/job/airflow_kinesis_spark_core.zip")
    assert isinstance(job.application_args, XComArg)
    assert (job.application_args.operator, job.application_args.key) == (plan, "job_arguments")
    assert job.working_dir == "/srv/jobs/{{ ti.id }}" and "working_dir" in job.template_fields
    assert job.env_vars == {"TMPDIR": job.working_dir} and job.conf["spark.local.dir"] == job.working_dir
    assert job.conf["spark.driver.extraJavaOptions"] == f"-Djava.io.tmpdir={job.working_dir}"
    assert plan.consumer_name == "parquet-lake-split" and plan.output_path == "/tmp/kinesis_spark_output_split"
    assert dag.max_active_runs == 1 and job.retry_delay.total_seconds() > plan.lease_seconds


def test_event_driven_dag_runs_on_a_backlog_watched_by_the_trigger(tmp_path, monkeypatch):
    from airflow_kinesis_spark.triggers.kinesis import KinesisBacklogTrigger

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("KINESIS_BACKLOG_MIN_RECORDS", "250")
    monkeypatch.setenv("KINESIS_BACKLOG_MIN_AGE_SECONDS", "")
    monkeypatch.setenv("KINESIS_BACKLOG_POLL_SECONDS", "10")
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_event_driven.py")).dags["kinesis_event_driven"]
    (backlog,) = dag.timetable.asset_condition.objects
    (watcher,) = backlog.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, KinesisBacklogTrigger)
    assert (trigger.consumer_name, trigger.poke_interval) == ("parquet-lake-events", 10.0)
    assert trigger.min_records == 250 and trigger.min_age_seconds is None
    assert dag.max_active_runs == 1
    task = dag.get_task("ingest_backlog")
    assert isinstance(task, KinesisToSparkOperator) and task.consumer_name == trigger.consumer_name
    assert task.output_path == "/tmp/kinesis_spark_output_events"  # not kinesis_microbatch's batch directories


def test_downstream_dag_is_scheduled_on_the_microbatch_output_asset(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("KINESIS_OUTPUT_PATH", "s3a://lake/access_log")
    from airflow.dag_processing.dagbag import DagBag

    microbatch = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_microbatch.py")).dags["kinesis_microbatch"]
    downstream = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_asset_downstream.py")).dags["kinesis_asset_downstream"]
    (scheduled_on,) = downstream.timetable.asset_condition.objects
    assert scheduled_on.uri == "s3://lake/access_log"
    assert scheduled_on in microbatch.get_task("ingest_access_log").outlets


@pytest.mark.dags
@pytest.mark.slow
def test_demo_runs_the_dag_twice_exactly_once(tmp_path):
    """``make demo`` at full size: airflow dags test, twice, on the real access log."""
    proc = subprocess.run(
        [sys.executable, "-m", "demo.run_demo", "--work-dir", str(tmp_path / "demo")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["batches"] >= 2
    assert result["records_in"] >= 10_517
    assert result["records_out"] == result["records_in"]
    assert result["duplicates"] == 0 and result["missing"] == 0 and result["unexpected"] == 0
    assert result["kpl_vector_records_ok"] == result["kpl_vector_records"] == 17
    assert result["schema_ok"] is True
    assert result["parsed_log_lines"] == 10_500


def test_backfill_dag_runs_cover_consecutive_non_empty_windows(tmp_path, monkeypatch):
    """Each scheduled or backfill run's data interval is the window it reads: never empty."""
    from datetime import datetime, timedelta, timezone

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("KINESIS_WINDOW_SECONDS", "600")
    from airflow.dag_processing.dagbag import DagBag

    from airflow.sdk.definitions.timetables.interval import DeltaDataIntervalTimetable
    from airflow.serialization.serialized_objects import decode_timetable, encode_timetable

    dag = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_backfill.py")).dags["kinesis_backfill"]
    assert isinstance(dag.timetable, DeltaDataIntervalTimetable)
    scheduler_side = decode_timetable(encode_timetable(dag.timetable))  # what the scheduler runs
    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    first = scheduler_side.infer_manual_data_interval(run_after=start)
    assert first.end - first.start == timedelta(minutes=10)
    task = dag.get_task("read_window")
    assert "data_interval_start" in task.window_start and "data_interval_end" in task.window_end
