"""Example: exactly-once micro-batches from Kinesis into an Apache Iceberg table and a Delta Lake
table, and a backfill window that replaces its rows in both.

``kinesis_tables`` (scheduled): two consumers of one stream, each with its own checkpoints.
Every batch of ``ingest_iceberg`` is one Iceberg snapshot (pyiceberg, any catalog: here a SQL
catalog, e.g. SQLite); every batch of ``ingest_delta`` one Delta version (deltalake). Each table
commit records stream, consumer and batch id before the checkpoints advance, so a retried batch
is never added twice. ``kinesis_tables_window`` (manual): re-reads ``[window_start, window_end)``
into separate tables; a re-run replaces the window's rows atomically.

Settings come from environment variables, so the same file runs locally and on AWS:

=================================  ===============================================  ======================================
variable                           meaning                                          default
=================================  ===============================================  ======================================
KINESIS_STREAM                     stream name or ARN                               apache-access-log
KINESIS_CHECKPOINT_TABLE           DynamoDB table of the checkpoints                kinesis_spark_checkpoints
KINESIS_TABLES_ROOT                where the tables' files go (local, s3a://...)    /tmp/kinesis_spark_tables
KINESIS_ICEBERG_CATALOG_URI        pyiceberg SQL catalog URI                        sqlite:///{KINESIS_TABLES_ROOT}/catalog.db
KINESIS_SPARK_CONN_ID              Spark connection (spark or spark_connect)        spark_default
KINESIS_LEASE_SECONDS              the batches' lease (keep it below retry_delay)   120
KINESIS_WINDOW_START / _END        the window of ``kinesis_tables_window`` (UTC)    the last hour
=================================  ===============================================  ======================================
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_kinesis_spark.operators.kinesis_to_spark import KinesisToSparkOperator
from airflow_kinesis_spark.operators.settings import OutputSettings, SparkSettings
from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator

STREAM = os.environ.get("KINESIS_STREAM", "apache-access-log")
CHECKPOINTS = os.environ.get("KINESIS_CHECKPOINT_TABLE", "kinesis_spark_checkpoints")
ROOT = os.environ.get("KINESIS_TABLES_ROOT", "/tmp/kinesis_spark_tables")
CATALOG = {"type": "sql", "uri": os.environ.get("KINESIS_ICEBERG_CATALOG_URI", f"sqlite:///{ROOT}/catalog.db")}
SPARK = os.environ.get("KINESIS_SPARK_CONN_ID", "spark_default")
PARSE = "airflow_kinesis_spark.transforms.apache_log:parse_combined_log"
LEASE = float(os.environ.get("KINESIS_LEASE_SECONDS", "120"))


# [START howto_operator_kinesis_to_iceberg_and_delta]
@dag(
    dag_id="kinesis_tables",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},  # above the 120 s lease
    tags=["kinesis", "spark", "iceberg", "delta", "example"],
)
def kinesis_tables():
    KinesisToSparkOperator(
        task_id="ingest_iceberg",
        stream_name=STREAM,
        consumer_name="iceberg-lake",
        checkpoint_table=CHECKPOINTS,
        output_settings=OutputSettings(
            format="iceberg",
            table="lake.access_log",
            catalog_properties=CATALOG,  # or catalog_conn_id="my_glue_catalog"
            partition_by=["day(approximate_arrival_timestamp)"],
        ),
        output_path=f"{ROOT}/iceberg/access_log",  # where Spark writes the files; the table's location
        transform=PARSE,
        spark_settings=SparkSettings(conn_id=SPARK),
        lease_seconds=LEASE,
    )
    KinesisToSparkOperator(
        task_id="ingest_delta",
        stream_name=STREAM,
        consumer_name="delta-lake",
        checkpoint_table=CHECKPOINTS,
        output_settings=OutputSettings(format="delta", partition_by=["arrival_date"]),
        output_path=f"{ROOT}/delta/access_log",  # the Delta table
        transform=PARSE,
        spark_settings=SparkSettings(conn_id=SPARK),
        lease_seconds=LEASE,
    )


# [END howto_operator_kinesis_to_iceberg_and_delta]


@dag(dag_id="kinesis_tables_window", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     tags=["kinesis", "spark", "iceberg", "delta", "example", "backfill"])  # fmt: skip
def kinesis_tables_window():
    window = {
        "spark_settings": SparkSettings(conn_id=SPARK),
        "window_start": os.environ.get("KINESIS_WINDOW_START", "{{ (data_interval_end - macros.timedelta(hours=1)).isoformat() }}"),
        "window_end": os.environ.get("KINESIS_WINDOW_END", "{{ data_interval_end.isoformat() }}"),
    }
    KinesisWindowToSparkOperator(
        task_id="window_iceberg", stream_name=STREAM, consumer_name="iceberg-backfill",
        output_settings=OutputSettings(format="iceberg", table="lake.access_log_window", catalog_properties=CATALOG),
        output_path=f"{ROOT}/iceberg/access_log_window", transform=PARSE, **window,
    )  # fmt: skip
    KinesisWindowToSparkOperator(
        task_id="window_delta", stream_name=STREAM, consumer_name="delta-backfill", output_settings=OutputSettings(format="delta"),
        output_path=f"{ROOT}/delta/access_log_window", transform=PARSE, **window,
    )  # fmt: skip


kinesis_tables()
kinesis_tables_window()
