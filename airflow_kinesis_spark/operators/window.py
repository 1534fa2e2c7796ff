"""The window operator: a past time window of a stream, by arrival time (backfill), through the
batch operator's machinery (Spark job, transform, credentials, output checks) without its
checkpoints. Also importable from ``airflow_kinesis_spark.operators.kinesis_to_spark``, where it
was defined before."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Context

from airflow_kinesis_spark.core.positions import parse_timestamp
from airflow_kinesis_spark.core.window_run import WindowSettings, run_window
from airflow_kinesis_spark.operators.base import KinesisBatchBaseOperator, refuse_arguments
from airflow_kinesis_spark.operators.settings import SparkSettings
from airflow_kinesis_spark.operators.spark_settings import SparkSettingsMixin

__all__ = ["INCREMENTAL_ONLY", "DEFAULT_WINDOW_TABLE", "KinesisWindowToSparkOperator"]

#: The checkpoint table of windows whose task names none: their plans and reports pass through it.
DEFAULT_WINDOW_TABLE = "kinesis_spark_windows"

#: Arguments of ``KinesisToSparkOperator`` that :class:`KinesisWindowToSparkOperator` does not take
#: (and refuses, saying why): where an incremental batch starts and stops, its lease and
#: hand-over, its batch log.
INCREMENTAL_ONLY = ("cutoff", "initial_position", "initial_timestamp", "max_records_per_shard", "max_bytes_per_shard",
                    "lease_seconds", "keep_batches", "deferrable", "poke_interval", "job_start_timeout")  # fmt: skip


class KinesisWindowToSparkOperator(SparkSettingsMixin, KinesisBatchBaseOperator):
    """Read a past time window ``[window_start, window_end)`` of a stream into Parquet (backfill).

    Window mode of ``KinesisToSparkOperator``, with the same machinery (Spark job, transform,
    credentials, validation) and without its checkpoints. Every shard that may have been open during the window is read,
    closed ones included, from an ``AT_TIMESTAMP window_start`` iterator to the first record
    arriving at or after ``window_end``. Output goes to ``{output_path}/window={label}`` (see
    ``core.window.window_label``), overwritten on re-run: the same window gives the same rows, so
    Airflow backfills and cleared task instances simply work. The incremental checkpoints are
    never read or moved.

    With few shards, each shard's window is cut into time slices read in parallel.

    .. seealso:: docs/backfill.md

    :param stream_name: the stream (templated).
    :param output_path: root of the output (templated).
    :param window_start: the window's start, inclusive (ISO 8601 or datetime, UTC). Default: the
        run's ``data_interval_start`` (templated).
    :param window_end: the window's end, exclusive. Default: the run's ``data_interval_end``
        (templated). Must not be in the future.
    :param time_slices: slices per shard (1..64); ``None`` derives them: one per ``slice_length``
        of window, no more than needed to give ``parallelism`` Spark tasks work.
    :param slice_length: the shortest slice worth a task when deriving (default 15 minutes).
    :param parallelism: Spark tasks to keep busy when deriving; default ``spark.default.parallelism``
        from ``spark_settings.conf``, else the CPU count.
    :param consumer_name: only names the Spark application and the window's items in
        ``checkpoint_table`` (default ``window``).
    :param checkpoint_table: the DynamoDB table (templated) through which the job takes the
        window's plan and returns its report, so the driver may run anywhere (cluster deploy
        mode, Spark Connect); created on first use, its window items expire after 7 days. No
        checkpoint is moved; the consumer's committed checkpoints are read when the window writes
        into the consumer's own output (the window may not reach past them), so give a window into
        an incremental consumer's output that consumer's table. Default
        :data:`DEFAULT_WINDOW_TABLE`.
    :param allow_data_loss: read a window that starts before the trim horizon, reporting the gap;
        without it such a window fails without retry.
    :returns: (XCom) ``mode`` ``window``, ``status`` (``written`` or ``no_records``),
        ``stream_name``, ``window_start``, ``window_end``, ``records``, ``bytes``, ``output_path``,
        ``quarantined``, ``quarantine_path``, ``out_of_range``, ``time_slices``, ``shards`` (per
        shard ``records``, ``bytes``, ``slices``, ``quarantined``, ``out_of_range``), ``trim_gap``.
    :raises AirflowFailException: the window starts before the trim horizon (without
        ``allow_data_loss``).
    :raises ValueError: ``window_start >= window_end``, an end in the future, or other bad arguments.

    :param spark_settings: where the job runs (:class:`~airflow_kinesis_spark.operators.settings.SparkSettings`).

    The output (``output_settings``, ``record_settings``), ``read_options``, ``transform``, ``consumer_type``,
    ``output_asset`` and the AWS arguments are those of
    :class:`~airflow_kinesis_spark.operators.base.KinesisBatchBaseOperator`. The incremental
    arguments of ``KinesisToSparkOperator`` (:data:`INCREMENTAL_ONLY`: where a batch starts and
    stops, its lease and hand-over, the batch log) are refused with a ``TypeError`` that says why.
    """

    settings_arguments: Sequence[str] = (*KinesisBatchBaseOperator.settings_arguments, "spark_settings")
    template_fields: Sequence[str] = (*KinesisBatchBaseOperator.template_fields, "spark_settings", "window_start", "window_end")

    def __init__(
        self,
        *,
        stream_name: str,
        output_path: str,
        window_start: str | datetime | None = "{{ data_interval_start }}",
        window_end: str | datetime | None = "{{ data_interval_end }}",
        time_slices: int | None = None,
        slice_length: timedelta = timedelta(minutes=15),
        parallelism: int | None = None,
        consumer_name: str = "window",
        checkpoint_table: str = DEFAULT_WINDOW_TABLE,
        spark_settings: SparkSettings | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_arguments(type(self).__name__, kwargs, INCREMENTAL_ONLY,
                         "a window reads [window_start, window_end) by arrival time in the worker's run, with no "
                         "checkpoint, lease or batch log; use KinesisToSparkOperator for incremental batches")
        super().__init__(stream_name=stream_name, consumer_name=consumer_name, checkpoint_table=checkpoint_table,
                         output_path=output_path, **kwargs)  # fmt: skip
        self._init_spark(spark_settings)
        self.window_start = window_start
        self.window_end = window_end
        self.time_slices = time_slices
        self.slice_length = slice_length
        self.parallelism = parallelism

    def _window(self) -> tuple[datetime, datetime]:
        bounds = []
        for name in ("window_start", "window_end"):
            value = getattr(self, name)
            if value in (None, "", "None"):
                raise ValueError(
                    f"{name} is not set and the run has no data interval: pass window_start and window_end "
                    "(ISO 8601, UTC), or run the DAG on a schedule / as a backfill"
                )
            try:
                bounds.append(parse_timestamp(value))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{name}: {err}") from err
        if self.time_slices is not None and (isinstance(self.time_slices, bool) or not 1 <= int(self.time_slices) <= 64):
            raise ValueError(f"time_slices must be 1..64 or None; got {self.time_slices!r}")
        if not isinstance(self.slice_length, timedelta) or self.slice_length <= timedelta(0):
            raise ValueError(f"slice_length must be a positive timedelta; got {self.slice_length!r}")
        return bounds[0], bounds[1]

    def _run_batch(self, context: Context) -> dict[str, Any]:
        start, end = self._window()
        parallelism = self.parallelism or int((self.spark_settings.conf or {}).get("spark.default.parallelism", os.cpu_count() or 2))
        settings = WindowSettings(
            stream_name=self.stream_name, consumer_name=self.consumer_name, output_root=self.output_root,
            start=start, end=end, time_slices=self.time_slices, slice_length=self.slice_length, parallelism=parallelism,
            allow_data_loss=self.allow_data_loss, min_call_interval=self.read_options.min_call_interval, sink=self.sink,
            consumer_type=self.consumer_type, summary_budget=self.kinesis_hook.summary_budget,
        )  # fmt: skip
        store = self.checkpoint_hook.get_store(self.checkpoint_table, self.stream_name, self.consumer_name,
                                               point_in_time_recovery=self.point_in_time_recovery,
                                               deletion_protection=self.deletion_protection)  # fmt: skip
        store.ensure_table()
        return run_window(self.kinesis_hook.conn, self.spark_job, settings, store=store, owner=self._owner(context))
