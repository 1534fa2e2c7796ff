"""Table sinks and KinesisTableCompactionOperator on real tables: pyiceberg (SQL catalog on SQLite)
and deltalake on local files written as the Spark job lays them out (pyarrow writes them here: no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_kinesis_spark.core.planner import BatchPlan
from airflow_kinesis_spark.core.schema import arrow_schema
from airflow_kinesis_spark.operators.settings import OutputSettings
from airflow_kinesis_spark.operators.tables import KinesisTableCompactionOperator
from airflow_kinesis_spark.sinks.delta import DeltaSink
from airflow_kinesis_spark.sinks.iceberg import IcebergSink

DAY = datetime(2026, 11, 20, tzinfo=timezone.utc)


def write_batch(location, batch_id: int, rows: int, *, delta: bool) -> None:
    """One batch's file, one day per file, under ``_p0=<day>`` as the job writes it."""
    arrival = [DAY + timedelta(minutes=batch_id, seconds=i) for i in range(rows)]
    columns = {
        "stream_name": ["s"] * rows, "shard_id": ["shardId-000000000000"] * rows,
        "sequence_number": [f"{batch_id:04d}{i:06d}" for i in range(rows)], "sub_sequence_number": [None] * rows,
        "partition_key": ["k"] * rows, "explicit_hash_key": [None] * rows, "approximate_arrival_timestamp": arrival,
        "data": [b"x"] * rows,
    }  # fmt: skip
    table = pa.table(columns, schema=arrow_schema())
    if delta:
        table = table.append_column("arrival_date", pa.array([DAY.date()] * rows, pa.date32()))
    folder = location / f"batch_id={batch_id}" / f"_p0={DAY.date().isoformat()}"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-00000.parquet")


def plan(location, batch_id: int) -> BatchPlan:
    return BatchPlan(batch_id=batch_id, stream_name="s", consumer_name="c", cutoff=DAY + timedelta(days=1), created_at=DAY,
                     ranges=(), checkpoints={}, output_location=f"{location}/batch_id={batch_id}")  # fmt: skip


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_compaction_rewrites_a_days_small_files_into_fewer_with_the_same_rows(output_format, tmp_path):
    location = tmp_path / "table"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    if output_format == "iceberg":
        sink = IcebergSink("lake.events", catalog, str(location))
        read = lambda: sink.load().scan().to_arrow()  # noqa: E731
        files = lambda: len(list(sink.load().scan().plan_files()))  # noqa: E731
    else:
        sink = DeltaSink(str(location))
        read = lambda: pa.table(DeltaTable(str(location)).to_pyarrow_table())  # noqa: E731
        files = lambda: len(DeltaTable(str(location)).file_uris())  # noqa: E731
    for batch_id in range(1, 7):  # six micro-batches: six small files in one day partition
        write_batch(location, batch_id, 50, delta=output_format == "delta")
        sink.commit_batch(plan(location, batch_id), [])
    before = sorted(read().column("sequence_number").to_pylist())
    assert files() == 6 and len(before) == 300

    operator = KinesisTableCompactionOperator(
        task_id="compact", output_path=str(location),
        output_settings=OutputSettings(format=output_format, table="lake.events" if output_format == "iceberg" else None,
                                       catalog_properties=catalog if output_format == "iceberg" else None),
        start=DAY.isoformat(), end=(DAY + timedelta(days=1)).isoformat(),
    )  # fmt: skip
    result = operator.execute({})
    assert result["files_before"] == 6 and result["files_after"] == 1, result
    assert files() == 1
    assert sorted(read().column("sequence_number").to_pylist()) == before  # the same rows, once each
    # Batches are still found in the table after compaction (a re-run adds nothing).
    again = sink.commit_batch(plan(location, 6), [])
    assert again.already_committed and sorted(read().column("sequence_number").to_pylist()) == before


def test_compaction_refuses_parquet_output(tmp_path):
    operator = KinesisTableCompactionOperator(task_id="compact", output_settings=OutputSettings(format="parquet"),
                                              output_path=str(tmp_path),
                                              start=DAY.isoformat(), end=(DAY + timedelta(days=1)).isoformat())  # fmt: skip
    with pytest.raises(ValueError, match="no table to compact"):
        operator.execute({})


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_a_table_ahead_of_the_checkpoint_store_fails_the_commit_loudly(output_format, tmp_path):
    """Checkpoints reset (a new checkpoint history numbers its batches from 1 again): batch 1 of
    the new history must neither be skipped as 'already in the table' nor silently appended as if
    nothing were wrong."""
    from airflow_kinesis_spark.exceptions import TableCommitError

    location = tmp_path / "table"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    sink = IcebergSink("lake.events", catalog, str(location)) if output_format == "iceberg" else DeltaSink(str(location))
    write_batch(location, 1, 10, delta=output_format == "delta")
    first = sink.commit_batch(plan(location, 1), [])
    assert not first.already_committed
    assert sink.commit_batch(plan(location, 1), []).already_committed  # the same plan again: a re-run, nothing added
    replanned = plan(location, 1)
    replanned = type(replanned)(**{**replanned.__dict__, "created_at": DAY + timedelta(hours=1)})  # batch 1 of another history
    with pytest.raises(TableCommitError, match="ahead of the checkpoint store"):
        sink.commit_batch(replanned, [])


def test_a_delta_window_over_files_that_straddle_its_bounds_replaces_exactly_its_rows(tmp_path):
    """Batches wrote files spanning more than the window (a batch's minutes straddle its start):
    the window's commit must replace the rows inside it and keep the others, in one commit."""
    location = tmp_path / "table"
    sink = DeltaSink(str(location))
    for batch_id in (1, 2, 3):  # 90 rows each, one a second from minute batch_id: the files overlap the window
        write_batch(location, batch_id, 90, delta=True)
        sink.commit_batch(plan(location, batch_id), [])
    before = pa.table(DeltaTable(str(location)).to_pyarrow_table())
    start, end = DAY + timedelta(minutes=2, seconds=30), DAY + timedelta(minutes=3, seconds=30)
    inside = [s for s, t in zip(before.column("sequence_number").to_pylist(),
                                before.column("approximate_arrival_timestamp").to_pylist(), strict=True) if start <= t < end]  # fmt: skip
    assert 0 < len(inside) < before.num_rows
    # The window run's own file: the same rows of the window, as its job would write them.
    window = BatchPlan(batch_id=0, stream_name="s", consumer_name="backfill", cutoff=end, created_at=DAY, ranges=(),
                       checkpoints={}, output_location=f"{location}/window=w/run=1", mode="window", window_start=start)  # fmt: skip
    rows = before.filter(pa.compute.and_(pa.compute.greater_equal(before["approximate_arrival_timestamp"], pa.scalar(start)),
                                         pa.compute.less(before["approximate_arrival_timestamp"], pa.scalar(end))))  # fmt: skip
    folder = location / "window=w" / "run=1" / f"_p0={DAY.date().isoformat()}"
    folder.mkdir(parents=True)
    pq.write_table(rows, folder / "part-0.parquet")
    version = DeltaTable(str(location)).version()
    for _ in range(2):  # and a re-run of the window leaves the same rows
        result = sink.commit_window(window, [])
        after = pa.table(DeltaTable(str(location)).to_pyarrow_table())
        assert sorted(after.column("sequence_number").to_pylist()) == sorted(before.column("sequence_number").to_pylist())
    assert result.version == version + 2  # one commit per window run


@pytest.mark.parametrize("output_format", ["iceberg", "delta"])
def test_a_target_file_size_becomes_a_rows_cap_from_the_tables_stored_bytes_per_row(output_format, tmp_path):
    location = tmp_path / "table"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    target = 64 * 1024
    sink = (IcebergSink("lake.events", catalog, str(location), target_file_size=target) if output_format == "iceberg"
            else DeltaSink(str(location), target_file_size=target))  # fmt: skip
    first = sink.planned_output_spec()
    assert first.target_file_size == target and first.max_records_per_file == 0  # a new table: no estimate, no cap
    write_batch(location, 1, 400, delta=output_format == "delta")
    sink.commit_batch(plan(location, 1), [])
    size = sum(f.stat().st_size for f in (location / "batch_id=1").rglob("*.parquet"))
    planned = sink.planned_output_spec()
    assert planned.max_records_per_file == int(target / (size / 400)), (planned, size)
    # What a pending plan is compared on: the author's settings, not the derived cap.
    assert planned.settings() == first.settings() and "max_records_per_file" not in first.settings()
    with pytest.raises(ValueError, match="target_file_size or max_records_per_file"):
        from airflow_kinesis_spark.sinks.build import build_sink

        build_sink("delta", str(location), target_file_size=target, max_records_per_file=10)


def test_an_iceberg_window_over_whole_files_is_one_overwrite_snapshot_and_a_re_run_another(tmp_path):
    """Windows that replace whole files (a window's earlier run, day-aligned windows over batches
    of one day): one snapshot per window run that removes those files and adds the run's, with
    stream, consumer and window in its summary; a window whose bounds cut files falls back to
    pyiceberg's copy-on-write delete and the append, in one transaction."""
    from airflow_kinesis_spark.sinks.iceberg import SUMMARY_CONSUMER, SUMMARY_WINDOW

    location = tmp_path / "table"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    sink = IcebergSink("lake.events", catalog, str(location))
    for batch_id in (1, 2, 3):
        write_batch(location, batch_id, 30, delta=False)
        sink.commit_batch(plan(location, batch_id), [])
    before = sink.load().scan().to_arrow()
    start, end = DAY, DAY + timedelta(days=1)  # the whole day: every batch file lies inside

    def window_run(run: int, window_start, window_end) -> BatchPlan:
        rows = before.filter(pa.compute.and_(pa.compute.greater_equal(before["approximate_arrival_timestamp"], pa.scalar(window_start)),
                                             pa.compute.less(before["approximate_arrival_timestamp"], pa.scalar(window_end))))  # fmt: skip
        folder = location / "window=w" / f"run={run}" / f"_p0={DAY.date().isoformat()}"
        folder.mkdir(parents=True)
        pq.write_table(rows, folder / "part-0.parquet")
        return BatchPlan(batch_id=0, stream_name="s", consumer_name="c", cutoff=window_end, created_at=DAY, ranges=(), checkpoints={},
                         output_location=f"{location}/window=w/run={run}", mode="window", window_start=window_start)  # fmt: skip

    for run in (1, 2):
        snapshots = len(sink.load().metadata.snapshots)
        sink.commit_window(window_run(run, start, end), [])
        table = sink.load()
        assert len(table.metadata.snapshots) == snapshots + 1  # one snapshot per window run
        summary = table.current_snapshot().summary
        assert summary.operation.value == "overwrite" and summary.additional_properties[SUMMARY_CONSUMER] == "c"
        assert SUMMARY_WINDOW in summary.additional_properties
        assert sorted(table.scan().to_arrow().column("sequence_number").to_pylist()) == sorted(before.column("sequence_number").to_pylist())
        assert len(list(table.scan().plan_files())) == 1  # the run's file replaced the batches' (or the last run's)

    # A window inside the day cuts the run's file: the rows outside it stay, the rows inside once.
    snapshots = len(sink.load().metadata.snapshots)
    sink.commit_window(window_run(3, DAY + timedelta(minutes=2), DAY + timedelta(minutes=2, seconds=10)), [])
    table = sink.load()
    assert len(table.metadata.snapshots) > snapshots
    assert sorted(table.scan().to_arrow().column("sequence_number").to_pylist()) == sorted(before.column("sequence_number").to_pylist())
