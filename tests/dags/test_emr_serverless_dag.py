"""dags/kinesis_emr_serverless.py: the DAG parses, and its plan and commit tasks give the EMR
Serverless job run the right arguments.

The plan task's ``execute`` runs against moto over HTTP; the job task's templated ``job_driver``
is rendered with the plan task's XCom, as Airflow renders it before the job task runs; the
rendered ``entryPointArguments`` are parsed by the job script's own argument parser and run by
the driver's side of the job contract (``core.job.run_handed_batch``, with plain-Python
callables in place of Spark); the commit task defers to its trigger, which is run against moto,
and commits from the trigger's event.

The EMR Serverless call itself (``StartJobRun``) is not made: nothing here emulates EMR
Serverless, and the job task's ``execute`` is never called.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import BaseXCom
from airflow.sdk.exceptions import TaskDeferred

from airflow_kinesis_spark.core.job import JobArguments, run_handed_batch
from airflow_kinesis_spark.core.reader import ShardReader
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.job import parse_args
from airflow_kinesis_spark.operators.split import JOB_ARGUMENTS_KEY, KinesisCommitBatchOperator, KinesisPlanBatchOperator
from airflow_kinesis_spark.triggers.kinesis import KinesisBatchReportTrigger
from demo.producer import put_aggregated, put_plain
from tests.conftest import REGION, create_stream

pytestmark = [pytest.mark.dags, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "dags" / "kinesis_emr_serverless.py"
JOB_CODE = "s3://code-bucket/kinesis-spark/test"
RUN_ID = "scheduled__2026-11-23T10:00:00+00:00"


class FakeTaskInstance:
    """What ``execute`` and ``XComArg.resolve`` use of Airflow's runtime task instance; the run's
    XComs in one dict (``xcoms[(task_id, key)]``)."""

    def __init__(self, dag_id: str, task_id: str, xcoms: dict[tuple[str, str], Any]) -> None:
        self.dag_id, self.task_id, self.run_id, self.try_number, self.map_index = dag_id, task_id, RUN_ID, 1, -1
        self.xcoms = xcoms

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = value

    def xcom_pull(self, task_ids: str, key: str = BaseXCom.XCOM_RETURN_KEY, **_: Any) -> Any:
        return self.xcoms.get((task_ids, key))


def context_for(task: Any, xcoms: dict[tuple[str, str], Any]) -> dict[str, Any]:
    ti = FakeTaskInstance(task.dag_id, task.task_id, xcoms)
    return {"ti": ti, "task_instance": ti, "task": task, "run_id": RUN_ID,
            "dag_run": SimpleNamespace(run_type="manual"), "data_interval_end": None}  # fmt: skip


def load_dag(monkeypatch, tmp_path: Path, **env: str) -> Any:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow_home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags["kinesis_emr_serverless"]


def test_the_dag_runs_an_emr_serverless_job_between_the_plan_and_a_deferrable_commit(monkeypatch, tmp_path):
    from airflow.providers.amazon.aws.operators.emr import EmrServerlessStartJobOperator

    dag = load_dag(monkeypatch, tmp_path, KINESIS_SPARK_JOB_S3=JOB_CODE + "/")
    plan, job, commit = dag.get_task("ingest.plan"), dag.get_task("ingest.job"), dag.get_task("ingest.commit")
    assert isinstance(plan, KinesisPlanBatchOperator) and isinstance(commit, KinesisCommitBatchOperator)
    assert isinstance(job, EmrServerlessStartJobOperator)
    assert job.upstream_task_ids == {"ingest.plan"} and commit.upstream_task_ids == {"ingest.job"}
    assert plan.job_task_ids == ["ingest.job"]
    assert commit.deferrable is True and commit.trigger_rule == "none_failed" and commit.plan_task_id == "ingest.plan"
    assert job.deferrable is True and job.wait_for_completion is True
    driver = job.job_driver["sparkSubmit"]
    assert driver["entryPoint"] == f"{JOB_CODE}/kinesis_batch.py"
    assert driver["sparkSubmitParameters"] == f"--py-files {JOB_CODE}/airflow_kinesis_spark_core.zip"
    assert plan.transform == "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"
    assert dag.max_active_runs == 1 and job.retry_delay.total_seconds() > plan.lease_seconds


def test_a_packed_python_environment_becomes_the_jobs_python(monkeypatch, tmp_path):
    dag = load_dag(monkeypatch, tmp_path, KINESIS_SPARK_JOB_S3=JOB_CODE, KINESIS_EMR_PYTHON_ARCHIVE="s3://code-bucket/venv.tar.gz")
    parameters = dag.get_task("ingest.job").job_driver["sparkSubmit"]["sparkSubmitParameters"]
    assert parameters.startswith(f"--py-files {JOB_CODE}/airflow_kinesis_spark_core.zip ")
    assert "--conf spark.archives=s3://code-bucket/venv.tar.gz#environment" in parameters
    assert "--conf spark.emr-serverless.driverEnv.PYSPARK_PYTHON=./environment/bin/python" in parameters
    assert "--conf spark.executorEnv.PYSPARK_PYTHON=./environment/bin/python" in parameters


def test_the_plan_task_hands_the_job_run_its_batch_and_the_commit_commits_its_report(
    monkeypatch, tmp_path, aws_conn, kinesis, dynamodb, unique_name
):
    table, consumer, output = f"{unique_name}_t", "lake-emr", tmp_path / "lake"
    dag = load_dag(monkeypatch, tmp_path, KINESIS_SPARK_JOB_S3=JOB_CODE, KINESIS_STREAM=unique_name,
                   KINESIS_EMR_CONSUMER=consumer, KINESIS_CHECKPOINT_TABLE=table, KINESIS_EMR_OUTPUT_PATH=str(output))  # fmt: skip
    create_stream(kinesis, unique_name, 2)
    lines = [(f"10.0.0.{i % 7}", f'10.0.0.{i % 7} - - [23/Nov/2026:10:00:00 +0000] "GET /{i} HTTP/1.1" 200 {i}'.encode()) for i in range(60)]
    produced = put_plain(kinesis, unique_name, lines[:30]) + put_aggregated(kinesis, unique_name, lines[30:])
    plan, job, commit = dag.get_task("ingest.plan"), dag.get_task("ingest.job"), dag.get_task("ingest.commit")
    xcoms: dict[tuple[str, str], Any] = {}

    # The plan task, for real against moto.
    handover = plan.execute(context_for(plan, xcoms))
    xcoms[("ingest.plan", BaseXCom.XCOM_RETURN_KEY)] = handover  # what Airflow's task runner pushes
    arguments = xcoms[("ingest.plan", JOB_ARGUMENTS_KEY)]
    assert handover["status"] == "pending" and handover["batch_id"] == 1 and handover[JOB_ARGUMENTS_KEY] == arguments
    assert all(isinstance(a, str) for a in arguments)
    store = DynamoDBCheckpointStore(dynamodb, table, unique_name, consumer)
    head = store.head()
    assert head.pending_batch_id == 1 and head.pending_owner == handover["lease_owner"]

    # The job task's job_driver, rendered with the plan task's XCom (no EMR call).
    job.render_template_fields(context_for(job, xcoms))
    driver = job.job_driver["sparkSubmit"]
    assert driver["entryPointArguments"] == arguments
    assert driver["entryPoint"] == f"{JOB_CODE}/kinesis_batch.py"
    assert job.name == f"kinesis-batch-{RUN_ID}"
    ns = parse_args(driver["entryPointArguments"])  # what the driver on EMR parses (kinesis_batch.py's main)
    job_args = JobArguments.from_namespace(ns)
    assert (job_args.checkpoint_table, job_args.stream_name, job_args.consumer_name) == (table, unique_name, consumer)
    assert (job_args.batch_id, job_args.lease_owner, job_args.region_name) == (1, handover["lease_owner"], REGION)
    assert job_args.records_expected is True and ns.transform == plan.transform

    # The commit task defers to the trigger that waits for the job's report.
    with pytest.raises(TaskDeferred) as deferred:
        commit.execute(context_for(commit, xcoms))
    trigger = deferred.value.trigger
    assert isinstance(trigger, KinesisBatchReportTrigger) and deferred.value.method_name == "execute_complete"
    _, kwargs = trigger.serialize()
    assert {k: kwargs[k] for k in ("stream_name", "consumer_name", "checkpoint_table", "batch_id", "lease_owner")} == {
        "stream_name": unique_name, "consumer_name": consumer, "checkpoint_table": table, "batch_id": 1,
        "lease_owner": handover["lease_owner"],
    }  # fmt: skip
    assert (kwargs["job_start_timeout"], kwargs["poke_interval"], kwargs["lease_seconds"]) == (1800.0, 15.0, plan.lease_seconds)

    # The driver's side of the job, given only those arguments (Python in place of Spark).
    def write(batch, location):
        rows, reports = [], []
        for rng in batch.ranges:
            records, report = ShardReader(kinesis, batch.stream_name, rng, min_call_interval=0).read_all()
            rows += [[r.shard_id, r.sequence_number, r.sub_sequence_number] for r in records]
            reports.append(report.to_dict())
        Path(location).mkdir(parents=True)  # Parquet, as the job writes it (the commit checks the report against it)
        pq.write_table(pa.table({"shard_id": [r[0] for r in rows], "sequence_number": [r[1] for r in rows],
                                 "sub_sequence_number": pa.array([r[2] for r in rows], pa.int64())}),
                       Path(location) / "part-0.parquet")  # fmt: skip
        return {"records": len(rows), "reports": reports}

    def publish(staging, target):
        shutil.rmtree(target, ignore_errors=True)
        if staging is not None:
            Path(staging).rename(target)

    outcome = run_handed_batch(
        DynamoDBCheckpointStore(dynamodb, job_args.checkpoint_table, job_args.stream_name, job_args.consumer_name), job_args,
        write=write, publish=publish, discard=lambda staging: shutil.rmtree(staging, ignore_errors=True), cancel=lambda: None,
    )  # fmt: skip
    assert outcome["status"] == "reported" and outcome["records"] == len(produced)

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    event = asyncio.run(asyncio.wait_for(first_event(), 120))
    assert event["status"] == "reported" and event["batch_id"] == 1
    summary = commit.execute_complete(context_for(commit, xcoms), event)
    assert summary["status"] == "committed" and summary["batch_id"] == 1 and summary["records"] == len(produced)
    assert store.head().committed_batch_id == 1
    written = zip(*pq.read_table(output / "batch_id=1" / "part-0.parquet").to_pydict().values(), strict=True)
    assert sorted(written, key=str) == sorted(((p.shard_id, p.sequence_number, p.sub_sequence_number) for p in produced), key=str)
