"""The table sinks' retries of a commit that conflicts with another writer's, on real tables:
pyiceberg (SQL catalog on SQLite) and deltalake on local files, as the Spark job lays them out
(pyarrow writes them: no Spark). The other writer is real too: it commits to the table between
the sink's load and its commit, so the sink's commit meets a table that moved.

pyiceberg retries a conflicting snapshot commit by itself (table property
``commit.retry.num-retries``, default 4); the tables here set it to 0 so that the sink's own
retry (``COMMIT_ATTEMPTS``) is what is exercised."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from deltalake import DeltaTable

from airflow_kinesis_spark.sinks import delta as delta_module
from airflow_kinesis_spark.sinks import conflicts
from airflow_kinesis_spark.sinks.delta import DeltaSink
from airflow_kinesis_spark.sinks.iceberg import IcebergSink
from tests.integration.test_table_sinks import DAY, plan, write_batch


def iceberg_sink(tmp_path) -> tuple[IcebergSink, object]:
    location = tmp_path / "table"
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    sink = IcebergSink("lake.events", catalog, str(location))
    write_batch(location, 1, 3, delta=False)
    sink.commit_batch(plan(location, 1), [])
    with sink.load().transaction() as tx:  # no retry inside pyiceberg: the sink's own is tested
        tx.set_properties({"commit.retry.num-retries": "0"})
    return sink, location


def interfere(sink: IcebergSink | DeltaSink, times: int, commit_elsewhere: Callable[[Callable[[], Any]], None]) -> list[int]:
    """Make ``sink.load`` hand out a table that another writer then moves on
    (``commit_elsewhere(load)``, ``load`` the sink's own), for the first ``times`` loads. Returns
    the list of loads (its length)."""
    real, loads = sink.load, []

    def load():
        table = real()
        loads.append(1)
        if len(loads) <= times:
            commit_elsewhere(real)
        return table

    sink.load = load  # type: ignore[method-assign]
    return loads


def append_nothing(load: Callable[[], Any]) -> None:
    """Another Iceberg writer: an empty append, a new snapshot."""
    other = load()
    other.append(other.schema().as_arrow().empty_table())


def interfere_with_iceberg(sink: IcebergSink, times: int) -> list[int]:
    return interfere(sink, times, append_nothing)


def test_an_iceberg_commit_that_conflicts_is_retried_on_the_refreshed_table(tmp_path, caplog):
    sink, location = iceberg_sink(tmp_path)
    write_batch(location, 2, 4, delta=False)
    loads = interfere_with_iceberg(sink, 2)
    with caplog.at_level(logging.WARNING, logger="airflow_kinesis_spark.sinks.iceberg"):
        commit = sink.commit_batch(plan(location, 2), [])
    assert len(loads) == 3 and not commit.already_committed
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_kinesis_spark.sinks.iceberg" and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("table lake.events: commit conflicted with another writer (")
    assert warnings[0].endswith("); retrying on the reloaded table (attempt 2 of 5)")
    assert warnings[1].endswith("(attempt 3 of 5)")
    assert sink.load().scan().to_arrow().num_rows == 3 + 4  # batch 2 once


def record_sleeps(monkeypatch) -> list[float]:
    """``time.sleep`` of this test's thread recorded instead of taken; other threads of the
    process (left by earlier tests in this worker) still sleep, and are not counted."""
    sleeps: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread():
            sleeps.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return sleeps


def test_an_iceberg_commit_that_keeps_conflicting_fails_after_the_last_attempt(tmp_path, caplog, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException

    sink, location = iceberg_sink(tmp_path)
    sleeps = record_sleeps(monkeypatch)  # the pauses between attempts, not taken
    write_batch(location, 2, 4, delta=False)
    loads = interfere_with_iceberg(sink, 100)
    with caplog.at_level(logging.WARNING, logger="airflow_kinesis_spark.sinks.iceberg"), pytest.raises(CommitFailedException):
        sink.commit_batch(plan(location, 2), [])
    assert len(loads) == conflicts.COMMIT_ATTEMPTS == 5
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_kinesis_spark.sinks.iceberg" and r.levelno == logging.WARNING]
    assert [w[-16:] for w in warnings] == [f"(attempt {n} of 5)" for n in (2, 3, 4, 5)]
    assert sleeps == pytest.approx([0.05, 0.1, 0.15, 0.2])  # 0.05 s times the attempt that failed
    assert sink.load().scan().to_arrow().num_rows == 3  # batch 2 is not in the table


def test_an_iceberg_compaction_that_conflicts_is_retried_and_one_that_keeps_conflicting_fails(tmp_path, caplog):
    from pyiceberg.exceptions import CommitFailedException

    sink, location = iceberg_sink(tmp_path)
    write_batch(location, 2, 4, delta=False)
    sink.commit_batch(plan(location, 2), [])
    loads = interfere_with_iceberg(sink, 1)
    with caplog.at_level(logging.WARNING, logger="airflow_kinesis_spark.sinks.iceberg"):
        result = sink.compact(DAY, DAY + timedelta(days=1))
    assert len(loads) == 2 and (result["files_before"], result["files_after"], result["rows"]) == (2, 1, 7)
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_kinesis_spark.sinks.iceberg" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("table lake.events: compaction conflicted with another writer ("), warnings
    assert warnings[0].endswith("); retrying on the reloaded table (attempt 2 of 5)")

    write_batch(location, 3, 2, delta=False)
    sink.commit_batch(plan(location, 3), [])
    loads = interfere_with_iceberg(sink, 100)
    with pytest.raises(CommitFailedException):
        sink.compact(DAY, DAY + timedelta(days=1))
    assert len(loads) == 5


def delta_sink(tmp_path) -> tuple[DeltaSink, object]:
    location = tmp_path / "delta"
    sink = DeltaSink(str(location))
    write_batch(location, 1, 3, delta=True)
    sink.commit_batch(plan(location, 1), [])
    return sink, location


def interfere_with_delta(sink: DeltaSink, location, times: int) -> list[int]:
    """Another Delta writer changes the table's metadata (a table property) after each of the
    first ``times`` loads."""
    return interfere(sink, times, lambda load: DeltaTable(str(location)).alter.set_table_properties({"delta.appendOnly": "false"}))


def test_a_delta_commit_that_conflicts_is_retried_on_the_reloaded_table(tmp_path, caplog):
    sink, location = delta_sink(tmp_path)
    write_batch(location, 2, 4, delta=True)
    loads = interfere_with_delta(sink, location, 2)
    with caplog.at_level(logging.WARNING, logger="airflow_kinesis_spark.sinks.delta"):
        commit = sink.commit_batch(plan(location, 2), [])
    assert len(loads) == 3 and not commit.already_committed
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_kinesis_spark.sinks.delta" and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"table {sink.uri}: commit conflicted with another writer (")
    assert warnings[0].endswith("); retrying on the reloaded table (attempt 2 of 5)")
    assert warnings[1].endswith("(attempt 3 of 5)")
    assert DeltaTable(str(location)).to_pyarrow_table().num_rows == 3 + 4
    assert DeltaTable(str(location)).transaction_version(delta_module.app_id("s", "c")) == 2


def test_a_delta_commit_that_keeps_conflicting_fails_after_the_last_attempt(tmp_path, caplog, monkeypatch):
    from deltalake.exceptions import CommitFailedError

    sink, location = delta_sink(tmp_path)
    sleeps = record_sleeps(monkeypatch)
    write_batch(location, 2, 4, delta=True)
    loads = interfere_with_delta(sink, location, 100)
    with caplog.at_level(logging.WARNING, logger="airflow_kinesis_spark.sinks.delta"), pytest.raises(CommitFailedError):
        sink.commit_batch(plan(location, 2), [])
    assert len(loads) == conflicts.COMMIT_ATTEMPTS == 5
    warnings = [r.getMessage() for r in caplog.records if r.name == "airflow_kinesis_spark.sinks.delta" and r.levelno == logging.WARNING]
    assert [w[-16:] for w in warnings] == [f"(attempt {n} of 5)" for n in (2, 3, 4, 5)]
    assert not any(sleeps)  # retried at once (no pause, or 0 s): the reloaded table is the fresh state
    assert DeltaTable(str(location)).to_pyarrow_table().num_rows == 3
