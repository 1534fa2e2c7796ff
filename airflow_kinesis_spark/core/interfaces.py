"""What the batch protocol drives besides boto3 and the checkpoint store: the job and the sink.

* a **job** runs a planned batch (reads its ranges, writes its output): a :class:`BatchJob`
  takes the batch from the checkpoint store and records its report there.
  spark-submit and Spark Connect are two implementations (``airflow_kinesis_spark.hooks.spark``,
  ``airflow_kinesis_spark.hooks.spark_connect``); tests use fake ones;
* a **sink** makes a batch's rows visible: Parquet folders, Iceberg, Delta. It is defined once,
  as :class:`airflow_kinesis_spark.sinks.Sink`, whose subclasses the protocol receives; core
  imports it for type checking only (core never imports ``sinks`` at run time).

The protocol (``core.protocol``) calls these and nothing else of them; this module does not
import it.

No Airflow import.
"""

from __future__ import annotations

from typing import Protocol

from airflow_kinesis_spark.core.job import JobArguments

__all__ = ["BatchJob"]


class BatchJob(Protocol):
    """Runs one planned batch (or window) that it takes from the checkpoint store (``core.job``):
    its driver claims the batch, reads the plan, holds the lease, publishes its output and records
    its report there itself, so nothing passes between the planning process and the driver but
    the :class:`~airflow_kinesis_spark.core.job.JobArguments`. The driver may run anywhere:
    spark-submit's (``hooks.spark``), a cluster's (a split task group's job task), or this
    process over Spark Connect (``hooks.spark_connect``).

    Implementations own everything about where and how the job runs (packaging, environment,
    credentials, processes, cleanup); the protocol only calls these two methods.
    """

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job with ``arguments`` and return when it ended.

        :param output_location: the batch's output location (for scoping the job's credentials).
        :raises Exception: the job failed; the protocol releases the lease and re-raises.
        """
        ...

    def kill(self) -> None:
        """Stop a running job at once (called from another thread)."""
        ...
