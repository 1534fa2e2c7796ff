"""A transform chosen in ``dag_run.conf`` never runs (issue #28, "Transforms only from code the DAG
author wrote").

Two DAGs of one consumer, run with ``airflow dags test`` on moto and a real ``spark-submit``:
``baseline`` names its transform in the DAG file and commits batch 1; ``from_conf`` templates its
transform from ``dag_run.conf`` (what a DAG author might write to make it configurable). Whoever
triggers ``from_conf`` passes ``{"transform": "planted_transform:wipe"}``: an importable function
that is not the DAG author's, which removes a file outside the output root and passes the batch
through. Before the fix it ran in the job, the file was gone and the checkpoints moved to
batch 2. Now ``transform`` is not templated: the task fails on the template before anything is
planned, the file is intact and the checkpoints stay at batch 1, with no pending batch.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from airflow_kinesis_spark.core.store import DynamoDBCheckpointStore
from demo.producer import put_plain
from demo.stack import BIN, ROOT, airflow, airflow_env
from tests.conftest import create_stream

pytestmark = [pytest.mark.dags, pytest.mark.slow, pytest.mark.spark]

DAG_FILE = '''
import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator

SETTINGS = dict(
    stream_name=os.environ["KINESIS_STREAM"], consumer_name="lake", checkpoint_table=os.environ["KINESIS_CHECKPOINT_TABLE"],
    output_path=os.environ["KINESIS_OUTPUT_PATH"], retries=0,
)

with DAG("baseline", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    KinesisToSparkOperator(task_id="ingest", transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
                           **SETTINGS)

with DAG("from_conf", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    KinesisToSparkOperator(
        task_id="ingest",
        transform="{{ dag_run.conf.get('transform') or 'airflow_kinesis_spark.transforms.apache_log:parse_combined_log' }}",
        **SETTINGS,
    )
'''

# Importable on the worker and in the Spark driver (on PYTHONPATH), as any installed module is.
PLANTED_MODULE = '''
import os


def wipe(df):
    """Not a transform the DAG author chose: removes a file outside the output root."""
    os.remove(os.environ["PLANTED_TRANSFORM_VICTIM"])
    return df
'''


def log_lines(start: int, n: int) -> list[tuple[str, bytes]]:
    return [(f"10.0.0.{i % 7}", f'10.0.0.{i % 7} - - [01/Mar/2026:10:00:00 +0000] "GET /p/{i} HTTP/1.1" 200 {i}'.encode())
            for i in range(start, start + n)]  # fmt: skip


def task_states(db: Path, dag_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [state for (state,) in conn.execute("SELECT state FROM task_instance WHERE dag_id = ?", (dag_id,))]


def test_transform_from_dag_run_conf_is_refused(moto_endpoint, kinesis, dynamodb, unique_name, tmp_path):
    create_stream(kinesis, unique_name, 2)
    put_plain(kinesis, unique_name, log_lines(0, 40))
    home, dags, site, output = tmp_path / "airflow_home", tmp_path / "dags", tmp_path / "site", tmp_path / "lake"
    for folder in (home, dags, site):
        folder.mkdir()
    (dags / "transform_dags.py").write_text(DAG_FILE, encoding="utf-8")
    (site / "planted_transform.py").write_text(PLANTED_MODULE, encoding="utf-8")
    victim = tmp_path / "precious" / "keep.txt"  # outside the output root
    victim.parent.mkdir()
    victim.write_text("committed elsewhere, keep", encoding="utf-8")
    table = f"{unique_name}_t"
    env = airflow_env(home, moto_endpoint, {
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "KINESIS_STREAM": unique_name, "KINESIS_CHECKPOINT_TABLE": table,
        "KINESIS_OUTPUT_PATH": str(output), "PLANTED_TRANSFORM_VICTIM": str(victim),
        "PYTHONPATH": os.pathsep.join((str(site), str(ROOT))),
    })  # fmt: skip
    airflow(["db", "migrate"], env)
    store = DynamoDBCheckpointStore(dynamodb, table, unique_name, "lake")

    airflow(["dags", "test", "baseline"], env)
    assert task_states(home / "airflow.db", "baseline") == ["success"]
    head = store.head()
    assert head.committed_batch_id == 1 and head.pending_batch_id is None
    checkpoints = store.committed_checkpoints(head)
    assert len(checkpoints) == 2
    output_before = sorted(str(p.relative_to(output)) for p in output.rglob("*"))

    put_plain(kinesis, unique_name, log_lines(40, 40))  # records a batch 2 would read
    proc = subprocess.run(
        [str(BIN / "airflow"), "dags", "test", "from_conf", "--conf", json.dumps({"transform": "planted_transform:wipe"})],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = proc.stdout + proc.stderr

    head = store.head()
    observed = {
        "file outside the output root": victim.read_text(encoding="utf-8") if victim.exists() else None,
        "committed, pending batch": (head.committed_batch_id, head.pending_batch_id),
        "checkpoints unchanged": store.committed_checkpoints(head) == checkpoints,
        "output unchanged": sorted(str(p.relative_to(output)) for p in output.rglob("*")) == output_before,
        "task states": task_states(home / "airflow.db", "from_conf"),
    }
    assert observed == {
        "file outside the output root": "committed elsewhere, keep",
        "committed, pending batch": (1, None),  # no checkpoint moved, nothing was planned
        "checkpoints unchanged": True,
        "output unchanged": True,
        "task states": ["failed"],
    }, log[-3000:]
    assert "transform is not templated" in log, log[-3000:]  # the run says why
