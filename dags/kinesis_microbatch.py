"""Example: scheduled, exactly-once micro-batches from a Kinesis stream of Apache access logs to Parquet.

Every run reads each shard from its committed checkpoint up to the run's data_interval_end (now
for manual runs), parses the log lines, writes Parquet under ``{output_path}/batch_id=N`` and
advances all checkpoints in one conditional DynamoDB write. A failed run's plan is re-used by its
retry, so retries neither lose nor duplicate records.

Settings come from environment variables so the same file runs locally and on AWS:

===================================  =====================================  ==============================
variable                             meaning                                default
===================================  =====================================  ==============================
KINESIS_STREAM                       stream name                            apache-access-log
KINESIS_CONSUMER                     consumer (application) name            parquet-lake
KINESIS_CHECKPOINT_TABLE             DynamoDB table of the checkpoints      kinesis_spark_checkpoints
KINESIS_OUTPUT_PATH                  Parquet root (local path, s3a://...)   /tmp/kinesis_spark_output
KINESIS_MICROBATCH_INTERVAL_SECONDS  seconds between two scheduled runs     600
===================================  =====================================  ==============================
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import SparkSettings


# [START howto_operator_kinesis_to_spark]
@dag(
    dag_id="kinesis_microbatch",
    schedule=timedelta(seconds=int(os.environ.get("KINESIS_MICROBATCH_INTERVAL_SECONDS", "600"))),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # retry_delay above the operator's lease_seconds (60 s): a retry can then take the failed
    # attempt's pending batch over at once.
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
    tags=["kinesis", "spark", "example"],
)
def kinesis_microbatch():
    KinesisToSparkOperator(
        task_id="ingest_access_log",
        stream_name=os.environ.get("KINESIS_STREAM", "apache-access-log"),
        consumer_name=os.environ.get("KINESIS_CONSUMER", "parquet-lake"),
        checkpoint_table=os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints"),
        output_path=os.environ.get("KINESIS_OUTPUT_PATH", "/tmp/kinesis_spark_output"),
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        max_records_per_shard=100_000,
        aws_conn_id="aws_default",
        spark_settings=SparkSettings(conn_id="spark_default"),
    )


# [END howto_operator_kinesis_to_spark]

kinesis_microbatch()
