"""DAGs of the deployment test's deferred batch (tests/deployment/conftest.py copies this file
into the deployment's DAG folder; nothing else loads it).

* ``kinesis_deferred_batch``: one ``KinesisToSparkOperator(deferrable=True)`` batch, Spark on a
  local master (``spark_default``: ``local[*]``), in the pool ``KINESIS_DEFERRED_POOL``. Its
  Spark job applies ``tests.deployment.job_gate:hold_until_released``, which holds the job
  (after its read, before its write) until the test opens the gate.
* ``kinesis_slot_probe``: one short task in the same pool. The test gives the pool one slot, so
  the probe can only run while the deferred batch occupies none.

Both are triggered by the test (no schedule, not paused), with no retries: a failure shows at once.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import dag, task

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings

POOL = os.environ.get("KINESIS_DEFERRED_POOL", "kinesis_deferred_slot")


@dag(
    dag_id="kinesis_deferred_batch",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    default_args={"retries": 0},
    tags=["kinesis", "spark", "deployment-test"],
)
def kinesis_deferred_batch():
    KinesisToSparkOperator(
        task_id="ingest_deferred",
        stream_name=os.environ.get("KINESIS_DEFERRED_STREAM", "apache-access-log"),
        consumer_name=os.environ.get("KINESIS_DEFERRED_CONSUMER", "deferred"),
        checkpoint_table=os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints"),
        output_path=os.environ.get("KINESIS_DEFERRED_OUTPUT_PATH", "/tmp/kinesis_spark_deferred"),
        transform="tests.deployment.job_gate:hold_until_released",
        deferrable=True,
        poke_interval=2.0,
        job_start_timeout=300.0,
        pool=POOL,
        aws_conn_id="aws_default",
        spark_settings=SparkSettings(conn_id="spark_default"),
    )


@dag(
    dag_id="kinesis_slot_probe",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    default_args={"retries": 0},
    tags=["deployment-test"],
)
def kinesis_slot_probe():
    @task(task_id="use_the_slot", pool=POOL)
    def use_the_slot() -> int:
        """Occupy the pool's slot for as long as a task takes to run."""
        return os.getpid()

    use_the_slot()


kinesis_deferred_batch()
kinesis_slot_probe()
