"""Split tasks (operators/split.py) against moto over HTTP, each task's ``execute`` as Airflow's
task runner calls it: the plan task can be built, with nothing to read it skips the job
task and still hands the commit task its summary, and a table output is committed by the commit task."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import BaseOperator, BaseXCom, dag
from airflow.sdk.exceptions import DownstreamTasksSkipped

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from airflow_kinesis_spark.operators.split import (
    JOB_ARGUMENTS_KEY,
    KinesisCommitBatchOperator,
    KinesisPlanBatchOperator,
    kinesis_batch_task_group,
)
from airflow_kinesis_spark.operators.settings import OutputSettings, RecordSettings, SparkSettings
from tests.conftest import create_stream

pytestmark = pytest.mark.integration


class FakeTaskInstance:
    """What ``execute`` and ``XComArg.resolve`` use of Airflow's runtime task instance; XComs in a
    dict shared by the run's task instances (``xcoms[(task_id, key)]``)."""

    def __init__(self, task_id: str, xcoms: dict[tuple[str, str], Any], run_id: str = "manual__2026-11-23T10:00:00+00:00"):
        self.dag_id, self.task_id, self.run_id = "split_test", task_id, run_id
        self.try_number, self.map_index = 1, -1
        self.xcoms = xcoms

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = value

    def xcom_pull(self, task_ids: str, key: str = BaseXCom.XCOM_RETURN_KEY, **_: Any) -> Any:
        return self.xcoms.get((task_ids, key))


def context_for(task: BaseOperator, xcoms: dict[tuple[str, str], Any]) -> dict[str, Any]:
    ti = FakeTaskInstance(task.task_id, xcoms)
    return {"ti": ti, "task_instance": ti, "task": task, "run_id": ti.run_id,
            "dag_run": SimpleNamespace(run_type="manual"), "data_interval_end": None}  # fmt: skip


def split_dag(stream: str, output: str) -> Any:
    @dag(dag_id="split_test", schedule=None)
    def split_test():
        kinesis_batch_task_group(
            "g", job=lambda arguments: BaseOperator(task_id="job"), stream_name=stream, consumer_name="lake",
            checkpoint_table=f"{stream}_t", output_path=output,
        )  # fmt: skip

    return split_test()


def test_the_plan_operator_is_built_and_refuses_the_job_tasks_arguments(tmp_path):
    """Its bases are in an order whose ``__init__`` chain reaches ``BaseOperator`` (with
    ``SkipMixin`` first it ended in ``LoggingMixin.__init__``: every split DAG failed to import)."""
    kwargs = dict(task_id="plan", stream_name="s", consumer_name="c", checkpoint_table="t", output_path=str(tmp_path))
    plan = KinesisPlanBatchOperator(**kwargs)
    assert (plan.stream_name, plan.output_asset, plan.job_task_ids) == ("s", False, None)
    with pytest.raises(TypeError, match="does not take spark_settings: Spark runs in the job task"):
        KinesisPlanBatchOperator(spark_settings=SparkSettings(conn_id="spark_default"), **kwargs)


def test_with_nothing_to_read_the_job_is_skipped_and_the_commit_returns_the_plans_summary(
    aws_conn, kinesis, dynamodb, unique_name, tmp_path
):
    """The skip ends the plan task's ``execute`` with ``DownstreamTasksSkipped``, after which
    Airflow's task runner pushes no return value: the hand-over must be in XCom all the same, or
    the commit task (which runs when the job was skipped) fails on a missing hand-over."""
    create_stream(kinesis, unique_name, 2)
    split = split_dag(unique_name, str(tmp_path / "out"))
    plan, commit = split.get_task("g.plan"), split.get_task("g.commit")
    assert isinstance(plan, KinesisPlanBatchOperator) and isinstance(commit, KinesisCommitBatchOperator)
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    # First run: the new shards' checkpoints are recorded without a job; second run: nothing at all.
    for status, committed in (("committed_without_records", 1), ("no_new_records", 1)):
        xcoms: dict[tuple[str, str], Any] = {}
        with pytest.raises(DownstreamTasksSkipped) as skipped:
            plan.execute(context_for(plan, xcoms))
        assert skipped.value.tasks == ["g.job"]
        assert xcoms[("g.plan", JOB_ARGUMENTS_KEY)] == []
        handover = xcoms.get(("g.plan", BaseXCom.XCOM_RETURN_KEY))
        assert handover is not None, "the plan task's hand-over was not pushed before the skip"
        assert handover["status"] == status and handover[JOB_ARGUMENTS_KEY] == []

        summary = commit.execute(context_for(commit, xcoms))
        assert summary["status"] == status and summary == handover["summary"]
        head = store.head()
        assert head.pending_batch_id is None and head.committed_batch_id == committed


def test_a_split_group_with_a_delta_output_commits_the_batch_to_the_table_in_the_commit_task(
    aws_conn, kinesis, dynamodb, unique_name, tmp_path
):
    """Plan task (the output spec goes into the stored plan), a job that takes its batch from the
    store (``core.job.run_handed_batch``; a pyarrow writer stands in for Spark, which this
    moto-only test does not start), commit task: the Delta table gets the batch once, with its
    transaction, and a retried commit adds nothing."""
    import os
    import shutil
    from datetime import timedelta

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from airflow_kinesis_spark.core.job import job_arguments_from, run_handed_batch
    from demo.producer import put_plain
    from tests.helpers import read_plan

    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"row {i}".encode()) for i in range(20)])
    output = tmp_path / "delta"

    @dag(dag_id="split_test", schedule=None)
    def split_test():
        kinesis_batch_task_group(
            "g", job=lambda arguments: BaseOperator(task_id="job"), stream_name=unique_name, consumer_name="lake",
            checkpoint_table=f"{unique_name}_t", output_path=str(output), output_settings=OutputSettings(format="delta"),
        )  # fmt: skip

    split = split_test()
    plan_task, commit = split.get_task("g.plan"), split.get_task("g.commit")
    xcoms: dict[tuple[str, str], Any] = {}
    handover = plan_task.execute(context_for(plan_task, xcoms))
    xcoms[("g.plan", BaseXCom.XCOM_RETURN_KEY)] = handover  # what Airflow's task runner pushes
    assert handover["status"] == "pending"
    arguments = job_arguments_from(xcoms[("g.plan", JOB_ARGUMENTS_KEY)])
    store = DynamoDBCheckpointStore(dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
    assert store.pending_plan(store.head()).output["format"] == "delta"  # what the job writes travels in the plan

    def write(plan, location):  # the job's write: the plan's rows, one file per arrival_date (the plan's spec)
        rows, reports = read_plan(kinesis, plan)
        day = (plan.cutoff - timedelta(seconds=1)).date()
        folder = os.path.join(location, f"_p0={day.isoformat()}")
        os.makedirs(folder)
        arrival = pa.array([plan.cutoff - timedelta(seconds=1)] * len(rows), pa.timestamp("us", tz="UTC"))
        pq.write_table(pa.table({"shard_id": [r[0] for r in rows], "sequence_number": [r[1] for r in rows],
                                 "approximate_arrival_timestamp": arrival, "arrival_date": pa.array([day] * len(rows), pa.date32())}),
                       os.path.join(folder, "part-0.parquet"))  # fmt: skip
        return {"records": len(rows), "quarantine_location": None, "reports": [r.to_dict() for r in reports]}

    def publish(staging, target):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(staging, target)

    run_handed_batch(store, arguments, write=write, publish=publish, discard=lambda s: shutil.rmtree(s, True), cancel=lambda: None)
    summary = commit.execute(context_for(commit, xcoms))
    assert summary["status"] == "committed" and summary["records"] == 20
    assert summary["output_format"] == "delta" and summary["table"]["version"] == 0 and summary["table"]["files"] == 1
    table = DeltaTable(str(output))
    assert pa.table(table.to_pyarrow_table()).num_rows == 20 and table.transaction_version(f"airflow-kinesis-spark:{unique_name}:lake") == 1
    again = commit.execute(context_for(commit, xcoms))  # a retried commit task: nothing added
    assert again["status"] == "committed" and DeltaTable(str(output)).version() == 0


def test_a_deferrable_commit_task_defers_only_while_no_report_is_recorded(aws_conn, kinesis, dynamodb, unique_name, tmp_path):
    """The commit task reads the head before it defers: while the job runs it defers; once the job
    recorded its report (the job task ran before the commit task, as it does in the task group) it
    commits at once, in the worker, instead of a round trip through the triggerer."""
    import os
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_kinesis_spark.core.job import job_arguments_from, run_handed_batch
    from airflow_kinesis_spark.triggers.kinesis import KinesisBatchReportTrigger
    from demo.producer import put_plain
    from tests.helpers import read_plan

    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"row {i}".encode()) for i in range(12)])
    output = str(tmp_path / "out")
    split = split_dag(unique_name, output)
    plan_task = split.get_task("g.plan")
    commit = KinesisCommitBatchOperator(
        task_id="commit", stream_name=unique_name, consumer_name="lake", checkpoint_table=f"{unique_name}_t",
        plan_task_id="g.plan", output_path=output, deferrable=True, poke_interval=1.0,
    )  # fmt: skip
    xcoms: dict[tuple[str, str], Any] = {}
    handover = plan_task.execute(context_for(plan_task, xcoms))
    xcoms[("g.plan", BaseXCom.XCOM_RETURN_KEY)] = handover
    assert handover["status"] == "pending"

    with pytest.raises(TaskDeferred) as deferred:  # no report yet: wait in the triggerer
        commit.execute(context_for(commit, xcoms))
    assert isinstance(deferred.value.trigger, KinesisBatchReportTrigger)
    assert deferred.value.trigger.batch_id == handover["batch_id"]

    def write(plan, location):
        rows, reports = read_plan(kinesis, plan)
        os.makedirs(location)
        pq.write_table(pa.table({"shard_id": [r[0] for r in rows], "sequence_number": [r[1] for r in rows]}),
                       os.path.join(location, "part-0.parquet"))  # fmt: skip
        return {"records": len(rows), "quarantine_location": None, "reports": [r.to_dict() for r in reports]}

    def publish(staging, target):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(staging, target)

    arguments = job_arguments_from(xcoms[("g.plan", JOB_ARGUMENTS_KEY)])
    store = DynamoDBCheckpointStore(dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
    run_handed_batch(store, arguments, write=write, publish=publish, discard=lambda s: shutil.rmtree(s, True), cancel=lambda: None)
    assert store.head().pending_report_owner is not None

    summary = commit.execute(context_for(commit, xcoms))  # the report is recorded: commit now, no deferral
    assert summary["status"] == "committed" and summary["records"] == 12 and summary["batch_id"] == handover["batch_id"]
    head = store.head()
    assert head.pending_batch_id is None and head.committed_batch_id == handover["batch_id"]
    again = commit.execute(context_for(commit, xcoms))  # a retried commit task: committed already, no deferral either
    assert again["status"] == "committed" and store.head().committed_batch_id == handover["batch_id"]


def test_a_split_group_with_typed_records_carries_the_schema_in_the_plan_and_counts_dead_letters(
    aws_conn, kinesis, dynamodb, unique_name, tmp_path
):
    """record_settings on the task group: the plan task stores the record spec in the plan; a
    stand-in job (``core.job.run_handed_batch`` with a pyarrow writer, no Spark: the decoding in
    Spark is tests/spark/test_typed_job.py's) writes rows and dead letters from the stored spec;
    the commit task checks the dead letters against the dead-letter output and counts them."""
    import json
    import os
    import shutil
    from dataclasses import replace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_kinesis_spark.core.job import job_arguments_from, run_handed_batch
    from airflow_kinesis_spark.core.records import RecordDecoder
    from demo.producer import put_plain
    from tests.helpers import read_plan

    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    create_stream(kinesis, unique_name, 1)
    put_plain(kinesis, unique_name, [(f"k{i}", json.dumps({"id": i, "name": f"n{i}"}).encode()) for i in range(9)] + [("bad", b"{")])
    output = tmp_path / "out"

    @dag(dag_id="typed_split", schedule=None)
    def typed():
        kinesis_batch_task_group(
            "g", job=lambda arguments: BaseOperator(task_id="job"), stream_name=unique_name, consumer_name="lake",
            checkpoint_table=f"{unique_name}_t", output_path=str(output),
            record_settings=RecordSettings(format="json", schema=json.dumps(schema), max_dead_letter_fraction=0.2),
        )  # fmt: skip

    split = typed()
    plan_task, commit = split.get_task("g.plan"), split.get_task("g.commit")
    xcoms: dict[tuple[str, str], Any] = {}
    xcoms[("g.plan", BaseXCom.XCOM_RETURN_KEY)] = plan_task.execute(context_for(plan_task, xcoms))
    arguments = job_arguments_from(xcoms[("g.plan", JOB_ARGUMENTS_KEY)])
    store = DynamoDBCheckpointStore(dynamodb, arguments.checkpoint_table, arguments.stream_name, arguments.consumer_name)
    records = store.pending_plan(store.head()).output["records"]
    assert records["format"] == "json" and json.loads(records["schema"]) == schema

    def write(plan, location):
        rows, reports = read_plan(kinesis, plan)
        decoded = RecordDecoder(plan.output["records"]).decode([r[3] for r in rows])
        keep = pa.array([k is None for k in decoded.kinds])
        table = pa.table({"shard_id": [r[0] for r in rows], "sequence_number": [r[1] for r in rows],
                          "sub_sequence_number": pa.array([r[2] for r in rows], pa.int64()),
                          **dict(zip(["id", "name"], decoded.columns))})  # fmt: skip
        os.makedirs(f"{location}/_quarantine")
        pq.write_table(table.filter(keep), f"{location}/part-0.parquet")
        pq.write_table(table.filter(pa.compute.invert(keep)).select(["shard_id", "sequence_number", "sub_sequence_number"]),
                       f"{location}/_quarantine/part-0.parquet")  # fmt: skip
        reports = [replace(r, dead_letters=decoded.dead_letters) for r in reports]
        return {"records": len(rows), "quarantine_location": f"{location}/_quarantine", "reports": [r.to_dict() for r in reports]}

    def publish(staging, target):
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(staging, target)

    run_handed_batch(store, arguments, write=write, publish=publish, discard=lambda s: shutil.rmtree(s, True), cancel=lambda: None)
    summary = commit.execute(context_for(commit, xcoms))
    assert summary["status"] == "committed" and summary["records"] == 10 and summary["dead_letters"] == 1
    assert pq.read_table(summary["output_path"]).column("id").to_pylist() == list(range(9))
