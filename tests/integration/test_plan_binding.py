"""BOUND: the job acts only on the plan the worker checked (issue 28, docs/security.md).

Whoever can write the checkpoint table can replace a pending plan after the worker checked it:
between a split task group's plan task and its job task (no race needed), or while the
operator's job starts. The job's arguments carry the checked plan's digest and the task's output
root; the driver (the real job script, ``spark_scripts/kinesis_batch.py``, run as its own
process) refuses any other plan before it reads or writes anything, and the commit refuses one
swapped after the job. After each: nothing outside the output root touched, no report recorded,
no checkpoint moved.

moto serves Kinesis and DynamoDB over HTTP. The refusal comes before the job starts Spark, so no
JVM runs here."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.protocol import IncrementalSettings, commit_handed, prepare_incremental, run_incremental
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain
from tests.conftest import REGION, ROOT, TEST_ACCESS_KEY, TEST_SECRET_KEY, create_stream

pytestmark = pytest.mark.integration

JOB = ROOT / "spark_scripts" / "kinesis_batch.py"


def plant(store: DynamoDBCheckpointStore, plan: BatchPlan) -> None:
    """Replace the pending plan's stored chunks, as anyone who can write the table can."""
    head = store.head()
    store._write_chunks(plan.batch_id, "PLAN", head.pending_plan_owner, plan.to_dict())


def run_job(arguments: list[str], moto_endpoint: str) -> subprocess.CompletedProcess:
    """The real job script in its own process, as a job task runs it (its driver's environment)."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
           "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": moto_endpoint, "PYTHONPATH": str(ROOT)}  # fmt: skip
    return subprocess.run([sys.executable, str(JOB), *arguments], env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def setup(kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    create_stream(kinesis, f"{unique_name}x", 1)  # another stream the planted plan points at
    put_plain(kinesis, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(20)])
    put_plain(kinesis, f"{unique_name}x", [(f"x{i}", f"other {i}".encode()) for i in range(5)])
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    store.ensure_table()
    victim = tmp_path / "elsewhere"  # outside the output root: must stay untouched
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    settings = IncrementalSettings(stream_name=unique_name, consumer_name="lake", output_root=str(tmp_path / "out"),
                                   cutoff=datetime.now(timezone.utc))  # fmt: skip
    return store, settings, victim


def swapped(plan: BatchPlan, victim: Path, unique_name: str) -> BatchPlan:
    """The planted plan: another stream, an output location outside the root."""
    return replace(plan, stream_name=f"{unique_name}x", output_location=str(victim / "batch_id=1"))


def assert_untouched(store: DynamoDBCheckpointStore, victim: Path) -> None:
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1 and head.pending_report_owner is None
    assert store.committed_checkpoints() == {}
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"] and (victim / "precious.txt").read_text() == "keep me"


def test_a_plan_swapped_between_the_plan_task_and_the_job_task_is_refused_by_the_job(
    setup, kinesis, moto_endpoint, unique_name
):
    store, settings, victim = setup
    prepared = prepare_incremental(kinesis, store, settings, "plan-task")  # the split group's plan task
    arguments = prepared.job_arguments(store, "plan-task", 60.0).to_args()  # what goes through XCom
    plant(store, swapped(prepared.plan, victim, unique_name))

    result = run_job(arguments, moto_endpoint)
    assert result.returncode != 0
    assert "is not the plan the worker checked" in result.stderr, result.stderr[-3000:]
    assert "digest" in result.stderr and "writes to" in result.stderr
    assert_untouched(store, victim)


def test_a_plan_swapped_after_the_operators_check_is_refused_by_the_job(setup, kinesis, moto_endpoint, unique_name):
    store, settings, victim = setup

    class PlantingJob:
        """The operator's handed job, with a writer of the table acting just before the job starts."""

        def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
            plan = store.pending_plan()
            plant(store, swapped(plan, victim, unique_name))
            result = run_job(arguments.to_args(), moto_endpoint)
            if result.returncode:
                raise RuntimeError(result.stderr[-2000:])

        def kill(self) -> None:
            pass

    with pytest.raises(RuntimeError, match="is not the plan the worker checked"):
        run_incremental(kinesis, store, PlantingJob(), settings, "operator")
    assert_untouched(store, victim)


def test_a_job_without_the_plan_digest_is_refused(setup, kinesis, moto_endpoint):
    """Arguments made by hand (or by an older plan task) carry no digest: the job does not guess."""
    store, settings, victim = setup
    prepared = prepare_incremental(kinesis, store, settings, "plan-task")
    arguments = replace(prepared.job_arguments(store, "plan-task", 60.0), plan_digest=None).to_args()
    result = run_job(arguments, moto_endpoint)
    assert result.returncode != 0 and "carry no plan digest" in result.stderr, result.stderr[-3000:]
    assert_untouched(store, victim)


def test_a_plan_swapped_after_the_job_recorded_its_report_is_refused_by_the_commit(setup, kinesis, dynamodb, unique_name):
    store, settings, victim = setup
    from airflow_kinesis_spark.exceptions import PlanBindingError
    from tests.integration.test_handoff import FileJob

    prepared = prepare_incremental(kinesis, store, settings, "plan-task")
    job = FileJob(kinesis, dynamodb)
    job.run_handed(prepared.job_arguments(store, "plan-task", 60.0))  # the job writes and records its report
    assert store.head().pending_report_owner is not None
    planted = replace(prepared.plan, checkpoints={}, ranges=prepared.plan.ranges[:1])  # commit fewer shards
    plant(store, planted)
    with pytest.raises(PlanBindingError, match="not the plan the planning run checked"):
        commit_handed(store, 1, "plan-task", 60.0, plan_digest=prepared.plan.digest())
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1 and store.committed_checkpoints() == {}
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]


def test_a_forged_report_that_claims_more_than_the_files_hold_commits_nothing(setup, kinesis, unique_name, tmp_path):
    """The job's files hold the first 3 records of each shard; a report recorded in the table
    (forged with a job's credentials) says 3 records up to the shard's newest one: committing it
    would move each checkpoint past records that were never written. The commit reads the
    published files and refuses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_kinesis_spark.core.schema import arrow_schema
    from airflow_kinesis_spark.exceptions import ReportValidationError
    from airflow_kinesis_spark.sinks.build import build_sink
    from tests.helpers import read_plan

    store, settings, victim = setup
    settings = replace(settings, sink=build_sink("parquet", settings.output_root, stream_name=unique_name, consumer_name="lake"))
    prepared = prepare_incremental(kinesis, store, settings, "plan-task")
    plan = prepared.plan
    rows, reports = read_plan(kinesis, plan)
    written = [r for shard in {r[0] for r in rows} for r in [x for x in rows if x[0] == shard][:3]]
    now = datetime.now(timezone.utc)
    table = pa.table({
        "stream_name": [unique_name] * len(written), "shard_id": [r[0] for r in written], "sequence_number": [r[1] for r in written],
        "sub_sequence_number": [r[2] for r in written], "partition_key": ["k"] * len(written),
        "explicit_hash_key": [None] * len(written), "approximate_arrival_timestamp": [now] * len(written),
        "data": [r[3] for r in written],
    }, schema=arrow_schema())  # fmt: skip
    Path(plan.output_location).mkdir(parents=True)
    pq.write_table(table, f"{plan.output_location}/part-00000.parquet")
    forged = [replace(r, records=3) for r in reports]  # the true last record of each range: past what was written
    store.record_report(plan.batch_id, "plan-task", forged)

    with pytest.raises(ReportValidationError, match="does not match the output published") as info:
        commit_handed(store, plan.batch_id, "plan-task", 60.0, sink=settings.sink, plan_digest=plan.digest())
    assert "the files hold 3 up to" in str(info.value)
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1 and store.committed_checkpoints() == {}


@pytest.mark.parametrize("transform", [None, "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"])
def test_a_forged_report_that_calls_unwritten_records_dead_letters_commits_nothing(setup, kinesis, unique_name, tmp_path, transform):
    """The files hold the first 3 records of each shard; the forged report counts every record
    read and calls the rest dead letters (records that did not decode), which no quarantine
    output holds: committing it would skip them. The commit reads the dead-letter output too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_kinesis_spark.core.schema import arrow_schema
    from airflow_kinesis_spark.exceptions import ReportValidationError
    from airflow_kinesis_spark.sinks.build import build_sink
    from tests.helpers import read_plan

    store, settings, _ = setup
    settings = replace(settings, sink=build_sink("parquet", settings.output_root, stream_name=unique_name, consumer_name="lake"),
                       transform=transform)  # with a transform the rows are not checked, the dead letters still are
    plan = prepare_incremental(kinesis, store, settings, "plan-task").plan
    rows, reports = read_plan(kinesis, plan)
    written = [r for shard in sorted({r[0] for r in rows}) for r in [x for x in rows if x[0] == shard][:3]]
    now = datetime.now(timezone.utc)
    n = len(written)
    table = pa.table({
        "stream_name": [unique_name] * n, "shard_id": [r[0] for r in written], "sequence_number": [r[1] for r in written],
        "sub_sequence_number": [r[2] for r in written], "partition_key": ["k"] * n, "explicit_hash_key": [None] * n,
        "approximate_arrival_timestamp": [now] * n, "data": [r[3] for r in written],
    }, schema=arrow_schema())  # fmt: skip
    Path(plan.output_location).mkdir(parents=True)
    pq.write_table(table, f"{plan.output_location}/part-00000.parquet")
    forged = [replace(r, dead_letters=r.records - 3) for r in reports]
    store.record_report(plan.batch_id, "plan-task", forged)

    with pytest.raises(ReportValidationError, match="quarantined records and dead letters, the quarantine output holds 0"):
        commit_handed(store, plan.batch_id, "plan-task", 60.0, sink=settings.sink, plan_digest=plan.digest())
    head = store.head()
    assert head.committed_batch_id == 0 and head.pending_batch_id == 1 and store.committed_checkpoints() == {}
