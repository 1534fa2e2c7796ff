"""What the batch protocol drives besides boto3 and the checkpoint store: the job and the sink.

* a **job** runs a planned batch (reads its ranges, writes its output): a :class:`BatchJob`
  returns its reports to the calling process, a :class:`HandedBatchJob` takes the batch from the
  checkpoint store and records its report there (:func:`hands_off` tells them apart).
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

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.ranges import ShardReport

if TYPE_CHECKING:  # annotations only (``from __future__ import annotations``): no run-time dependency
    from typing_extensions import TypeIs

__all__ = ["BatchJob", "HandedBatchJob", "hands_off"]


@runtime_checkable
class BatchJob(Protocol):
    """Runs one planned batch: reads every planned range, writes the output at
    ``plan.output_location`` (overwriting), and returns one report per planned range.

    Implementations own everything about where and how the job runs (packaging, environment,
    credentials, processes, cleanup); the protocol only calls these two methods.
    """

    def run(self, plan: BatchPlan, *, records_expected: bool) -> list[ShardReport]:
        """Run the job of ``plan``.

        :param records_expected: the probes saw a user record, so the job may read and write
            in one pass.
        :raises Exception: any failure; the protocol leaves the plan pending (incremental) and
            re-raises.
        """
        ...

    def kill(self) -> None:
        """Stop a running job at once (called from another thread when the lease is lost)."""
        ...


class HandedBatchJob(Protocol):
    """Runs one planned batch that it takes from the checkpoint store (``core.job``): the Spark
    driver claims the batch, reads the plan, holds the lease, publishes its output and records
    its report there itself, so nothing passes between this process and the driver but the
    :class:`~airflow_kinesis_spark.core.job.JobArguments`. The driver may run anywhere.

    ``takes_batch_from_store`` is ``True`` (see :func:`hands_off`).
    """

    takes_batch_from_store: bool

    def run_handed(self, arguments: JobArguments, *, output_location: str | None = None) -> None:
        """Run the job with ``arguments`` and return when it ended.

        :param output_location: the batch's output location (for scoping the job's credentials).
        :raises Exception: the job failed; the protocol releases the lease and re-raises.
        """
        ...

    def kill(self) -> None:
        """Stop a running job at once."""
        ...


def hands_off(job: BatchJob | HandedBatchJob) -> TypeIs[HandedBatchJob]:
    """Whether ``job`` takes its batch from the store (:class:`HandedBatchJob`: its
    ``takes_batch_from_store`` is ``True``); for a type checker, ``job`` is a
    :class:`HandedBatchJob` where this is true and a :class:`BatchJob` where it is false.

    A runner may be both (``hooks.spark.SparkJob``: its attribute says which way it runs);
    ``isinstance(job, BatchJob)`` tells whether it can also take a plan directly.
    """
    return getattr(job, "takes_batch_from_store", False) is True
