"""The operator's output Asset (events with the batch summary, a downstream DAG queued) and its
OpenLineage datasets, after real batches: moto over HTTP, real spark-submit, ``airflow dags test``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset, AssetAlias

from airflow_kinesis_spark.lineage import (
    asset_event_extra,
    asset_for_output,
    operator_lineage,
    output_dataset_name,
    output_uri,
    stream_dataset_name,
)
from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import ReadOptions
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator
from demo.producer import put_plain
from demo.stack import airflow, airflow_env
from tests.conftest import REGION, create_stream

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def log_lines(n: int) -> list[tuple[str, bytes]]:
    """``n`` Apache combined-log lines (what kinesis_microbatch's transform parses)."""
    return [
        (f"10.0.0.{i % 5}", f'10.0.0.{i % 5} - - [21/Nov/2026:10:00:{i % 60:02d} +0000] "GET /p/{i} HTTP/1.1" 200 {100 + i} "-" "test"'.encode())
        for i in range(n)
    ]


def rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


# -- names: pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "uri"),
    [
        ("/data/lake/access_log", "file:///data/lake/access_log"),
        ("/data/lake/access_log/", "file:///data/lake/access_log"),
        ("file:///data/lake", "file:///data/lake"),
        ("file://nas01/data/lake", "file://nas01/data/lake"),
        ("s3a://lake/access_log/", "s3://lake/access_log"),
        ("s3://lake/access_log", "s3://lake/access_log"),
        ("s3n://lake/x", "s3://lake/x"),
        ("gs://lake/x", "gs://lake/x"),
        ("relative/dir", None),
        ("{{ var.value.lake }}/x", None),
        ("", None),
    ],
)
def test_output_uri(path, uri):
    assert output_uri(path) == uri


@pytest.mark.parametrize(
    ("uri", "dataset"),
    [
        ("file:///data/lake", ("file", "/data/lake")),
        ("file://nas01/data/lake", ("file://nas01", "/data/lake")),
        ("s3://lake/access_log", ("s3://lake", "access_log")),
        ("s3://lake", ("s3://lake", "/")),
        ("hdfs://nn:8020/lake/x", ("hdfs://nn:8020", "/lake/x")),
    ],
)
def test_openlineage_names_follow_the_naming_spec(uri, dataset):
    assert output_dataset_name(uri) == dataset
    assert stream_dataset_name("orders", "eu-west-1") == ("kinesis://eu-west-1", "orders")


def test_operators_declare_the_output_asset_unless_told_not_to():
    def outlets(**kwargs):
        return KinesisToSparkOperator(task_id="t", stream_name="s", consumer_name="c", checkpoint_table="tbl", **kwargs).outlets

    assert outlets(output_path="s3a://lake/x/") == [Asset(name="s3://lake/x", uri="s3://lake/x")]
    assert outlets(output_path="s3a://lake/x", output_asset=False) == []
    assert outlets(output_path="{{ var.value.lake }}") == []  # rendered only at run time
    assert outlets(output_path="/lake", outlets=[Asset("file:///lake")]) == [Asset("file:///lake")]  # not twice
    window = KinesisWindowToSparkOperator(task_id="w", stream_name="s", output_path="/lake/w")
    assert window.outlets == [asset_for_output("/lake/w")]
    with pytest.raises(ValueError, match="no asset"):
        asset_for_output("relative")


def test_window_event_extra_names_the_window():
    extra = asset_event_extra({"mode": "window", "status": "written", "stream_name": "s", "records": 3, "bytes": 9,
                               "window_start": "a", "window_end": "b", "output_path": "/o/window=x",
                               "shards": {"shardId-0": {"records": 3, "slices": 2}}})  # fmt: skip
    assert extra["batch_id"] is None and extra["records"] == 3 and extra["shards"] == {"shardId-0": 3}
    assert extra["window_start"] == "a" and extra["window_end"] == "b"


def test_a_table_output_is_named_in_the_event_extra_and_the_lineage():
    table = {"format": "iceberg", "table": "lake.clicks", "snapshot_id": 42, "version": None, "files": 2,
             "already_committed": False, "seconds": 0.1}  # fmt: skip
    summary = {"batch_id": 7, "status": "committed", "stream_name": "s", "records": 3, "bytes": 9, "output_path": "/o/batch_id=7",
               "shards": {}, "output_format": "iceberg", "table": table}  # fmt: skip
    extra = asset_event_extra(summary)
    assert extra["output_format"] == "iceberg" and extra["table"]["table"] == "lake.clicks" and extra["table"]["snapshot_id"] == 42
    assert "table" not in asset_event_extra({**summary, "output_format": "parquet", "table": None})

    lineage = operator_lineage(stream_name="s", region="eu-west-1", output_path="s3a://lake/clicks", summary=summary,
                               table="lake.clicks", output_format="iceberg")  # fmt: skip
    (output,) = lineage.outputs
    assert (output.namespace, output.name) == ("s3://lake", "clicks")
    (identifier,) = output.facets["symlinks"].identifiers
    assert (identifier.name, identifier.type) == ("lake.clicks", "TABLE")
    plain = operator_lineage(stream_name="s", region="eu-west-1", output_path="s3a://lake/clicks", summary=summary)
    assert "symlinks" not in plain.outputs[0].facets


# -- a real batch --------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_lineage_and_alias_events_of_a_real_batch(aws_conn, kinesis, dynamodb, tmp_path, unique_name):
    """OpenLineage after a committed batch and an idle run; events through an AssetAlias only with records."""
    from airflow.sdk.execution_time.context import OutletEventAccessors
    from openlineage.client.serde import Serde

    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, [(f"k{i}", f"r{i}".encode()) for i in range(40)])
    output = tmp_path / "out"

    def operator() -> KinesisToSparkOperator:
        return KinesisToSparkOperator(
            task_id="ingest", stream_name=unique_name, consumer_name="tests", checkpoint_table=f"{unique_name}_ckpt",
            output_path=str(output), read_options=ReadOptions(min_call_interval=0.0), output_asset=False, outlets=[AssetAlias("kinesis-lake")],
        )  # fmt: skip

    batch, events = operator(), OutletEventAccessors()
    summary = batch.execute({"outlet_events": events})
    assert summary["status"] == "committed" and summary["records"] == 40
    (alias_event,) = events[AssetAlias("kinesis-lake")].asset_alias_events
    assert alias_event.dest_asset_key.uri == f"file://{output}"
    assert alias_event.extra["batch_id"] == 1 and alias_event.extra["records"] == 40
    assert sum(alias_event.extra["shards"].values()) == 40 and alias_event.extra["output_path"] == f"{output}/batch_id=1"

    lineage = batch.get_openlineage_facets_on_complete(None)
    (stream,) = lineage.inputs
    (written,) = lineage.outputs
    assert (stream.namespace, stream.name) == (f"kinesis://{REGION}", unique_name)
    assert stream.inputFacets["inputStatistics"].rowCount == 40
    assert (written.namespace, written.name) == ("file", str(output))
    assert written.outputFacets["outputStatistics"].rowCount == summary["records"] == 40
    assert json.loads(Serde.to_json(written))["outputFacets"]["outputStatistics"]["rowCount"] == 40

    idle, idle_events = operator(), OutletEventAccessors()
    assert idle.execute({"outlet_events": idle_events})["status"] == "no_new_records"
    assert idle_events[AssetAlias("kinesis-lake")].asset_alias_events == []  # no event without records
    (idle_out,) = idle.get_openlineage_facets_on_complete(None).outputs
    assert idle_out.outputFacets["outputStatistics"].rowCount == 0


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.dags
def test_batches_emit_the_output_asset_event_that_queues_the_downstream_dag(moto_endpoint, kinesis, unique_name, tmp_path, monkeypatch):
    """``airflow dags test kinesis_microbatch`` twice (a batch, then an idle run); the asset events in
    Airflow's database carry the batch summary, and kinesis_asset_downstream is queued on them."""
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, log_lines(60))
    home, output = tmp_path / "airflow_home", tmp_path / "lake"
    home.mkdir()
    env = airflow_env(home, moto_endpoint, {
        "KINESIS_STREAM": unique_name, "KINESIS_CONSUMER": "lake", "KINESIS_CHECKPOINT_TABLE": f"{unique_name}_t",
        "KINESIS_OUTPUT_PATH": str(output), "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    })  # fmt: skip
    airflow(["db", "migrate"], env)
    airflow(["dags", "reserialize"], env)  # every example DAG in the DB, unpaused: the downstream one is scheduled on the asset
    db = home / "airflow.db"
    uri = f"file://{output}"
    assert rows(db, "SELECT r.dag_id FROM dag_schedule_asset_reference r JOIN asset a ON a.id = r.asset_id WHERE a.uri = ?", uri) == [
        ("kinesis_asset_downstream",)
    ]
    # The event-driven example's watcher is registered with its trigger.
    triggers = rows(db, "SELECT classpath, kwargs FROM trigger")
    assert any(path == "airflow_kinesis_spark.triggers.kinesis.KinesisBacklogTrigger" for path, _ in triggers), triggers

    airflow(["dags", "test", "kinesis_microbatch"], env)
    events = rows(db, "SELECT e.extra, e.source_dag_id, e.source_task_id FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                      "WHERE a.uri = ? ORDER BY e.id", uri)  # fmt: skip
    assert len(events) == 1
    extra, dag_id, task_id = events[0]
    extra = json.loads(extra)
    assert (dag_id, task_id) == ("kinesis_microbatch", "ingest_access_log")
    assert extra["batch_id"] == 1 and extra["status"] == "committed" and extra["records"] == 60
    assert sum(extra["shards"].values()) == 60 and extra["output_path"] == f"{output}/batch_id=1"
    assert extra["stream_name"] == unique_name and extra["consumer_name"] == "lake"
    queued = rows(db, "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id WHERE a.uri = ?", uri)
    assert queued == [("kinesis_asset_downstream",)]

    # A run without new records still emits an event (Airflow emits one per declared outlet), with records 0.
    airflow(["dags", "test", "kinesis_microbatch"], env)
    extras = [json.loads(e) for (e,) in rows(db, "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                                                 "WHERE a.uri = ? ORDER BY e.id", uri)]  # fmt: skip
    assert len(extras) == 2
    assert extras[1]["status"] == "no_new_records" and extras[1]["records"] == 0
    assert extras[1]["batch_id"] is None and extras[1]["output_path"] is None

    # What the downstream task makes of those events (as triggering_asset_events hands them over).
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.setenv("KINESIS_OUTPUT_PATH", str(output))
    dag = DagBag(dag_folder=str(ROOT / "dags" / "kinesis_asset_downstream.py")).dags["kinesis_asset_downstream"]
    fresh_data = asset_for_output(str(output))
    assert [a.uri for a in dag.timetable.asset_condition.objects] == [uri]
    result = dag.get_task("new_batches").python_callable(
        triggering_asset_events={fresh_data: [SimpleNamespace(extra=e) for e in extras]}
    )
    assert result["records"] == 60
    assert result["batches"] == [{"batch_id": 1, "records": 60, "output_path": f"{output}/batch_id=1", "shards": extras[0]["shards"]}]
