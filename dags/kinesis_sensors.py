"""Example: ingest when the backlog is worth it, guard retention, and watch for resharding.

* ``retention_guard`` fails (no retry) when a shard's oldest unconsumed record is within two hours
  of the stream's retention period: someone must act before records age out.
* ``wait_for_backlog`` succeeds when any shard has records this consumer has not committed; its
  XCom is the per-shard lag. Deferrable by default (it waits in the triggerer, not a worker slot);
  KINESIS_SENSORS_DEFERRABLE=false runs every sensor in poke mode.
* ``ingest`` is one exactly-once batch (see kinesis_microbatch.py).
* ``watch_resharding`` reports a split or merge since the last committed batch (new shards,
  closed shards, parent -> children) and is skipped when there was none. The operator needs no
  help with resharding: it reads parents to SHARD_END before their children.

Settings come from the same environment variables as kinesis_microbatch.py.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.sensors.kinesis import (
    KinesisReshardingSensor,
    KinesisRetentionGuardSensor,
    KinesisShardLagSensor,
)

STREAM = os.environ.get("KINESIS_STREAM", "apache-access-log")
CONSUMER = os.environ.get("KINESIS_CONSUMER", "parquet-lake")
TABLE = os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints")
OUTPUT = os.environ.get("KINESIS_OUTPUT_PATH", "/tmp/kinesis_spark_output")
# Wait in the triggerer (deferrable) or in a worker slot (poke mode).
DEFERRABLE = os.environ.get("KINESIS_SENSORS_DEFERRABLE", "true").lower() == "true"


# [START howto_sensor_kinesis]
@dag(
    dag_id="kinesis_sensors",
    schedule=timedelta(minutes=15),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["kinesis", "spark", "example"],
)
def kinesis_sensors():
    consumer = {"stream_name": STREAM, "consumer_name": CONSUMER, "checkpoint_table": TABLE}
    sensing = {**consumer, "deferrable": DEFERRABLE}

    retention_guard = KinesisRetentionGuardSensor(task_id="retention_guard", margin=timedelta(hours=2), **sensing)
    wait_for_backlog = KinesisShardLagSensor(task_id="wait_for_backlog", poke_interval=5, timeout=600, **sensing)
    ingest = KinesisToSparkOperator(
        task_id="ingest",
        output_path=OUTPUT,
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        retries=2,
        **consumer,
    )
    watch_resharding = KinesisReshardingSensor(
        task_id="watch_resharding", poke_interval=3, timeout=120, soft_fail=True, **sensing
    )
    retention_guard >> wait_for_backlog >> ingest >> watch_resharding


# [END howto_sensor_kinesis]

kinesis_sensors()
