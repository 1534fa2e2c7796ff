"""Example: re-read past time windows of a stream into Parquet (backfill by arrival time).

Each run reads ``[data_interval_start, data_interval_end)`` by ApproximateArrivalTimestamp from
every shard that was open then (closed ones included) and overwrites
``{output_path}/window=<start>-<end>``: the same window always gives the same rows, so
``airflow backfill create`` and cleared task instances simply work. A run triggered with
``{"window_start": ..., "window_end": ...}`` in its conf reads that window instead. The
incremental checkpoints of kinesis_microbatch.py are never touched.

Environment: KINESIS_STREAM, KINESIS_BACKFILL_OUTPUT_PATH, KINESIS_WINDOW_SECONDS (the schedule
and window length, default 900).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import dag
from airflow.sdk.definitions.timetables.interval import DeltaDataIntervalTimetable

from airflow_kinesis_spark.operators.window import KinesisWindowToSparkOperator

WINDOW = timedelta(seconds=int(os.environ.get("KINESIS_WINDOW_SECONDS", "900")))
# A data-interval timetable: in Airflow 3 a plain ``schedule=timedelta(...)`` gives runs whose
# data interval is empty (start == end), which is no window to read.


# [START howto_operator_kinesis_window]
@dag(
    dag_id="kinesis_backfill",
    schedule=DeltaDataIntervalTimetable(WINDOW),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["kinesis", "spark", "example", "backfill"],
)
def kinesis_backfill():
    KinesisWindowToSparkOperator(
        task_id="read_window",
        stream_name=os.environ.get("KINESIS_STREAM", "apache-access-log"),
        output_path=os.environ.get("KINESIS_BACKFILL_OUTPUT_PATH", "/tmp/kinesis_spark_windows"),
        window_start="{{ dag_run.conf.get('window_start') or data_interval_start }}",
        window_end="{{ dag_run.conf.get('window_end') or data_interval_end }}",
        transform="airflow_kinesis_spark.transforms.apache_log:parse_combined_log",
        time_slices=None,  # derived: one per 15 minutes of window, enough to keep Spark busy
    )


# [END howto_operator_kinesis_window]

kinesis_backfill()
