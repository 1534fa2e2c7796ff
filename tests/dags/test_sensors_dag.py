"""``airflow dags test kinesis_sensors`` on moto: guard, deferred lag sensor, ingestion, resharding watch."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain
from demo.stack import BIN, airflow, airflow_env
from tests.conftest import create_stream

pytestmark = [pytest.mark.dags, pytest.mark.slow, pytest.mark.spark]


def test_sensor_dag_defers_until_records_arrive_then_ingests(moto_endpoint, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    env = airflow_env(tmp_path / "airflow_home", moto_endpoint, {
        "KINESIS_STREAM": unique_name, "KINESIS_CONSUMER": "lake", "KINESIS_CHECKPOINT_TABLE": f"{unique_name}_t",
        "KINESIS_OUTPUT_PATH": str(tmp_path / "out"),
    })  # fmt: skip
    (tmp_path / "airflow_home").mkdir()
    airflow(["db", "migrate"], env)
    lines: list[str] = []
    proc = subprocess.Popen([str(BIN / "airflow"), "dags", "test", "kinesis_sensors"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 300
    while not any("Deferring: KinesisShardLagTrigger" in line for line in list(lines)):
        assert proc.poll() is None, "".join(lines)[-3000:]
        assert time.monotonic() < deadline, "the lag sensor never deferred"
        time.sleep(0.2)
    put_plain(kinesis, unique_name, [(f"10.0.0.{i % 5}", f"line {i}".encode()) for i in range(50)])
    assert proc.wait(timeout=300) == 0
    reader.join(timeout=10)
    log = "".join(lines)
    assert "DagRun Finished" in log and "state=success" in log, log[-3000:]
    store = DynamoDBCheckpointStore(dynamodb, f"{unique_name}_t", unique_name, "lake")
    assert store.head().committed_batch_id == 1
    assert sum(1 for _ in (tmp_path / "out" / "batch_id=1").glob("part-*.parquet")) >= 1
