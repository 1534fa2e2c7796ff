"""airflow-kinesis-spark: exactly-once, bounded Kinesis Data Streams to PySpark micro-batches.

This module imports nothing: ``airflow_kinesis_spark.core`` runs in Spark executors without Airflow.
"""

__version__ = "0.1.0"
