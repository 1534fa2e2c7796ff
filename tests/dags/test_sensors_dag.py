"""``airflow dags test kinesis_sensors`` on moto, every sensor in poke mode and in deferrable mode:
retention guard, lag sensor (waits until records arrive), ingestion, resharding watch (a split
made after the batch commits). Their XComs, read from Airflow's metadata database, carry per-shard
figures."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import time

import pytest

from airflow_kinesis_spark.core.shards import list_shards
from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain
from demo.stack import BIN, airflow, airflow_env
from tests.conftest import create_stream

pytestmark = [pytest.mark.dags, pytest.mark.slow, pytest.mark.spark]


def wait_for(lines: list[str], text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in list(lines)):
        assert proc.poll() is None, f"the DAG run ended before {text!r}:\n" + "".join(lines)[-3000:]
        assert time.monotonic() < deadline, f"never saw {text!r}"
        time.sleep(0.2)


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferrable", "poke"])
def test_sensor_dag(deferrable, moto_endpoint, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    home = tmp_path / "airflow_home"
    home.mkdir()
    env = airflow_env(home, moto_endpoint, {
        "KINESIS_STREAM": unique_name, "KINESIS_CONSUMER": "lake", "KINESIS_CHECKPOINT_TABLE": f"{unique_name}_t",
        "KINESIS_OUTPUT_PATH": str(tmp_path / "out"), "KINESIS_SENSORS_DEFERRABLE": str(deferrable).lower(),
    })  # fmt: skip
    airflow(["db", "migrate"], env)
    lines: list[str] = []
    proc = subprocess.Popen([str(BIN / "airflow"), "dags", "test", "kinesis_sensors"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    # the lag sensor waits: deferred to its trigger, or poking in the worker
    wait_for(lines, "Deferring: KinesisShardLagTrigger" if deferrable else "waiting", proc)
    put_plain(kinesis, unique_name, [(f"10.0.0.{i % 5}", f"line {i}".encode()) for i in range(50)])
    wait_for(lines, "Batch 1 committed", proc)
    parent = list_shards(kinesis, unique_name)[0]
    middle = (int(parent.starting_hash_key) + int(parent.ending_hash_key)) // 2
    kinesis.split_shard(StreamName=unique_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle))
    assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
    log = "".join(lines)
    assert "DagRun Finished" in log and "state=success" in log, log[-3000:]
    if deferrable:
        assert "Deferring: KinesisShardLagTrigger" in log and "ready (from the trigger)" in log
    assert DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake").head().committed_batch_id == 1

    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute("SELECT task_id, value FROM xcom WHERE key = 'return_value'").fetchall()
    xcom = {task: json.loads(value) if isinstance(value, str) else json.loads(bytes(value)) for task, value in rows}
    lag = xcom["wait_for_backlog"]
    assert set(lag["shards"]) == {s.shard_id for s in list_shards(kinesis, unique_name) if not s.parent_shard_id}
    assert all({"age_ms", "millis_behind_latest", "checkpoint"} <= set(v) for v in lag["shards"].values())
    assert lag["shards_with_unconsumed"]
    guard = xcom["retention_guard"]
    assert guard["at_risk"] == {} and set(guard["lag"]["shards"]) == set(lag["shards"])
    change = xcom["watch_resharding"]
    assert change["closed_shards"] == [parent.shard_id] and len(change["children"][parent.shard_id]) == 2
    assert xcom["ingest"]["records"] == 50 and set(xcom["ingest"]["shards"]) == set(lag["shards"])
