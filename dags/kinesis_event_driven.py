"""Example: event-driven micro-batches, run when the backlog is worth a batch rather than on a clock.

The DAG is scheduled on an asset watched by ``KinesisBacklogTrigger`` (Airflow 3 event-driven
scheduling; the trigger runs in the triggerer). The trigger reads this consumer's committed
checkpoints and fires when at least KINESIS_BACKLOG_MIN_RECORDS records wait, or when the
oldest waiting record is KINESIS_BACKLOG_MIN_AGE_SECONDS old, whichever comes first. Each run
is one exactly-once batch (see kinesis_microbatch.py), cut off at the time it plans.

Events and runs: the trigger fires at most once per committed batch and never for records a
run already committed. An event that arrives while a run is ingesting queues one more run
(``max_active_runs=1``), which finds little or nothing: a run without new records starts no
Spark job. A triggerer needs to run (``airflow triggerer``).

Low latency (a record's output committed seconds after it arrives): leave both thresholds empty
(any waiting record is due), poll every 5 seconds, and make ``spark_default`` a ``spark_connect``
connection (a warm server of this deployment; the consumer's session is reused from batch to batch, an
opt-in: ``SparkSettings(connect_reuse_session=True)``). See
docs/triggers.md, "Low latency", and ``benchmarks/freshness.py``, which runs this DAG so.

Settings come from environment variables (as in kinesis_microbatch.py); this DAG has its own
consumer and output defaults, so it does not share checkpoints or batch directories with
kinesis_microbatch; its consumer and output path have their own variables, so one environment
can run both DAGs against one stream.

================================  ==========================================  ================================
variable                          meaning                                     default
================================  ==========================================  ================================
KINESIS_STREAM                    stream name                                 apache-access-log
KINESIS_EVENT_DRIVEN_CONSUMER     consumer (application) name                 parquet-lake-events
KINESIS_CHECKPOINT_TABLE          DynamoDB table of the checkpoints           kinesis_spark_checkpoints
KINESIS_EVENT_DRIVEN_OUTPUT_PATH  Parquet root (local path, s3a://...)        /tmp/kinesis_spark_output_events
KINESIS_BACKLOG_MIN_RECORDS       records waiting that start a run, 1..10000  1000 (empty: no count threshold)
KINESIS_BACKLOG_MIN_AGE_SECONDS   age of the oldest waiting record (s)        300 (empty: no age threshold)
KINESIS_BACKLOG_POLL_SECONDS      seconds between two polls, at least 5       30
================================  ==========================================  ================================
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, AssetWatcher, dag

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings
from airflow_kinesis_spark.triggers.kinesis import KinesisBacklogTrigger

STREAM = os.environ.get("KINESIS_STREAM", "apache-access-log")
CONSUMER = os.environ.get("KINESIS_EVENT_DRIVEN_CONSUMER", "parquet-lake-events")
TABLE = os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints")
OUTPUT = os.environ.get("KINESIS_EVENT_DRIVEN_OUTPUT_PATH", "/tmp/kinesis_spark_output_events")
MIN_RECORDS = os.environ.get("KINESIS_BACKLOG_MIN_RECORDS", "1000").strip()
MIN_AGE_SECONDS = os.environ.get("KINESIS_BACKLOG_MIN_AGE_SECONDS", "300").strip()
POLL_SECONDS = float(os.environ.get("KINESIS_BACKLOG_POLL_SECONDS", "30"))


# [START howto_trigger_kinesis_backlog]
backlog = Asset(
    f"kinesis_backlog.{STREAM}.{CONSUMER}",
    watchers=[
        AssetWatcher(
            name=f"kinesis_backlog_{CONSUMER}",
            trigger=KinesisBacklogTrigger(
                stream_name=STREAM,
                consumer_name=CONSUMER,
                checkpoint_table=TABLE,
                min_records=int(MIN_RECORDS) if MIN_RECORDS else None,
                min_age_seconds=float(MIN_AGE_SECONDS) if MIN_AGE_SECONDS else None,
                poke_interval=POLL_SECONDS,
                aws_conn_id="aws_default",
            ),
        )
    ],
)


@dag(
    dag_id="kinesis_event_driven",
    schedule=[backlog],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # One run at a time: events during a run queue a single next run.
    max_active_runs=1,
    # retry_delay above the operator's lease_seconds (60 s): a retry takes the pending batch over at once.
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
    tags=["kinesis", "spark", "example"],
)
def kinesis_event_driven():
    KinesisToSparkOperator(
        task_id="ingest_backlog",
        stream_name=STREAM,
        consumer_name=CONSUMER,
        checkpoint_table=TABLE,
        output_path=OUTPUT,
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        max_records_per_shard=100_000,
        aws_conn_id="aws_default",
        spark_settings=SparkSettings(
            conn_id="spark_default",
            # A Spark Connect server of this deployment alone: keep the consumer's warm session from batch
            # to batch (on a server other teams' clients reach, leave it off: docs/security.md).
            connect_reuse_session=True,
        ),
    )


# [END howto_trigger_kinesis_backlog]

kinesis_event_driven()
