"""What the batch protocol drives besides boto3 and the checkpoint store: the job and the sink.

* a **job** runs a planned batch (reads its ranges, writes its output): a :class:`BatchJob`
  returns its reports to the calling process, a :class:`HandedBatchJob` takes the batch from the
  checkpoint store and records its report there (:func:`hands_off` tells them apart).
  spark-submit and Spark Connect are two implementations (``airflow_kinesis_spark.hooks.spark``);
  tests use fake ones;
* a **sink** (:class:`Sink`) makes a batch's rows visible: Parquet folders, Iceberg, Delta
  (``airflow_kinesis_spark.sinks``).

The protocol (``core.protocol``) calls these and nothing else of them; this module does not
import it.

No Airflow import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from airflow_kinesis_spark.core.job import JobArguments
from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.ranges import ShardReport

__all__ = ["BatchJob", "HandedBatchJob", "Sink", "hands_off"]


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


class Sink(Protocol):
    """Where a batch's rows become visible (``airflow_kinesis_spark.sinks``: Parquet folders,
    Iceberg, Delta). Every method is idempotent: the protocol calls them again when it rolls a
    batch forward.

    - ``output_spec()``: what the job writes (an ``OutputSpec``, stored in each plan).
    - ``commit_batch(plan, reports)``: make a batch with records visible *before* its checkpoints
      advance (a table commit that records stream, consumer and batch id; a batch already in the
      table adds nothing); returns a ``TableCommit`` (or ``None``).
    - ``after_checkpoint_commit(plan, reports)``: after they advanced (Parquet's committed record).
    - ``repair(store, head)``: before planning, finish what a crash after the last checkpoint
      commit left undone.
    - ``commit_window(plan, reports)``: replace a window's rows atomically.
    """

    format: str
    table: str

    def output_spec(self) -> Any: ...

    def planned_output_spec(self) -> Any: ...

    def commit_batch(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> Any: ...

    def check_written(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None: ...

    def check_schema(self, transform: str | None) -> None: ...

    def after_checkpoint_commit(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> None: ...

    def repair(self, store: Any, head: Any) -> None: ...

    def commit_window(self, plan: BatchPlan, reports: Sequence[ShardReport]) -> Any: ...


def hands_off(job: Any) -> bool:
    """Whether ``job`` takes its batch from the store (:class:`HandedBatchJob`)."""
    return bool(getattr(job, "takes_batch_from_store", False))
